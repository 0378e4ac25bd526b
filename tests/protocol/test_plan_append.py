"""Append planning (``append.plan_append``): offsets, rebase, markers, aborted index. Pure."""

from __future__ import annotations

import dataclasses

import pytest
from tableutil import batch, snapshot_of

from txntable.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    UnknownTopicOrPartitionError,
)
from txntable.protocol.actions import (
    AbortedTxn,
    AppTxn,
    Batch,
    Marker,
)
from txntable.protocol.append import PendingBatch, PendingMarker, plan_append


def pending(partition: int, count: int = 1, pid: int = -1, seq: int = -1, **kw: object):
    epoch = kw.pop("epoch", 0 if pid >= 0 else -1)
    return PendingBatch(
        partition=partition,
        path=f"t/data/{partition}/x{seq}.parquet",
        count=count,
        size=10,
        producer_id=pid,
        producer_epoch=epoch,  # type: ignore[arg-type]
        base_sequence=seq,
        **kw,  # type: ignore[arg-type]
    )


def test_offsets_follow_the_log_end_per_partition() -> None:
    snap = snapshot_of([batch(0, 0, 3)], [batch(1, 0, 1)])
    plan = plan_append(snap, [pending(0, 2), pending(1, 4), pending(0, 1)])
    assert plan.result.base_offsets == [3, 1, 5]
    assert plan.result.duplicates == [False, False, False]
    assert [(a.partition, a.baseOffset, a.count) for a in plan.actions] == [  # type: ignore[union-attr]
        (0, 3, 2),
        (1, 1, 4),
        (0, 5, 1),
    ]
    assert plan.operation == "WRITE"


def test_rebase_onto_newer_snapshot_changes_only_base_offsets() -> None:
    ours = [pending(0, 2, pid=7, seq=0, transactional=True), pending(1, 1, pid=7, seq=0)]
    old = snapshot_of([batch(0, 0, 1)])
    new = snapshot_of([batch(0, 0, 1)], [batch(0, 1, 5), batch(1, 0, 2)])
    a = plan_append(old, ours, now=5)
    b = plan_append(new, ours, now=5)
    assert a.result.base_offsets == [1, 0] and b.result.base_offsets == [6, 2]
    assert len(a.actions) == len(b.actions) == 2
    for x, y in zip(a.actions, b.actions, strict=True):
        assert isinstance(x, Batch) and isinstance(y, Batch)
        assert x.baseOffset != y.baseOffset
        assert dataclasses.replace(x, baseOffset=0) == dataclasses.replace(y, baseOffset=0)


def test_markers_are_skipped_when_nothing_is_open() -> None:
    snap = snapshot_of([batch(0, 0, 1, pid=7, epoch=0, seq=0, txn=True)])
    plan = plan_append(
        snap, [], [PendingMarker(1, 7, 0, "COMMIT"), PendingMarker(0, 8, 0, "ABORT")]
    )
    assert plan.actions == [] and plan.result.marker_offsets == {}
    # … but written where the producer has an open transaction.
    plan = plan_append(
        snap, [], [PendingMarker(0, 7, 0, "COMMIT"), PendingMarker(1, 7, 0, "COMMIT")]
    )
    assert plan.actions == [Marker(0, 1, 7, 0, "COMMIT", 0, 0)]
    assert plan.result.marker_offsets == {0: 1}
    assert plan.operation == "TXN_MARKERS"


