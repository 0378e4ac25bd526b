"""Producer fencing over S3: a new instance of a transactional id fences the old one."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from s3util import S3Location, drain

from txntable import Producer, Warehouse
from txntable.errors import ProducerFencedError
from txntable.txn.coordinator import TransactionCoordinator, TxnState

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_second_instance_fences_first_and_aborts_its_transaction(
    s3_location: S3Location, make_producer: Callable[..., Producer]
) -> None:
    # Two warehouse handles, as two separate programs would have.
    wh1 = Warehouse(s3_location.url, storage_options=s3_location.options)
    wh2 = Warehouse(s3_location.url, storage_options=s3_location.options)
    wh1.create_table("orders", partitions=2)

    old = make_producer(wh1, transactional_id="etl")
    old.init_transactions()
    old.begin_transaction()
    old.send("orders", value=b"committed", partition=0)
    old.commit_transaction()  # offsets 0 (data), 1 (COMMIT)

    old.begin_transaction()
    flushed = [
        old.send("orders", value=b"zombie-0", partition=0),
        old.send("orders", value=b"zombie-1", partition=1),
    ]
    old.flush()  # in the log now, transaction Ongoing
    assert [(f.result().partition, f.result().offset) for f in flushed] == [(0, 2), (1, 0)]
    pid, old_epoch = old.producer_id, old.producer_epoch
    table = wh1.table("orders")
    assert [p.last_stable_offset for p in table.describe().partitions] == [2, 0]

    new = make_producer(wh2, transactional_id="etl")
    new.init_transactions()  # fences `old` and aborts its open transaction
    # Same producer id, a newer epoch (bumped once for the abort, once for the new instance).
    assert new.producer_id == pid
    assert new.producer_epoch > old_epoch

    # The zombie's transaction is aborted: ABORT markers at p0 offset 3, p1 offset 1; then
    # the fence of the table its first (one-log) transaction registered: p0 offset 4.
    parts = wh2.table("orders").describe().partitions
    assert [(p.high_watermark, p.last_stable_offset) for p in parts] == [(5, 5), (2, 2)]
    assert all(p.open_transactions == () for p in parts)
    meta, _ = TransactionCoordinator(wh2.store).load("etl")  # type: ignore[misc]
    assert meta.state is TxnState.EMPTY
    assert (meta.producer_id, meta.producer_epoch) == (pid, new.producer_epoch)

    # The old instance: its next write is refused with ProducerFencedError, and from then
    # on every call raises it (Kafka: fatal).
    late = old.send("orders", value=b"zombie-late", partition=0)
    with pytest.raises(ProducerFencedError):
        late.result(timeout=30)
    with pytest.raises(ProducerFencedError):
        old.send("orders", value=b"zombie-later", partition=0)
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    with pytest.raises(ProducerFencedError):
        old.begin_transaction()

    # The new instance works; nothing of the zombie is visible read_committed.
    new.begin_transaction()
    ok = new.send("orders", value=b"new", partition=1)
    new.commit_transaction()
    assert (ok.result().partition, ok.result().offset) == (1, 2)

    committed, positions = drain(wh2, "orders", 2, "read_committed")
    assert [(r.offset, r.value) for r in committed[0]] == [(0, b"committed")]
    assert [(r.offset, r.value) for r in committed[1]] == [(2, b"new")]
    assert positions == {0: 5, 1: 4}
    uncommitted, _ = drain(wh2, "orders", 2, "read_uncommitted")
    values = {r.value for recs in uncommitted.values() for r in recs}
    assert {b"zombie-0", b"zombie-1"} <= values  # in the log, but aborted
    assert not {b"zombie-late", b"zombie-later"} & values  # refused: never in the log

    # The abort is recorded in the aborted-transaction index of both partitions (and the
    # fence in partition 0's).
    log_objects = {k: v for k, v in s3_location.objects().items() if "/orders/_log/" in k}
    aborted = [
        json.loads(line)["abortedTxn"]
        for data in log_objects.values()
        for line in data.splitlines()
        if line.strip() and "abortedTxn" in json.loads(line)
    ]
    assert sorted((a["partition"], a["producerId"]) for a in aborted) == [
        (0, pid),
        (0, pid),
        (1, pid),
    ]
    wh1.store.close()
    wh2.store.close()
