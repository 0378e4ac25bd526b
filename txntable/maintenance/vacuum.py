"""Deleting segment files no version in the retention window references (Delta's VACUUM).

A segment becomes garbage when the append that wrote it never committed (a producer that
crashed or gave up between the PUT and the log commit, an aborted Spark task, a merge that
died before its commit), or when maintenance replaced it (merge, compaction) or moved the
log start past it (retention). A replaced file stays while a version inside the retention
window still references it — a reader that planned before the merge may still be reading
it, and time travel within the window must keep working — so vacuum keeps every file that
the latest snapshot or the snapshot at the oldest version inside the window references. Such a file
can still be committed for a while — a producer retries until ``delivery_timeout_ms``, a
Spark job commits when its last task ends, and an earlier client's short-path PrepareCommit
names its segments until someone completes it — so only files older than the retention period, and
named by no coordinator intent, are deleted. A file's age comes from its name
(:func:`new_segment_name`), never from storage metadata; a file whose name carries no
time is never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txntable import config
from txntable.errors import CorruptLogError, InvalidConfigurationError, ObjectNotFoundError
from txntable.layout import data_dir, intents_prefix, segment_created_ms
from txntable.log.log import Log
from txntable.mirror.iceberg import iceberg_referenced_keys
from txntable.mirror.publisher import mirror_referenced_keys
from txntable.protocol.actions import CommitInfo, Marker
from txntable.protocol.sequencing import AppendOp, Intent
from txntable.protocol.snapshot import TableSnapshot
from txntable.table import Table
from txntable.txn.coordinator import TransactionCoordinator, TxnState
from txntable.util import Progress, now_ms

#: Delta's default: a week, far beyond any delivery timeout or Spark job.
RETENTION_MS_DEFAULT = config.VERSION_RETENTION_MS_DEFAULT
#: Below this, a slow writer's not-yet-committed segment could be deleted.
RETENTION_MS_MIN = config.VERSION_RETENTION_MS_MIN
#: How far vacuum's clock may run ahead of the store's: every millisecond of it shortens the
#: time a segment written just now (by a clock near the store's) is safe from deletion.
CLOCK_AHEAD_MAX_MS = 5 * 60 * 1000
#: Listed files between two progress reports.
_PROGRESS_EVERY = 1000


@dataclass
class VacuumReport:
    """What ``vacuum`` deleted (or would delete, in a dry run) and what it could not date."""

    deleted: list[str] = field(default_factory=list)
    undated: list[str] = field(default_factory=list)
    referenced: int = 0


def vacuum(
    table: Table,
    retention_ms: int = RETENTION_MS_DEFAULT,
    dry_run: bool = False,
    now: int | None = None,
    progress: Progress | None = None,
) -> VacuumReport:
    """Delete ``table``'s unreferenced segment files older than ``retention_ms``.

    Args:
        progress: Told phase ``"list"`` (files listed, total unknown) then ``"delete"``
            (files deleted of those to delete; not in a dry run).

    Raises:
        InvalidConfigurationError: ``retention_ms`` is below one hour, or (unless
            ``dry_run``) ``now`` — or this machine's clock — is more than
            :data:`CLOCK_AHEAD_MAX_MS` ahead of the store's clock.
    """
    if retention_ms < RETENTION_MS_MIN:
        raise InvalidConfigurationError(
            f"retention_ms {retention_ms} is below {RETENTION_MS_MIN}: a writer still "
            "retrying could lose a segment it is about to commit"
        )
    clock = now_ms() if now is None else now
    if not dry_run:
        store_now = table.store.clock_ms()
        if clock - store_now > CLOCK_AHEAD_MAX_MS:
            # A segment is old when its name's time is older than clock - retention_ms: with
            # a clock hours ahead, one a writer is about to commit would be deleted under it.
            raise InvalidConfigurationError(
                f"vacuum's clock ({clock}) is {(clock - store_now) / 60_000:.0f} minutes ahead "
                f"of the store's ({store_now}); more than "
                f"{CLOCK_AHEAD_MAX_MS // 60_000} would delete segments still being committed "
                "(a dry run may look ahead)"
            )
    snap = table.snapshot()
    referenced = referenced_paths(snap)
    oldest = first_version_since(table.log, clock - retention_ms, snap.version)
    if oldest < snap.version:
        referenced |= referenced_paths(table.log.load(oldest))
    referenced |= _intent_paths(table)
    # Files the Delta mirror lists, or removed from it within the period: readers of the
    # mirror (pinned to an older mirror version too) never lose a file under them. The same
    # for the Iceberg mirror: files of its snapshots replaced within the period.
    assert snap.metadata is not None
    referenced |= mirror_referenced_keys(
        table.store, table.name, snap.metadata.tableId, clock - retention_ms
    )
    referenced |= iceberg_referenced_keys(
        table.store, table.name, snap.metadata.tableId, clock - retention_ms
    )
    report = VacuumReport(referenced=len(referenced))
    listed = 0
    for listed, key in enumerate(table.store.list(data_dir(table.name)), 1):
        if progress is not None and listed % _PROGRESS_EVERY == 0:
            progress("list", listed, 0)
        if key in referenced:
            continue
        created = segment_created_ms(key)
        if created is None:
            report.undated.append(key)
        elif clock - created > retention_ms:
            report.deleted.append(key)
    if progress is not None:
        progress("list", listed, listed)
    if dry_run:
        return report
    for deleted, key in enumerate(report.deleted, 1):
        table.store.delete(key)
        if progress is not None:
            progress("delete", deleted, len(report.deleted))
    return report


def referenced_paths(snap: TableSnapshot) -> set[str]:
    """Segment files the snapshot's entries name (batches and merged segments)."""
    return {
        e.path
        for part in snap.partitions
        for e in part.entries
        if not isinstance(e, Marker) and e.path
    }


def version_time(log: Log, version: int) -> int | None:
    """Commit time of ``version`` (its ``commitInfo.timestamp``), ``None`` if it is gone."""
    actions = log.read_version(version)
    if actions is None:
        return None
    return max((a.timestamp for a in actions if isinstance(a, CommitInfo)), default=0)


def first_version_since(log: Log, since_ms: int, latest: int) -> int:
    """The oldest readable version committed at or after ``since_ms`` (binary search on
    commit timestamps: O(log versions) reads), else ``latest``."""
    lo, hi = log.earliest_version(), latest
    while lo < hi:
        mid = (lo + hi) // 2
        ts = version_time(log, mid)
        if ts is None or ts < since_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _intent_paths(table: Table) -> set[str]:
    """Segments named by prepared short-path transactions (recovery will commit them) and
    by pending group-commit intents (a round may still commit them)."""
    coordinator = TransactionCoordinator(table.store)
    paths: set[str] = set()
    for tid in coordinator.transactional_ids():
        loaded = coordinator.load(tid)
        if loaded is not None and loaded[0].state is TxnState.PREPARE_COMMIT:
            paths.update(b.path for b in loaded[0].intent.get(table.name, ()))
    for key in table.store.list(intents_prefix(table.name)):
        try:
            intent = Intent.from_json(table.store.get(key).data, key)
        except ObjectNotFoundError:
            continue  # decided and deleted meanwhile
        except CorruptLogError:
            continue  # no committer can decide it: what it names is garbage
        if isinstance(intent.op, AppendOp):
            paths.update(b.path for b in intent.op.batches)
    return paths
