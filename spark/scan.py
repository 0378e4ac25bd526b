"""Executor side of a read: planned segment slices in, Arrow record batches out.

Runs inside Spark's Python workers. The store is reopened from the warehouse URL and the
storage options carried by the input partition (and cached per worker process, since
workers are reused across tasks). Segments are fetched a few at a time in threads because
object-store reads are latency bound, and small slices are merged into batches of about
:data:`TARGET_BATCH_ROWS` rows because every batch crossing to the JVM has a fixed cost.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txntable.records import OFFSET_COLUMN, check_segment, read_segment
from txntable.storage import Store, open_store

from .planning import SegmentSlice
from .schema import ARROW_HEADERS, ARROW_SCHEMA, ARROW_SCHEMA_NO_HEADERS, ARROW_TIMESTAMP

#: Rows per record batch handed to Spark (small segments are merged up to this).
TARGET_BATCH_ROWS = 65_536
#: Segments fetched concurrently per task.
PREFETCH = 8
#: Below this size a remote segment is fetched with one GET and decoded in memory, which
#: beats the several ranged requests (footer, then column chunks) of a Parquet file reader.
SMALL_SEGMENT_BYTES = 8 * 1024 * 1024

T = TypeVar("T")
R = TypeVar("R")

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], Store] = {}
_stores_lock = threading.Lock()


def cached_store(url: str, storage_options: dict[str, str]) -> Store:
    """The store for ``url``, opened once per worker process and options."""
    key = (url, tuple(sorted(storage_options.items())))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(url, storage_options)
        return store


def _arrow_fs(store: Store) -> tuple[pa.fs.FileSystem, str, bool] | None:
    try:
        from txntable.storage.arrowfs import arrow_filesystem
    except ImportError:  # pragma: no cover - older core without the Arrow bridge
        return None
    found = arrow_filesystem(store)
    if found is None:
        return None
    fs, base = found
    return fs, base.rstrip("/"), isinstance(fs, pa.fs.LocalFileSystem)


def read_slice_table(
    store: Store, fs: tuple[pa.fs.FileSystem, str, bool] | None, s: SegmentSlice
) -> pa.Table:
    """Read the segment of ``s`` (checked against its batch) and keep its rows.

    Raises:
        MissingSegmentError: If the segment object is gone.
        SchemaMismatchError: If it does not match its batch.
    """
    table: pa.Table | None = None
    if s.merged:
        table = read_segment(store, s.path, s.count, merged=True)
        offsets = table.column(OFFSET_COLUMN)
        first, end = s.base_offset + s.row_start, s.base_offset + s.row_stop
        keep = pc.and_(pc.greater_equal(offsets, first), pc.less(offsets, end))
        return table.filter(keep)
    if fs is not None and (fs[2] or s.size > SMALL_SEGMENT_BYTES):
        filesystem, base, _ = fs
        try:
            with filesystem.open_input_file(f"{base}/{s.path}" if base else s.path) as f:
                table = pq.ParquetFile(f).read()
        except (OSError, pa.ArrowInvalid):
            table = None  # fall back to the store, which raises the typed errors
    if table is None:
        table = read_segment(store, s.path, s.count)
    else:
        table = check_segment(table, s.path, s.count)
    if s.row_start or s.row_stop != s.count:
        table = table.slice(s.row_start, s.rows)
    return table


def to_output(
    table: pa.Table, s: SegmentSlice, topic: str, include_headers: bool = True
) -> pa.Table:
    """Segment rows -> the output schema: add topic, partition and offsets, fix types."""
    n = table.num_rows
    first = s.base_offset + s.row_start
    if s.merged:
        offsets = table.column(OFFSET_COLUMN).combine_chunks()
    else:
        offsets = pa.array(np.arange(first, first + n, dtype=np.int64))
    columns = [
        table.column("key"),
        table.column("value"),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(s.partition, pa.int32()), n),
        offsets,
        table.column("timestamp").cast(ARROW_TIMESTAMP),
    ]
    if not include_headers:
        return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA_NO_HEADERS)
    headers = table.column("headers").combine_chunks()
    if headers.null_count:
        # Output headers are non-null (an empty list for "no headers").
        headers = pc.if_else(pc.is_null(headers), pa.scalar([], headers.type), headers)
    return pa.Table.from_arrays([*columns, headers.cast(ARROW_HEADERS)], schema=ARROW_SCHEMA)


def prefetch(items: Iterable[T], fn: Callable[[T], R], window: int) -> Iterator[R]:
    """``map(fn, items)`` in order, with up to ``window`` calls running ahead in threads."""
    if window <= 1:
        yield from map(fn, items)
        return
    it = iter(items)
    with ThreadPoolExecutor(window, thread_name_prefix="txntable-scan") as pool:
        pending: deque[Future[R]] = deque()
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(fn, nxt))
            yield result


def read_slices(
    url: str,
    storage_options: dict[str, str],
    topic: str,
    slices: list[SegmentSlice],
    include_headers: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``slices``, in order, in the exact output schema."""
    if not slices:
        return
    store = cached_store(url, storage_options)
    fs = _arrow_fs(store)
    window = min(PREFETCH, len(slices))
    buffered: list[pa.Table] = []
    rows = 0
    for s, table in zip(
        slices, prefetch(slices, lambda s: read_slice_table(store, fs, s), window), strict=True
    ):
        buffered.append(to_output(table, s, topic, include_headers))
        rows += table.num_rows
        if rows >= TARGET_BATCH_ROWS:
            yield from _flush(buffered)
            buffered, rows = [], 0
    if buffered:
        yield from _flush(buffered)


def _flush(tables: list[pa.Table]) -> Iterator[pa.RecordBatch]:
    merged = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    yield from merged.combine_chunks().to_batches(max_chunksize=TARGET_BATCH_ROWS * 4)
