"""A table handle: its log, a cached snapshot, appends and ``describe``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from txntable import config
from txntable.errors import (
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    SchemaMismatchError,
)
from txntable.layout import segment_key
from txntable.log.log import Log
from txntable.protocol.actions import (
    Action,
    AppTxn,
    Batch,
    CommitPlan,
    LogStart,
    Segment,
)
from txntable.protocol.append import (
    AppendResult,
    PendingBatch,
    PendingMarker,
    plan_append,
)
from txntable.protocol.schema import (
    TypedLayout,
    check_evolution,
    layout_of,
    normalize_schema,
    schema_to_json,
)
from txntable.protocol.snapshot import PartitionState, TableSnapshot
from txntable.storage.base import Store
from txntable.util import Progress, now_ms

if TYPE_CHECKING:
    from txntable.log.group_commit import GroupCommit, GroupCommitConfig
    from txntable.maintenance.maintain import (
        CheckpointReport,
        LogCleanupReport,
        MaintenanceReport,
    )
    from txntable.maintenance.merge import RewriteReport
    from txntable.maintenance.retention import ExpiryReport, RetentionReport
    from txntable.maintenance.vacuum import VacuumReport
    from txntable.maintenance.verify import VerifyReport
    from txntable.mirror.publisher import AutoPublisher, MirrorPublishers, PublishReport
    from txntable.protocol.sequencing import Operation
    from txntable.read.scan import Offsets, TableScan
    from txntable.txn.recovery import StuckTransactionFinisher

_log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction holding back a partition's LSO."""

    producer_id: int
    first_offset: int
    #: Transactional id carried by the transaction's first batch (None if it has none).
    transactional_id: str | None = None
    #: Smallest record timestamp of the transaction's first batch on the partition: the
    #: log's own evidence of when it started (record timestamps are the producer's, any value).
    start_timestamp: int = 0
    #: When the transaction began, from its coordinator object (Kafka's
    #: ``transactionStartTimeMs``); ``None`` when the object is gone or has moved on.
    txn_start_timestamp: int | None = None


