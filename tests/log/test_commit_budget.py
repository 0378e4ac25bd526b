"""A storage outage is a timeout, bounded by the commit's time budget (issue 25.7).

``Log.commit`` used to count a failed put as a lost race and give up after 50 attempts with
``CommitConflictError`` — neither a timeout nor a conflict. Now an outage is retried until
the budget is spent and then raised as ``KafkaTimeoutError`` (outcome unknown), with group
commit on (its direct path) and off; a table that only ever loses races still reports
``CommitConflictError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from tableutil import ReadFaultStore, is_log_version, read_all

from txntable import Producer, Warehouse
from txntable.errors import (
    CommitConflictError,
    KafkaTimeoutError,
    ObjectExistsError,
    TransientStorageError,
)
from txntable.protocol.append import PendingBatch

MakeProducer = Callable[..., Producer]
GROUP_COMMIT = pytest.mark.parametrize("group_commit", [True, False], ids=["gc", "no-gc"])


def _warehouse(store: ReadFaultStore, group_commit: bool) -> Warehouse:
    wh = Warehouse(store=store, group_commit=group_commit)
    wh.create_table("t", partitions=1)
    return wh


def _batch(wh: Warehouse, seq: int) -> PendingBatch:
    """A written one-record segment of producer 7, at sequence ``seq``."""
    from txntable.protocol.records import encode_table, to_record_table

    rows = to_record_table({"value": [b"v%d" % seq]}, 1_700_000_000_000)
    data = encode_table(rows)
    path = f"t/data/0/seg-{seq}.parquet"
    wh.store.put_data_file(path, data)
    return PendingBatch(
        partition=0,
        path=path,
        count=1,
        size=len(data),
        producer_id=7,
        producer_epoch=0,
        base_sequence=seq,
        transactional=False,
        min_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_000,
    )


@GROUP_COMMIT
def test_an_outage_longer_than_the_budget_is_a_timeout(
    fault_store: ReadFaultStore, group_commit: bool
) -> None:
    wh = _warehouse(fault_store, group_commit)
    table = wh.table("t")
    fault = fault_store.fail_before_write(is_log_version, times=10**6, ops={"put_if_absent"})
    start = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="outcome is unknown") as info:
        table.append([_batch(wh, 0)], timeout_ms=300)
    assert 0.25 < time.monotonic() - start < 10
    assert isinstance(info.value.__cause__, TransientStorageError)
    assert fault.fired > 1  # retried, not given up at the first failure
    fault_store.clear()
    # The retry of the same idempotent batch lands once.
    result, _ = table.append([_batch(wh, 0)], timeout_ms=5_000)
    assert result.base_offsets == [0]
    assert read_all(wh, "t", [0], "read_uncommitted") == {0: [(0, b"v0")]}


@GROUP_COMMIT
def test_an_outage_within_the_budget_is_ridden_out(
    fault_store: ReadFaultStore, group_commit: bool
) -> None:
    wh = _warehouse(fault_store, group_commit)
    table = wh.table("t")
    table.log.backoff_max_ms = 5  # quick retries: the test counts attempts, not time
    fault = fault_store.fail_before_write(is_log_version, times=60, ops={"put_if_absent"})
    result, _ = table.append([_batch(wh, 0)], timeout_ms=60_000)
    assert result.base_offsets == [0] and fault.fired == 60  # more than the old 50 attempts
    assert read_all(wh, "t", [0], "read_uncommitted") == {0: [(0, b"v0")]}


def test_losing_every_race_for_the_budget_is_a_conflict(fault_store: ReadFaultStore) -> None:
    wh = _warehouse(fault_store, group_commit=False)
    table = wh.table("t")
    fault_store.fail_before_write(
        is_log_version, times=10**6, exc=ObjectExistsError("lost"), ops={"put_if_absent"}
    )
    with pytest.raises(CommitConflictError, match="nothing was written"):
        table.append([_batch(wh, 0)], timeout_ms=300)


@GROUP_COMMIT
def test_a_producer_batch_during_a_log_outage_expires_with_a_timeout(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    wh = _warehouse(fault_store, group_commit)
    p = make_producer(wh, linger_ms=0, delivery_timeout_ms=300)
    assert p.send("t", value=b"a", partition=0).get(10).offset == 0
    fault_store.fail_before_write(is_log_version, times=10**6, ops={"put_if_absent"})
    start = time.monotonic()
    with pytest.raises(KafkaTimeoutError):
        p.send("t", value=b"lost", partition=0).get(30)
    assert time.monotonic() - start < 10  # the delivery timeout, not a 120 s default
    fault_store.clear()
    assert p.send("t", value=b"b", partition=0).get(10).offset == 1  # KIP-360: no gap