def test_abort_writes_index_entry_with_last_stable_offset() -> None:
    snap = snapshot_of(
        [batch(0, 0, 2, pid=1, epoch=0, seq=0, txn=True)],
        [batch(0, 2, 3, pid=2, epoch=0, seq=0, txn=True)],
        [batch(0, 5, 1)],
    )
    # Aborting pid 2 while pid 1 (first offset 0) is open: LSO stays 0.
    plan = plan_append(snap, [], [PendingMarker(0, 2, 0, "ABORT", coordinator_epoch=4)], now=77)
    assert plan.actions == [
        Marker(0, 6, 2, 0, "ABORT", coordinatorEpoch=4, timestamp=77),
        AbortedTxn(0, 2, 2, 6, 0),
    ]
    # Aborting pid 1 while pid 2 (first offset 2) is open: LSO becomes 2.
    plan = plan_append(snap, [], [PendingMarker(0, 1, 0, "ABORT")])
    assert plan.actions[1] == AbortedTxn(0, 1, 0, 6, 2)
    # Nothing else open: LSO is just past the marker.
    alone = snapshot_of([batch(0, 0, 2)], [batch(0, 2, 1, pid=3, epoch=0, seq=0, txn=True)])
    plan = plan_append(alone, [], [PendingMarker(0, 3, 0, "ABORT")])
    assert plan.actions == [Marker(0, 3, 3, 0, "ABORT"), AbortedTxn(0, 3, 2, 3, 4)]
    # A COMMIT writes no index entry.
    plan = plan_append(alone, [], [PendingMarker(0, 3, 0, "COMMIT")])
    assert plan.actions == [Marker(0, 3, 3, 0, "COMMIT")]


def test_batch_and_marker_in_one_plan() -> None:
    snap = snapshot_of([batch(0, 0, 1, pid=2, epoch=0, seq=0, txn=True)])
    plan = plan_append(
        snap,
        [pending(0, 2, pid=1, seq=0, transactional=True)],
        [PendingMarker(0, 1, 0, "ABORT")],
    )
    assert plan.result.base_offsets == [1]
    assert plan.actions[1:] == [Marker(0, 3, 1, 0, "ABORT"), AbortedTxn(0, 1, 1, 3, 0)]
    assert plan.operation == "WRITE"


def test_duplicate_batch_returns_original_offsets_and_writes_nothing() -> None:
    snap = snapshot_of([batch(0, 0, 3, pid=7, epoch=0, seq=0)], [batch(0, 3, 2)])
    plan = plan_append(snap, [pending(0, 3, pid=7, seq=0)])
    assert plan.actions == []
    assert plan.result.base_offsets == [0] and plan.result.duplicates == [True]
    # A duplicate next to a new batch: only the new one is written.
    plan = plan_append(snap, [pending(0, 3, pid=7, seq=0), pending(1, 1, pid=7, seq=0)])
    assert plan.result.base_offsets == [0, 0] and plan.result.duplicates == [True, False]
    assert len(plan.actions) == 1


def test_app_txn_only_with_actions() -> None:
    snap = snapshot_of([batch(0, 0, 1, pid=7, epoch=0, seq=0)])
    app = AppTxn("job", 3)
    assert plan_append(snap, [pending(0, 1, pid=7, seq=0)], app_txn=app).actions == []
    assert plan_append(snap, [pending(0, 1)], app_txn=app).actions[-1] == app


def test_validation_errors() -> None:
    snap = snapshot_of([batch(0, 0, 3, pid=7, epoch=2, seq=0)])
    with pytest.raises(OutOfOrderSequenceError):
        plan_append(snap, [pending(0, 1, pid=7, seq=5, epoch=2)])
    with pytest.raises(InvalidProducerEpochError):
        plan_append(snap, [pending(1, 1, pid=7, seq=0, epoch=1)])  # fenced on any partition
    with pytest.raises(InvalidProducerEpochError, match="marker for producer 7 epoch 1"):
        plan_append(snap, [], [PendingMarker(0, 7, 1, "ABORT")])
    with pytest.raises(UnknownTopicOrPartitionError):
        plan_append(snap, [pending(2, 1)])
    with pytest.raises(InvalidTxnStateError, match="one batch per producer and partition"):
        plan_append(
            snap, [pending(1, 1, pid=7, seq=0, epoch=2), pending(1, 1, pid=7, seq=1, epoch=2)]
        )
    # Two plain (non-idempotent) batches on one partition are fine.
    assert plan_append(snap, [pending(1, 1), pending(1, 2)]).result.base_offsets == [0, 1]
