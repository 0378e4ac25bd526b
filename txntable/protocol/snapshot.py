"""Snapshot reconstruction: log actions in, table state out. Pure; no I/O.

A snapshot is built by applying versions in order (from version 0, or from a checkpoint,
which is itself a list of actions). Applying a version costs O(actions in it), so a reader
that refreshes incrementally never pays for the history again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace

from txntable.errors import CorruptLogError, SchemaMismatchError, UnknownTopicOrPartitionError
from txntable.protocol.actions import (
    INTENT_WINDOW_VERSIONS,
    MAINTENANCE_PROTOCOL_VERSION,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    AbortedTxn,
    Action,
    AppTxn,
    Batch,
    CommitInfo,
    ExpireProducer,
    IntentOutcome,
    LogStart,
    Marker,
    Metadata,
    OffsetCommit,
    PartitionStart,
    ProducerSnapshot,
    Protocol,
    Segment,
    check_protocol,
)
from txntable.protocol.producer_state import BatchMetadata, ProducerEntry

Entry = Batch | Marker | Segment
#: Entries that hold records (a marker holds none).
DataEntry = Batch | Segment


def entry_size(entry: Entry) -> int:
    """Bytes of storage an entry's segment takes (a marker: none)."""
    return 0 if isinstance(entry, Marker) else entry.size


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
    #: Bytes of the retained segments (``retention.bytes`` compares against it).
    size_bytes: int = 0
    #: Bumped whenever entries are replaced (merge, compaction) or dropped (log start):
    #: tells an incremental reader of this snapshot (the Delta mirror) that entries it
    #: already saw changed. Not part of the state: a loaded snapshot starts at 0.
    rewrites: int = field(default=0, compare=False)
    #: Producers whose entries this partition may change in place; ``None``: all of them.
    #: A copy (:func:`_copy_partition`) starts with none: it shares the entries with the
    #: partition it was copied from, and copies one before its first change (a round's fork
    #: touches a few producers of a partition that holds hundreds).
    _owned: set[int] | None = field(default=None, compare=False, repr=False)

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
    #: Group commit: intents decided within the dedup window, by id.
    intents: dict[str, IntentOutcome] = field(default_factory=dict)
    #: Set when a version failed half-way through :meth:`apply`: the state is unusable.
    torn: bool = False
    #: A fork's partitions still shared with the snapshot it was forked from (copied on
    #: their first change).
    _shared: set[int] = field(default_factory=set, repr=False, compare=False)
    #: The ids of ``intents`` by their base version: the window's oldest are forgotten at
    #: every version, and finding them by a pass over all of them (thousands at W=256) cost
    #: a fifth of applying a version.
    _intent_bases: dict[int, list[str]] = field(default_factory=dict, repr=False, compare=False)

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

    def apply(
        self,
        version: int,
        actions: Iterable[Action],
        path: str | None = None,
        checkpoint: bool = False,
    ) -> None:
        """Apply one log version (or, with ``checkpoint``, a v2 checkpoint) in place.

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
                apply_action(self, action, path, checkpoint)
            if self.protocol is None or self.metadata is None:
                raise CorruptLogError("table has no protocol or metadata action", path)
        except BaseException:
            self.torn = True  # some actions applied, some not: never use this state again
            raise
        self.version = version
        self._forget_intents()

    def remember_intent(self, outcome: IntentOutcome) -> None:
        """Record a decided intent (until :meth:`_forget_intents` drops it)."""
        self.intents[outcome.id] = outcome
        self._intent_bases.setdefault(outcome.baseVersion, []).append(outcome.id)

    def _forget_intents(self) -> None:
        """Drop decided intents that no writer can submit again (outside the window)."""
        horizon = self.version - INTENT_WINDOW_VERSIONS
        for base in [b for b in self._intent_bases if b < horizon]:
            for intent_id in self._intent_bases.pop(base):
                kept = self.intents.get(intent_id)
                if kept is not None and kept.baseVersion == base:
                    del self.intents[intent_id]

    def become(self, other: TableSnapshot) -> None:
        """Take ``other``'s whole state, in place: a handle that fell behind log cleanup
        reloads from a checkpoint, and whoever holds this snapshot sees the new state."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))

    def fork(self) -> TableSnapshot:
        """A copy to plan a group-commit round on: changes to it never reach this snapshot.

        Cheap: partitions are shared until the fork first changes one (then that one is
        copied), and the top-level maps are copied shallowly (their values are immutable).
        """
        if self.torn:
            raise CorruptLogError("snapshot was torn by a damaged version; load it again")
        return replace(
            self,
            partitions=list(self.partitions),
            producer_epochs=dict(self.producer_epochs),
            app_txns=dict(self.app_txns),
            offsets=dict(self.offsets),
            pending_offsets={pid: dict(p) for pid, p in self.pending_offsets.items()},
            intents=dict(self.intents),
            _intent_bases={base: list(ids) for base, ids in self._intent_bases.items()},
            _shared=set(range(len(self.partitions))),
        )


