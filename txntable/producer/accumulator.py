"""The producer's record accumulator: columns, not record objects.

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
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txntable.producer.futures import ProduceResult
from txntable.producer.partitioner import StickyPartitioner, partitions_for_keys
from txntable.protocol.records import (
    HEADERS_TYPE,
    SEGMENT_SCHEMA,
    TIMESTAMP_TYPE,
    empty_headers,
)
from txntable.protocol.schema import TypedLayout, fill_required
from txntable.structs import (
    Header,
)

#: Memory a record sent with ``send`` costs beyond its record bytes while it waits as
#: Python objects: two ``bytes`` headers (33 B each), four list slots (8 B each, with the
#: lists' growth slack) and its timestamp's ``int`` (32 B).
PY_RECORD_OVERHEAD = 140
#: Memory per queued row beyond its Arrow buffers: its record size and row number (int64
#: each), and its batch's partition, offset and timestamp slots.
ROW_BOOKKEEPING = 36


class ThreadColumns:
    """One sending thread's records of a :class:`RecordColumns`: plain column lists."""

    __slots__ = ("keys", "values", "timestamps", "partitions", "headers", "record_bytes",
                 "slot")  # fmt: skip

    def __init__(self, slot: int) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.partitions: list[int] = []  # -1: choose by key
        self.headers: dict[int, tuple[Header, ...]] = {}  # sparse: most records have none
        self.record_bytes = 0
        self.slot = slot  # handles number this thread's rows ``slot << 32 | index``


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

    def columns(self) -> tuple[pa.Table, np.ndarray, np.ndarray, list[int]]:
        """The closed records as one Arrow table in the segment schema, their timestamps,
        their explicit partitions (-1: by key) and each thread slot's first row. No per-row
        Python code unless records carry headers."""
        parts = sorted(self.threads.values(), key=lambda t: t.slot)
        if len(parts) == 1:
            (one,) = parts
            keys, values, stamps, explicit = one.keys, one.values, one.timestamps, one.partitions
        else:
            keys = [k for t in parts for k in t.keys]
            values = [v for t in parts for v in t.values]
            stamps = [x for t in parts for x in t.timestamps]
            explicit = [p for t in parts for p in t.partitions]
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
        timestamps = np.array(stamps, dtype=np.int64)
        table = pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "headers": header_column,
                "timestamp": pa.array(timestamps, TIMESTAMP_TYPE),
            },
            schema=SEGMENT_SCHEMA,
        )
        return table, timestamps, np.array(explicit, dtype=np.int32), bases


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
    bounds = pc.min_max(table.column("timestamp").cast(pa.int64()))
    return int(bounds["min"].as_py()), int(bounds["max"].as_py())


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
) -> tuple[pa.Table, np.ndarray, np.ndarray, list[int]]:
    """:meth:`RecordColumns.columns` for records of a typed table (their values are dicts):
    segment rows, timestamps, explicit partitions (-1: by key) and each thread's first row.

    Raises:
        pyarrow.ArrowInvalid: A value ``send`` let through does not convert after all
            (the producer fails the records' futures with a ``SerializationError``).
    """
    parts = sorted(columns.threads.values(), key=lambda t: t.slot)
    values: list[Any] = [v for t in parts for v in t.values]
    stamps = np.array([x for t in parts for x in t.timestamps], dtype=np.int64)
    explicit = np.array([p for t in parts for p in t.partitions], dtype=np.int32)
    bases = list(itertools.accumulate((len(t.keys) for t in parts), initial=0))[:-1]
    return layout.rows_table(values, stamps), stamps, explicit, bases


def segment_rows(segment: ProducerBatch) -> pa.Table:
    """A typed segment's rows; runs sealed before and after a schema change are unified
    (new columns null, widened types upcast), as a reader would read them anyway."""
    tables = [r.table for r in segment.runs]
    if len(tables) == 1 or all(t.schema.equals(tables[0].schema) for t in tables):
        return pa.concat_tables(tables)
    return fill_required(pa.concat_tables(tables, promote_options="permissive"))
