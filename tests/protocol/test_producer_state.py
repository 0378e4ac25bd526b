"""Kafka's sequence and epoch validation (``producer_state.check_batch``). Pure, no I/O."""

from __future__ import annotations

import pytest
from tableutil import batch

from txntable.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from txntable.protocol.producer_state import (
    INT32_MAX,
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    ProducerEntry,
    check_batch,
    in_sequence,
)

PID = 42


def entry_with(*batches: tuple[int, int, int], epoch: int = 0) -> ProducerEntry:
    """A producer entry that committed batches given as (base_seq, count, base_offset)."""
    entry = ProducerEntry()
    for seq, count, offset in batches:
        entry.record_batch(batch(0, offset, count, pid=PID, epoch=epoch, seq=seq))
    return entry


def check(entry: ProducerEntry | None, epoch: int, first: int, last: int, table_epoch: int = -1):
    return check_batch(entry, table_epoch, PID, epoch, first, last, 0)


def test_producer_unknown_to_the_partition_may_start_at_any_sequence() -> None:
    # Kafka's rule: the state of an idle producer may have expired (producer.id.expiration.ms),
    # so a producer without state continues at whatever sequence it sends.
    assert check(None, 0, 0, 4) is None
    assert check(None, 0, 3, 4) is None


def test_known_producer_in_a_new_epoch_starts_at_zero() -> None:
    with pytest.raises(OutOfOrderSequenceError, match="first sequence must be 0, got 3"):
        check(entry_with((0, 3, 0)), 1, 3, 4)


def test_in_sequence_batches_are_accepted() -> None:
    entry = entry_with((0, 3, 0))
    assert entry.last_seq == 2
    assert check(entry, 0, 3, 3) is None


@pytest.mark.parametrize("n_batches", range(1, 9))
def test_duplicates_of_the_last_five_return_the_original(n_batches: int) -> None:
    # Batches of 2 records: sequences 0-1, 2-3, …; offsets 100, 110, …
    entry = entry_with(*[(2 * i, 2, 100 + 10 * i) for i in range(n_batches)])
    assert len(entry.batches) == min(n_batches, NUM_BATCHES_TO_RETAIN) == min(n_batches, 5)
    for i in range(n_batches):
        if i >= n_batches - 5:
            assert check(entry, 0, 2 * i, 2 * i + 1) == BatchMetadata(
                2 * i, 2 * i + 1, 100 + 10 * i, 2
            )
        else:  # older than the last five: not recognised, and not in sequence
            with pytest.raises(OutOfOrderSequenceError, match=f"expected sequence {2 * n_batches}"):
                check(entry, 0, 2 * i, 2 * i + 1)


def test_sixth_oldest_batch_is_out_of_order() -> None:
    entry = entry_with(*[(i, 1, i) for i in range(6)])  # sequences 0..5
    assert check(entry, 0, 1, 1) == BatchMetadata(1, 1, 1, 1)  # 5th oldest: duplicate
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 6, got 0"):
        check(entry, 0, 0, 0)


def test_partial_overlap_is_not_a_duplicate() -> None:
    entry = entry_with((0, 3, 0))
    with pytest.raises(OutOfOrderSequenceError):
        check(entry, 0, 1, 3)


def test_gap_is_out_of_order() -> None:
    entry = entry_with((0, 3, 0))
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 3, got 5"):
        check(entry, 0, 5, 5)
    with pytest.raises(OutOfOrderSequenceError):
        check(entry, 0, 4, 6)


@pytest.mark.parametrize(("table_epoch", "entry_epoch"), [(3, 0), (0, 3), (3, 3)])
def test_old_epoch_is_fenced(table_epoch: int, entry_epoch: int) -> None:
    entry = entry_with((0, 1, 0), epoch=entry_epoch)
    with pytest.raises(InvalidProducerEpochError, match="epoch 2 is fenced by epoch 3") as info:
        check(entry, 2, 1, 1, table_epoch=table_epoch)
    assert isinstance(info.value, ProducerFencedError)
    # As Kafka, the duplicate check comes first: the retry of a batch that landed gets its
    # offsets back even after the producer was fenced; anything else from it is refused.
    fenced_entry = entry_with((0, 1, 0), epoch=2)
    duplicate = check(fenced_entry, 2, 0, 0, table_epoch=3)
    assert duplicate is not None and duplicate.base_offset == 0
    with pytest.raises(InvalidProducerEpochError):
        check(fenced_entry, 2, 1, 1, table_epoch=3)


def test_new_epoch_must_start_at_zero() -> None:
    entry = entry_with((0, 5, 0), epoch=0)
    with pytest.raises(OutOfOrderSequenceError, match="epoch 1 .* must be 0, got 5"):
        check(entry, 1, 5, 5, table_epoch=0)
    assert check(entry, 1, 0, 0, table_epoch=0) is None
    # A batch repeating an old-epoch sequence under a new epoch is new data, not a duplicate.
    assert check(entry, 1, 0, 4, table_epoch=0) is None


def test_same_epoch_without_batches_must_start_at_zero() -> None:
    entry = ProducerEntry()
    entry.record_marker(epoch=4, coordinator_epoch=0)  # e.g. the fencing abort marker
    assert entry.epoch == 4 and entry.last_seq == -1
    with pytest.raises(OutOfOrderSequenceError):
        check(entry, 4, 1, 1, table_epoch=4)
    assert check(entry, 4, 0, 0, table_epoch=4) is None


def test_int32_wraparound() -> None:
    assert in_sequence(INT32_MAX, 0)
    assert not in_sequence(INT32_MAX, 1)
    assert in_sequence(5, 6) and not in_sequence(5, 5) and not in_sequence(5, 7)
    entry = entry_with((INT32_MAX - 2, 3, 0))  # ends exactly at INT32_MAX
    assert entry.last_seq == INT32_MAX
    assert check(entry, 0, 0, 1) is None
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 0, got 1"):
        check(entry, 0, 1, 1)
    # A batch whose sequences wrap: INT32_MAX-1, INT32_MAX, 0.
    b = batch(0, 3, 3, pid=PID, epoch=0, seq=INT32_MAX - 1)
    assert b.last_sequence == 0
    entry = entry_with((INT32_MAX - 3, 2, 0))
    assert check(entry, 0, INT32_MAX - 1, 0) is None
    entry.record_batch(b)
    assert entry.last_seq == 0
    assert check(entry, 0, 1, 1) is None
    assert check(entry, 0, INT32_MAX - 1, 0) == BatchMetadata(INT32_MAX - 1, 0, 3, 3)


def test_batches_without_sequence_are_not_validated() -> None:
    entry = entry_with((0, 3, 0))
    assert check(entry, 0, -1, -1) is None


def test_record_batch_and_marker_bookkeeping() -> None:
    entry = ProducerEntry()
    entry.record_batch(batch(0, 7, 2, pid=PID, epoch=1, seq=0, txn=True))
    entry.record_batch(batch(0, 9, 1, pid=PID, epoch=1, seq=2, txn=True))
    assert entry.current_txn_first_offset == 7 and entry.epoch == 1 and entry.last_seq == 2
    entry.record_marker(epoch=1, coordinator_epoch=3)
    assert entry.current_txn_first_offset is None and entry.coordinator_epoch == 3
    assert entry.last_seq == 2  # same epoch: the batches stay for duplicate detection
    entry.record_batch(batch(0, 11, 1, pid=PID, epoch=2, seq=0))
    assert [b.base_offset for b in entry.batches] == [11]