def _producer(part: PartitionState, pid: int) -> ProducerEntry:
    """Producer ``pid``'s entry of ``part``, to change (a shared one is copied first)."""
    entry = part.producers.get(pid)
    owned = part._owned
    if entry is None:
        entry = part.producers[pid] = ProducerEntry()
    elif owned is None or pid in owned:
        return entry
    else:
        entry = part.producers[pid] = entry.copy()
    if owned is not None:
        owned.add(pid)
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
    part.size_bytes += entry_size(entry)


def _replace_range(part: PartitionState, seg: Segment, path: str | None) -> None:
    """Swap the entries covering exactly ``[seg.baseOffset, seg.endOffset)`` for ``seg``."""
    where = f"segment [{seg.baseOffset}, {seg.endOffset}) on partition {part.partition}"
    if seg.endOffset > part.last_stable_offset:
        raise CorruptLogError(f"{where} reaches past the LSO {part.last_stable_offset}", path)
    offsets = part.entry_offsets
    i = bisect.bisect_left(offsets, seg.baseOffset)
    j = bisect.bisect_left(offsets, seg.endOffset, i)
    if i >= len(offsets) or offsets[i] != seg.baseOffset or j <= i:
        raise CorruptLogError(f"{where} does not start at a retained entry", path)
    if part.entries[j - 1].next_offset != seg.endOffset:
        raise CorruptLogError(f"{where} does not end at an entry boundary", path)
    part.size_bytes -= sum(entry_size(e) for e in part.entries[i:j])
    part.rewrites += 1
    part.entries[i:j] = [seg]
    offsets[i:j] = [seg.baseOffset]
    part.size_bytes += seg.size
    # Index entries of transactions wholly inside the range describe nothing any more.
    lo = bisect.bisect_left(part.aborted_last_offsets, seg.baseOffset)
    hi = bisect.bisect_left(part.aborted_last_offsets, seg.endOffset, lo)
    if hi > lo:
        kept = [a for a in part.aborted[lo:hi] if a.firstOffset < seg.baseOffset]
        part.aborted[lo:hi] = kept
        part.aborted_last_offsets[lo:hi] = [a.lastOffset for a in kept]


def retained_from(part: PartitionState) -> int:
    """Where a v2 partition's retained entries begin: the log start offset, or the first
    offset of an open transaction below it.

    Delete-records may pass an open transaction's first offset, but its first batch names
    the transaction (its ``transactionalId``), which a writer needs to abort it once timed
    out; keeping everything from that batch on keeps the entries contiguous, as a v2
    checkpoint writes them. (Not the LSO: it never falls below the log start offset.)
    """
    if not part.ongoing:
        return part.log_start_offset
    return min(part.log_start_offset, *part.ongoing.values())


def _drop_below_log_start(part: PartitionState) -> None:
    """Forget entries and index entries wholly below :func:`retained_from` (v2 replay)."""
    start = retained_from(part)
    i = bisect.bisect_right(part.entry_offsets, start) - 1
    if i >= 0 and part.entries[i].next_offset <= start:
        i += 1
    if i > 0:
        part.size_bytes -= sum(entry_size(e) for e in part.entries[:i])
        part.rewrites += 1
        del part.entries[:i]
        del part.entry_offsets[:i]
    k = bisect.bisect_left(part.aborted_last_offsets, start)
    if k:
        del part.aborted[:k]
        del part.aborted_last_offsets[:k]


def _check_typed_metadata(snap: TableSnapshot, action: Metadata, path: str | None) -> None:
    """A typed table's metadata needs protocol v3 and may only evolve its schema."""
    from txntable.protocol.schema import TYPED_PROTOCOL_VERSION, check_evolution, layout_of

    if snap.protocol is None or snap.protocol.minReaderVersion < TYPED_PROTOCOL_VERSION:
        raise CorruptLogError("a record schema of its own needs protocol version 3", path)
    old = layout_of(snap.metadata) if snap.metadata is not None else None
    if snap.metadata is None:
        return
    new = layout_of(action)
    if old is None or new is None or old.key_columns != new.key_columns:
        raise CorruptLogError("metadata changes the record kind or the key columns", path)
    try:
        check_evolution(old.schema, new.schema)
    except SchemaMismatchError as e:
        raise CorruptLogError(f"metadata changes the record schema illegally: {e}", path) from None


