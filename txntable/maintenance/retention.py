"""Retention (``retention.ms``, ``retention.bytes``) and producer-state expiry, as pure plans.

Retention follows Kafka's ``UnifiedLog.deleteOldSegments``: walking a partition's entries
from the oldest, an entry goes while its newest timestamp is older than ``retention.ms``
(time), or while the partition stays at or above ``retention.bytes`` without it (size); the
walk stops at the first entry that must stay. The log start offset moves to the end of the
last entry that went, with a ``logStart`` action — never past the LSO, so an open
transaction's first offset is always kept.

Producer expiry follows Kafka's ``ProducerStateManager.removeExpiredProducers``: a producer
whose last activity is older than ``producer.id.expiration.ms`` and that has no open
transaction (and no pending offset commit) is forgotten, with an ``expireProducer`` action.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txntable.maintenance.merge import upgrade_protocol
from txntable.protocol.actions import (
    Action,
    CommitPlan,
    ExpireProducer,
    LogStart,
    Marker,
)
from txntable.protocol.snapshot import (
    Entry,
    PartitionState,
    TableSnapshot,
    entry_size,
)


@dataclass
class RetentionReport:
    """Log start offsets moved by retention (partition → new log start) and the version."""

    version: int | None = None
    log_start_offsets: dict[int, int] = field(default_factory=dict)
    bytes_released: int = 0


@dataclass
class ExpiryReport:
    """Producers forgotten by producer-state expiry and the version that did it."""

    version: int | None = None
    producer_ids: list[int] = field(default_factory=list)


def newest_timestamp(entry: Entry) -> int:
    """The newest record (or marker) timestamp of an entry (Kafka's segment largestTimestamp)."""
    return entry.timestamp if isinstance(entry, Marker) else entry.maxTimestamp


def retention_point(
    part: PartitionState, now: int, retention_ms: int, retention_bytes: int
) -> int:
    """The log start offset retention allows for ``part`` (its current one if nothing goes).

    ``retention_ms`` / ``retention_bytes`` below 0 disable that rule (Kafka's -1).
    """
    lso = part.last_stable_offset
    new_start = part.log_start_offset
    excess = part.size_bytes - retention_bytes if retention_bytes >= 0 else -1
    for entry in part.entries:
        if entry.next_offset > lso:
            break
        by_time = retention_ms >= 0 and newest_timestamp(entry) < now - retention_ms
        size = entry_size(entry)
        by_size = retention_bytes >= 0 and excess - size >= 0
        if not (by_time or by_size):
            break
        excess -= size
        new_start = max(new_start, entry.next_offset)
    return new_start


def plan_retention(
    snap: TableSnapshot, now: int, retention_ms: int, retention_bytes: int
) -> CommitPlan[RetentionReport]:
    """Pure: the ``logStart`` actions retention calls for (plus a v2 protocol upgrade)."""
    actions: list[Action] = []
    report = RetentionReport()
    for part in snap.partitions:
        start = retention_point(part, now, retention_ms, retention_bytes)
        if start > part.log_start_offset:
            actions.append(LogStart(part.partition, start))
            report.log_start_offsets[part.partition] = start
            report.bytes_released += sum(
                entry_size(e) for e in part.entries if e.next_offset <= start
            )
    if actions:
        actions[:0] = upgrade_protocol(snap)
    return CommitPlan(actions, report, "RETENTION")


def expired_producers(snap: TableSnapshot, now: int, expiration_ms: int) -> list[int]:
    """Producer ids idle for longer than ``expiration_ms`` with no open transaction."""
    last: dict[int, int] = {}
    busy: set[int] = set(snap.pending_offsets)
    for part in snap.partitions:
        busy.update(part.ongoing)
        for pid, entry in part.producers.items():
            last[pid] = max(last.get(pid, 0), entry.last_timestamp)
    cutoff = now - expiration_ms
    return sorted(pid for pid, ts in last.items() if ts < cutoff and pid not in busy)


def plan_expiry(snap: TableSnapshot, now: int, expiration_ms: int) -> CommitPlan[ExpiryReport]:
    """Pure: one ``expireProducer`` per expired producer (plus a v2 protocol upgrade)."""
    pids = expired_producers(snap, now, expiration_ms)
    actions: list[Action] = [ExpireProducer(pid) for pid in pids]
    if actions:
        actions[:0] = upgrade_protocol(snap)
    return CommitPlan(actions, ExpiryReport(producer_ids=pids), "EXPIRE PRODUCERS")
