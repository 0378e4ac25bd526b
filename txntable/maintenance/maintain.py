"""Table maintenance: merge, compaction, retention, producer expiry, checkpoints, log cleanup.

Kafka keeps a log bounded with segment rolling, retention and the log cleaner; Delta with
OPTIMIZE, checkpoints and VACUUM. Here each is a log action committed through the same
optimistic loop as any append, so maintenance is safe next to producers and readers, and
any client may run it: ``Table.maintain()`` (CLI ``txntable maintain``) does everything due,
and a producer starts it in the background after its commits when a cheap check says it
is due (:class:`AutoMaintenance`).

The table's configuration (Kafka's names) drives it; see :class:`MaintenanceConfig`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txntable import config
from txntable.errors import InvalidConfigurationError, TxnTableError
from txntable.layout import new_segment_name
from txntable.maintenance.merge import (
    Compaction,
    MergeRun,
    RewriteReport,
    dirty_ratio,
    latest_offsets,
    plan_commit,
    plan_groups,
    rewrite_run,
)
from txntable.maintenance.retention import (
    ExpiryReport,
    RetentionReport,
    newest_timestamp,
    plan_expiry,
    plan_retention,
)
from txntable.maintenance.vacuum import first_version_since, version_time
from txntable.protocol.actions import MAINTENANCE_PROTOCOL_VERSION
from txntable.protocol.schema import layout_of
from txntable.protocol.snapshot import PartitionState, TableSnapshot
from txntable.util import Progress, now_ms

if TYPE_CHECKING:
    from txntable.maintenance.vacuum import VacuumReport
    from txntable.table import Table

_log = logging.getLogger(__name__)

@dataclass(frozen=True)
class MaintenanceConfig:
    """The maintenance settings of a table, parsed from its configuration."""

    segment_bytes: int = config.SEGMENT_BYTES_DEFAULT
    compact: bool = False
    delete: bool = True
    retention_ms: int = config.RETENTION_MS_DEFAULT
    retention_bytes: int = config.RETENTION_BYTES_DEFAULT
    delete_retention_ms: int = config.DELETE_RETENTION_MS_DEFAULT
    min_cleanable_dirty_ratio: float = config.MIN_CLEANABLE_DIRTY_RATIO_DEFAULT
    producer_id_expiration_ms: int = config.PRODUCER_ID_EXPIRATION_MS_DEFAULT
    version_retention_ms: int = config.VERSION_RETENTION_MS_DEFAULT
    interval_ms: int = config.MAINTENANCE_INTERVAL_MS_DEFAULT
    merge_min_entries: int = config.MAINTENANCE_MERGE_MIN_ENTRIES_DEFAULT

    @classmethod
    def parse(cls, conf: Mapping[str, str]) -> MaintenanceConfig:
        """Parse a table configuration (the keys of :data:`txntable.config.TABLE_CONFIG`).

        Raises:
            InvalidConfigurationError: A maintenance key has a malformed value.
        """

        def get(key: str) -> int:
            value = config.table_setting(conf, key)
            assert isinstance(value, int)
            return value

        policy = config.table_setting(conf, config.CLEANUP_POLICY)
        assert isinstance(policy, frozenset)
        ratio = config.table_setting(conf, config.MIN_CLEANABLE_DIRTY_RATIO)
        assert isinstance(ratio, float)
        return cls(
            segment_bytes=get(config.SEGMENT_BYTES),
            compact="compact" in policy,
            delete="delete" in policy,
            retention_ms=get(config.RETENTION_MS),
            retention_bytes=get(config.RETENTION_BYTES),
            delete_retention_ms=get(config.DELETE_RETENTION_MS),
            min_cleanable_dirty_ratio=ratio,
            producer_id_expiration_ms=get(config.PRODUCER_ID_EXPIRATION_MS),
            version_retention_ms=get(config.VERSION_RETENTION_MS),
            interval_ms=get(config.MAINTENANCE_INTERVAL_MS),
            merge_min_entries=get(config.MAINTENANCE_MERGE_MIN_ENTRIES),
        )

    @classmethod
    def of(cls, snap: TableSnapshot) -> MaintenanceConfig:
        """The settings of the table ``snap`` is a snapshot of (defaults, with a warning,
        where another client wrote a value this one refuses)."""
        assert snap.metadata is not None
        try:
            return cls.parse(snap.metadata.configuration)
        except InvalidConfigurationError as e:
            _log.warning("table %s: %s; using defaults", snap.metadata.name, e)
            return cls()


@dataclass
class CheckpointReport:
    """The checkpoint ``Table.checkpoint`` wrote: its version and the entries it holds."""

    version: int
    written: bool
    entries: int


@dataclass
class LogCleanupReport:
    """Log versions and checkpoints deleted before the oldest retained checkpoint."""

    earliest_version: int | None = None
    versions_deleted: int = 0
    checkpoints_deleted: int = 0
    #: Checkpoints old enough by commit time but not by the store's clock (or undated).
    too_young: list[int] = field(default_factory=list)


@dataclass
class MaintenanceReport:
    """Everything ``Table.maintain`` did, step by step (``None``: the step did not run)."""

    #: Transactional ids whose decided, unfinished transaction was completed.
    decided: list[str] | None = None
    retention: RetentionReport | None = None
    expiry: ExpiryReport | None = None
    rewrite: RewriteReport | None = None
    checkpoint: CheckpointReport | None = None
    log_cleanup: LogCleanupReport | None = None
    vacuum: VacuumReport | None = None
    errors: list[str] = field(default_factory=list)


# --- merge and compaction ---------------------------------------------------------------


def rewrite(
    table: Table,
    compact: bool,
    now: int | None = None,
    target_bytes: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> RewriteReport:
    """Merge (``compact=False``) or key-compact the table's partitions below their LSO.

    Args:
        table: The table.
        compact: Keep only the latest record per key (the table's ``cleanup.policy`` need
            not say so: this is the explicit request).
        now: Clock for tombstone horizons (tests).
        target_bytes: Output segment size (default: the table's ``segment.bytes``).
        force: Compact even below ``min.cleanable.dirty.ratio``.
        progress: Told the input bytes read, phase ``"keys"`` (compaction's first pass,
            per partition) and ``"rewrite"`` (per merged segment).
    """
    clock = now_ms() if now is None else now
    snap = table.snapshot()
    cfg = MaintenanceConfig.of(snap)
    layout = layout_of(snap.metadata)  # a typed table's segments are rewritten in its schema
    target = cfg.segment_bytes if target_bytes is None else target_bytes
    report = RewriteReport()
    outputs = []
    planned: list[tuple[PartitionState, list[MergeRun]]] = []
    for part in snap.partitions:
        if compact and not force and dirty_ratio(part) < cfg.min_cleanable_dirty_ratio:
            continue
        runs: list[MergeRun] = plan_groups(part, target, rewrite_all=compact)
        if runs:
            planned.append((part, runs))
    total = sum(run.input_bytes for _, runs in planned for run in runs)
    indexed = 0
    for part, runs in planned:
        compaction = None
        if compact:
            latest = latest_offsets(table.store, runs, layout)
            compaction = Compaction(latest, clock, cfg.delete_retention_ms)
            indexed += sum(run.input_bytes for run in runs)
            if progress is not None:
                progress("keys", indexed, total)
        for run in runs:
            segment, kept, dropped = rewrite_run(
                table.store,
                run,
                part.log_start_offset,
                lambda p: table.segment_key(p, new_segment_name()),
                compaction,
                layout,
            )
            if segment.path:
                report.written_paths.append(segment.path)
            outputs.append((run, segment))
            report.records_kept += kept
            report.records_dropped += dropped
            report.bytes_read += run.input_bytes
            report.bytes_written += segment.size
            if progress is not None:
                progress("rewrite", report.bytes_read, total)
    if not outputs:
        return report
    plan, version = table.commit(lambda s: plan_commit(s, outputs))
    committed = {(s.partition, s.baseOffset) for s in plan.result}
    report.version = version if plan.result else None
    report.segments_written = len(plan.result)
    report.runs_dropped_by_conflict = len(outputs) - len(plan.result)
    report.entries_replaced = sum(
        len(run.entries) for run, seg in outputs if (seg.partition, seg.baseOffset) in committed
    )
    if plan.result:
        # The snapshot just shrank: checkpoint it, so cold loads pay for the live state only.
        table.log.write_checkpoint(table.snapshot(refresh=False))
    return report


# --- retention and expiry ---------------------------------------------------------------


def apply_retention(table: Table, now: int | None = None) -> RetentionReport:
    """Move log start offsets forward per ``retention.ms`` / ``retention.bytes``.

    Does nothing unless ``cleanup.policy`` includes ``delete``.
    """
    clock = now_ms() if now is None else now
    cfg = MaintenanceConfig.of(table.snapshot())
    if not cfg.delete:
        return RetentionReport()
    plan, version = table.commit(
        lambda s: plan_retention(s, clock, cfg.retention_ms, cfg.retention_bytes)
    )
    plan.result.version = version if plan.actions else None
    return plan.result


def expire_producers(table: Table, now: int | None = None) -> ExpiryReport:
    """Forget producers idle past ``producer.id.expiration.ms`` with nothing open."""
    clock = now_ms() if now is None else now
    cfg = MaintenanceConfig.of(table.snapshot())
    plan, version = table.commit(
        lambda s: plan_expiry(s, clock, cfg.producer_id_expiration_ms)
    )
    plan.result.version = version if plan.actions else None
    return plan.result


# --- checkpoints and log cleanup --------------------------------------------------------


def checkpoint(table: Table, progress: Progress | None = None) -> CheckpointReport:
    """Write a checkpoint of the latest version now.

    Args:
        progress: Told phase ``"write"`` in entries: none before, all once written (one
            object: nothing in between).

    Raises:
        StorageError: If the checkpoint or its hint could not be written.
    """
    snap = table.snapshot()
    listing_size = sum(len(p.entries) for p in snap.partitions)
    if progress is not None:
        progress("write", 0, listing_size)
    written = table.log.write_checkpoint(snap, strict=True)
    if progress is not None:
        progress("write", listing_size, listing_size)
    return CheckpointReport(snap.version, written, listing_size)


def clean_log(table: Table, now: int | None = None) -> LogCleanupReport:
    """Delete log versions (never version 0) and checkpoints older than the newest checkpoint
    that is itself older than ``version.retention.ms``; time travel keeps working back to it.

    Only on protocol v2 tables (v1 readers would replay a truncated log).
    """
    clock = now_ms() if now is None else now
    snap = table.snapshot()
    assert snap.protocol is not None
    report = LogCleanupReport()
    if snap.protocol.minReaderVersion < MAINTENANCE_PROTOCOL_VERSION:
        return report
    cfg = MaintenanceConfig.of(snap)
    log = table.log
    # Versions before the first one inside the window are older than it (commit timestamps
    # grow with versions, up to clock skew): keep the newest checkpoint among them.
    cutoff = clock - cfg.version_retention_ms
    first_inside = first_version_since(log, cutoff, snap.version)
    if first_inside == snap.version and (version_time(log, snap.version) or 0) < cutoff:
        first_inside += 1  # even the latest version is outside: its checkpoint qualifies
    listing = log.listing()
    # The window is also measured on the store's clock, the one clock every client shares:
    # a version the store dated less than version.retention.ms ago may be the one a writer
    # that listed the log a moment ago is about to put (it lists at least once a minute),
    # however far ahead ``now`` or this client's clock is.
    store_now = table.store.clock_ms()
    keep: int | None = None
    for v in sorted((c for c in listing.checkpoints if c < first_inside), reverse=True):
        written = table.store.modified_ms(log.version_key(v))
        if written is None or store_now - written < cfg.version_retention_ms:
            report.too_young.append(v)
            continue
        try:
            cp = log.read_checkpoint(v, listing.parts_of(v))
        except TxnTableError as e:
            _log.warning("not cleaning the log up to damaged checkpoint %d: %s", v, e)
            continue
        if cp is not None and cp.protocol is not None and (
            cp.protocol.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION
        ):
            keep = v
        break
    if keep is None:
        return report
    report.earliest_version = keep
    # Oldest first: a crash part-way leaves a shorter, still valid, truncated log.
    for v in listing.versions:
        if 0 < v < keep:
            table.store.delete(log.version_key(v))
            report.versions_deleted += 1
    for v in listing.checkpoints:
        if v >= keep:
            break
        n = listing.parts_of(v)
        if n > 1:
            for i in range(1, n + 1):
                table.store.delete(log.checkpoint_key(v, i, n))
        table.store.delete(log.checkpoint_key(v))  # the single file, or the parts' stub
        report.checkpoints_deleted += 1
    return report


# --- everything ------------------------------------------------------------------------


def maintain(
    table: Table,
    now: int | None = None,
    vacuum: bool = True,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> MaintenanceReport:
    """Run every maintenance step the table's configuration calls for, in order.

    Completion of decided transactions their producers left unfinished (see
    :meth:`Table.finish_decided_transactions`), retention, producer expiry, compaction
    (``cleanup.policy`` with ``compact``) or merge, a checkpoint, log cleanup, and
    (``vacuum``) deletion of segment files no version in the retention window references.
    A step that fails is reported and the next still runs.
    ``dry_run`` only reports what vacuum would delete and skips the other steps.
    ``progress`` is told phase ``"steps"`` (steps done) and the phases of the steps that
    report theirs.
    """
    from txntable.maintenance.vacuum import vacuum as run_vacuum

    clock = now_ms() if now is None else now
    report = MaintenanceReport()
    cfg = MaintenanceConfig.of(table.snapshot())
    steps: list[tuple[str, Callable[[], object]]] = []
    if not dry_run:
        steps = [
            ("decided", lambda: table.finish_decided_transactions(clock)),
            ("retention", lambda: apply_retention(table, clock)),
            ("expiry", lambda: expire_producers(table, clock)),
            ("rewrite", lambda: rewrite(table, cfg.compact, clock, progress=progress)),
            ("checkpoint", lambda: checkpoint(table, progress)),
            ("log_cleanup", lambda: clean_log(table, clock)),
        ]
    if vacuum:
        steps.append(
            (
                "vacuum",
                lambda: run_vacuum(table, cfg.version_retention_ms, dry_run, clock, progress),
            )
        )
    for done, (name, step) in enumerate(steps):
        if progress is not None:
            progress("steps", done, len(steps))
        try:
            setattr(report, name, step())
        except TxnTableError as e:
            _log.warning("maintenance of %s: %s failed: %s", table.name, name, e)
            report.errors.append(f"{name}: {type(e).__name__}: {e}")
    if progress is not None:
        progress("steps", len(steps), len(steps))
    return report


def maintenance_due(snap: TableSnapshot, cfg: MaintenanceConfig, now: int) -> bool:
    """Cheap check (O(partitions)) whether merge or retention has work to do."""
    for part in snap.partitions:
        if len(part.entries) >= cfg.merge_min_entries:
            return True
        if cfg.delete and part.entries:
            first = part.entries[0]
            if first.next_offset <= part.last_stable_offset:
                if cfg.retention_ms >= 0 and newest_timestamp(first) < now - cfg.retention_ms:
                    return True
                if 0 <= cfg.retention_bytes < part.size_bytes:
                    return True
    return False


class AutoMaintenance:
    """Starts ``maintain`` in a background thread when a table needs it (one at a time).

    A producer calls :meth:`after_commit` after each commit; it costs a clock read, and at
    most once per ``maintenance.interval.ms`` a check of the producer's own snapshot. Then,
    even when nothing else is due, the background thread completes the decided
    transactions of the table that their producers left unfinished (see
    :meth:`Table.finish_decided_transactions`): what bounds how long an earlier client's
    decided short-path commit stays invisible when its producer died.
    """

    def __init__(self, open_table: Callable[[str], Table]) -> None:
        self._open_table = open_table
        self._next_check: dict[str, float] = {}
        self._running: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def after_commit(self, table: Table) -> None:
        """Check (rarely) whether ``table`` needs maintenance and start it if so."""
        mono = time.monotonic()
        snap = table.snapshot(refresh=False)
        cfg = MaintenanceConfig.of(snap)
        if cfg.interval_ms < 0:
            return
        with self._lock:
            due_at = self._next_check.setdefault(table.name, mono + cfg.interval_ms / 1000)
            if mono < due_at:
                return
            self._next_check[table.name] = mono + cfg.interval_ms / 1000
            running = self._running.get(table.name)
            if running is not None and running.is_alive():
                return
            due = maintenance_due(snap, cfg, now_ms())
            thread = threading.Thread(
                target=self._run,
                args=(table.name, due, cfg.interval_ms),
                name="txntable-maintenance",
                daemon=True,
            )
            self._running[table.name] = thread
        thread.start()

    def _run(self, name: str, due: bool, interval_ms: int) -> None:
        try:
            own = self._open_table(name)
            if due:
                maintain(own, vacuum=False)  # its first step completes decided transactions
            else:
                # One writer of the table per interval sweeps (the others read one object).
                own.finish_decided_transactions(once_per_ms=interval_ms)
        except Exception:  # noqa: BLE001 - background work: never kill the producer
            _log.exception("background maintenance of %s failed", name)

    def join(self, timeout: float | None = None) -> None:
        """Wait for running maintenance (e.g. before closing the producer)."""
        for thread in list(self._running.values()):
            thread.join(timeout)