def apply_action(
    snap: TableSnapshot, action: Action, path: str | None = None, checkpoint: bool = False
) -> None:
    """Apply one action to a snapshot in place (the replay rules of the spec).

    With ``checkpoint`` the action comes from a v2 checkpoint, which holds state rather
    than history: entries are appended without touching producer state (``producerState``
    actions carry it), and the checkpoint-only actions are allowed.
    """
    if checkpoint and isinstance(action, Batch | Marker | Segment):
        _append(_partition(snap, action.partition, path), action, path)
        return
    if isinstance(action, Protocol):
        check_protocol(action)
        old = snap.protocol
        if old is not None and (
            action.minReaderVersion < old.minReaderVersion
            or action.minWriterVersion < old.minWriterVersion
        ):
            # A client of the lower version would misread what the table holds: typed
            # segments (3), merged segments and a truncated log (2).
            raise CorruptLogError(
                f"protocol {{{action.minReaderVersion}, {action.minWriterVersion}}} lowers "
                f"the table's {{{old.minReaderVersion}, {old.minWriterVersion}}}",
                path,
            )
        snap.protocol = action
        if action.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION:
            for p in range(len(snap.partitions)):
                _drop_below_log_start(_partition(snap, p, path))
    elif isinstance(action, Metadata):
        if action.partitions < len(snap.partitions):
            raise CorruptLogError("metadata reduces the number of partitions", path)
        if action.typed or (snap.metadata is not None and snap.metadata.typed):
            _check_typed_metadata(snap, action, path)
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
        first = part.ongoing.pop(action.producerId, None)
        if first is not None and first < part.log_start_offset and _v2(snap):
            # The transaction kept its entries below the log start; it is closed now.
            _drop_below_log_start(part)
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
        if _v2(snap):
            # v2: nothing below the log start is ever read again; v1 keeps the entries.
            _drop_below_log_start(part)
    elif isinstance(action, Segment):
        _replace_range(_partition(snap, action.partition, path), action, path)
    elif isinstance(action, ExpireProducer):
        _expire_producer(snap, action.producerId, path)
    elif isinstance(action, PartitionStart | ProducerSnapshot):
        if not checkpoint:
            raise CorruptLogError(f"{action.NAME} is only valid in a checkpoint", path)
        _restore(snap, action, path)
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
        for outcome in action.intents:
            snap.remember_intent(outcome)


def _v2(snap: TableSnapshot) -> bool:
    """Whether the snapshot's protocol forgets entries below the log start (v2 and later)."""
    return snap.protocol is not None and (
        snap.protocol.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION
    )


def _expire_producer(snap: TableSnapshot, pid: int, path: str | None) -> None:
    if pid in snap.pending_offsets or any(pid in p.ongoing for p in snap.partitions):
        raise CorruptLogError(f"expireProducer {pid}: the producer has an open transaction", path)
    for p, part in enumerate(snap.partitions):
        if pid in part.producers:
            _partition(snap, p, path).producers.pop(pid)
    snap.producer_epochs.pop(pid, None)


def _restore(
    snap: TableSnapshot, action: PartitionStart | ProducerSnapshot, path: str | None
) -> None:
    part = _partition(snap, action.partition, path)
    if isinstance(action, PartitionStart):
        if part.entries or part.log_end_offset:
            raise CorruptLogError(f"partitionStart {action.partition} is not first", path)
        part.log_start_offset = action.logStartOffset
        part.log_end_offset = action.baseOffset
        return
    entry = _producer(part, action.producerId)
    entry.epoch = action.epoch
    entry.batches.clear()
    entry.batches.extend(BatchMetadata(*b) for b in action.batches)
    entry.coordinator_epoch = action.coordinatorEpoch
    entry.last_timestamp = action.lastTimestamp
    if action.currentTxnFirstOffset >= 0:
        entry.current_txn_first_offset = action.currentTxnFirstOffset
        part.ongoing[action.producerId] = action.currentTxnFirstOffset
    _raise_epoch(snap, action.producerId, action.epoch)


