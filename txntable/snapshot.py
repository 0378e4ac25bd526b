"""Snapshot reconstruction: log actions in, table state out. Pure; no I/O.

A snapshot is built by applying versions in order (from version 0, or from a checkpoint,
which is itself a list of actions). Applying a version costs O(actions in it), so a reader
that refreshes incrementally never pays for the history again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from txntable.actions import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    AbortedTxn,
    Action,
    AppTxn,
    Batch,
    CommitInfo,
    LogStart,
    Marker,
    Metadata,
    OffsetCommit,
    Protocol,
    check_protocol,
)
from txntable.errors import CorruptLogError, UnknownTopicOrPartitionError
from txntable.producer_state import ProducerEntry

Entry = Batch | Marker


@dataclass
class PartitionState:
    """One partition: its entries in offset order, aborted index and open transactions."""

    partition: int
    log_start_offset: int = 0
    log_end_offset: int = 0
    entries: list[Entry] = field(default_factory=list)
    entry_offsets: list[int] = field(default_factory=list)
    aborted: list[AbortedTxn] = field(default_factory=list)
    aborted_last_offsets: list[int] = field(default_factory=list)
    ongoing: dict[int, int] = field(default_factory=dict)
    producers: dict[int, ProducerEntry] = field(default_factory=dict)

    @property
    def high_watermark(self) -> int:
        """Offset after the last entry; every written version is durable, so HW = LEO."""
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """First offset of the earliest open transaction, else the high watermark.

        Never below the log start offset: records deleted from under an open transaction
        no longer hold anything back (Kafka's ``maybeIncrementFirstUnstableOffset``).
        """
        if not self.ongoing:
            return self.log_end_offset
        return max(min(self.ongoing.values()), self.log_start_offset)

    def entries_between(self, start: int, end: int) -> Iterator[Entry]:
        """Entries (batches and markers) that hold any offset in ``[start, end)``."""
        # Index, never slice: a slice would copy every entry after ``start`` (O(history)).
        lo = max(bisect.bisect_right(self.entry_offsets, start) - 1, 0)
        hi = bisect.bisect_left(self.entry_offsets, end, lo)
        for i in range(lo, hi):
            entry = self.entries[i]
            if entry.next_offset > start:
                yield entry

    def entry_at(self, offset: int) -> Entry | None:
        """The batch or marker holding ``offset``, if any."""
        i = bisect.bisect_right(self.entry_offsets, offset) - 1
        if i < 0:
            return None
        entry = self.entries[i]
        return entry if entry.baseOffset <= offset < entry.next_offset else None

    def open_transaction_ids(self) -> dict[str, int]:
        """Transactional ids of the open transactions, with their first batch's max timestamp."""
        out: dict[str, int] = {}
        for first in self.ongoing.values():
            entry = self.entry_at(first)
            if isinstance(entry, Batch) and entry.transactionalId is not None:
                tid = entry.transactionalId
                out[tid] = min(out.get(tid, entry.maxTimestamp), entry.maxTimestamp)
        return out

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping ``[start, end)`` (Kafka's txn index lookup)."""
        i = bisect.bisect_left(self.aborted_last_offsets, start)
        aborted = self.aborted
        return [aborted[j] for j in range(i, len(aborted)) if aborted[j].firstOffset < end]


@dataclass
class TableSnapshot:
    """State of one table at one log version."""

    version: int = -1
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    partitions: list[PartitionState] = field(default_factory=list)
    producer_epochs: dict[int, int] = field(default_factory=dict)
    app_txns: dict[str, AppTxn] = field(default_factory=dict)
    offsets: dict[tuple[str, str, int], OffsetCommit] = field(default_factory=dict)
    pending_offsets: dict[int, dict[tuple[str, str, int], OffsetCommit]] = field(
        default_factory=dict
    )
    last_commit_timestamp: int = 0
    #: Set when a version failed half-way through :meth:`apply`: the state is unusable.
    torn: bool = False

    @property
    def num_partitions(self) -> int:
        """Number of partitions of the table."""
        return len(self.partitions)

    def partition(self, p: int) -> PartitionState:
        """State of partition ``p``.

        Raises:
            UnknownTopicOrPartitionError: If the table has no such partition.
        """
        if not 0 <= p < len(self.partitions):
            name = self.metadata.name if self.metadata else "?"
            raise UnknownTopicOrPartitionError(f"table {name} has no partition {p}")
        return self.partitions[p]

    def apply(self, version: int, actions: Iterable[Action], path: str | None = None) -> None:
        """Apply one log version in place.

        Raises:
            CorruptLogError: If the version does not follow the snapshot or an action is
                inconsistent with the state (an offset that does not continue its partition).
        """
        if self.torn:
            raise CorruptLogError("snapshot was torn by a damaged version; load it again", path)
        if version != self.version + 1:
            raise CorruptLogError(f"version {version} does not follow {self.version}", path)
        try:
            for action in actions:
                apply_action(self, action, path)
            if self.protocol is None or self.metadata is None:
                raise CorruptLogError("table has no protocol or metadata action", path)
        except BaseException:
            self.torn = True  # some actions applied, some not: never use this state again
            raise
        self.version = version


def _producer(part: PartitionState, pid: int) -> ProducerEntry:
    entry = part.producers.get(pid)
    if entry is None:
        entry = part.producers[pid] = ProducerEntry()
    return entry


def _append(part: PartitionState, entry: Entry, path: str | None) -> None:
    if entry.baseOffset != part.log_end_offset:
        raise CorruptLogError(
            f"{type(entry).__name__.lower()} at offset {entry.baseOffset} on partition "
            f"{part.partition} does not continue the log end offset {part.log_end_offset}",
            path,
        )
    part.entries.append(entry)
    part.entry_offsets.append(entry.baseOffset)
    part.log_end_offset = entry.next_offset


def apply_action(snap: TableSnapshot, action: Action, path: str | None = None) -> None:
    """Apply one action to a snapshot in place (the replay rules of the spec)."""
    if isinstance(action, Protocol):
        check_protocol(action)
        snap.protocol = action
    elif isinstance(action, Metadata):
        if action.partitions < len(snap.partitions):
            raise CorruptLogError("metadata reduces the number of partitions", path)
        snap.metadata = action
        for p in range(len(snap.partitions), action.partitions):
            snap.partitions.append(PartitionState(p))
    elif isinstance(action, Batch):
        part = _partition(snap, action.partition, path)
        _append(part, action, path)
        if action.producerId >= 0:
            _producer(part, action.producerId).record_batch(action)
            _raise_epoch(snap, action.producerId, action.producerEpoch)
            if action.transactional:
                part.ongoing.setdefault(action.producerId, action.baseOffset)
    elif isinstance(action, Marker):
        part = _partition(snap, action.partition, path)
        _append(part, action, path)
        part.ongoing.pop(action.producerId, None)
        _producer(part, action.producerId).record_marker(
            action.producerEpoch, action.coordinatorEpoch
        )
        _raise_epoch(snap, action.producerId, action.producerEpoch)
        pending = snap.pending_offsets.pop(action.producerId, None)
        if pending and action.type == "COMMIT":
            snap.offsets.update(pending)
    elif isinstance(action, AbortedTxn):
        part = _partition(snap, action.partition, path)
        part.aborted.append(action)
        part.aborted_last_offsets.append(action.lastOffset)
        if len(part.aborted_last_offsets) > 1 and (
            part.aborted_last_offsets[-2] > action.lastOffset
        ):
            raise CorruptLogError("aborted index entries out of order", path)
    elif isinstance(action, LogStart):
        part = _partition(snap, action.partition, path)
        part.log_start_offset = max(part.log_start_offset, min(action.offset, part.log_end_offset))
    elif isinstance(action, AppTxn):
        snap.app_txns[action.appId] = action
    elif isinstance(action, OffsetCommit):
        key = (action.group, action.table, action.partition)
        if action.producerId >= 0:
            snap.pending_offsets.setdefault(action.producerId, {})[key] = action
            _raise_epoch(snap, action.producerId, action.producerEpoch)
        else:
            snap.offsets[key] = action
    elif isinstance(action, CommitInfo):
        snap.last_commit_timestamp = max(snap.last_commit_timestamp, action.timestamp)


def _raise_epoch(snap: TableSnapshot, pid: int, epoch: int) -> None:
    if epoch > snap.producer_epochs.get(pid, -1):
        snap.producer_epochs[pid] = epoch


def _partition(snap: TableSnapshot, p: int, path: str | None) -> PartitionState:
    if not 0 <= p < len(snap.partitions):
        raise CorruptLogError(f"action names partition {p}, table has {len(snap.partitions)}", path)
    return snap.partitions[p]


def replay(versions: Iterable[tuple[int, list[Action]]]) -> TableSnapshot:
    """Build a snapshot from versions given in order, starting at version 0."""
    snap = TableSnapshot()
    for version, actions in versions:
        snap.apply(version, actions)
    return snap


def checkpoint_actions(snap: TableSnapshot) -> list[Action]:
    """Actions that, replayed as one version, rebuild ``snap`` exactly (a checkpoint).

    Batches and markers are kept in offset order per partition, so replaying them also
    rebuilds the producer state (epochs, last five batches, open transactions).
    """
    assert snap.protocol is not None and snap.metadata is not None
    out: list[Action] = [snap.protocol, snap.metadata]
    for part in snap.partitions:
        out.extend(part.entries)
        out.extend(part.aborted)
        if part.log_start_offset:
            out.append(LogStart(part.partition, part.log_start_offset))
    out.extend(snap.app_txns.values())
    # A committed transactional offset keeps its producer id; replayed as such it would be
    # pending again (its COMMIT marker is behind the checkpoint), so write it as plain.
    out.extend(
        replace(o, producerId=NO_PRODUCER_ID, producerEpoch=NO_PRODUCER_EPOCH)
        if o.producerId >= 0
        else o
        for o in snap.offsets.values()
    )
    if snap.last_commit_timestamp:
        out.append(CommitInfo(snap.last_commit_timestamp, "CHECKPOINT", ""))
    for pending in snap.pending_offsets.values():
        out.extend(pending.values())
    return out


def load_checkpoint(version: int, actions: list[Action], path: str | None = None) -> TableSnapshot:
    """Rebuild the snapshot at ``version`` from a checkpoint's actions."""
    snap = TableSnapshot(version=version - 1)
    snap.apply(version, actions, path)
    return snap
