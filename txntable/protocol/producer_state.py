"""Per-partition producer state and Kafka's sequence validation, as pure functions.

This mirrors Kafka's ``ProducerStateManager`` / ``ProducerAppendInfo``: for every producer id
a partition remembers the epoch, the last five batches (for duplicate detection), and the
first offset of its ongoing transaction. No I/O happens here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from txntable.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from txntable.protocol.actions import NO_PRODUCER_EPOCH, NO_SEQUENCE, Batch

#: How many batches per producer and partition are kept for duplicate detection (Kafka's 5).
NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class BatchMetadata:
    """What duplicate detection needs of a committed batch."""

    first_seq: int
    last_seq: int
    base_offset: int
    count: int


@dataclass
class ProducerEntry:
    """One producer's state on one partition."""

    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    current_txn_first_offset: int | None = None
    coordinator_epoch: int = -1
    last_timestamp: int = 0

    def copy(self) -> ProducerEntry:
        """An independent copy (a snapshot fork changes its own)."""
        return ProducerEntry(
            self.epoch,
            deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN),
            self.current_txn_first_offset,
            self.coordinator_epoch,
            self.last_timestamp,
        )

    @property
    def last_seq(self) -> int:
        """Last sequence number appended in the current epoch, or ``NO_SEQUENCE``."""
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """Return the retained batch with exactly these sequences in this epoch, if any."""
        if epoch != self.epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def record_batch(self, batch: Batch) -> None:
        """Update the entry with a committed batch (the replay side of validation)."""
        if batch.producerEpoch > self.epoch:
            self.epoch = batch.producerEpoch
            self.batches.clear()
        if batch.baseSequence != NO_SEQUENCE:
            self.batches.append(
                BatchMetadata(
                    batch.baseSequence, batch.last_sequence, batch.baseOffset, batch.count
                )
            )
        self.last_timestamp = max(self.last_timestamp, batch.maxTimestamp)
        if batch.transactional and self.current_txn_first_offset is None:
            self.current_txn_first_offset = batch.baseOffset

    def record_marker(self, epoch: int, coordinator_epoch: int) -> None:
        """Close the ongoing transaction (the replay side of a marker)."""
        if epoch > self.epoch:
            self.epoch = epoch
            self.batches.clear()
        self.coordinator_epoch = max(self.coordinator_epoch, coordinator_epoch)
        self.current_txn_first_offset = None


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Kafka's rule: the next sequence follows the last, wrapping at int32 max."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def check_batch(
    entry: ProducerEntry | None,
    table_epoch: int,
    producer_id: int,
    epoch: int,
    first_seq: int,
    last_seq: int,
    partition: int,
) -> BatchMetadata | None:
    """Validate a batch against the producer's state on its partition.

    Args:
        entry: The producer's state on the partition, or ``None`` if it has none.
        table_epoch: Highest epoch of this producer id seen anywhere in the table.
        producer_id: The batch's producer id.
        epoch: The batch's producer epoch.
        first_seq: The batch's base sequence.
        last_seq: The batch's last sequence.
        partition: For error messages.

    Returns:
        The original batch if this one is a duplicate of one of the last five (the caller
        writes nothing and returns the original offsets), else ``None``.

    Raises:
        InvalidProducerEpochError: The epoch is older than one the table has seen (fenced).
        OutOfOrderSequenceError: The sequence does not follow the last one.
    """
    # As Kafka (UnifiedLog.analyzeAndValidateProducerState), a retry of a batch that is
    # already in the log gets its original offsets even if the producer was fenced since:
    # the batch did land, and saying otherwise would make the client count it as lost.
    if entry is not None and first_seq != NO_SEQUENCE:
        duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
        if duplicate is not None:
            return duplicate
    if epoch < table_epoch or (entry is not None and epoch < entry.epoch):
        raise InvalidProducerEpochError(
            f"producer {producer_id} epoch {epoch} is fenced by epoch "
            f"{max(table_epoch, entry.epoch if entry else -1)} on partition {partition}"
        )
    if first_seq == NO_SEQUENCE:
        return None
    if entry is None:
        # No state on the partition: a new producer, or one whose state expired
        # (producer.id.expiration.ms). As Kafka, accept whatever sequence it continues at.
        return None
    current_epoch = entry.epoch
    current_last = entry.last_seq
    if epoch != current_epoch or current_last == NO_SEQUENCE:
        # A new epoch (or a producer new to the partition) must start at sequence 0.
        if first_seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch} on partition {partition}: first "
                f"sequence must be 0, got {first_seq}"
            )
    elif not in_sequence(current_last, first_seq):
        raise OutOfOrderSequenceError(
            f"producer {producer_id} epoch {epoch} on partition {partition}: expected "
            f"sequence {(current_last + 1) % (INT32_MAX + 1)}, got {first_seq}"
        )
    return None
