"""Executor side of a read: planned segment slices in, Arrow record batches out.

Runs inside Spark's Python workers. Reading is the core's (:mod:`txntable.read.reader`, shared
with ``Table.scan`` and the consumer): segments are fetched a few at a time in threads
because object-store reads are latency bound. What is Spark's is here: the store is reopened
from the warehouse URL and the storage options carried by the input partition (and cached
per worker process, since workers are reused across tasks), and small slices are merged
into batches of about :data:`TARGET_BATCH_ROWS` rows because every batch crossing to the
JVM has a fixed cost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa

from txntable.protocol.schema import TypedLayout
from txntable.read.reader import SegmentReader, prefetch
from txntable.storage import Store, open_store

from .planning import SegmentSlice
from .schema import to_spark_batches, typed_arrow_schema, typed_spark_schema

#: Rows per record batch handed to Spark (small segments are merged up to this).
TARGET_BATCH_ROWS = 65_536
#: Segments fetched concurrently per task.
PREFETCH = 8

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


def read_slices(
    url: str,
    storage_options: dict[str, str],
    topic: str,
    slices: list[SegmentSlice],
    include_headers: bool = True,
    layout: TypedLayout | None = None,
    columns: Sequence[str] | None = None,
    arrow_schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``slices``, in order, in the exact output schema (a typed table's:
    ``columns`` of it, only those read from Parquet)."""
    if not slices:
        return
    reader = SegmentReader(cached_store(url, storage_options), layout, columns)
    target = arrow_schema
    if layout is not None and target is None:
        target = typed_arrow_schema(typed_spark_schema(layout, columns))
    window = min(PREFETCH, len(slices))
    buffered: list[pa.Table] = []
    rows = 0
    def read(s: SegmentSlice) -> pa.Table:
        out = reader.read_output(s, topic, include_headers)
        return out if target is None else to_spark_batches(out, target)

    for table in prefetch(slices, read, window):
        buffered.append(table)
        rows += table.num_rows
        if rows >= TARGET_BATCH_ROWS:
            yield from _flush(buffered)
            buffered, rows = [], 0
    if buffered:
        yield from _flush(buffered)


def _flush(tables: list[pa.Table]) -> Iterator[pa.RecordBatch]:
    merged = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    yield from merged.combine_chunks().to_batches(max_chunksize=TARGET_BATCH_ROWS * 4)