@dataclass(frozen=True)
class ProducerDescription:
    """A producer's state on one partition (Kafka's DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_first_offset: int | None


@dataclass(frozen=True)
class PartitionDescription:
    """Offsets of one partition, as ``Table.describe`` reports them."""

    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    open_transactions: tuple[OpenTransaction, ...]
    producers: tuple[ProducerDescription, ...] = ()
    #: Segment files the partition's entries reference (batches' and merged ones'), and their
    #: bytes.
    segments: int = 0
    segment_bytes: int = 0


@dataclass(frozen=True)
class TableDescription:
    """What ``Table.describe`` returns."""

    name: str
    table_id: str
    version: int
    partitions: tuple[PartitionDescription, ...]
    #: A typed table's record schema (``None``: Kafka's record) and key columns.
    schema: pa.Schema | None = None
    key_columns: tuple[str, ...] = ()


def checkpoint_interval(configuration: Mapping[str, str]) -> int:
    """The table's ``checkpoint.interval`` (versions between checkpoints; 0 disables them).

    Raises:
        InvalidConfigurationError: If it is not a non-negative integer.
    """
    value = config.table_setting(configuration, config.CHECKPOINT_INTERVAL)
    assert isinstance(value, int)
    return value


def mirror_formats(configuration: Mapping[str, str]) -> tuple[str, ...]:
    """The mirror formats the table's configuration turns on (``mirror.delta``,
    ``mirror.iceberg``); a malformed value written by another client: off, with a warning."""
    out = []
    for fmt, key in (("delta", config.MIRROR_DELTA), ("iceberg", config.MIRROR_ICEBERG)):
        try:
            on = config.table_setting(configuration, key)
        except InvalidConfigurationError as e:
            _log.warning("%s mirror off: %s", fmt, e)
            continue
        if on:
            out.append(fmt)
    return tuple(out)


def mirror_interval(configuration: Mapping[str, str]) -> int | None:
    """Background publish interval of the mirrors, ``None`` when none is on or they publish
    on demand only (a malformed value written by another client: off, with a warning)."""
    try:
        interval = config.table_setting(configuration, config.MIRROR_INTERVAL_MS)
    except InvalidConfigurationError as e:
        _log.warning("mirrors off: %s", e)
        return None
    assert isinstance(interval, int)
    return interval if mirror_formats(configuration) and interval >= 0 else None


def plan_delete_records(
    snap: TableSnapshot, offsets: Mapping[int, int]
) -> CommitPlan[dict[int, int]]:
    """Pure planning of :meth:`Table.delete_records`: ``logStart`` actions and low watermarks."""
    actions: list[Action] = []
    result: dict[int, int] = {}
    for partition, requested in sorted(offsets.items()):
        part = snap.partition(partition)
        offset = part.high_watermark if requested == -1 else requested
        if not isinstance(offset, int) or not 0 <= offset <= part.high_watermark:
            raise OffsetOutOfRangeError(
                f"{snap.metadata.name if snap.metadata else '?'}-{partition}: cannot delete "
                f"records below {requested}: high watermark is {part.high_watermark}"
            )
        if offset > part.log_start_offset:
            actions.append(LogStart(partition, offset))
        result[partition] = max(offset, part.log_start_offset)
    return CommitPlan(actions, result, "DELETE RECORDS")


class Table:
    """One table of a warehouse. Each handle keeps its own snapshot, refreshed incrementally.

    A handle is safe to share between threads; readers that must not see a snapshot change
    under them take their own handle.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        log: Log | None = None,
        finisher: StuckTransactionFinisher | None = None,
        group_commit: GroupCommitConfig | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.log = log or Log(store, name)
        self._finisher = finisher
        self._lock = threading.RLock()
        self._snapshot: TableSnapshot | None = None
        from txntable.log.group_commit import GroupCommit, GroupCommitConfig

        cfg = group_commit or GroupCommitConfig()
        #: Commits of this handle (group commit), or ``None``: each commit races alone.
        self.group_commit: GroupCommit | None = GroupCommit(self, cfg) if cfg.enabled else None
        #: The mirrors: background publishes after commits (``mirror.delta``,
        #: ``mirror.iceberg``), every ``mirror_interval_ms`` at most; ``None`` when off or
        #: only on demand.
        self.mirror_interval_ms: int | None = None
        self.mirror_formats: tuple[str, ...] = ()
        self._publishers: dict[tuple[str, ...], MirrorPublishers] = {}
        self._auto_publisher: AutoPublisher | None = None
        self._mirror_mark: tuple[tuple[int, int, int], ...] = ()

    def snapshot(self, refresh: bool = True) -> TableSnapshot:
        """The handle's snapshot, brought up to date first unless ``refresh`` is false."""
        with self._lock:
            if self._snapshot is not None and self._snapshot.torn:
                # A damaged version failed half-way through (here or in a commit's refresh):
                # never use the partial state; rebuild from storage.
                self._snapshot = None
            if self._snapshot is None:
                self._snapshot = self.log.load()
                self._configure(self._snapshot)
            elif refresh:
                self.log.refresh(self._snapshot)
            return self._snapshot

    def caught_up(self, known: int) -> TableSnapshot:
        """The handle's snapshot brought to version ``known`` (known to exist), then
        refreshed; from a checkpoint when it fell far behind (see :meth:`Log.caught_up`)."""
        with self._lock:
            snap = self.snapshot(refresh=False)
            fresh = self.log.caught_up(snap, known)
            if fresh is not snap:
                self._snapshot = fresh
                self._configure(fresh)
            return fresh

    def close(self) -> None:
        """Stop committing rounds for others (releasing the committer lease, if held).

        The handle stays usable: a later commit starts again as a single writer.
        """
        if self.group_commit is not None:
            self.group_commit.close()

    def _configure(self, snap: TableSnapshot) -> None:
        assert snap.metadata is not None
        try:
            self.log.checkpoint_interval = checkpoint_interval(snap.metadata.configuration)
        except InvalidConfigurationError as e:
            # Written by another client: a reader must still read; use the default.
            _log.warning("table %s: %s; using %d", self.name, e, config.CHECKPOINT_INTERVAL_DEFAULT)
            self.log.checkpoint_interval = config.CHECKPOINT_INTERVAL_DEFAULT
        self.mirror_interval_ms = mirror_interval(snap.metadata.configuration)
        self.mirror_formats = mirror_formats(snap.metadata.configuration)

    def finish_decided_transactions(
        self, now: int | None = None, once_per_ms: int | None = None
    ) -> list[str]:
        """Complete the decided (prepared) transactions naming this table that their
        producers left unfinished past the grace period, including short-path commits,
        which nothing in the table shows. One LIST of the coordinator objects and a GET
        each: maintenance, not a hot path. Nothing with ``finish_stuck_transactions=False``.

        Args:
            now: The clock (ms) the grace period is measured against.
            once_per_ms: Sweep only if no client swept this table within this long (a CAS
                object says when the last one did): for writers that sweep periodically.

        Returns:
            The transactional ids completed.
        """
        if self._finisher is None:
            return []
        if once_per_ms is not None:
            from txntable.txn.recovery import claim_sweep

            clock = now_ms() if now is None else now
            if not claim_sweep(self.store, self.log.root, once_per_ms, clock):
                return []
        finished = self._finisher.finish_decided(self.name, now)
        if finished:
            self.snapshot()
        return finished

    def finish_stuck_transactions(self) -> bool:
        """Complete prepared transactions that dead producers left pinning the LSO.

        What readers call after a refresh (``describe``, the consumer's poll, Spark
        planning): cheap, since each stuck transactional id's coordinator object is read at
        most once per grace period (see :class:`~txntable.txn.recovery.StuckTransactionFinisher`);
        nothing at all when the warehouse was opened with ``finish_stuck_transactions=False``.

        Returns:
            Whether a transaction was completed (the snapshot was then refreshed).
        """
        if self._finisher is None or not self._finisher.check(self.snapshot(refresh=False)):
            return False
        self.snapshot()
        return True

    def snapshot_at(self, version: int) -> TableSnapshot:
        """A new snapshot as of ``version`` (time travel)."""
        return self.log.load(version)

    def scan(
        self,
        isolation_level: str = "read_committed",
        starting_offsets: Offsets = "earliest",
        ending_offsets: Offsets = "latest",
        partitions: Iterable[int] | None = None,
        version: int | None = None,
        max_workers: int = config.SCAN_WORKERS_DEFAULT,
        max_bytes_in_flight: int = config.FETCH_MAX_BYTES_DEFAULT,
        columns: Sequence[str] | None = None,
        request_timeout_ms: int = config.REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> TableScan:
        """A bulk read of the table as Arrow: ``.to_arrow()``, ``.to_batches()``, ``.to_pandas()``.

        Rows have the Spark source's columns (key, value, topic, partition, offset,
        timestamp, headers) — a typed table's: its columns, then partition, offset and
        timestamp —, partition by partition in offset order. The snapshot is read
        and the scan planned now; segments are read by the ``to_*`` calls.

        Args:
            isolation_level: ``"read_committed"`` (offsets below the LSO, aborted
                transactions and markers removed, as a read_committed consumer returns them)
                or ``"read_uncommitted"`` (everything below the high watermark).
            starting_offsets: ``"earliest"``, ``"latest"``, one offset for every partition,
                or ``{partition: offset}`` (``-2`` earliest, ``-1`` latest; partitions left
                out start at earliest).
            ending_offsets: Offsets to stop before, in the same forms (partitions left out
                end at latest); lowered to the LSO (read_committed) or high watermark.
            partitions: Partitions to read, in this order (default: all).
            version: Read the table as of this log version (time travel).
            max_workers: Segments fetched at once (object-store reads are latency bound).
            max_bytes_in_flight: Segment bytes fetched ahead of the batch being returned.
            columns: Return only these columns, in this order. On a typed table only the
                requested user columns are read from the segments' Parquet files.
            request_timeout_ms: How long a failing storage request (the snapshot, a
                segment) is retried before ``KafkaTimeoutError``.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``request_timeout_ms`` (also from
                the ``to_*`` calls).
            OffsetOutOfRangeError: A starting offset is past the high watermark, or an
                offset is below the log start offset.
            UnknownTopicOrPartitionError: A partition the table does not have.
            InvalidConfigurationError: An argument of the wrong kind.
        """
        from txntable.read.scan import TableScan

        return TableScan(
            self,
            isolation_level,
            starting_offsets,
            ending_offsets,
            partitions,
            version,
            max_workers,
            max_bytes_in_flight,
            columns,
            request_timeout_ms,
        )

    @property
    def layout(self) -> TypedLayout | None:
        """A typed table's layout (schema and key columns) at the handle's snapshot;
        ``None`` for a table of Kafka's record."""
        return layout_of(self.snapshot(refresh=False).metadata)

    @property
    def schema(self) -> pa.Schema | None:
        """A typed table's record schema (the user's columns) at the handle's snapshot."""
        layout = self.layout
        return layout.schema if layout else None

    @property
    def configuration(self) -> dict[str, str]:
        """The table's configuration keys that are set (the others have their default, see
        :data:`txntable.config.TABLE_CONFIG`), at the handle's snapshot."""
        metadata = self.snapshot(refresh=False).metadata
        assert metadata is not None
        return dict(metadata.configuration)

    def alter_configuration(
        self, updates: Mapping[str, str | int] | None = None, removals: Iterable[str] = ()
    ) -> dict[str, str]:
        """Set the keys of ``updates`` and unset those of ``removals`` (back to their
        default) in one log version: a new ``metadata`` action (Kafka's
        ``IncrementalAlterConfigs``, Delta's ``ALTER TABLE SET / UNSET TBLPROPERTIES``).

        Returns:
            The configuration now in force (the keys that are set).

        Raises:
            InvalidConfigurationError: A key to set is unknown or not implemented, or its
                value malformed; a key to unset is neither known nor set; a key is both set
                and unset. Nothing is written.
        """
        changes = config.validate_table_configuration(updates)
        removed = frozenset(removals)
        both = removed & changes.keys()
        if both:
            raise InvalidConfigurationError(
                f"configuration key {min(both)!r} is both set and unset"
            )

        def build(s: TableSnapshot) -> CommitPlan[dict[str, str]]:
            assert s.metadata is not None
            current = s.metadata.configuration
            for name in sorted(removed - current.keys() - config.TABLE_CONFIG.keys()):
                config.validate_table_configuration({name: ""})  # raises: unknown key
            new = {k: v for k, v in current.items() if k not in removed} | changes
            if new == current:
                return CommitPlan([], new, "SET TBLPROPERTIES")
            return CommitPlan([replace(s.metadata, configuration=new)], new, "SET TBLPROPERTIES")

        self.snapshot()
        plan, _ = self.commit(build)
        with self._lock:
            self._configure(self.snapshot())  # this handle's checkpoint interval
        return dict(plan.result)

    def evolve_schema(self, schema: pa.Schema) -> pa.Schema:
        """Replace a typed table's record schema by an evolution of it, in one log version
        (a new ``metadata`` action).

        Allowed: new nullable columns (at the end, also inside structs) and widened types
        (int8/int16/int32 to a wider integer, float32 to float64); see
        :func:`txntable.protocol.schema.check_evolution`. Segments written before are read with
        nulls
        for the new columns and their values upcast. Producers holding the older schema
        keep committing (their segments are read the same way) and pick the new schema up
        when they meet a column they do not know.

        Returns:
            The schema now in force.

        Raises:
            SchemaMismatchError: The table is not typed, or the change is not allowed
                against the newest schema; nothing is written.
        """
        new = normalize_schema(schema)

        def build(s: TableSnapshot) -> CommitPlan[pa.Schema]:
            assert s.metadata is not None
            layout = layout_of(s.metadata)
            if layout is None:
                raise SchemaMismatchError(f"table {self.name!r} has no record schema to evolve")
            if layout.schema.equals(new):
                return CommitPlan([], new, "SET SCHEMA")
            check_evolution(layout.schema, new)
            metadata = replace(s.metadata, schema=schema_to_json(new))
            return CommitPlan([metadata], new, "SET SCHEMA")

        self.snapshot()
        plan, _ = self.commit(build)
        return plan.result

    @property
    def num_partitions(self) -> int:
        """Number of partitions."""
        return self.snapshot(refresh=False).num_partitions

    def segment_key(self, partition: int, file_name: str) -> str:
        """Store key of a segment file of ``partition``."""
        return segment_key(self.name, partition, file_name)

    def append(
        self,
        batches: list[PendingBatch],
        markers: list[PendingMarker] | None = None,
        app_txn: AppTxn | None = None,
        transactional_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> tuple[AppendResult, int]:
        """Commit already-written segments and/or markers as one log version.

        Args:
            timeout_ms: The commit's time budget (default: the table's commit timeout).

        Returns:
            Offsets assigned (duplicates get their original offsets) and the version.

        Raises:
            KafkaTimeoutError: Not decided within the budget (storage failing; outcome
                unknown: an idempotent retry resolves it).
        """
        if self.group_commit is not None:
            from txntable.protocol.sequencing import AppendOp

            op = AppendOp(tuple(batches), tuple(markers or ()), app_txn)
            result, version = self.submit(op, transactional_id, timeout_ms)
            assert isinstance(result, AppendResult)
            return result, version
        marks = markers or []

        def build(s: TableSnapshot) -> CommitPlan[AppendResult]:
            return plan_append(s, batches, marks, app_txn, now_ms())

        plan, version = self.commit(build, transactional_id, timeout_ms)
        return plan.result, version

    def expect_writes(self) -> None:
        """This handle will commit appends or offset commits soon (a producer's): with group
        commit, it looks for a live committer now, off the caller's path, so that its first
        commit follows one instead of racing its rounds."""
        if self.group_commit is not None:
            self.group_commit.expect_writes()

    def submit(
        self, op: Operation, transactional_id: str | None = None, timeout_ms: int | None = None
    ) -> tuple[object, int]:
        """Commit a declarative operation (an append, an offset commit), which any writer
        of the table may commit on this one's behalf (group commit).

        Returns:
            The operation's result and the version that holds it.
        """
        self.snapshot(refresh=False)  # loaded, so a first commit needs no special case
        if self.group_commit is None:
            plan, version = self.commit(
                lambda s: op.plan(s, now_ms()), transactional_id, timeout_ms
            )
            return plan.result, version
        out = self.group_commit.submit(op, transactional_id, timeout_ms)
        self._after_commit()
        return out

    def commit(
        self,
        build: Callable[[TableSnapshot], CommitPlan[T]],
        transactional_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> tuple[CommitPlan[T], int]:
        """Commit what ``build`` plans against the newest snapshot (see :meth:`Log.commit`),
        within ``timeout_ms`` (default: the commit timeout).

        Optimistic: the attempt starts from the handle's snapshot without a refresh; a lost
        race refreshes it and calls ``build`` again.
        """
        if self.group_commit is not None:
            self.snapshot(refresh=False)
            out = self.group_commit.commit(build, transactional_id, timeout_ms)
        else:
            with self._lock:
                out = self.log.commit(
                    self.snapshot(refresh=False), build, transactional_id, timeout_ms
                )
        self._after_commit()
        return out

    def _after_commit(self) -> None:
        """Hint the background publisher when what the mirror lists may have changed (an
        LSO or log start moved, entries were rewritten): O(partitions), no I/O."""
        if self.mirror_interval_ms is None:
            return
        snap = self._snapshot
        if snap is None:
            return
        mark = tuple(
            (p.log_start_offset, p.last_stable_offset, p.rewrites) for p in snap.partitions
        )
        if mark == self._mirror_mark:
            return
        self._mirror_mark = mark
        if self._auto_publisher is None:
            from txntable.mirror.publisher import AutoPublisher, MirrorPublishers

            formats = self.mirror_formats
            self._auto_publisher = AutoPublisher(
                lambda: MirrorPublishers(self.store, self.name, formats), self.mirror_interval_ms
            )
        self._auto_publisher.hint()

    def publish(self, formats: Sequence[str] | None = None) -> PublishReport:
        """Publish the mirrors of read_committed at the table's newest version, on demand.

        ``formats``: ``"delta"`` (``<table>/_delta_log/``, readable by Spark, Trino,
        delta-rs, DuckDB and Polars) and/or ``"iceberg"`` (``<table>/metadata/``, format v2,
        needs the ``txntable[iceberg]`` extra). By default Delta, whether or not
        ``mirror.delta`` is on, and Iceberg if ``mirror.iceberg`` is on. The report is
        Delta's, with Iceberg's as ``report.iceberg``. See :mod:`txntable.mirror`.

        Raises:
            MirrorConflictError: A mirror holds a commit no publisher of this table wrote.
            MirrorUnsupportedError: The table cannot be mirrored in a format asked for
                (:class:`~txntable.errors.MirrorDependencyError`: pyiceberg is missing).
            InvalidConfigurationError: An unknown format.
        """
        if formats is None:
            snap = self.snapshot()  # the configuration in force now
            assert snap.metadata is not None
            enabled = mirror_formats(snap.metadata.configuration)
            chosen = ("delta", *(f for f in enabled if f != "delta"))
        else:
            chosen = tuple(dict.fromkeys(formats))
        publishers = self._publishers.get(chosen)
        if publishers is None:
            from txntable.mirror.publisher import MirrorPublishers

            publishers = self._publishers[chosen] = MirrorPublishers(self.store, self.name, chosen)
        return publishers.publish()

    def wait_for_mirror(self, timeout: float | None = None) -> None:
        """Wait for this handle's background publishes to finish (tests, shutdown)."""
        if self._auto_publisher is not None:
            self._auto_publisher.join(timeout)

    def delete_records(self, offsets: Mapping[int, int]) -> dict[int, int]:
        """Kafka's DeleteRecords: move partitions' log start offsets forward.

        Records below the new log start offset are no longer returned to readers
        (consumers reset per ``auto_offset_reset``; ``seek_to_beginning`` starts there).
        Segments are not deleted from storage.

        Args:
            offsets: Partition → new log start offset; ``-1`` means the high watermark.

        Returns:
            Partition → log start offset after the call (Kafka's low watermark).

        Raises:
            OffsetOutOfRangeError: An offset is above the partition's high watermark.
            UnknownTopicOrPartitionError: A partition does not exist.
            InvalidArgumentTypeError: A partition or offset is not an ``int``.
        """

        if not isinstance(offsets, Mapping):
            raise InvalidArgumentTypeError(
                f"offsets must be a dict of partition to offset, not {type(offsets).__name__}"
            )
        for partition, offset in offsets.items():
            for what, v in (("partition", partition), ("offset", offset)):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise InvalidArgumentTypeError(f"a {what} must be an int, not {v!r:.40}")

        def build(s: TableSnapshot) -> CommitPlan[dict[int, int]]:
            return plan_delete_records(s, offsets)

        plan, _ = self.commit(build)
        return plan.result

    def vacuum(
        self,
        retention_ms: int | None = None,
        dry_run: bool = True,
        progress: Progress | None = None,
    ) -> VacuumReport:
        """Delete segment files that no version of the retention window references and that
        are older than ``retention_ms`` (Delta's VACUUM).

        As delta-rs's ``DeltaTable.vacuum``, a dry run by default: the report lists what
        would be deleted; ``dry_run=False`` deletes it. See :mod:`txntable.maintenance.vacuum`
        (default retention: the table's ``version.retention.ms``, a week). ``progress`` is
        told files listed and deleted (:data:`~txntable.util.Progress`).
        """
        from txntable.maintenance.maintain import MaintenanceConfig
        from txntable.maintenance.vacuum import vacuum

        if retention_ms is None:
            retention_ms = MaintenanceConfig.of(self.snapshot()).version_retention_ms
        return vacuum(self, retention_ms, dry_run, progress=progress)

    def optimize(
        self, target_bytes: int | None = None, progress: Progress | None = None
    ) -> RewriteReport:
        """Merge runs of small segments below the LSO into segments of ``segment.bytes``.

        Offsets never change; markers and aborted data are dropped. One log version swaps
        the runs for the merged segments, then a checkpoint is written. See
        :mod:`txntable.maintenance.merge`. ``progress`` is told the input bytes rewritten.
        """
        from txntable.maintenance.maintain import rewrite

        return rewrite(self, compact=False, target_bytes=target_bytes, progress=progress)

    def compact(
        self,
        force: bool = True,
        now: int | None = None,
        ignore_cleanup_policy: bool = False,
        progress: Progress | None = None,
    ) -> RewriteReport:
        """Key compaction (Kafka's log cleaner) below the LSO: keep the latest record per key.

        Tombstones (null values) go once ``delete.retention.ms`` has passed since a
        compaction first kept them. ``force=False`` skips partitions whose dirty ratio is
        below ``min.cleanable.dirty.ratio``. ``progress`` is told the input bytes read by
        each pass (``"keys"``, then ``"rewrite"``).

        Raises:
            PolicyViolationError: The table's ``cleanup.policy`` does not include
                ``compact`` (Kafka never key-compacts such a topic: its records with
                repeated keys are all data) and ``ignore_cleanup_policy`` is not set.
        """
        from txntable.maintenance.maintain import MaintenanceConfig, rewrite

        if not ignore_cleanup_policy and not MaintenanceConfig.of(self.snapshot()).compact:
            raise PolicyViolationError(
                f"table {self.name} has cleanup.policy without compact: key compaction would "
                "delete every record but the latest of each key. Set cleanup.policy=compact "
                "(or compact,delete), or pass ignore_cleanup_policy=True; optimize() merges "
                "segments without dropping records"
            )
        return rewrite(self, compact=True, now=now, force=force, progress=progress)

    def apply_retention(self, now: int | None = None) -> RetentionReport:
        """Advance log start offsets per ``retention.ms`` / ``retention.bytes``."""
        from txntable.maintenance.maintain import apply_retention

        return apply_retention(self, now)

    def expire_producers(self, now: int | None = None) -> ExpiryReport:
        """Forget producers idle past ``producer.id.expiration.ms`` with nothing open."""
        from txntable.maintenance.maintain import expire_producers

        return expire_producers(self, now)

    def checkpoint(self, progress: Progress | None = None) -> CheckpointReport:
        """Write a checkpoint of the latest version now (Delta's ``CHECKPOINT``);
        ``progress`` is told the entries written.

        Raises:
            StorageError: If the checkpoint or its hint could not be written.
        """
        from txntable.maintenance.maintain import checkpoint

        return checkpoint(self, progress)

    def clean_log(self, now: int | None = None) -> LogCleanupReport:
        """Delete log versions and checkpoints older than the time-travel window."""
        from txntable.maintenance.maintain import clean_log

        return clean_log(self, now)

    def maintain(
        self,
        now: int | None = None,
        vacuum: bool = True,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> MaintenanceReport:
        """Retention, producer expiry, compaction or merge, checkpoint, log cleanup and
        vacuum, as the table's configuration says. See :mod:`txntable.maintenance.maintain`;
        ``progress`` is told the steps done and the progress of each step."""
        from txntable.maintenance.maintain import maintain

        return maintain(self, now, vacuum, dry_run, progress)

    def verify(
        self, segments: bool = True, progress: Progress | None = None
    ) -> VerifyReport:
        """Replay the whole log and check every invariant of the spec (see
        :mod:`txntable.maintenance.verify`).

        Args:
            segments: Also read every referenced segment and check it against its batch.
            progress: Called with ``(phase, done, total)``, phase ``"log"`` then
                ``"segments"``.
        """
        from txntable.maintenance.verify import verify_log

        return verify_log(self.log, self.name, segments=segments, progress=progress)

    def describe(self) -> TableDescription:
        """Per partition: offsets, open transactions, producers and segments.

        A prepared transaction that a dead producer left pinning the LSO is completed first
        (see :meth:`finish_stuck_transactions`). Costs O(entries) of the partition (it
        counts segments): an inspection call, not for a hot path.
        """
        self.snapshot()
        self.finish_stuck_transactions()
        snap = self.snapshot(refresh=False)
        assert snap.metadata is not None
        layout = layout_of(snap.metadata)
        partitions = tuple(_describe_partition(p) for p in snap.partitions)
        return TableDescription(
            name=self.name,
            table_id=snap.metadata.tableId,
            version=snap.version,
            partitions=self._with_start_times(partitions),
            schema=layout.schema if layout else None,
            key_columns=layout.key_columns if layout else (),
        )

    def _with_start_times(
        self, partitions: tuple[PartitionDescription, ...]
    ) -> tuple[PartitionDescription, ...]:
        """Open transactions with their start time from the coordinator (one read per
        transactional id): the record timestamps the log has are whatever producers set."""
        from txntable.txn.coordinator import TransactionCoordinator

        coordinator = TransactionCoordinator(self.store)
        starts: dict[str, tuple[int, int] | None] = {}
        for p in partitions:
            for o in p.open_transactions:
                tid = o.transactional_id
                if tid is not None and tid not in starts:
                    loaded = coordinator.load(tid)
                    meta = loaded[0] if loaded else None
                    starts[tid] = (meta.producer_id, meta.txn_start_timestamp) if meta else None

        def timed(o: OpenTransaction) -> OpenTransaction:
            found = starts.get(o.transactional_id or "")
            if found is None or found[0] != o.producer_id or found[1] < 0:
                return o
            return replace(o, txn_start_timestamp=found[1])

        return tuple(
            replace(p, open_transactions=tuple(timed(o) for o in p.open_transactions))
            for p in partitions
        )

    def __repr__(self) -> str:
        return f"Table({self.name!r})"


def _describe_partition(p: PartitionState) -> PartitionDescription:
    opened = []
    for pid, first in sorted(p.ongoing.items()):
        entry = p.entry_at(first)
        batch = entry if isinstance(entry, Batch) else None
        opened.append(
            OpenTransaction(
                pid,
                first,
                batch.transactionalId if batch else None,
                batch.minTimestamp if batch else 0,
            )
        )
    files = {e.path: e.size for e in p.entries if isinstance(e, Batch | Segment) and e.path}
    return PartitionDescription(
        partition=p.partition,
        log_start_offset=p.log_start_offset,
        high_watermark=p.high_watermark,
        last_stable_offset=p.last_stable_offset,
        open_transactions=tuple(opened),
        producers=tuple(
            ProducerDescription(
                pid, e.epoch, e.last_seq, e.last_timestamp, e.current_txn_first_offset
            )
            for pid, e in sorted(p.producers.items())
        ),
        segments=len(files),
        segment_bytes=sum(files.values()),
    )
