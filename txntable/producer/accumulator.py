"""The producer's record accumulator: columns, not record objects.

:class:`RecordAccumulator` owns the buffers and their memory: the open column lists of every
table, sealing them into per-partition runs, the queue of each partition, ``buffer_memory``
accounting (and blocking for ``max_block_ms`` when it is full), the futures of the buffered
batches, and when a round is ready (``batch_size``, ``linger_ms``, a flush, a waiter for
memory). The sender drains it one round at a time.

``send`` appends a record's fields to per-table column lists (:class:`RecordColumns`).
Sealing turns those lists into one Arrow table, chooses every row's partition at once
(vectorised murmur2 of the keys, the sticky partition for null keys), sorts the rows by
partition and queues each partition's rows as a :class:`QueuedRows`. ``send_batch`` queues runs
of the caller's Arrow data directly. The sender cuts a partition's queued runs into
segments of at most ``max_request_size`` record bytes (:meth:`PartitionQueue.take`).

Sizes come in two kinds: *record bytes* (:func:`txntable.protocol.records.record_sizes`, Kafka's
serialized size, which ``batch_size`` and ``max_request_size`` limit) and *memory bytes*
(what the buffered rows occupy in this process, which ``buffer_memory`` limits).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import get_ident as _get_ident
from time import time as _now
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txntable.errors import (
    BufferExhaustedError,
    InternalError,
    SerializationError,
    TxnTableError,
)
from txntable.producer.futures import FutureRecordMetadata, ProduceResult
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.partitioner import StickyPartitioner, partitions_for_keys
from txntable.protocol.records import (
    HEADERS_TYPE,
    SEGMENT_SCHEMA,
    TIMESTAMP_TYPE,
    empty_headers,
    record_sizes,
)
from txntable.protocol.schema import TypedLayout, fill_required, typed_record_sizes
from txntable.structs import (
    Header,
    TopicPartition,
)

_log = logging.getLogger(__name__)

#: Memory a record sent with ``send`` costs beyond its record bytes while it waits as
#: Python objects: two ``bytes`` headers (33 B each), three list slots (8 B each, with the
#: lists' growth slack) and the ``float`` of its send time (24 B), rounded up to leave room
#: for the sparse entries of the rare record with an explicit partition or timestamp.
PY_RECORD_OVERHEAD = 140
#: Memory per queued row beyond its Arrow buffers: its record size and row number (int64
#: each), and its batch's partition, offset and timestamp slots.
ROW_BOOKKEEPING = 36


class ThreadColumns:
    """One sending thread's records of a :class:`RecordColumns`: plain column lists.

    Only what every record has gets a list entry (key, value, the clock at ``send``);
    explicit partitions, timestamps and headers are sparse, by row, since most records
    have none. ``check_at`` is the record bytes at which ``append`` next leaves its fast
    path: the first record (a new linger deadline), ``batch_size`` (wake the sender), and
    the seal threshold.
    """

    __slots__ = ("keys", "values", "clock", "partitions", "timestamps", "headers",
                 "record_bytes", "check_at", "tag")  # fmt: skip

    def __init__(self, slot: int) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[Any] = []
        #: ``time.time()`` at each ``send`` without a timestamp (0.0 for the others):
        #: converted to milliseconds per batch, not per record.
        self.clock: list[float] = []
        self.partitions: dict[int, int] = {}  # sparse: explicit partitions (else by key)
        self.timestamps: dict[int, int] = {}  # sparse: explicit timestamps (ms)
        self.headers: dict[int, tuple[Header, ...]] = {}  # sparse: most records have none
        self.record_bytes = 0
        self.check_at = 0
        self.tag = slot << 32  # handles number this thread's rows ``slot << 32 | index``

    def stamps(self) -> np.ndarray:
        """Every row's timestamp in milliseconds (int64), as ``int(time.time() * 1000)``
        at its ``send`` would have been, or the explicit one."""
        clock = np.array(self.clock, dtype=np.float64)
        clock *= 1000
        stamps = clock.astype(np.int64)  # truncates, as int() of a positive float does
        if self.timestamps:
            rows = np.fromiter(self.timestamps.keys(), np.int64, len(self.timestamps))
            stamps[rows] = np.fromiter(self.timestamps.values(), np.int64, len(rows))
        return stamps

    def explicit(self) -> np.ndarray:
        """Every row's explicit partition, -1 where it is chosen by key (int32)."""
        out = np.full(len(self.keys), -1, dtype=np.int32)
        if self.partitions:
            rows = np.fromiter(self.partitions.keys(), np.int64, len(self.partitions))
            out[rows] = np.fromiter(self.partitions.values(), np.int32, len(rows))
        return out


