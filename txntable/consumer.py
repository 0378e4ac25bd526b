"""The consumer: assign partitions, seek, and poll records below the HW or the LSO.

Under ``read_committed`` a poll returns only offsets below the last stable offset, with
aborted transactions removed by :mod:`txntable.aborted` (the same module the Spark reader
uses) and markers skipped; the position moves past both, so a read_committed consumer sees
gaps, as with Kafka. ``read_uncommitted`` returns everything below the high watermark.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from txntable import config
from txntable.errors import (
    IllegalStateError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    UnstableOffsetCommitError,
)
from txntable.groups import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    check_offsets,
    committed_offset,
    open_group_table,
    plan_offset_commit,
)
from txntable.planning import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FetchPlan,
    SegmentSlice,
    plan_fetch,
    take,
)
from txntable.reader import SegmentCache, SegmentReader, slice_rows, to_output
from txntable.records import (
    ConsumerRecord,
    TopicPartition,
    check_topic_partition,
    check_topic_partitions,
    rows_to_records,
)
from txntable.schema import TypedLayout, layout_of
from txntable.snapshot import PartitionState
from txntable.table import Table
from txntable.typed import rows_to_dict_records
from txntable.warehouse import Warehouse, require_warehouse

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Consumer"]

#: What a fetch returns for one partition: segment rows and their offsets.
Fetched = tuple[pa.Table, np.ndarray]


class Consumer:
    """Reads records from assigned table partitions.

    Args:
        warehouse: The warehouse of the tables.
        isolation_level: ``"read_uncommitted"`` (Kafka's default) or ``"read_committed"``.
        auto_offset_reset: Where a partition without a position starts: ``"earliest"``,
            ``"latest"`` (Kafka's default) or ``"none"`` (raise).
        max_poll_records: Default record limit of ``poll``.
        group_id: Consumer group whose committed offsets positions start from and
            ``commit`` writes to (``_groups/<group_id>/_log``).
        enable_auto_commit: Commit positions every ``auto_commit_interval_ms`` during
            ``poll`` and on ``close`` (needs ``group_id``).
        group_generation: Generation carried by offset commits; a commit older than one
            already in the group log is refused (a fenced member).
        unstable_offset_timeout_ms: How long ``committed`` and the initial position wait for
            a pending transactional offset commit to resolve before raising
            ``UnstableOffsetCommitError`` (0: raise at once).
        fetch_max_bytes: Segment bytes (as stored) fetched in the background ahead of the
            positions, so object-store latency overlaps the caller's work (Kafka's
            ``fetch.max.bytes``; a segment larger than this is still fetched, alone).

    Raises:
        InvalidConfigurationError: An argument has the wrong type or is out of range (see
            :data:`txntable.config.CONSUMER_ARGUMENTS`), or ``enable_auto_commit`` is set
            without a ``group_id``; the message names the argument.
    """

    def __init__(
        self,
        warehouse: Warehouse,
        isolation_level: str = READ_UNCOMMITTED,
        auto_offset_reset: str = "latest",
        max_poll_records: int = config.MAX_POLL_RECORDS_DEFAULT,
        fetch_backoff_ms: int = config.FETCH_BACKOFF_MS_DEFAULT,
        group_id: str | None = None,
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: int = config.AUTO_COMMIT_INTERVAL_MS_DEFAULT,
        group_generation: int = -1,
        unstable_offset_timeout_ms: int = 0,
        fetch_max_bytes: int = config.FETCH_MAX_BYTES_DEFAULT,
    ) -> None:
        require_warehouse(warehouse)
        config.validate_arguments(config.CONSUMER_ARGUMENTS, locals())
        if enable_auto_commit and group_id is None:
            # Kafka's ConfigException: auto-commit has nowhere to commit to without a group.
            raise InvalidConfigurationError("enable_auto_commit=True needs a group_id")
        self.warehouse = warehouse
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.fetch_backoff_ms = fetch_backoff_ms
        self._tables: dict[str, Table] = {}
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self.fetch_max_bytes = fetch_max_bytes
        self._cache: SegmentCache | None = None
        self._closed = False
        self._next_start = 0
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.group_generation = group_generation
        self.unstable_offset_timeout_ms = unstable_offset_timeout_ms
        self._group: Table | None = None
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self._async_lock = threading.Lock()

    # --- assignment and positions ----------------------------------------------------------

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self.warehouse.table(name)
        return table

    def _partition(self, tp: TopicPartition, refresh: bool = False) -> PartitionState:
        table = self._table(tp.topic)
        if refresh:
            self._refresh(table)
        return table.snapshot(refresh=False).partition(tp.partition)

    @staticmethod
    def _refresh(table: Table) -> None:
        # Read the new versions, then complete what a dead producer left prepared (at most
        # one coordinator read per stuck transactional id per grace period).
        table.snapshot(refresh=True)
        table.finish_stuck_transactions()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces the previous assignment)."""
        self._check_open()
        tps = list(dict.fromkeys(check_topic_partitions(partitions)))
        for tp in tps:
            self._partition(tp)  # raises for unknown tables/partitions
        for tp in self._assignment:
            if tp not in tps:
                self._forget_read_ahead(tp)
        self._assignment = tps
        self._positions = {tp: pos for tp, pos in self._positions.items() if tp in tps}

    def assignment(self) -> set[TopicPartition]:
        """The assigned partitions."""
        return set(self._assignment)

    def _targets(self, partitions: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        tps = self._assignment if partitions is None else check_topic_partitions(partitions)
        for tp in tps:
            if tp not in self._assignment:
                raise IllegalStateError(f"{tp} is not assigned to this consumer")
        return tps

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Set the next offset ``poll`` returns from for ``partition``."""
        self._check_open()
        check_topic_partition(partition)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidOffsetError(f"offset must be a non-negative integer, got {offset!r}")
        self._targets([partition])
        self._positions[partition] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Seek to the log start offset of each partition (all assigned if none given)."""
        for tp in self._targets(partitions):
            self._positions[tp] = self._partition(tp, refresh=True).log_start_offset

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Seek to the end offset (LSO under read_committed, else the high watermark)."""
        for tp in self._targets(partitions):
            self._positions[tp] = self._end(self._partition(tp, refresh=True))

    def _end(self, part: PartitionState) -> int:
        if self.isolation_level == READ_COMMITTED:
            return part.last_stable_offset
        return part.high_watermark

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` would return for ``partition``."""
        self._check_open()
        self._targets([check_topic_partition(partition)])
        if partition not in self._positions:
            self._reset(partition)
        return self._positions[partition]

    def _reset(self, tp: TopicPartition, use_committed: bool = True) -> None:
        if use_committed and self.group_id is not None:
            committed = self.committed(tp)
            if committed is not None:
                self._positions[tp] = committed.offset
                return
        part = self._partition(tp, refresh=True)
        if self.auto_offset_reset == "earliest":
            self._positions[tp] = part.log_start_offset
        elif self.auto_offset_reset == "latest":
            self._positions[tp] = self._end(part)
        else:
            from txntable.errors import NoOffsetForPartitionError

            raise NoOffsetForPartitionError(f"no position for {tp} and auto_offset_reset=none")

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """End offset per partition: the LSO under read_committed, else the high watermark."""
        tps = check_topic_partitions(partitions)
        return {tp: self._end(self._partition(tp, refresh=True)) for tp in tps}

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offset per partition."""
        tps = check_topic_partitions(partitions)
        return {tp: self._partition(tp, refresh=True).log_start_offset for tp in tps}

    # --- polling -------------------------------------------------------------------------

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Return records from the assigned partitions, waiting up to ``timeout_ms`` for some.

        At most ``max_records`` (default ``max_poll_records``) in all. Each poll starts one
        partition further than the last, so none starves. Segments the next polls will read
        are fetched in the background meanwhile (up to ``fetch_max_bytes``).

        Raises:
            OffsetOutOfRangeError: A position is outside the log and ``auto_offset_reset``
                is ``none``.
            MissingSegmentError: A segment of a committed batch is gone (positions stay).
        """
        out = {}
        for tp, (rows, offsets) in self._poll(timeout_ms, max_records).items():
            layout = self._layout(tp)
            if layout is None:
                out[tp] = rows_to_records(rows, offsets.tolist(), tp.topic, tp.partition)
            else:  # a typed table: value is a dict of the user's columns
                out[tp] = rows_to_dict_records(
                    rows, offsets.tolist(), tp.topic, tp.partition, layout
                )
        return out

    def poll_arrow(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, pa.Table]:
        """:meth:`poll`, with each partition's records as one Arrow table.

        The tables have the columns of ``Table.scan`` (key, value, topic, partition,
        offset, timestamp, headers; :data:`~txntable.records.READ_SCHEMA`; a typed table's
        columns, then partition, offset and timestamp). Positions move
        exactly as :meth:`poll` moves them, past markers and aborted batches included.

        Raises:
            OffsetOutOfRangeError: As :meth:`poll`.
            MissingSegmentError: As :meth:`poll`.
        """
        out = {}
        for tp, (rows, offsets) in self._poll(timeout_ms, max_records).items():
            layout = self._layout(tp)
            if layout is None:
                out[tp] = to_output(rows, offsets, tp.partition, tp.topic)
            else:
                out[tp] = layout.output(rows, offsets, tp.partition)
        return out

    def _layout(self, tp: Hashable) -> TypedLayout | None:
        """The layout of a typed table's partition at the handle's snapshot (``None``:
        Kafka's record)."""
        assert isinstance(tp, TopicPartition)
        return layout_of(self._table(tp.topic).snapshot(refresh=False).metadata)

    def _poll(self, timeout_ms: int, max_records: int | None) -> dict[TopicPartition, Fetched]:
        self._check_open()
        checks = (("timeout_ms", timeout_ms, 0), ("max_records", max_records, 1))
        for name, value, minimum in checks:
            if value is None and name == "max_records":
                continue
            if not config.is_int(value):
                raise InvalidArgumentTypeError(f"{name} must be an int, not {value!r:.40}")
            assert isinstance(value, int)
            if value < minimum:
                raise InvalidConfigurationError(f"{name} must be >= {minimum}, got {value}")
        self._maybe_auto_commit()
        limit = self.max_poll_records if max_records is None else max_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for table in {tp.topic for tp in self._assignment}:
                self._refresh(self._table(table))
            out = self._fetch(limit)
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(self.fetch_backoff_ms / 1000, max(deadline - time.monotonic(), 0)))

    def _fetch(self, limit: int) -> dict[TopicPartition, Fetched]:
        # Start each poll one partition further (Kafka rotates fetch order too), so a
        # busy partition cannot starve the others when max_records is reached.
        n = len(self._assignment)
        start = self._next_start % n if n else 0
        self._next_start = start + 1
        order = self._assignment[start:] + self._assignment[:start]
        committed = self.isolation_level == READ_COMMITTED
        # Enough read-ahead per partition to keep every fetch thread busy.
        lookahead = max(1, -(-2 * config.READ_WORKERS_DEFAULT // max(n, 1)))
        cache = self._segment_cache()
        plans: list[tuple[TopicPartition, FetchPlan]] = []
        ahead: list[tuple[TopicPartition, list[SegmentSlice]]] = []
        remaining = limit
        for tp in order:
            if remaining > 0:
                part, pos = self._fetch_position(tp)
                plan = plan_fetch(part, pos, self._end(part), committed, remaining, lookahead)
                plans.append((tp, plan))
                ahead.append((tp, plan.ahead))
                # At least this many: part of a merged segment holds a bounded number
                # of rows until read, and reading cuts the fetch to the limit exactly.
                remaining -= plan.min_rows
            elif tp in self._positions and not cache.holds(tp):
                # Not read this poll and nothing fetched ahead yet: start its read-ahead
                # (a partition read ahead when it was last read keeps what it has).
                part, pos = self._partition(tp), self._positions[tp]
                if part.log_start_offset <= pos <= part.high_watermark:
                    plan = plan_fetch(part, pos, self._end(part), committed, 0, lookahead)
                    ahead.append((tp, plan.ahead))
        for tp, plan in plans:
            cache.request(plan.slices, tp, within_budget=False)
        # The next poll starts one partition further: its segments are wanted first.
        for tp, slices in ahead[1:] + ahead[:1]:
            cache.request(slices, tp)
        out = {}
        positions = {}
        budget = limit
        for tp, plan in plans:  # every segment is read before any position moves
            fetched, positions[tp] = self._read(tp, plan, budget, cache)
            if fetched is not None:
                out[tp] = fetched
                budget -= len(fetched[1])
        for tp, position in positions.items():
            self._positions[tp] = position
            cache.release(tp, position)
        return out

    def _fetch_position(self, tp: TopicPartition) -> tuple[PartitionState, int]:
        if tp not in self._positions:
            self._reset(tp)
        part = self._partition(tp)
        pos = self._positions[tp]
        if pos < part.log_start_offset or pos > part.high_watermark:
            if self.auto_offset_reset == "none":
                raise OffsetOutOfRangeError(
                    f"{tp}: offset {pos} outside [{part.log_start_offset}, {part.high_watermark}]"
                )
            self._reset(tp, use_committed=False)
            pos = self._positions[tp]
        return part, pos

    def _read(
        self, tp: TopicPartition, plan: FetchPlan, budget: int, cache: SegmentCache
    ) -> tuple[Fetched | None, int]:
        """The rows of ``plan`` up to ``budget`` of them, and the position after them."""
        found: list[Fetched] = []

        def offsets() -> Iterator[np.ndarray]:
            for s in plan.slices:  # read only as far as the budget goes
                found.append(slice_rows(cache.get(s, tp), s))
                yield found[-1][1]

        counts, position = take(plan, offsets(), budget)
        pairs = zip(found, counts, strict=True)
        parts = [(rows.slice(0, n), offs[:n]) for (rows, offs), n in pairs if n]
        if not parts:
            return None, position
        if len(parts) == 1:
            return parts[0], position
        rows = pa.concat_tables([p[0] for p in parts])
        return (rows, np.concatenate([p[1] for p in parts])), position

    def _segment_cache(self) -> SegmentCache:
        if self._cache is None:
            reader = SegmentReader(self.warehouse.store)
            self._cache = SegmentCache(
                reader, self.fetch_max_bytes, config.READ_WORKERS_DEFAULT, self._layout
            )
        return self._cache

    def _forget_read_ahead(self, tp: TopicPartition) -> None:
        if self._cache is not None:
            self._cache.release(tp)

    # --- groups ---------------------------------------------------------------------------

    def _group_table(self, create: bool = True) -> Table | None:
        if self.group_id is None:
            raise IllegalStateError("this consumer has no group_id")
        if self._group is None:
            self._group = open_group_table(self.warehouse.store, self.group_id, create)
        return self._group

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What ``Producer.send_offsets_to_transaction`` needs to commit for this group."""
        if self.group_id is None:
            raise IllegalStateError("this consumer has no group_id")
        return ConsumerGroupMetadata(self.group_id, self.group_generation)

    def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        """The group's committed offset for ``partition``, or ``None``.

        Raises:
            UnstableOffsetCommitError: A transactional offset commit for the partition is
                still pending after ``unstable_offset_timeout_ms`` (KIP-447).
        """
        check_topic_partition(partition)
        table = self._group_table(create=False)
        if table is None:
            return None  # no offset was ever committed for the group
        deadline = time.monotonic() + self.unstable_offset_timeout_ms / 1000
        while True:
            try:
                return committed_offset(table.snapshot(), self.group_id or "", partition)
            except UnstableOffsetCommitError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self.fetch_backoff_ms / 1000)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None) -> None:
        """Commit ``offsets`` (default: current positions) to the group, synchronously.

        Raises:
            OffsetMetadataTooLargeError: Metadata over the group's limit.
            IllegalGenerationError: This consumer's generation is older than the group's.
        """
        self._check_open()
        if offsets is None:
            offsets = {tp: OffsetAndMetadata(pos) for tp, pos in self._positions.items()}
        offsets = check_offsets(offsets)
        if not offsets:
            return
        table = self._group_table()
        assert table is not None
        group, generation = self.group_id or "", self.group_generation
        table.commit(lambda s: plan_offset_commit(s, group, offsets, generation))

    def commit_async(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
        callback: Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]
        | None = None,
    ) -> Future[None]:
        """Commit in the background; ``callback(offsets, error)`` runs when it is done."""
        if offsets is None:
            offsets = {tp: OffsetAndMetadata(pos) for tp, pos in self._positions.items()}
        frozen = check_offsets(offsets)  # a wrong type is the caller's error, raised here
        future: Future[None] = Future()

        def run() -> None:
            error: Exception | None = None
            with self._async_lock:  # async commits are applied in call order
                try:
                    self.commit(frozen)
                except Exception as e:  # noqa: BLE001 - handed to the callback and future
                    error = e
            if callback is not None:
                callback(frozen, error)
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        threading.Thread(target=run, name="txntable-commit-async", daemon=True).start()
        return future

    def _maybe_auto_commit(self) -> None:
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self.commit()
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000

    def close(self) -> None:
        """Release the consumer (committing positions if auto-commit is on)."""
        if self._closed:
            return
        if self.enable_auto_commit and self._positions:
            self.commit()
        self._closed = True
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
