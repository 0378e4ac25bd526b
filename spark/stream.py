"""Micro-batch reads: ``spark.readStream.format("txntable")``.

Offsets are JSON objects mapping partition number (as a string) to the next offset to
read, e.g. ``{"0": 12, "1": 40}``. The latest offset of a partition is its last stable
offset under read_committed (its high watermark under read_uncommitted), so a transaction's
records reach a micro-batch only once its COMMIT marker is in the log, and an aborted one
never does. A micro-batch ``(start, end]`` is planned exactly like a batch read of that
range, so a query restarted from its checkpoint re-plans the same slices: no loss, no
duplicates.

Spark keeps this reader in one long-lived worker process per query, so it keeps one
:class:`~txntable.table.Table` handle whose snapshot is refreshed incrementally (only new
log versions are read each trigger). Spark also instantiates the reader elsewhere just to
ship :meth:`read` to executors, so nothing is loaded in ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from txntable import config
from txntable.errors import (
    InvalidConfigurationError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
)
from txntable.protocol.schema import layout_of
from txntable.protocol.snapshot import TableSnapshot
from txntable.table import Table
from txntable.util import now_ms, within_timeout

from .options import EARLIEST, LATEST, ReadOptions
from .planning import (
    DATA_LOSS_HINT,
    OFFSET_OPTIONS,
    OffsetRange,
    limit_offsets,
    limit_segments,
    plan_ranges,
    resolve_offset,
    upper_bound,
)
from .scan import ScanPartition, open_table, read_partition
from .schema import typed_spark_schema
from .timepos import resolve_time_options

if TYPE_CHECKING:
    import pyarrow as pa

Offsets = dict[int, int]


def encode_offsets(offsets: Offsets) -> dict[str, int]:
    """Offsets as Spark stores them (JSON keys are strings)."""
    return {str(p): o for p, o in sorted(offsets.items())}


def decode_offsets(obj: dict) -> Offsets:
    """Parse offsets written by :func:`encode_offsets`.

    Raises:
        InvalidConfigurationError: If ``obj`` is not a partition -> offset mapping.
    """
    try:
        return {int(p): int(o) for p, o in obj.items()}
    except (AttributeError, TypeError, ValueError):
        raise InvalidConfigurationError(f"not a txntable stream offset: {obj!r}") from None


class TxnTableStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader with admission control and AvailableNow.

    ``maxOffsetsPerTrigger``, ``maxFilesPerTrigger`` (segments) and ``minOffsetsPerTrigger``
    with ``maxTriggerDelay`` behave as in Spark's Kafka source.
    """

    def __init__(self, opts: ReadOptions, clock: Callable[[], int] = now_ms) -> None:
        self.opts = opts
        self._table: Table | None = None
        self._target: Offsets | None = None
        #: Milliseconds now (a parameter so tests can drive ``maxTriggerDelay``).
        self._clock = clock
        #: When the ``minOffsetsPerTrigger`` delay last started (ms; 0: never, so the
        #: query's first trigger starts it, as in Spark's Kafka source).
        self._last_trigger_ms = 0

    # --- driver side ---------------------------------------------------------------------

    def _snapshot(self, refresh: bool = True) -> TableSnapshot:
        """The table's snapshot (refreshed), retrying transient storage errors for the
        request timeout (then ``KafkaTimeoutError``)."""
        return within_timeout(
            lambda: self._load_snapshot(refresh),
            config.REQUEST_TIMEOUT_MS_DEFAULT,
            f"reading table {self.opts.location.table}",
        )

    def _load_snapshot(self, refresh: bool) -> TableSnapshot:
        if self._table is None:
            self._table = open_table(self.opts.location, self.opts.finish_stuck_transactions)
        snap = self._table.snapshot(refresh=refresh)
        if refresh and self._table.finish_stuck_transactions():
            snap = self._table.snapshot(refresh=False)
        return snap

    def _available(self, snap: TableSnapshot) -> Offsets:
        return {p.partition: upper_bound(p, self.opts.read_committed) for p in snap.partitions}

    def _start_of_new_partition(self, snap: TableSnapshot, p: int) -> int:
        # A partition added while the query runs starts at earliest, as in Kafka's source.
        return snap.partition(p).log_start_offset

    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingOffsets`` (default ``latest``)."""
        snap = self._snapshot()
        assert self._table is not None
        starting = resolve_time_options(self._table, snap, self.opts).starting
        out = {}
        for part in snap.partitions:
            requested = starting.for_partition(part.partition)
            out[part.partition] = resolve_offset(
                part,
                requested,
                self.opts.read_committed,
                start=True,
                fail_on_data_loss=self.opts.fail_on_data_loss,
                name=OFFSET_OPTIONS[0],
                data_loss_hint=DATA_LOSS_HINT,
            )
        return encode_offsets(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The limit the options set: Spark passes it back to :meth:`latestOffset`.

        Spark's Python API has no composite limit, so this names one of them and
        :meth:`latestOffset` applies every limit the options set unless Spark passes
        ``ReadAllAvailable`` (a trigger that must read everything).
        """
        opts = self.opts
        if opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        if opts.max_files_per_trigger is not None:
            return ReadMaxFiles(opts.max_files_per_trigger)
        if opts.min_offsets_per_trigger is not None:
            return ReadMinRows(opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target offsets: an AvailableNow query stops once it reaches them."""
        self._target = self._available(self._snapshot())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End offsets of the next micro-batch: the LSO (or HW), capped by the read limit.

        Raises:
            SchemaMismatchError: A typed table's schema changed since the query started in
                a way its rows would show (see :meth:`_check_schema`).
        """
        snap = self._snapshot()
        self._check_schema(snap)
        begin = decode_offsets(start)
        available = self._available(snap)
        if self._target is not None:
            available = {p: min(o, self._target.get(p, o)) for p, o in available.items()}
        for p in available:
            begin.setdefault(p, self._start_of_new_partition(snap, p))
            # Never move backwards (e.g. a start inside a transaction that is still open).
            available[p] = max(available[p], begin[p])
        if isinstance(limit, ReadAllAvailable):
            return encode_offsets(available)
        return encode_offsets(self._admit(snap, begin, available, limit))

    def _check_schema(self, snap: TableSnapshot) -> None:
        """Fail at a batch boundary when the schema the query returns is no longer the
        table's: Spark fixes a query's schema when it starts, so an added column would go
        missing and a widened one fail on its first value that does not fit the old type.
        A restart reads with the new schema (Delta's streaming source fails the same way).
        Changes to columns the query does not read are harmless and pass."""
        started = self.opts.layout
        current = layout_of(snap.metadata)
        if started is None or current is None or current.schema.equals(started.schema):
            return
        columns = self.opts.columns
        if typed_spark_schema(current, columns) == typed_spark_schema(started, columns):
            return
        old, new = started.schema, current.schema
        changes = [f"{f.name} added" for f in new if f.name not in old.names]
        changes += [
            f"{f.name} {old.field(f.name).type} -> {f.type}"
            for f in new
            if f.name in old.names and old.field(f.name).type != f.type
        ]
        raise SchemaMismatchError(
            f"the schema of table {self.opts.location.table!r} changed while this stream ran "
            f"({', '.join(changes) or 'nullability'}); a streaming query keeps the schema it "
            "started with: restart the query to read on with the new schema (it resumes from "
            "its checkpoint)"
        )

    def _admit(
        self, snap: TableSnapshot, begin: Offsets, available: Offsets, limit: ReadLimit
    ) -> Offsets:
        """Spark's Kafka-source admission control: min (with its delay), then the maxima."""
        opts = self.opts
        backlog = sum(available[p] - begin[p] for p in available)
        if (
            opts.min_offsets_per_trigger is not None
            and self._target is None  # AvailableNow must not wait for data that never comes
            and self._delay_batch(backlog, opts.min_offsets_per_trigger)
        ):
            return {p: begin[p] for p in available}  # no micro-batch yet
        if backlog == 0:
            return available
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is None:
            max_rows = opts.max_offsets_per_trigger
        if max_rows is not None:
            available = limit_offsets(begin, available, max_rows)
        if opts.max_files_per_trigger is not None:
            available = limit_segments(
                snap, begin, available, opts.max_files_per_trigger, opts.read_committed
            )
        return available

    def _delay_batch(self, backlog: int, min_offsets: int) -> bool:
        """Whether to wait for more offsets: Spark's Kafka source (``delayBatch``) to the
        letter. The delay restarts whenever it has run out or a batch is admitted, also on
        a trigger with nothing to read — so a query that starts with nothing waits for its
        first data as for any later data, instead of admitting it at once."""
        now = self._clock()
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        if backlog < min_offsets:
            return True
        self._last_trigger_ms = now
        return False

    def reportLatestOffset(self) -> dict | None:
        """The offsets available right now, for the query's progress report."""
        if self._table is None:
            return None
        return encode_offsets(self._available(self._snapshot(refresh=False)))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Plan the micro-batch ``[start, end)`` like a batch read of that range."""
        begin, until = decode_offsets(start), decode_offsets(end)

        def beyond(snap: TableSnapshot) -> list[int]:
            # An end may exceed the bound only where the start already did (a start inside
            # an open transaction makes an empty range).
            return [
                p
                for p, o in until.items()
                if p >= snap.num_partitions
                or o
                > max(upper_bound(snap.partition(p), self.opts.read_committed), begin.get(p, 0))
            ]

        snap = self._snapshot(refresh=False)
        if beyond(snap):
            # After a restart the first batch may come from the offset log: catch up first.
            snap = self._snapshot()
            bad = beyond(snap)
            if bad:
                raise OffsetOutOfRangeError(
                    f"stream end offset {until[bad[0]]} of partition {bad[0]} is past what the "
                    "table holds: was the checkpoint written for another table?"
                )
        ranges = []
        for p, end_offset in until.items():
            part = snap.partition(p)
            first = begin.get(p, self._start_of_new_partition(snap, p))
            if first < part.log_start_offset:
                if self.opts.fail_on_data_loss:
                    raise OffsetOutOfRangeError(
                        f"offsets {first}..{part.log_start_offset} of partition {p} were "
                        "deleted before the query read them (set failOnDataLoss=false to skip)"
                    )
                first = part.log_start_offset
            ranges.append(OffsetRange(p, first, max(first, end_offset)))
        groups = plan_ranges(
            snap,
            ranges,
            self.opts.read_committed,
            self.opts.max_bytes_per_partition,
            self.opts.min_partitions,
        )
        return [ScanPartition.of(self.opts, g) for g in groups]

    def commit(self, end: dict) -> None:
        """Nothing to release: the log is immutable and reads hold no resources."""

    def stop(self) -> None:
        """Drop the table handle."""
        if self._table is not None:
            self._table.store.close()
            self._table = None

    # --- executor side -------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the partition's records as Arrow batches."""
        return read_partition(partition)


__all__ = ["EARLIEST", "LATEST", "TxnTableStreamReader", "decode_offsets", "encode_offsets"]