class RecordColumns:
    """Records of one table sent with ``send`` and not sealed yet, as column lists.

    ``send`` takes no lock. Each sending thread appends to its own lists (so the columns
    of a row stay aligned), inside an ``inside`` marker; a sealer closes the object and
    waits until ``inside`` is empty before reading the lists. No per-record object is
    created but the caller's handle (a row tuple would cost the garbage collector).
    """

    __slots__ = ("threads", "slots", "inside", "closed", "budget", "created", "result")

    def __init__(self, topic: str, budget: int) -> None:
        self.threads: dict[int, ThreadColumns] = {}
        self.slots = itertools.count()  # atomic: two threads never share a slot
        self.inside: list[None] = []  # one entry per send() appending right now
        self.closed = False
        #: Memory these records may reach before the producer's buffer is checked again.
        self.budget = budget
        self.created = time.monotonic()
        self.result = ProduceResult(topic)

    def for_thread(self, ident: int) -> ThreadColumns:
        """The calling thread's lists (only that thread ever adds its own entry)."""
        columns = self.threads.get(ident)
        if columns is None:
            columns = self.threads[ident] = ThreadColumns(next(self.slots))
        return columns

    def parts(self) -> list[ThreadColumns]:
        """Every thread's lists, in slot order (the rows' order in the batch)."""
        return sorted(self.threads.values(), key=lambda t: t.tag)

    def __len__(self) -> int:
        return sum(len(t.keys) for t in tuple(self.threads.values()))

    @property
    def record_bytes(self) -> int:
        """Record bytes of the records."""
        return sum(t.record_bytes for t in tuple(self.threads.values()))

    @property
    def memory(self) -> int:
        """Buffer memory the records occupy."""
        return sum(
            t.record_bytes + len(t.keys) * PY_RECORD_OVERHEAD
            for t in tuple(self.threads.values())
        )

    def close(self) -> None:
        """Stop further appends and wait for those in progress (before reading the lists)."""
        self.closed = True
        while self.inside:
            time.sleep(0)  # an appender needs the GIL for a few bytecodes

    def columns(self) -> tuple[pa.Table, np.ndarray, np.ndarray | None, list[int]]:
        """The closed records as one Arrow table in the segment schema, their timestamps,
        their explicit partitions (-1: by key; ``None`` if no record has one) and each
        thread slot's first row. No per-row Python code unless records carry headers."""
        parts = self.parts()
        if len(parts) == 1:
            (one,) = parts
            keys, values = one.keys, one.values
        else:
            keys = [k for t in parts for k in t.keys]
            values = [v for t in parts for v in t.values]
        bases = list(itertools.accumulate((len(t.keys) for t in parts), initial=0))[:-1]
        n = len(keys)
        if any(t.headers for t in parts):
            empty: tuple[Header, ...] = ()
            rows = [
                [{"key": k, "value": v} for k, v in t.headers.get(i, empty)]
                for t in parts
                for i in range(len(t.keys))
            ]
            header_column = pa.array(rows, HEADERS_TYPE)
        else:
            header_column = empty_headers(n)
        timestamps = _joined([t.stamps() for t in parts], np.int64)
        # The timestamps' own memory as the column, and the table from arrays in schema
        # order: each is a fraction of its general counterpart's cost, paid at every seal.
        stamps = pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(timestamps)])
        table = pa.Table.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary()), header_column, stamps],
            schema=SEGMENT_SCHEMA,
        )
        return table, timestamps, explicit_partitions(parts), bases


def _joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def explicit_partitions(parts: list[ThreadColumns]) -> np.ndarray | None:
    """The rows' explicit partitions (-1: by key), ``None`` if no row has one."""
    if not any(t.partitions for t in parts):
        return None
    return _joined([t.explicit() for t in parts], np.int32)


@dataclass(eq=False)
class QueuedRows:
    """Consecutive rows of one partition from one batch, waiting to be written.

    Attributes:
        table: The rows, in offset order.
        sizes: Record bytes of each row.
        rows: Each row's number in ``result``.
        result: The batch the rows belong to.
        memory: Buffer memory the rows hold.
    """

    table: pa.Table
    sizes: np.ndarray
    rows: np.ndarray
    result: ProduceResult
    memory: int
    record_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.record_bytes = int(self.sizes.sum())

    def split(self, k: int) -> tuple[QueuedRows, QueuedRows]:
        """The first ``k`` rows and the rest (memory shared in proportion)."""
        n = len(self.rows)
        head_memory = self.memory * k // n
        return (
            QueuedRows(
                self.table.slice(0, k), self.sizes[:k], self.rows[:k], self.result, head_memory
            ),
            QueuedRows(
                self.table.slice(k),
                self.sizes[k:],
                self.rows[k:],
                self.result,
                self.memory - head_memory,
            ),
        )


