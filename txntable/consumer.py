"""The consumer: assign partitions, seek, and poll records below the HW or the LSO.

Under ``read_committed`` a poll returns only offsets below the last stable offset, with
aborted transactions removed by :mod:`txntable.protocol.aborted` (the same module the Spark reader
uses) and markers skipped; the position moves past both, so a read_committed consumer sees
gaps, as with Kafka. ``read_uncommitted`` returns everything below the high watermark.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
import pyarrow as pa

from txntable import config
from txntable.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    TableNotFoundError,
    TxnTableError,
    UnstableOffsetCommitError,
)
from txntable.groups.assignors import check_strategies
from txntable.groups.member import load_group
from txntable.groups.offsets import (
    check_offset_targets,
    check_offsets,
    open_group_table,
)
from txntable.groups.subscription import ConsumerRebalanceListener, Subscription
from txntable.protocol.offsets import committed_offset
from txntable.protocol.records import (
    rows_to_records,
)
from txntable.protocol.schema import TypedLayout, layout_of
from txntable.protocol.sequencing import OffsetCommitOp
from txntable.protocol.snapshot import PartitionState, TableSnapshot
from txntable.protocol.typed import rows_to_dict_records
from txntable.read.planning import (
    FetchPlan,
    SegmentSlice,
    plan_fetch,
    take,
)
from txntable.read.reader import (
    SegmentCache,
    SegmentReader,
    slice_rows,
    to_output,
)
from txntable.read.timestamps import offset_for_time
from txntable.structs import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
    check_topic_partition,
    check_topic_partitions,
)
from txntable.table import Table
from txntable.util import now_ms, within_timeout
from txntable.warehouse import Warehouse, require_warehouse

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Consumer"]

#: What a fetch returns for one partition: segment rows and their offsets.
Fetched = tuple[pa.Table, np.ndarray]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: The group's offset log among the logs a consumer's step read (no table name starts
#: with a NUL).
GROUP_LOG = "\0group"


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
            ``poll`` and on ``close``. Default (``None``): on with a ``group_id``, as Kafka's
            clients (off without one); a consumer whose offsets a transaction commits needs
            ``False``.
        group_generation: Generation carried by offset commits; a commit older than one
            already in the group log is refused (a fenced member).
        unstable_offset_timeout_ms: How long ``committed`` and the initial position wait for
            a pending transactional offset commit to resolve before raising
            ``UnstableOffsetCommitError`` (0: raise at once).
        fetch_max_bytes: Segment bytes (as stored) fetched in the background ahead of the
            positions, so object-store latency overlaps the caller's work (Kafka's
            ``fetch.max.bytes``; a segment larger than this is still fetched, alone).
        consumer_timeout_ms: Iterating the consumer (``for record in consumer``) stops
            after this long without a record (kafka-python's); ``None``: never.
        request_timeout_ms: How long a storage request that fails transiently (reading
            the log, a segment, the group's offsets) is retried before the call raises
            ``KafkaTimeoutError`` (Kafka's ``request.timeout.ms``); ``poll`` may block this
            long beyond its own timeout while storage fails.

    Raises:
        InvalidConfigurationError: An argument has the wrong type or is out of range (see
            :data:`txntable.config.CONSUMER_ARGUMENTS`), ``enable_auto_commit`` is set
            without a ``group_id``, or ``heartbeat_interval_ms`` is not below
            ``session_timeout_ms``; the message names the argument.
    """

    def __init__(
        self,
        warehouse: Warehouse,
        isolation_level: str = READ_UNCOMMITTED,
        auto_offset_reset: str = "latest",
        max_poll_records: int = config.MAX_POLL_RECORDS_DEFAULT,
        fetch_backoff_ms: int = config.FETCH_BACKOFF_MS_DEFAULT,
        group_id: str | None = None,
        enable_auto_commit: bool | None = None,
        auto_commit_interval_ms: int = config.AUTO_COMMIT_INTERVAL_MS_DEFAULT,
        group_generation: int = -1,
        unstable_offset_timeout_ms: int = 0,
        fetch_max_bytes: int = config.FETCH_MAX_BYTES_DEFAULT,
        client_id: str = "txntable-consumer",
        group_instance_id: str | None = None,
        session_timeout_ms: int = config.SESSION_TIMEOUT_MS_DEFAULT,
        heartbeat_interval_ms: int = config.HEARTBEAT_INTERVAL_MS_DEFAULT,
        max_poll_interval_ms: int = config.MAX_POLL_INTERVAL_MS_DEFAULT,
        partition_assignment_strategy: str | Sequence[str] = (
            config.PARTITION_ASSIGNMENT_STRATEGY_DEFAULT
        ),
        metadata_max_age_ms: int = config.METADATA_MAX_AGE_MS_DEFAULT,
        consumer_timeout_ms: int | None = None,
        request_timeout_ms: int = config.REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> None:
        require_warehouse(warehouse)
        config.validate_arguments(config.CONSUMER_ARGUMENTS, locals())
        if enable_auto_commit and group_id is None:
            # Kafka's ConfigException: auto-commit has nowhere to commit to without a group.
            raise InvalidConfigurationError("enable_auto_commit=True needs a group_id")
        if heartbeat_interval_ms >= session_timeout_ms:
            # Kafka's rule: a session would expire between two heartbeats.
            raise InvalidConfigurationError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be lower than "
                f"session_timeout_ms ({session_timeout_ms})"
            )
        if enable_auto_commit is None:  # Kafka's default, turned off without a group
            enable_auto_commit = group_id is not None
        self.warehouse = warehouse
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.fetch_backoff_ms = fetch_backoff_ms
        self._tables: dict[str, Table] = {}
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self.fetch_max_bytes = fetch_max_bytes
        self.request_timeout_ms = request_timeout_ms
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
        self.client_id = client_id
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.partition_assignment_strategy = check_strategies(partition_assignment_strategy)
        self.metadata_max_age_ms = metadata_max_age_ms
        self._subscription: Subscription | None = None
        self._paused: set[TopicPartition] = set()
        #: Newly assigned partitions whose committed offset is still unstable (KIP-447).
        self._awaiting: set[TopicPartition] = set()
        #: The logs read during the current step (one pass of poll's loop, one offsets
        #: call): a step reads each table's log, and the group's, once however many of its
        #: partitions it looks at (Kafka's ListOffsets and OffsetFetch are one request per
        #: broker, not one per partition). Per thread (a ``commit_async`` thread, or an
        #: application's, is not in the caller's step); unset outside a step.
        self._steps = threading.local()
        self._next_stuck_check = 0.0
        self.consumer_timeout_ms = consumer_timeout_ms
        #: Records polled for iteration and not yielded yet, and per partition how many
        #: and the position after them (``for record in consumer``).
        self._iterated: deque[ConsumerRecord] = deque()
        self._iterated_left: dict[TopicPartition, int] = {}
        self._iterated_end: dict[TopicPartition, int] = {}

    # --- assignment and positions ----------------------------------------------------------

    def _io(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying transient storage errors for ``request_timeout_ms``.

        Raises:
            KafkaTimeoutError: Storage kept failing that long.
        """
        return within_timeout(fn, self.request_timeout_ms, what)

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:

            def load() -> Table:
                loaded = self.warehouse.table(name)
                loaded.snapshot(refresh=False)
                return loaded

            table = self._tables[name] = self._io(f"loading table {name}", load)
        return table

    def _partition_count(self, name: str) -> int | None:
        """The table's partition count, ``None`` if there is no such table."""
        try:
            return self._table(name).num_partitions
        except TableNotFoundError:
            return None

    def _partition(self, tp: TopicPartition, refresh: bool = False) -> PartitionState:
        table = self._table(tp.topic)
        if refresh:
            self._refresh(table)
        return table.snapshot(refresh=False).partition(tp.partition)

    def _refresh(self, table: Table) -> None:
        # Read the new versions, then complete what a dead producer left prepared (at most
        # one coordinator read per stuck transactional id per grace period).
        fresh = self._fresh()
        if fresh is not None and table.name in fresh:
            return
        self._io(f"reading table {table.name}", table.snapshot)
        table.finish_stuck_transactions()
        if fresh is not None:
            fresh.add(table.name)

    def _group_snapshot(self, table: Table) -> TableSnapshot:
        """The group's offset log, read unless this thread's step has read it already."""
        fresh = self._fresh()
        if fresh is None or GROUP_LOG not in fresh:
            self._io(f"reading group {self.group_id}", table.snapshot)
            if fresh is not None:
                fresh.add(GROUP_LOG)
        return table.snapshot(refresh=False)

    def _reread_group(self) -> None:
        """The group's log may have changed: the step's next look reads it again."""
        fresh = self._fresh()
        if fresh is not None:
            fresh.discard(GROUP_LOG)

    def _fresh(self) -> set[str] | None:
        """The logs this thread's current step has read (``None`` outside a step)."""
        fresh: set[str] | None = getattr(self._steps, "fresh", None)
        return fresh

    @contextmanager
    def _step(self) -> Iterator[None]:
        """Within it each log is read at most once (see ``_steps``); a step inside a step
        is part of it."""
        outer = self._fresh() is None
        if outer:
            self._steps.fresh = set()
        try:
            yield
        finally:
            if outer:
                self._steps.fresh = None

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces the previous assignment).

        Raises:
            IllegalStateError: The consumer is subscribed (Kafka's rule: one or the other).
        """
        self._check_open()
        if self._subscription is not None:
            raise IllegalStateError("assign() after subscribe(): call unsubscribe() first")
        self._drop_iterated()
        tps = list(dict.fromkeys(check_topic_partitions(partitions)))
        for tp in tps:
            self._partition(tp)  # raises for unknown tables/partitions
        for tp in self._assignment:
            if tp not in tps:
                self._forget_read_ahead(tp)
        self._assignment = tps
        self._positions = {tp: pos for tp, pos in self._positions.items() if tp in tps}
        self._awaiting &= set(tps)

    def assignment(self) -> set[TopicPartition]:
        """The assigned partitions (of the group, when subscribed)."""
        return set(self._assignment)

    # --- subscription (group membership) --------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | None = None,
        pattern: str | re.Pattern[str] | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Join the group and consume the partitions it assigns to this consumer.

        The group is joined at the next :meth:`poll`; partitions are assigned and revoked
        at polls, with ``listener``'s callbacks (``spec/PROTOCOL.md#member-procedure``).

        Args:
            topics: Tables to read, or ``None`` with ``pattern``.
            pattern: A regular expression matched (fully) against the warehouse's tables,
                again every ``metadata_max_age_ms``.
            listener: Rebalance callbacks.

        Raises:
            IllegalStateError: No ``group_id``, or partitions were ``assign``ed.
            InvalidArgumentTypeError: Neither or both of ``topics`` and ``pattern``.
        """
        self._check_open()
        if self.group_id is None:
            raise IllegalStateError("subscribe() needs a group_id")
        if self._subscription is None and self._assignment:
            raise IllegalStateError("subscribe() after assign(): call unsubscribe() first")
        if (topics is None) == (pattern is None):
            raise InvalidArgumentTypeError("subscribe() takes topics or a pattern, not both")
        names: frozenset[str] | None = None
        regex: re.Pattern[str] | None = None
        if topics is not None:
            if isinstance(topics, str):
                topics = [topics]
            names = frozenset(topics)
            if not names or not all(isinstance(t, str) for t in names):
                raise InvalidArgumentTypeError("topics must be a non-empty list of table names")
        else:
            regex = re.compile(pattern) if isinstance(pattern, str) else pattern
            if not isinstance(regex, re.Pattern):
                raise InvalidArgumentTypeError("pattern must be a str or a compiled regex")
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            raise InvalidArgumentTypeError("listener must be a ConsumerRebalanceListener")
        previous = self._subscription
        sub = Subscription(self, names, regex, listener or ConsumerRebalanceListener())
        if previous is not None:
            # Same member, new subscription: it re-joins at the next poll.
            sub.member_id, sub.generation, sub.owned = (
                previous.member_id,
                previous.generation,
                previous.owned,
            )
            previous.stop_heartbeat()
            if sub.member_id is not None:
                sub.join_again()
                sub._start_heartbeat()
        self._subscription = sub

    def subscription(self) -> set[str]:
        """The subscribed tables (a pattern's current matches)."""
        sub = self._subscription
        if sub is None:
            return set()
        return set(sub.topics if sub.topics is not None else sub.subscribed)

    def unsubscribe(self) -> None:
        """Leave the group (revoking every partition, committing if auto-commit is on)."""
        sub = self._subscription
        if sub is not None:
            sub.leave(self._auto_commit_all if self.enable_auto_commit else None)
        self._subscription = None
        self._assignment = []
        self._positions = {}
        self._paused.clear()
        self._awaiting.clear()

    def _auto_commit_all(self) -> None:
        self.commit()

    def partition_count(self, table: str) -> int:
        """Partitions of ``table`` now (what the group's assignor divides)."""
        return self._table(table).snapshot().num_partitions

    def assign_from_group(
        self, partitions: set[TopicPartition], gained: set[TopicPartition]
    ) -> None:
        """Install the group's assignment; ``gained`` start again from the committed offset."""
        for tp in self._assignment:
            if tp not in partitions or tp in gained:
                self._forget_read_ahead(tp)
        self._assignment = sorted(partitions)
        self._positions = {
            tp: pos for tp, pos in self._positions.items() if tp in partitions and tp not in gained
        }
        self._paused &= partitions
        self._awaiting = (self._awaiting & partitions) | gained

    def positions_as_offsets(
        self, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions of ``tps`` that have one, as offsets to commit (for the group)."""
        return {tp: OffsetAndMetadata(self._positions[tp]) for tp in tps if tp in self._positions}

    def _resolve_awaiting(self) -> None:
        """Give partitions waiting for a stable committed offset (newly assigned by the
        group, or assigned partitions whose offset was unstable) their starting position."""
        for tp in sorted(self._awaiting):
            try:
                self._reset(tp)
            except UnstableOffsetCommitError:
                self._finish_pending_offset_transactions()
                continue
            self._awaiting.discard(tp)

    def _finish_pending_offset_transactions(self) -> None:
        """Abort the expired transactions whose offset commits keep a partition unstable.

        The previous owner of a partition may have died inside a transaction that committed
        offsets; as the group log's next writer, the new owner aborts it once it timed out
        (rate-limited: one sweep per second while waiting).
        """
        if time.monotonic() < self._next_stuck_check:
            return
        self._next_stuck_check = time.monotonic() + 1.0
        if not self.warehouse.finish_stuck_transactions:
            return  # read-only: wait for the producer, recover() or a writer
        from txntable.layout import group_root
        from txntable.txn.coordinator import TransactionCoordinator
        from txntable.txn.recovery import finish_if_stuck

        table = self._group_table(create=False)
        if table is None:
            return
        pending = set(self._group_snapshot(table).pending_offsets)
        if not pending:
            return
        self._reread_group()  # the sweep below may change it
        coordinator = TransactionCoordinator(self.warehouse.store)
        name = group_root(self.group_id or "")
        for tid in coordinator.transactional_ids():
            loaded = coordinator.load(tid)
            if loaded is None or name not in loaded[0].partitions:
                continue
            if loaded[0].producer_id in pending:
                try:
                    finish_if_stuck(coordinator, tid, now_ms(), None)
                except TxnTableError as e:
                    # Another client finished it first, or storage trouble: next sweep.
                    _log.info("could not finish the transaction of %s: %s", tid, e)

    # --- pause / resume --------------------------------------------------------------------

    def pause(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Stop returning records of these assigned partitions (positions are kept).

        Takes a list of partitions, or kafka-python's form ``pause(tp1, tp2)``.
        """
        tps = _partitions_argument(partitions) or []
        self._drop_iterated()
        self._paused.update(self._targets(tps))

    def resume(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Return records of these paused partitions again (a list, or ``resume(tp1, tp2)``)."""
        for tp in _partitions_argument(partitions) or []:
            self._paused.discard(tp)

    def paused(self) -> set[TopicPartition]:
        """The paused partitions."""
        return set(self._paused)

    def _fetchable(self) -> list[TopicPartition]:
        if not self._paused and not self._awaiting:
            return self._assignment
        skip = self._paused | self._awaiting
        return [tp for tp in self._assignment if tp not in skip]

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
        self._set_position(partition, offset)

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        # A seek wins over the committed offset a newly assigned partition would start from
        # (as Kafka: a seek in on_partitions_assigned is where it starts).
        self._drop_iterated()
        self._awaiting.discard(tp)
        self._positions[tp] = offset

    def seek_to_beginning(
        self, *partitions: TopicPartition | Iterable[TopicPartition] | None
    ) -> None:
        """Seek to the log start offset of each partition (all assigned if none given).

        Takes a list of partitions, or kafka-python's form ``seek_to_beginning(tp1, tp2)``.
        """
        with self._step():
            for tp in self._targets(_partitions_argument(partitions)):
                self._set_position(tp, self._partition(tp, refresh=True).log_start_offset)

    def seek_to_end(self, *partitions: TopicPartition | Iterable[TopicPartition] | None) -> None:
        """Seek to the end offset (LSO under read_committed, else the high watermark) of each
        partition (all assigned if none given; a list, or ``seek_to_end(tp1, tp2)``)."""
        with self._step():
            for tp in self._targets(_partitions_argument(partitions)):
                self._set_position(tp, self._end(self._partition(tp, refresh=True)))

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
        with self._step():
            return {tp: self._end(self._partition(tp, refresh=True)) for tp in tps}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose record timestamp is ``>= timestamps[tp]``.

        Kafka's ``offsetsForTimes``: records visible at this consumer's isolation level
        count (read_committed: below the LSO, aborted ones skipped); ``None`` where no
        record is that recent. Batches are skipped by their timestamp bounds in the log;
        at most one segment per partition is read (see :mod:`txntable.read.timestamps`).

        Raises:
            InvalidArgumentTypeError: Not a mapping of ``TopicPartition`` to an int.
            InvalidOffsetError: A negative timestamp.
        """
        if not isinstance(timestamps, Mapping):
            raise InvalidArgumentTypeError("timestamps must be a dict of TopicPartition to int")
        for tp, ts in timestamps.items():
            check_topic_partition(tp)
            if not config.is_int(ts):
                raise InvalidArgumentTypeError(f"timestamp for {tp} must be an int, not {ts!r:.40}")
            if ts < 0:
                raise InvalidOffsetError(f"timestamp for {tp} must be >= 0, got {ts}")
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        with self._step():
            for tp, ts in timestamps.items():
                table = self._table(tp.topic)
                self._refresh(table)
                snap = table.snapshot(refresh=False)
                out[tp] = offset_for_time(table, snap, tp.partition, ts, self.isolation_level)
        return out

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offset per partition."""
        tps = check_topic_partitions(partitions)
        with self._step():
            return {tp: self._partition(tp, refresh=True).log_start_offset for tp in tps}

    def highwater(self, partition: TopicPartition) -> int:
        """The last known high watermark of an assigned partition (kafka-python's): from the
        table's snapshot of the last poll or offset lookup, without reading storage.

        Raises:
            InvalidArgumentTypeError: Not a ``TopicPartition``.
            IllegalStateError: The partition is not assigned.
        """
        self._targets([check_topic_partition(partition)])
        return self._partition(partition).high_watermark

    # --- metadata (kafka-python's names) ------------------------------------------------

    def topics(self) -> set[str]:
        """The warehouse's tables (Kafka's topics)."""
        self._check_open()
        return set(self.warehouse.list_tables())

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The partition numbers of ``topic``; empty if there is no such table (as
        kafka-python's)."""
        self._check_open()
        if not isinstance(topic, str):
            raise InvalidArgumentTypeError(f"topic must be a str, not {type(topic).__name__}")
        try:
            return set(range(self.partition_count(topic)))
        except TableNotFoundError:
            return set()

    # --- iteration (kafka-python's ``for record in consumer``) ---------------------------

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        """The next record, polling as needed; ``StopIteration`` once the consumer is closed
        or after ``consumer_timeout_ms`` without a record.

        A record's partition's position moves past it as it is returned (kafka-python's), so
        ``position()`` and commits count only the records the loop has seen.
        """
        if self._closed:
            raise StopIteration
        wait = self.consumer_timeout_ms
        deadline = None if wait is None else time.monotonic() + wait / 1000
        while not self._iterated:
            left = 1000 if deadline is None else int((deadline - time.monotonic()) * 1000)
            if left <= 0 and deadline is not None:
                raise StopIteration
            for tp, records in self.poll(timeout_ms=max(0, min(left, 1000))).items():
                if records:
                    self._iterated.extend(records)
                    self._iterated_left[tp] = len(records)
                    self._iterated_end[tp] = self._positions[tp]
                    self._positions[tp] = records[0].offset  # not returned yet
        record = self._iterated.popleft()
        tp = TopicPartition(record.topic, record.partition)
        self._iterated_left[tp] -= 1
        if self._iterated_left[tp]:
            self._positions[tp] = record.offset + 1
        else:  # the poll's own position: past trailing markers and aborted batches too
            self._positions[tp] = self._iterated_end.pop(tp)
            del self._iterated_left[tp]
        return record

    def _drop_iterated(self) -> None:
        """Forget records polled for iteration but not returned (their partitions' positions
        already stand at the first of them)."""
        self._iterated.clear()
        self._iterated_left.clear()
        self._iterated_end.clear()

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
        self._drop_iterated()  # their positions stand at the first of them: polled again
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
        offset, timestamp, headers; :data:`~txntable.protocol.records.READ_SCHEMA`; a typed table's
        columns, then partition, offset and timestamp). Positions move
        exactly as :meth:`poll` moves them, past markers and aborted batches included.

        Raises:
            OffsetOutOfRangeError: As :meth:`poll`.
            MissingSegmentError: As :meth:`poll`.
        """
        self._drop_iterated()
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
        if self._subscription is not None:
            self._subscription.poll()
        self._maybe_auto_commit()
        limit = self.max_poll_records if max_records is None else max_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._step():
                if self._awaiting:
                    self._resolve_awaiting()
                for table in {tp.topic for tp in self._fetchable()}:
                    self._refresh(self._table(table))
                out = self._fetch(limit)
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(self.fetch_backoff_ms / 1000, max(deadline - time.monotonic(), 0)))

    def _fetch(self, limit: int) -> dict[TopicPartition, Fetched]:
        # Start each poll one partition further (Kafka rotates fetch order too), so a
        # busy partition cannot starve the others when max_records is reached.
        fetchable = self._fetchable()
        n = len(fetchable)
        start = self._next_start % n if n else 0
        self._next_start = start + 1
        order = fetchable[start:] + fetchable[:start]
        committed = self.isolation_level == READ_COMMITTED
        # Enough read-ahead per partition to keep every fetch thread busy.
        lookahead = max(1, -(-2 * config.READ_WORKERS_DEFAULT // max(n, 1)))
        cache = self._segment_cache()
        plans: list[tuple[TopicPartition, FetchPlan]] = []
        ahead: list[tuple[TopicPartition, list[SegmentSlice]]] = []
        remaining = limit
        for tp in order:
            if remaining > 0:
                try:
                    part, pos = self._fetch_position(tp)
                except UnstableOffsetCommitError:
                    # Kafka's consumer keeps fetching the committed offset while it is
                    # unstable and returns nothing for the partition meanwhile.
                    self._awaiting.add(tp)
                    self._finish_pending_offset_transactions()
                    continue
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
            reader = SegmentReader(
                self.warehouse.store, request_timeout_ms=self.request_timeout_ms
            )
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
            group_id = self.group_id
            self._group = self._io(
                f"opening group {group_id}",
                lambda: open_group_table(self.warehouse.store, group_id, create),
            )
        return self._group

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What ``Producer.send_offsets_to_transaction`` needs to commit for this group.

        When subscribed, the member's generation and id: a transactional commit of a
        member that a newer generation replaced is refused (KIP-447). A newer generation
        in which this member keeps every partition it owns is used at once (one read of
        the group object): another member's rebalance must not fail this member's
        transactions until its next poll or heartbeat notices it.
        """
        if self.group_id is None:
            raise IllegalStateError("this consumer has no group_id")
        sub = self._subscription
        auto = self.enable_auto_commit
        if sub is not None:
            generation = sub.generation
            if sub.member_id is not None:
                generation = sub.newer_generation_owning(set(sub.owned)) or generation
            return ConsumerGroupMetadata(
                self.group_id, generation, sub.member_id or "", auto_commit=auto
            )
        return ConsumerGroupMetadata(self.group_id, self.group_generation, auto_commit=auto)

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
                snap = self._group_snapshot(table)
                return committed_offset(snap, self.group_id or "", partition)
            except UnstableOffsetCommitError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self.fetch_backoff_ms / 1000)
                self._reread_group()  # waiting for it to settle

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None) -> None:
        """Commit ``offsets`` (default: current positions) to the group, synchronously.

        Raises:
            OffsetMetadataTooLargeError: Metadata over the group's limit.
            UnknownTopicOrPartitionError: A table or partition that does not exist; nothing
                is committed.
            IllegalGenerationError: This consumer's generation is older than the group's
                (a ``CommitFailedError``): when subscribed, a newer generation took some of
                the partitions away (one in which it still owns them all is retried).
            CommitFailedError: Not subscribed (``assign()``) while the group has live
                members (Kafka refuses a commit without a generation to a non-empty group).
        """
        self._check_open()
        if offsets is None:
            offsets = {tp: OffsetAndMetadata(pos) for tp, pos in self._positions.items()}
        offsets = check_offsets(offsets)
        if not offsets:
            return
        check_offset_targets(self.group_id or "", offsets, self._partition_count)
        sub = self._subscription
        if sub is None:
            generation = self.group_generation
            if generation < 0:
                generation = self._generation_outside_group()
            self.commit_for_generation(offsets, generation)
            return
        sub.check_fenced()
        if sub.member_id is None or sub.generation < 0:
            raise CommitFailedError(
                f"group {self.group_id}: this consumer is not a member of the group now (its "
                "partitions were lost or it has not joined yet); poll() to join"
            )
        generation = sub.generation
        for _ in range(5):
            try:
                self.commit_for_generation(offsets, generation)
                return
            except IllegalGenerationError:
                newer = sub.newer_generation_owning(set(offsets))
                if newer is None:
                    raise
                generation = newer
        self.commit_for_generation(offsets, generation)

    def _generation_outside_group(self) -> int:
        """The generation a consumer that is not a member (``assign()``) commits with: the
        group object's, if the group has no live member.

        Kafka accepts an offset commit without a generation only while the group is empty.
        Committing with the empty group's generation keeps that true after the check: a
        member that joins meanwhile fences a newer generation in the group log before it
        reads offsets, and the fence refuses this commit (``IllegalGenerationError``).

        Raises:
            CommitFailedError: The group has members whose session has not expired.
        """
        state, _ = load_group(self.warehouse.store, self.group_id or "")
        now = now_ms()
        live = [m for m in state.members.values() if not m.expired(now)]
        if live:
            raise CommitFailedError(
                f"group {self.group_id} has {len(live)} live member(s) in generation "
                f"{state.generation}: a consumer outside the group (assign()) cannot commit "
                "its offsets (Kafka's UNKNOWN_MEMBER_ID); subscribe() to join it, or use "
                "another group_id"
            )
        return state.generation

    def commit_for_generation(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], generation: int
    ) -> None:
        """Commit ``offsets`` as a member of ``generation`` (the group's rebalance calls
        this too, under the generation it has not acknowledged yet)."""
        table = self._group_table()
        assert table is not None
        table.submit(OffsetCommitOp.of(self.group_id or "", offsets, generation))

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
        sub = self._subscription
        if sub is not None:
            sub.leave(self._auto_commit_all if self.enable_auto_commit else None)
            self._subscription = None
        elif self.enable_auto_commit and self._positions:
            self.commit()
        self._closed = True
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _partitions_argument(
    args: tuple[TopicPartition | Iterable[TopicPartition] | None, ...],
) -> list[TopicPartition] | None:
    """The partitions given to ``seek_to_beginning`` and the like: one list of them (this
    client's form), kafka-python's ``f(tp1, tp2)``, or none at all (``None``).

    Raises:
        InvalidArgumentTypeError: Anything else.
    """
    if not args or (len(args) == 1 and args[0] is None):
        return None
    if len(args) == 1 and not isinstance(args[0], TopicPartition):
        return check_topic_partitions(args[0])
    return check_topic_partitions(args)
