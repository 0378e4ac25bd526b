"""Planning an append: validate pending batches and markers against a snapshot, assign offsets.

Pure functions of (snapshot, pending writes). :meth:`Log.commit` calls :func:`plan_append`
again after every lost race, so offsets are always rebased onto the newest version and
sequence/epoch validation always sees every batch committed before it. Data files are never
rewritten on rebase: only ``baseOffset`` in the small log entry changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txntable.errors import InvalidProducerEpochError, InvalidTxnStateError
from txntable.protocol.actions import (
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    AbortedTxn,
    Action,
    AppTxn,
    Batch,
    CommitPlan,
    Marker,
    MarkerType,
)
from txntable.protocol.producer_state import check_batch
from txntable.protocol.snapshot import TableSnapshot


@dataclass(frozen=True)
class PendingBatch:
    """A segment already written to storage, waiting for its offsets."""

    partition: int
    path: str
    count: int
    size: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = NO_SEQUENCE
    transactional: bool = False
    min_timestamp: int = 0
    max_timestamp: int = 0
    transactional_id: str | None = None

    @property
    def last_sequence(self) -> int:
        """Sequence of the batch's last record."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.count - 1) % (2**31)


@dataclass(frozen=True)
class PendingMarker:
    """A transaction marker to write on one partition (skipped if nothing is open there)."""

    partition: int
    producer_id: int
    producer_epoch: int
    type: MarkerType
    coordinator_epoch: int = 0


@dataclass
class AppendResult:
    """Base offset of each pending batch (in input order) and which were duplicates."""

    base_offsets: list[int] = field(default_factory=list)
    duplicates: list[bool] = field(default_factory=list)
    marker_offsets: dict[int, int] = field(default_factory=dict)


def plan_append(
    snap: TableSnapshot,
    batches: list[PendingBatch],
    markers: list[PendingMarker] = (),  # type: ignore[assignment]
    app_txn: AppTxn | None = None,
    now: int = 0,
) -> CommitPlan[AppendResult]:
    """Validate and place ``batches`` then ``markers`` after the snapshot's log end offsets.

    Raises:
        InvalidProducerEpochError: A batch or marker is from a fenced epoch.
        OutOfOrderSequenceError: A batch's sequence does not follow the producer's last.
        UnknownTopicOrPartitionError: A partition does not exist.
    """
    next_offset: dict[int, int] = {}
    # Transactions opened by batches of this very plan (a one-log commit: data + marker).
    opened: dict[tuple[int, int], int] = {}
    # (partition, producer) of batches that are duplicates: the version that committed them
    # holds their markers, so a stale copy of a one-log append closes nothing.
    duplicated: set[tuple[int, int]] = set()
    actions: list[Action] = []
    result = AppendResult()
    seen: set[tuple[int, int]] = set()
    for pb in batches:
        part = snap.partition(pb.partition)
        if (pb.partition, pb.producer_id) in seen and pb.producer_id != NO_PRODUCER_ID:
            raise InvalidTxnStateError("one append holds one batch per producer and partition")
        seen.add((pb.partition, pb.producer_id))
        if pb.producer_id != NO_PRODUCER_ID:
            duplicate = check_batch(
                part.producers.get(pb.producer_id),
                snap.producer_epochs.get(pb.producer_id, -1),
                pb.producer_id,
                pb.producer_epoch,
                pb.base_sequence,
                pb.last_sequence,
                pb.partition,
            )
            if duplicate is not None:
                result.base_offsets.append(duplicate.base_offset)
                result.duplicates.append(True)
                duplicated.add((pb.partition, pb.producer_id))
                continue
        base = next_offset.get(pb.partition, part.log_end_offset)
        next_offset[pb.partition] = base + pb.count
        if pb.transactional and pb.producer_id not in part.ongoing:
            opened.setdefault((pb.partition, pb.producer_id), base)
        actions.append(
            Batch(
                partition=pb.partition,
                baseOffset=base,
                count=pb.count,
                path=pb.path,
                size=pb.size,
                producerId=pb.producer_id,
                producerEpoch=pb.producer_epoch,
                baseSequence=pb.base_sequence,
                transactional=pb.transactional,
                minTimestamp=pb.min_timestamp,
                maxTimestamp=pb.max_timestamp,
                transactionalId=pb.transactional_id,
            )
        )
        result.base_offsets.append(base)
        result.duplicates.append(False)
    for pm in markers:
        part = snap.partition(pm.partition)
        if (pm.partition, pm.producer_id) in duplicated:
            continue  # before the epoch check, as the batch's: the retry did land
        table_epoch = snap.producer_epochs.get(pm.producer_id, -1)
        if pm.producer_epoch < table_epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {pm.producer_id} epoch {pm.producer_epoch} is fenced by "
                f"epoch {table_epoch}"
            )
        first = part.ongoing.get(pm.producer_id, opened.get((pm.partition, pm.producer_id)))
        if first is None and pm.producer_id in snap.pending_offsets:
            # A group offset log: the transaction holds offset commits, not batches.
            first = part.log_end_offset
        if first is None and 0 < pm.producer_epoch and table_epoch < pm.producer_epoch:
            # Nothing open, but the epoch is new to this log: the fence of a producer that
            # registered this partition and had not written here yet. Write the marker, as
            # Kafka writes one to every registered partition, so that the fenced epoch is
            # refused here afterwards (else its late batch or offset commit would land).
            first = next_offset.get(pm.partition, part.log_end_offset)
        if first is None:
            continue  # nothing open: the marker was already written (idempotent completion)
        offset = next_offset.get(pm.partition, part.log_end_offset)
        next_offset[pm.partition] = offset + 1
        actions.append(
            Marker(
                partition=pm.partition,
                offset=offset,
                producerId=pm.producer_id,
                producerEpoch=pm.producer_epoch,
                type=pm.type,
                coordinatorEpoch=pm.coordinator_epoch,
                timestamp=now,
            )
        )
        result.marker_offsets[pm.partition] = offset
        if pm.type == "ABORT":
            others = [
                f for pid, f in part.ongoing.items() if pid != pm.producer_id
            ] + [
                f
                for (p, pid), f in opened.items()
                if p == pm.partition and pid != pm.producer_id
            ]
            lso = min(others, default=offset + 1)
            actions.append(AbortedTxn(pm.partition, pm.producer_id, first, offset, lso))
        opened.pop((pm.partition, pm.producer_id), None)
    if app_txn is not None and actions:
        actions.append(app_txn)
    return CommitPlan(actions, result, "TXN_MARKERS" if markers and not batches else "WRITE")