class PartitionQueue:
    """Runs queued for one partition, oldest first."""

    def __init__(self) -> None:
        self.runs: deque[QueuedRows] = deque()
        self.record_bytes = 0
        self.created = 0.0

    def push(self, run: QueuedRows) -> None:
        """Queue ``run`` behind the others."""
        if not self.runs:
            self.created = time.monotonic()
        self.runs.append(run)
        self.record_bytes += run.record_bytes

    def take(self, limit: int) -> list[QueuedRows]:
        """Dequeue the oldest rows holding at most ``limit`` record bytes (at least one row)."""
        out: list[QueuedRows] = []
        total = 0
        while self.runs:
            run = self.runs[0]
            if total + run.record_bytes <= limit:
                out.append(self.runs.popleft())
                total += run.record_bytes
                continue
            fits = int(np.searchsorted(np.cumsum(run.sizes), limit - total, side="right"))
            if fits == 0 and out:
                break
            head, tail = run.split(max(fits, 1))
            out.append(head)
            total += head.record_bytes
            self.runs[0] = tail
            break
        self.record_bytes -= total
        if self.runs:
            self.created = time.monotonic()
        return out


@dataclass(eq=False)
class ProducerBatch:
    """The runs of one partition that become one segment (one producer batch)."""

    partition: int
    runs: list[QueuedRows]
    settled: bool = False

    @property
    def count(self) -> int:
        """Number of records."""
        return sum(len(r.rows) for r in self.runs)

    @property
    def memory(self) -> int:
        """Buffer memory the segment's rows hold."""
        return sum(r.memory for r in self.runs)

    def table(self) -> pa.Table:
        """The records, in offset order (zero-copy: chunks of the runs' tables)."""
        if len(self.runs) == 1:
            return self.runs[0].table
        return pa.concat_tables([r.table for r in self.runs])

    def results(self) -> set[ProduceResult]:
        """The batches the segment's rows come from."""
        return {r.result for r in self.runs}

    def resolve(self, base_offset: int) -> None:
        """The segment was committed at ``base_offset``: settle its rows."""
        self.settled = True
        at = base_offset
        for run in self.runs:
            run.result.resolve(run.rows, self.partition, at)
            at += len(run.rows)

    def fail(self, error: BaseException) -> None:
        """The segment will never be committed: fail its rows."""
        self.settled = True
        for run in self.runs:
            run.result.fail(len(run.rows), error)


def timestamp_range(table: pa.Table) -> tuple[int, int]:
    """Smallest and largest timestamp of a non-empty segment table, in milliseconds."""
    column = table.column("timestamp")
    if column.null_count:  # not in a segment table; the compute kernels skip nulls
        bounds = pc.min_max(column.cast(pa.int64()))
        return int(bounds["min"].as_py()), int(bounds["max"].as_py())
    # numpy on the values themselves: two compute calls and a cast cost a small segment
    # more than the work.
    chunks = [c.to_numpy(zero_copy_only=True).view(np.int64) for c in column.chunks if len(c)]
    return int(min(c.min() for c in chunks)), int(max(c.max() for c in chunks))


def choose_partitions(
    keys: pa.ChunkedArray | pa.Array,
    explicit: np.ndarray | None,
    sizes: np.ndarray,
    topic: str,
    num_partitions: int,
    sticky: StickyPartitioner,
    run_limit: int,
) -> np.ndarray:
    """Every row's partition: explicit if given (>= 0), else by key, else sticky.

    Rows with neither an explicit partition nor a key go to the table's sticky partition;
    every ``run_limit`` record bytes of them the sticky partition moves on (KIP-480 moves
    it after each batch, and a batch holds at most ``max_request_size`` bytes).
    """
    n = len(sizes)
    out = np.full(n, -1, dtype=np.int32) if explicit is None else explicit.copy()
    by_key = np.flatnonzero(out < 0) if explicit is not None else None
    if by_key is None:
        if keys.null_count < n:
            out = partitions_for_keys(keys, num_partitions)
    elif by_key.size:
        keyed = keys.take(pa.array(by_key)) if by_key.size < n else keys
        out[by_key] = partitions_for_keys(keyed, num_partitions)
    stuck = np.flatnonzero(out < 0)
    if stuck.size:
        ends = greedy_cuts(sizes[stuck], run_limit)
        choices = sticky.partitions(topic, len(ends), num_partitions)
        run_of = np.repeat(np.arange(len(ends)), np.diff(ends, prepend=0))
        out[stuck] = np.asarray(choices, dtype=np.int32)[run_of]
    return out


