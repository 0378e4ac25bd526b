"""Segment reading: planned slices in, Arrow out. The I/O half of every reader.

:mod:`txntable.read.planning` decides which rows of which segments a reader returns; this module
fetches them and finds a slice's rows in its segment (by row index in a batch's segment, by
binary search on the offset column in a merged one). Object-store reads are latency bound
(tens of milliseconds per GET, whatever the size), so segments are fetched by a bounded
thread pool, several ahead of the one being consumed: :func:`prefetch` for scans
(``Table.scan``, the Spark executors) and :class:`SegmentCache` for the consumer, which
keeps a byte budget (``fetch_max_bytes``) of segments in flight or decoded ahead of its
positions.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from txntable import config
from txntable.errors import CorruptLogError, MissingSegmentError, ObjectNotFoundError
from txntable.protocol.records import (
    MERGED_SEGMENT_SCHEMA,
    OFFSET_COLUMN,
    READ_HEADERS,
    READ_SCHEMA,
    READ_SCHEMA_NO_HEADERS,
    READ_TIMESTAMP,
    check_segment,
    decode_segment,
    merged_offsets,
)
from txntable.protocol.schema import TypedLayout
from txntable.protocol.typed import decode_typed
from txntable.read.planning import SegmentSlice
from txntable.storage.base import Store, StoreWrapper, validate_key
from txntable.util import within_timeout

#: Above this size a remote segment is read with ranged requests through pyarrow's file
#: system (footer, then column chunks); below it one GET of the whole object is cheaper.
SMALL_SEGMENT_BYTES = 8 * 1024 * 1024

T = TypeVar("T")
R = TypeVar("R")


class SegmentReader:
    """Reads segments of one store, checked against their batches.

    Local segments are opened through pyarrow's file system (no copy through Python bytes),
    large remote ones with ranged reads; everything else, and every segment of a wrapped
    store (wrappers count requests or inject latency and faults, and must see every read),
    goes through :meth:`Store.get_data_file`, whose errors are the typed ones.
    """

    def __init__(
        self,
        store: Store,
        layout: TypedLayout | None = None,
        columns: Sequence[str] | None = None,
        request_timeout_ms: int = config.REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> None:
        from txntable.storage.local import LocalStore

        self.store = store
        #: How long a segment read that fails transiently is retried.
        self.request_timeout_ms = request_timeout_ms
        #: A typed table's layout (``None``: Kafka's record), and the columns read of it.
        self.layout = layout
        self.columns = columns
        self._local = isinstance(store, LocalStore)
        self._fs: tuple[pafs.FileSystem, str] | None = None
        self._fs_lock = threading.Lock()
        self._fs_resolved = False

    def _filesystem(self) -> tuple[pafs.FileSystem, str] | None:
        # Resolved on first need: an S3 file system sets up an AWS client.
        with self._fs_lock:
            if not self._fs_resolved:
                from txntable.storage.arrowfs import arrow_filesystem

                found = arrow_filesystem(self.store)
                self._fs = None if found is None else (found[0], found[1].rstrip("/"))
                self._fs_resolved = True
            return self._fs

    def read_segment(self, s: SegmentSlice, layout: TypedLayout | None = None) -> pa.Table:
        """The whole segment of ``s``, checked against its batch or merged segment.

        A merged segment keeps its ``offset`` column, in one chunk, checked to be strictly
        increasing inside the segment's range. A typed table's segment (``layout``, or the
        reader's) is read as :meth:`TypedLayout.conform_segment` makes it: only the columns
        asked for are read from the Parquet file.

        Raises:
            MissingSegmentError: If the segment object is gone.
            CorruptLogError: If it is not Parquet.
            SchemaMismatchError: If it does not match its batch or merged segment.
            KafkaTimeoutError: Storage kept failing for ``request_timeout_ms``.
        """
        return within_timeout(
            lambda: self._read_segment(s, layout or self.layout),
            self.request_timeout_ms,
            f"reading segment {s.path}",
        )

    def _read_segment(self, s: SegmentSlice, layout: TypedLayout | None) -> pa.Table:
        direct = self._local or (
            s.size > SMALL_SEGMENT_BYTES and not isinstance(self.store, StoreWrapper)
        )
        found = self._filesystem() if direct else None
        table: pa.Table | None = None
        if found is not None:
            fs, base = found
            validate_key(s.path)  # as the store would: a log entry must not escape the root
            try:
                with fs.open_input_file(f"{base}/{s.path}" if base else s.path) as f:
                    if layout is not None:
                        table = self._read_typed(f, s, layout)
                    else:
                        table = pq.ParquetFile(f).read()
            except (OSError, pa.ArrowInvalid, CorruptLogError):
                pass  # read again through the store, which raises the typed errors
            else:
                if layout is None:
                    table = check_segment(table, s.path, s.count, s.merged)
        if table is None and layout is not None:
            try:
                data = self.store.get_data_file(s.path)
            except ObjectNotFoundError:
                raise MissingSegmentError(
                    f"segment {s.path} of a committed batch is missing", s.path
                ) from None
            table = self._read_typed(pa.BufferReader(data), s, layout)
        if table is None:
            table = read_segment(self.store, s.path, s.count, s.merged)
        if s.merged:
            offsets = table.column(OFFSET_COLUMN)
            if offsets.num_chunks != 1:  # one chunk: slice_rows reads it without a copy
                table = table.set_column(
                    0, MERGED_SEGMENT_SCHEMA.field(OFFSET_COLUMN), offsets.combine_chunks()
                )
            merged_offsets(table, s.path, s.base_offset, s.segment_end)
        return table

    def _read_typed(self, source: object, s: SegmentSlice, layout: TypedLayout) -> pa.Table:
        """Read the wanted columns of a typed table's segment and conform them to ``layout``.

        Raises:
            CorruptLogError: Not readable Parquet.
            SchemaMismatchError: See :meth:`TypedLayout.conform_segment`.
        """
        try:
            pf = pq.ParquetFile(source)
            names = pf.schema_arrow.names
            table = pf.read(columns=layout.file_columns(names, self.columns, s.merged))
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptLogError(f"segment is not readable Parquet ({e})", s.path) from None
        return layout.conform_segment(table, s.path, s.count, s.merged, self.columns)

    def read_slice(self, s: SegmentSlice) -> pa.Table:
        """The rows of ``s`` (segment columns)."""
        return slice_rows(self.read_segment(s), s)[0]

    def read_output(self, s: SegmentSlice, topic: str, include_headers: bool = True) -> pa.Table:
        """The rows of ``s`` in :data:`~txntable.protocol.records.READ_SCHEMA` (or without
        headers)."""
        rows, offsets = slice_rows(self.read_segment(s), s)
        if self.layout is not None:
            return self.layout.output(rows, offsets, s.partition, self.columns)
        return to_output(rows, offsets, s.partition, topic, include_headers)


def slice_rows(segment: pa.Table, s: SegmentSlice) -> tuple[pa.Table, np.ndarray]:
    """The rows of ``s`` in its decoded segment (segment columns), and their offsets.

    A batch's rows are ``[row_start, row_stop)``, at ``base_offset`` plus the row index. A
    merged segment's are those whose ``offset`` column value lies in ``[first_offset,
    next_offset)`` (a binary search: the column is strictly increasing), at those offsets.
    """
    if not s.merged:
        rows = segment
        if s.row_start or s.row_stop != s.count:
            rows = segment.slice(s.row_start, s.rows)
        return rows, np.arange(s.first_offset, s.next_offset, dtype=np.int64)
    column = segment.column(OFFSET_COLUMN)
    all_offsets = column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()
    lo, hi = (int(i) for i in np.searchsorted(all_offsets, [s.first_offset, s.next_offset]))
    rows = segment.slice(lo, hi - lo).drop_columns([OFFSET_COLUMN])
    return rows, all_offsets[lo:hi]


def to_output(
    rows: pa.Table, offsets: np.ndarray, partition: int, topic: str, include_headers: bool = True
) -> pa.Table:
    """Segment rows of one partition, with their offsets -> :data:`READ_SCHEMA`.

    Adds topic, partition and offset, widens the timestamp to microseconds and turns null
    header lists into empty ones; without ``include_headers``, the result has
    :data:`READ_SCHEMA_NO_HEADERS`.
    """
    n = rows.num_rows
    columns = [
        rows.column("key"),
        rows.column("value"),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        # From the numpy buffer directly: pa.array(ndarray) would import pandas.
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        rows.column("timestamp").cast(READ_TIMESTAMP),
    ]
    if not include_headers:
        return pa.Table.from_arrays(columns, schema=READ_SCHEMA_NO_HEADERS)
    headers = rows.column("headers")
    if headers.null_count:
        headers = pc.if_else(pc.is_null(headers), pa.scalar([], headers.type), headers)
    return pa.Table.from_arrays([*columns, headers.cast(READ_HEADERS)], schema=READ_SCHEMA)


def prefetch(
    items: Iterable[T],
    fn: Callable[[T], R],
    window: int,
    size: Callable[[T], int] | None = None,
    max_bytes: int | None = None,
) -> Iterator[R]:
    """``map(fn, items)`` in order, with calls running ahead in a thread pool.

    At most ``window`` calls run or wait to be consumed at once, and, when ``size`` and
    ``max_bytes`` are given, at most ``max_bytes`` of items (but always at least one): that
    bounds the memory a streaming scan holds. Stopping the iteration early cancels what has
    not started.
    """
    if window <= 1:
        yield from map(fn, items)
        return
    it = iter(items)
    pending: deque[tuple[Future[R], int]] = deque()
    held = 0
    head = next(it, _END)
    with ThreadPoolExecutor(window, thread_name_prefix="txntable-read") as pool:
        try:
            while True:
                while head is not _END and len(pending) < window:
                    item = cast(T, head)
                    cost = size(item) if size is not None else 0
                    if pending and max_bytes is not None and held + cost > max_bytes:
                        break
                    pending.append((pool.submit(fn, item), cost))
                    held += cost
                    head = next(it, _END)
                if not pending:
                    return
                future, cost = pending.popleft()
                held -= cost
                yield future.result()
        finally:
            for future, _ in pending:
                future.cancel()


_END = object()


@dataclass
class _Cached:
    future: Future[pa.Table]
    size: int
    owner: Hashable
    next_offset: int


class SegmentCache:
    """Whole decoded segments by path, fetched ahead in a thread pool within a byte budget.

    The consumer's read-ahead (Kafka's fetcher keeps ``fetch.max.bytes`` of completed
    fetches): :meth:`get` returns a segment, waiting for it if it is being fetched;
    :meth:`request` starts fetching segments the owner will want next, while the bytes held
    (compressed segment sizes, fetched or in flight) stay within ``max_bytes``;
    :meth:`release` drops what an owner has consumed. A fetch that fails is reported by
    :meth:`get` only, so a read-ahead of a segment never needed raises nothing.
    """

    def __init__(
        self,
        reader: SegmentReader,
        max_bytes: int,
        workers: int,
        layout_of: Callable[[Hashable], TypedLayout | None] | None = None,
    ) -> None:
        self.reader = reader
        #: The layout an owner's segments are read with (typed tables); ``None``: the reader's.
        self.layout_of = layout_of
        self.max_bytes = max_bytes
        self.workers = workers
        self._entries: dict[str, _Cached] = {}
        self._bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """Bytes of the segments held (fetched or in flight)."""
        return self._bytes

    def _submit(self, s: SegmentSlice, owner: Hashable) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="txntable-fetch")
        layout = self.layout_of(owner) if self.layout_of is not None else None
        future = self._pool.submit(self.reader.read_segment, s, layout)
        self._entries[s.path] = _Cached(future, s.size, owner, s.segment_end)
        self._bytes += s.size

    def request(
        self, slices: Iterable[SegmentSlice], owner: Hashable, within_budget: bool = True
    ) -> None:
        """Start fetching the segments of ``slices`` not held yet, in order.

        Args:
            slices: Slices whose segments will be wanted, in the order they will be.
            owner: Who wants them (a topic partition): :meth:`release` drops by owner.
            within_budget: Stop at the first segment that would pass ``max_bytes`` (unless
                nothing is held); ``False`` for segments wanted right now.
        """
        with self._lock:
            for s in slices:
                if s.path in self._entries:
                    continue
                if within_budget and self._entries and self._bytes + s.size > self.max_bytes:
                    return
                self._submit(s, owner)

    def holds(self, owner: Hashable) -> bool:
        """Whether any segment of ``owner`` is held (fetched or in flight)."""
        with self._lock:
            return any(e.owner == owner for e in self._entries.values())

    def get(self, s: SegmentSlice, owner: Hashable) -> pa.Table:
        """The whole segment of ``s``, fetched now if it was not requested.

        Raises:
            MissingSegmentError, CorruptLogError, SchemaMismatchError: As
                :meth:`SegmentReader.read_segment`.
        """
        with self._lock:
            entry = self._entries.get(s.path)
            if entry is None:
                self._submit(s, owner)
                entry = self._entries[s.path]
        try:
            return entry.future.result()
        except BaseException:
            self._drop(s.path)  # a later get tries again
            raise

    def _drop(self, path: str) -> None:
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is not None:
                self._bytes -= entry.size
                entry.future.cancel()

    def release(self, owner: Hashable, position: int | None = None) -> None:
        """Drop ``owner``'s segments that end at or before ``position`` (all if ``None``)."""
        with self._lock:
            gone = [
                path
                for path, e in self._entries.items()
                if e.owner == owner and (position is None or e.next_offset <= position)
            ]
        for path in gone:
            self._drop(path)

    def close(self) -> None:
        """Drop everything and stop the threads (fetches under way finish in the background)."""
        with self._lock:
            for entry in self._entries.values():
                entry.future.cancel()
            self._entries.clear()
            self._bytes = 0
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def read_segment(store: Store, path: str, expected_count: int, merged: bool = False) -> pa.Table:
    """Read a committed batch's segment (``merged``: a merged segment, with its offsets).

    Raises:
        MissingSegmentError: If the segment object is gone.
    """
    try:
        data = store.get_data_file(path)
    except ObjectNotFoundError:
        raise MissingSegmentError(f"segment {path} of a committed batch is missing", path) from None
    return decode_segment(data, path, expected_count, merged)


def read_typed(
    store: Store, path: str, count: int, merged: bool, layout: TypedLayout
) -> pa.Table:
    """A typed table's whole segment, conformed to ``layout`` (what maintenance reads).

    Raises:
        MissingSegmentError: The object is gone.
        CorruptLogError: Not readable Parquet.
        SchemaMismatchError: See :meth:`TypedLayout.conform_segment`.
    """
    try:
        data = store.get_data_file(path)
    except ObjectNotFoundError:
        raise MissingSegmentError(f"segment {path} of a committed batch is missing", path) from None
    return decode_typed(data, path, count, merged, layout)