def producer_snapshot(partition: int, pid: int, entry: ProducerEntry) -> ProducerSnapshot:
    """The checkpoint form of one producer's state on one partition."""
    first = entry.current_txn_first_offset
    return ProducerSnapshot(
        partition=partition,
        producerId=pid,
        epoch=entry.epoch,
        batches=tuple((b.first_seq, b.last_seq, b.base_offset, b.count) for b in entry.batches),
        currentTxnFirstOffset=-1 if first is None else first,
        coordinatorEpoch=entry.coordinator_epoch,
        lastTimestamp=entry.last_timestamp,
    )


def _raise_epoch(snap: TableSnapshot, pid: int, epoch: int) -> None:
    if epoch > snap.producer_epochs.get(pid, -1):
        snap.producer_epochs[pid] = epoch


def _partition(snap: TableSnapshot, p: int, path: str | None) -> PartitionState:
    """Partition ``p`` of ``snap``, to change (a fork copies it first)."""
    if not 0 <= p < len(snap.partitions):
        raise CorruptLogError(f"action names partition {p}, table has {len(snap.partitions)}", path)
    if p in snap._shared:
        snap._shared.discard(p)
        snap.partitions[p] = _copy_partition(snap.partitions[p])
    return snap.partitions[p]


def _copy_partition(part: PartitionState) -> PartitionState:
    """A copy whose changes never reach ``part``: its lists and maps are its own (entries
    themselves are immutable) and its producer entries are copied on their first change
    (see :func:`_producer`). Like a fork's shared partitions, the copy assumes ``part`` is
    not changed while the copy is in use."""
    return replace(
        part,
        entries=list(part.entries),
        entry_offsets=list(part.entry_offsets),
        aborted=list(part.aborted),
        aborted_last_offsets=list(part.aborted_last_offsets),
        ongoing=dict(part.ongoing),
        producers=dict(part.producers),
        _owned=set(),
    )


def replay(versions: Iterable[tuple[int, list[Action]]]) -> TableSnapshot:
    """Build a snapshot from versions given in order, starting at version 0."""
    snap = TableSnapshot()
    for version, actions in versions:
        snap.apply(version, actions)
    return snap


def checkpoint_actions(snap: TableSnapshot) -> list[Action]:
    """The v2 checkpoint of ``snap``: its state, not its history.

    Per partition: ``partitionStart``, the retained entries in offset order (batches,
    markers, merged segments), the aborted index, and one ``producerState`` per producer
    (Kafka's producer snapshot), so the checkpoint stays O(live state) after merges,
    retention and producer expiry. Loaded with :func:`load_checkpoint` (``state=True``).
    """
    assert snap.protocol is not None and snap.metadata is not None
    out: list[Action] = [snap.protocol, snap.metadata]
    for part in snap.partitions:
        first = part.entries[0].baseOffset if part.entries else part.log_end_offset
        out.append(PartitionStart(part.partition, part.log_start_offset, first))
        out.extend(part.entries)
        out.extend(part.aborted)
        out.extend(
            producer_snapshot(part.partition, pid, entry)
            for pid, entry in sorted(part.producers.items())
        )
    out.extend(snap.app_txns.values())
    # A committed transactional offset keeps its producer id; replayed as such it would be
    # pending again (its COMMIT marker is behind the checkpoint), so write it as plain.
    out.extend(
        replace(o, producerId=NO_PRODUCER_ID, producerEpoch=NO_PRODUCER_EPOCH)
        if o.producerId >= 0
        else o
        for o in snap.offsets.values()
    )
    if snap.last_commit_timestamp or snap.intents:
        out.append(
            CommitInfo(
                snap.last_commit_timestamp,
                "CHECKPOINT",
                "",
                intents=tuple(sorted(snap.intents.values(), key=lambda o: (o.version, o.id))),
            )
        )
    for pending in snap.pending_offsets.values():
        out.extend(pending.values())
    return out


def load_checkpoint(
    version: int, actions: list[Action], path: str | None = None, state: bool = False
) -> TableSnapshot:
    """Rebuild the snapshot at ``version`` from a checkpoint's actions.

    ``state``: a v2 checkpoint (:func:`checkpoint_actions`); else a v1 checkpoint, which is
    replayed as one version.
    """
    if state:
        started = [a.partition for a in actions if isinstance(a, PartitionStart)]
        if len(set(started)) != len(started):
            raise CorruptLogError("a partition has two partitionStart actions", path)
    snap = TableSnapshot(version=version - 1)
    snap.apply(version, actions, path, checkpoint=state)
    return snap