def greedy_cuts(sizes: np.ndarray, limit: int) -> list[int]:
    """End indices of consecutive groups of rows, each as many rows as fit in ``limit``
    bytes (at least one): the cuts a segment writer makes. Work per group, not per row."""
    cumulative = np.cumsum(sizes)
    ends: list[int] = []
    start, done = 0, 0
    while start < len(sizes):
        end = max(start + 1, int(np.searchsorted(cumulative, done + limit, side="right")))
        ends.append(end)
        done = int(cumulative[end - 1])
        start = end
    return ends


def seal(
    table: pa.Table,
    sizes: np.ndarray,
    partitions: np.ndarray,
    result: ProduceResult,
    first_row: int,
) -> list[tuple[int, QueuedRows]]:
    """Split rows into one run per partition, in their order (one ``take``, no row loop).

    Args:
        table: Rows in the segment schema.
        sizes: Their record bytes.
        partitions: Their partitions.
        result: Their batch.
        first_row: Number of the first row in ``result``.

    Returns:
        ``(partition, run)`` pairs, by partition.
    """
    n = table.num_rows
    result.place(np.arange(first_row, first_row + n), partitions)
    if n == 0:
        return []
    first = int(partitions[0])
    if (partitions == first).all():
        rows = np.arange(first_row, first_row + n, dtype=np.int64)
        return [(first, QueuedRows(table, sizes, rows, result, table.nbytes + n * ROW_BOOKKEEPING))]
    narrow = partitions.astype(np.int16) if partitions.max() < 1 << 15 else partitions
    order = np.argsort(narrow, kind="stable")  # a radix sort for 16-bit partitions
    ordered = table.take(pa.array(order))
    counts = np.bincount(partitions, minlength=int(partitions.max()) + 1)
    total_memory = ordered.nbytes + n * ROW_BOOKKEEPING
    runs: list[tuple[int, QueuedRows]] = []
    at = 0
    for partition in np.flatnonzero(counts):
        k = int(counts[partition])
        rows = order[at : at + k] + first_row
        memory = total_memory * k // n
        run = QueuedRows(ordered.slice(at, k), sizes[order[at : at + k]], rows, result, memory)
        runs.append((int(partition), run))
        at += k
    return runs


def typed_columns(
    columns: RecordColumns, layout: TypedLayout
) -> tuple[pa.Table, np.ndarray, np.ndarray | None, list[int]]:
    """:meth:`RecordColumns.columns` for records of a typed table (their values are dicts):
    segment rows, timestamps, explicit partitions (-1: by key; ``None``: none) and each
    thread's first row.

    Raises:
        pyarrow.ArrowInvalid: A value ``send`` let through does not convert after all
            (the producer fails the records' futures with a ``SerializationError``).
    """
    parts = columns.parts()
    values: list[Any] = [v for t in parts for v in t.values]
    stamps = _joined([t.stamps() for t in parts], np.int64)
    bases = list(itertools.accumulate((len(t.keys) for t in parts), initial=0))[:-1]
    return layout.rows_table(values, stamps), stamps, explicit_partitions(parts), bases


def segment_rows(segment: ProducerBatch) -> pa.Table:
    """A typed segment's rows; runs sealed before and after a schema change are unified
    (new columns null, widened types upcast), as a reader would read them anyway."""
    tables = [r.table for r in segment.runs]
    if len(tables) == 1 or all(t.schema.equals(tables[0].schema) for t in tables):
        return pa.concat_tables(tables)
    return fill_required(pa.concat_tables(tables, promote_options="permissive"))


def return_freed_memory() -> None:
    """Hand memory Arrow freed in this thread back to the OS, once Arrow allocated
    :data:`RELEASE_EVERY_BYTES` since this thread last did.

    pyarrow's default allocator (mimalloc) keeps freed pages in per-thread heaps; with a
    sender, writer threads and callers all encoding and copying, that retention alone was
    several times ``buffer_memory``. Not at every call: each release makes the next
    allocations fault their pages in again (a tenth of a key/value ``send_batch``'s time
    when every batch released).
    """
    pool = pa.default_memory_pool()
    counter = getattr(pool, "total_bytes_allocated", None)
    if counter is None:  # pyarrow < 16 counts no allocations: release every time
        pool.release_unused()
        return
    allocated = counter()
    if allocated - getattr(_last_release, "allocated", 0) >= RELEASE_EVERY_BYTES:
        _last_release.allocated = allocated
        pool.release_unused()


#: Arrow bytes allocated (by any thread) between two releases of a thread's freed memory:
#: bounds what each thread keeps.
RELEASE_EVERY_BYTES = 8 * 1024 * 1024
_last_release = threading.local()


def segment_scratch(room: int) -> pa.Buffer | None:
    """This thread's buffer to encode a segment into, of at least ``room`` bytes, kept from
    one segment to the next (see :func:`~txntable.protocol.records.encode_table`); ``None``
    above :data:`SCRATCH_MAX` bytes, so each thread keeps little."""
    if room > SCRATCH_MAX:
        return None
    scratch: pa.Buffer | None = getattr(_scratch, "buffer", None)
    if scratch is None or scratch.size < room:
        scratch = _scratch.buffer = pa.allocate_buffer(room)
    return scratch


#: The largest scratch buffer a thread keeps for encoding segments (a producer's segments
#: hold at most ``max_request_size`` record bytes: 1 MiB by default).
SCRATCH_MAX = 8 * 1024 * 1024
_scratch = threading.local()


#: One round of the sender: each table's batches, one per partition.
Round = dict[str, list[ProducerBatch]]


class RecordAccumulator:
    """The producer's buffers: open columns, queued runs, the round in flight, and memory.

    Args:
        metadata: Partition counts and layouts of the tables (sealing partitions rows).
        batch_size: Record bytes of a partition (or a table's unsealed records) that make a
            round ready.
        linger_ms: How long the oldest buffered record may wait before a round is ready.
        buffer_memory: Memory the buffered records may occupy.
        max_block_ms: How long an append waits for memory.
        max_request_size: The most record bytes in one batch.
        on_unsent_failure: Told about a batch that failed before any of it was drained
            (sealing failed, or ``send_batch`` queued only part of its rows): a transaction
            can only be aborted then.

    Lock order: ``_seal_lock``, then ``_lock`` or ``_cond`` (never both at once).
    """

    def __init__(
        self,
        metadata: ProducerMetadata,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        max_block_ms: int,
        max_request_size: int,
        on_unsent_failure: Callable[[TxnTableError], None],
    ) -> None:
        self._metadata = metadata
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.max_request_size = max_request_size
        self._on_unsent_failure = on_unsent_failure
        # send() seals a table's column lists once they hold this many record bytes, so
        # most buffered records sit in compact Arrow buffers, not Python objects.
        self._seal_bytes = max(batch_size, min(max_request_size, buffer_memory // 8))
        # send_batch() queues its rows in pieces of this many record bytes, so a call
        # larger than buffer_memory streams instead of being copied whole.
        self._piece_bytes = max(max_request_size, buffer_memory // 4)
        self._partitioner = StickyPartitioner()
        self._lock = threading.Lock()  # adding and removing open records (never per record)
        self._seal_lock = threading.Lock()  # one sealer at a time: keeps partitions in order
        self._cond = threading.Condition()  # queues, memory, rounds in flight, flush
        self._open: dict[str, RecordColumns] = {}
        self._sealing: set[ProduceResult] = set()  # under _lock: taken from _open, not queued
        self._queues: dict[TopicPartition, PartitionQueue] = {}
        self._memory = 0  # under _cond: queued and in-flight rows, encoded segments
        self._memory_waiters = 0  # under _cond: callers blocked on a full buffer
        self._in_flight: list[ProducerBatch] = []  # the round drained and not done yet
        self._flush_requested = False
        #: No more appends; the sender drains what is buffered, then stops.
        self.closed = False

    # --- appending -----------------------------------------------------------------------

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: Any,
        timestamp: int | None,
        partition: int,
        headers: tuple[Header, ...],
        size: int,
        row_memory: int,
    ) -> FutureRecordMetadata:
        """Buffer one checked record (``partition`` -1: chosen when sealed; ``timestamp``
        ``None``: now).

        The per-record path: no lock, one append per column to this thread's lists, and a
        handle; partitioning, Arrow conversion, futures and memory accounting are per batch.

        Raises:
            BufferExhaustedError: The buffer stayed full for ``max_block_ms``.
        """
        ident = _get_ident()
        # The send time is read before a wait for memory, as Kafka's producer does.
        clock = _now() if timestamp is None else 0.0
        while True:
            columns = self._open.get(topic)
            if columns is None or columns.budget < row_memory:
                columns = self._make_room(topic, row_memory)
            # No lock: this thread appends to its own lists, and a sealer closes the
            # object, then waits until ``inside`` is empty (each step is atomic).
            inside = columns.inside
            inside.append(None)
            if columns.closed:  # sealed meanwhile: append to the table's next object
                inside.pop()
                continue
            mine = columns.threads.get(ident) or columns.for_thread(ident)
            index = len(mine.keys)
            mine.keys.append(key)
            mine.values.append(value)
            mine.clock.append(clock)
            if timestamp is not None:
                mine.timestamps[index] = timestamp
            if partition >= 0:
                mine.partitions[index] = partition
            if headers:
                mine.headers[index] = headers
            mine.record_bytes = buffered = mine.record_bytes + size
            columns.budget -= row_memory  # approximate if threads race; renewed when spent
            inside.pop()
            break
        if buffered >= mine.check_at:
            self._passed_check(topic, mine, buffered)
        return FutureRecordMetadata(columns.result, index | mine.tag)

    def _passed_check(self, topic: str, mine: ThreadColumns, buffered: int) -> None:
        """``append`` past ``mine.check_at``: a first record (a new linger deadline) or a
        full batch wakes the sender; at the seal threshold the table's records are sealed."""
        if buffered >= self._seal_bytes:
            self.seal(topic)
        seal_bytes, batch_size = self._seal_bytes, self.batch_size
        mine.check_at = min(batch_size, seal_bytes) if buffered < batch_size else seal_bytes
        with self._cond:
            self._cond.notify_all()

    def append_rows(
        self,
        topic: str,
        table: pa.Table,
        sizes: np.ndarray,
        partition: int | None,
        result: ProduceResult,
    ) -> None:
        """Queue checked rows of one ``send_batch`` call (``result`` started), in pieces of
        at most a quarter of ``buffer_memory``, waiting for memory before each.

        Raises:
            BufferExhaustedError: The buffer stayed full for ``max_block_ms``; the rows not
                queued yet fail with it (the queued ones are still sent).
        """
        n = table.num_rows
        start = 0
        for stop in greedy_cuts(sizes, self._piece_bytes):
            piece = table.slice(start, stop - start)
            copies = 1 if partition is None else 0  # sorting rows by partition copies them
            estimate = piece.nbytes * (1 + copies) + (stop - start) * ROW_BOOKKEEPING
            try:
                self._wait_for_memory(topic, estimate, reserve=True)
                self._queue_rows(
                    topic, piece, sizes[start:stop], partition, result, start, estimate
                )
            except Exception as e:
                error = InternalError.wrap(e)
                result.fail(n - start, error)
                if start:
                    self._on_unsent_failure(error)  # half a batch must not be committed
                if error is e:
                    raise
                raise error from e
            return_freed_memory()
            start = stop

    def _queue_rows(
        self,
        topic: str,
        rows: pa.Table,
        sizes: np.ndarray,
        partition: int | None,
        result: ProduceResult,
        first_row: int,
        reserved: int,
    ) -> None:
        """Partition and queue rows of ``send_batch`` whose memory was reserved."""
        with self._seal_lock:
            self._seal_locked(topic)  # records sent before this call stay ahead of it
            explicit = None if partition is None else np.full(len(sizes), partition, np.int32)
            try:
                partitions = choose_partitions(
                    self._metadata.keys(topic, rows),
                    explicit,
                    sizes,
                    topic,
                    self._metadata.partition_count(topic),
                    self._partitioner,
                    self.max_request_size,
                )
                runs = seal(rows, sizes, partitions, result, first_row)
            except BaseException:
                self.release(reserved)
                raise
            self._enqueue(topic, runs, reserved)

    def _enqueue(self, topic: str, runs: list[tuple[int, QueuedRows]], reserved: int) -> None:
        """Queue sealed runs; their memory replaces ``reserved`` bytes of reservation."""
        with self._cond:
            for partition, run in runs:
                tp = TopicPartition(topic, partition)
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = PartitionQueue()
                queue.push(run)
            self._memory += sum(run.memory for _, run in runs) - reserved
            self._cond.notify_all()

    # --- memory --------------------------------------------------------------------------

    def _open_memory(self) -> int:
        return sum(c.memory for c in tuple(self._open.values()))

    def _free_memory(self) -> int:
        return self.buffer_memory - self._open_memory() - self._memory

    def _make_room(self, topic: str, memory: int) -> RecordColumns:
        """``append``'s slow path: no open records for the table, or their budget is spent.

        Waits for buffer memory and gives the table's open records a new budget (the memory
        free now), so ``append`` compares one number per record instead of summing the
        buffer.
        """
        self._wait_for_memory(topic, memory, reserve=False)
        with self._lock:
            columns = self._open.get(topic)
            if columns is None:
                columns = self._open[topic] = RecordColumns(topic, 0)
            columns.budget = max(self._free_memory(), memory)
            return columns

    def _wait_for_memory(self, topic: str, memory: int, reserve: bool) -> None:
        """Block until ``memory`` more bytes fit in ``buffer_memory`` (and reserve them).

        Raises:
            BufferExhaustedError: They did not fit within ``max_block_ms``.
        """
        deadline = time.monotonic() + self.max_block_ms / 1000
        if topic in self._open and self._free_memory() < memory:
            self.seal(topic)  # Arrow holds the waiting records in less memory
        with self._cond:
            # Something must be buffered to wait for; a reservation larger than the whole
            # buffer goes ahead alone rather than never.
            # While someone waits, the sender sends what is buffered at once, whatever
            # batch_size and linger_ms say (Kafka's accumulator counts an exhausted buffer
            # as ready): else a buffer full of lingering records frees nothing.
            self._memory_waiters += 1
            try:
                while (used := self._open_memory() + self._memory) + memory > (
                    self.buffer_memory
                ) and used > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BufferExhaustedError(
                            f"failed to allocate {memory} bytes within "
                            f"max_block_ms={self.max_block_ms}"
                        )
                    self._cond.notify_all()  # the sender, waiting for a linger deadline
                    self._cond.wait(remaining)
            finally:
                self._memory_waiters -= 1
            if reserve:
                self._memory += memory

    def add_memory(self, memory: int) -> None:
        """Count ``memory`` more bytes as used without waiting (encoded segments in flight,
        whose rows still hold theirs)."""
        with self._cond:
            self._memory += memory

    def release(self, memory: int) -> None:
        """Give back ``memory`` bytes counted by :meth:`add_memory` or a reservation."""
        with self._cond:
            self._memory -= memory
            self._cond.notify_all()

    @property
    def used_memory(self) -> int:
        """Buffer memory in use now (open, queued and in-flight records, encoded segments)."""
        with self._cond:
            return self._open_memory() + self._memory

    # --- sealing -------------------------------------------------------------------------

    def seal(self, topic: str) -> None:
        """Turn ``topic``'s open column lists into queued Arrow runs."""
        with self._seal_lock:
            self._seal_locked(topic)

    def seal_all(self) -> None:
        """:meth:`seal` every table."""
        with self._seal_lock:
            for topic in list(self._open):
                self._seal_locked(topic)

    def _seal_locked(self, topic: str) -> None:
        """:meth:`seal` holding ``_seal_lock``."""
        with self._lock:
            columns = self._open.pop(topic, None)
            if columns is None:
                return
            self._sealing.add(columns.result)  # flush() waits for it meanwhile
        try:
            self._seal_columns(topic, columns)
        finally:
            with self._lock:
                self._sealing.discard(columns.result)

    def _seal_columns(self, topic: str, columns: RecordColumns) -> None:
        columns.close()
        # The rows stay counted (as a reservation) until their Arrow copy replaces them.
        with self._cond:
            self._memory += columns.memory
        n = len(columns)
        result = columns.result
        try:
            layout = self._metadata.layout(topic)
            if layout is None:
                table, timestamps, explicit, bases = columns.columns()
                sizes = record_sizes(table)
            else:
                try:
                    table, timestamps, explicit, bases = typed_columns(columns, layout)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    # A value send() let through that does not convert after all.
                    raise SerializationError(f"a record of table {topic}: {e}") from e
                sizes = typed_record_sizes(table)
            result.bases = bases
            partitions = choose_partitions(
                self._metadata.keys(topic, table),
                explicit,
                sizes,
                topic,
                self._metadata.partition_count(topic),
                self._partitioner,
                self.max_request_size,
            )
            result.start(n, timestamps)
            runs = seal(table, sizes, partitions, result, 0)
        except Exception as e:
            # Sealing runs in whichever thread fills the buffer: the batch's records fail
            # (their futures hold the error) and the producer goes on with the next batch.
            error = InternalError.wrap(e)
            if error is not e:
                _log.error("sealing a batch of %s failed", topic, exc_info=e)
            self._fail_columns(columns, error)
            self._on_unsent_failure(error)
            return
        except BaseException as e:
            self._fail_columns(columns, e)
            raise
        self._enqueue(topic, runs, columns.memory)  # the lists are freed with ``columns``
        return_freed_memory()

    def _fail_columns(self, columns: RecordColumns, error: BaseException) -> None:
        n = len(columns)
        if not columns.result.started:
            columns.result.start(n, np.zeros(n, np.int64))
        columns.result.fail(n, error)
        self.release(columns.memory)

    def batch_written(self, topic: str, num_partitions: int) -> None:
        """A batch of ``topic`` was written: its null-key records stick to another
        partition from now on (KIP-480)."""
        self._partitioner.on_new_batch(topic, num_partitions)

    # --- flushing and aborting -----------------------------------------------------------

    def _pending_results(self) -> set[ProduceResult]:
        with self._lock:
            pending = {c.result for c in self._open.values()} | self._sealing
        with self._cond:
            for queue in self._queues.values():
                pending.update(run.result for run in queue.runs)
            for batch in self._in_flight:
                pending.update(batch.results())
        return pending

    def flush(self, timeout: float | None = None) -> bool:
        """Make what is buffered ready now and wait until every buffered batch is done
        (committed or failed); whether all were within ``timeout`` seconds."""
        pending = self._pending_results()
        if not pending:
            return True
        with self._cond:
            # Only buffered records need the flag (the sender clears it when it drains);
            # set with nothing buffered, it outlived this call and the next record was sent
            # at once, ignoring linger_ms.
            if self._has_buffered():
                self._flush_requested = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in pending:  # an error is the future's; transactional errors kept apart
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not result.wait(left):
                return False
        return True

    def abort_undrained(self, error: BaseException) -> None:
        """Fail every buffered record not drained yet with ``error`` and free its memory
        (the round in flight goes on)."""
        with self._seal_lock:
            with self._lock:
                opened, self._open = self._open, {}
            with self._cond:
                runs = [run for q in self._queues.values() for run in q.runs]
                self._queues = {}
                self._memory -= sum(run.memory for run in runs)
                self._cond.notify_all()
        for columns in opened.values():
            columns.close()
            columns.result.start(len(columns), np.zeros(len(columns), np.int64))
            columns.result.fail(len(columns), error)
        for run in runs:
            run.result.fail(len(run.rows), error)

    def close(self) -> int | None:
        """Refuse further appends (the sender drains what is buffered, then stops).

        Returns:
            The number of records not drained yet, or ``None`` if it was closed already.
        """
        with self._cond:
            if self.closed:
                return None
            unsent = sum(len(c) for c in self._open.values()) + sum(
                len(run.rows) for q in self._queues.values() for run in q.runs
            )
            self.closed = True
            self._cond.notify_all()
            return unsent

    # --- draining ------------------------------------------------------------------------

    def _has_buffered(self) -> bool:
        return bool(self._open or self._sealing) or any(q.runs for q in self._queues.values())

    def _ready(self, now: float) -> tuple[bool, float | None]:
        """Whether a round is ready, else how long until the oldest record's linger ends
        (``None``: nothing buffered)."""
        opened = tuple(self._open.values())
        queues = [q for q in self._queues.values() if q.runs]
        if not opened and not queues:
            return False, None
        if self._flush_requested or self.closed or self._memory_waiters:
            return True, None
        if any(c.record_bytes >= self.batch_size for c in opened) or any(
            q.record_bytes >= self.batch_size for q in queues
        ):
            return True, None
        oldest = min([c.created for c in opened] + [q.created for q in queues])
        due = oldest + self.linger_ms / 1000
        return now >= due, max(due - now, 0.0)

    def await_ready(self) -> bool:
        """Block until a round is ready (True), or until closed with nothing buffered
        (False: the sender stops)."""
        with self._cond:
            while True:
                ready, wait = self._ready(time.monotonic())
                if ready:
                    return True
                if self.closed and not self._has_buffered():
                    return False
                if not self._has_buffered():
                    self._flush_requested = False
                self._cond.wait(wait)

    def drain(self) -> Round:
        """Take one round: one batch per partition with queued rows, each of at most
        ``max_request_size`` record bytes. Call :meth:`round_done` when it is done."""
        with self._cond:
            by_table: Round = {}
            for tp in sorted(self._queues):
                queue = self._queues[tp]
                if queue.runs:
                    batch = ProducerBatch(tp.partition, queue.take(self.max_request_size))
                    by_table.setdefault(tp.topic, []).append(batch)
            self._in_flight = [b for items in by_table.values() for b in items]
            if not self._has_buffered():
                self._flush_requested = False
            return by_table

    def drain_whole(self, allowed: Callable[[], bool]) -> Round | None:
        """Take everything buffered as one round if it is one table's, no partition holds
        more than one batch, no round is in flight and ``allowed()`` (asked while no
        round can start); else ``None`` and nothing is taken.

        One log only: its one version makes data and markers visible at once. Across
        several logs the versions land one after the other, and a transaction whose
        producer dies between them must hold the others' LSO (the normal path's open
        batches do; a short path's data is in no log before its markers).
        """
        self.seal_all()
        with self._cond:
            if self._in_flight or not allowed():
                return None
            queues = sorted((tp, q) for tp, q in self._queues.items() if q.runs)
            if not queues or any(q.record_bytes > self.max_request_size for _, q in queues):
                return None
            if len({tp.topic for tp, _ in queues}) > 1:
                return None
            by_table: Round = {}
            for tp, q in queues:
                batch = ProducerBatch(tp.partition, q.take(self.max_request_size))
                by_table.setdefault(tp.topic, []).append(batch)
            self._in_flight = [b for items in by_table.values() for b in items]
            return by_table

    def round_done(self, batches: list[ProducerBatch]) -> None:
        """The drained ``batches`` are settled: free their memory; the next round may
        start."""
        return_freed_memory()
        with self._cond:
            self._memory -= sum(b.memory for b in batches)
            self._in_flight = []
            self._cond.notify_all()
