"""Kafka's read_committed fetch scenarios (FetcherTest), end to end through the public API.

Every producer here flushes only when told to, so each ``send`` + ``flush`` places exactly
one batch and the offsets below are exact.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tableutil import drain, offsets_values, read_all

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.protocol.actions import AbortedTxn, CommitPlan, Marker
from txntable.protocol.append import PendingMarker

TP = TopicPartition("orders", 0)
MakeProducer = Callable[..., Producer]


@pytest.fixture
def orders(wh: Warehouse) -> Warehouse:
    wh.create_table("orders", partitions=1)
    return wh


def send_batch(p: Producer, *values: bytes) -> list[int]:
    """Send ``values`` as one batch on partition 0; return their offsets."""
    futures = [p.send("orders", value=v, partition=0) for v in values]
    p.flush()
    return [f.result(timeout=10).offset for f in futures]


def committed_consumer(wh: Warehouse, level: str = "read_committed") -> Consumer:
    c = Consumer(wh, isolation_level=level)
    c.assign([TP])
    c.seek_to_beginning()
    return c


def test_return_committed_transactions(orders: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(orders, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    assert send_batch(p, b"1", b"2") == [0, 1]
    p.commit_transaction()
    c = committed_consumer(orders)
    batch = c.poll(timeout_ms=0)
    assert list(batch) == [TP]
    assert offsets_values(batch[TP]) == [(0, b"1"), (1, b"2")]
    assert all(r.topic == "orders" and r.partition == 0 for r in batch[TP])
    assert c.position(TP) == 3  # past the COMMIT marker at 2
    assert c.end_offsets([TP]) == {TP: 3}


def test_skipping_aborted_transactions_advances_position(
    orders: Warehouse, make_producer: MakeProducer
) -> None:
    p = make_producer(orders, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    assert send_batch(p, b"1", b"2") == [0, 1]
    epoch = p.producer_epoch
    p.abort_transaction()
    assert p.producer_epoch == epoch + 1  # every completed transaction bumps it (KIP-890)
    c = committed_consumer(orders)
    assert c.poll(timeout_ms=0) == {}
    assert c.position(TP) == 3  # skipped the batch and the ABORT marker
    part = orders.table("orders").snapshot().partition(0)
    marker = part.entries[-1]
    assert isinstance(marker, Marker)
    assert (marker.offset, marker.type) == (2, "ABORT")
    assert (marker.producerId, marker.producerEpoch) == (p.producer_id, epoch)
    assert part.aborted == [AbortedTxn(0, p.producer_id, 0, 2, 3)]


def test_return_aborted_transactions_in_uncommitted_mode(
    orders: Warehouse, make_producer: MakeProducer
) -> None:
    p = make_producer(orders, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    send_batch(p, b"1", b"2")
    p.abort_transaction()
    c = committed_consumer(orders, "read_uncommitted")
    assert offsets_values(c.poll(timeout_ms=0)[TP]) == [(0, b"1"), (1, b"2")]
    assert c.position(TP) == 3


def test_multiple_abort_markers(orders: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(orders, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    assert send_batch(p, b"abort1-1", b"abort1-2") == [0, 1]
    epoch = p.producer_epoch  # the aborted transaction's epoch; the producer moves past it
    p.abort_transaction()  # ABORT marker at 2
    table = orders.table("orders")
    version = table.snapshot().version
    # The writer itself never duplicates a marker: nothing is open, so nothing is written.
    result, v = table.append([], [PendingMarker(0, p.producer_id, epoch, "ABORT")])
    assert v == version and result.marker_offsets == {}
    assert table.snapshot().version == version
    # Force a raw duplicate ABORT marker at offset 3.
    snap = table.snapshot()
    dup = Marker(0, 3, p.producer_id, epoch, "ABORT")
    table.log.commit(snap, lambda s: CommitPlan([dup], None))
    assert table.snapshot().partition(0).entries[-1] == dup
    p.begin_transaction()
    assert send_batch(p, b"commit1-1", b"commit1-2") == [4, 5]
    p.commit_transaction()  # COMMIT marker at 6
    c = committed_consumer(orders)
    assert offsets_values(drain(c, [TP])[TP]) == [(4, b"commit1-1"), (5, b"commit1-2")]
    assert c.position(TP) == 7
    assert read_all(orders, "orders", [0], "read_uncommitted")[0] == [
        (0, b"abort1-1"),
        (1, b"abort1-2"),
        (4, b"commit1-1"),
        (5, b"commit1-2"),
    ]


def test_interleaved_producers_return_committed_in_offset_order(
    orders: Warehouse, make_producer: MakeProducer
) -> None:
    """FetcherTest.testReadCommittedWithCompactedTopic, with dense offsets."""
    p1, p2, p3 = (make_producer(orders, transactional_id=f"tx-{i}") for i in (1, 2, 3))
    for p in (p1, p2, p3):
        p.init_transactions()
        p.begin_transaction()
    assert send_batch(p3, b"3", b"4") == [0, 1]
    assert send_batch(p2, b"5", b"6", b"7") == [2, 3, 4]
    assert send_batch(p1, b"9", b"10") == [5, 6]
    p2.abort_transaction()  # ABORT at 7
    assert send_batch(p3, b"12", b"13", b"14") == [8, 9, 10]
    assert send_batch(p1, b"15", b"16") == [11, 12]
    desc = orders.table("orders").describe().partitions[0]
    assert (desc.high_watermark, desc.last_stable_offset) == (13, 0)
    p3.commit_transaction()  # COMMIT at 13
    p1.commit_transaction()  # COMMIT at 14
    part = orders.table("orders").snapshot().partition(0)
    assert part.aborted == [AbortedTxn(0, p2.producer_id, 2, 7, 0)]
    assert [(e.baseOffset, e.type) for e in part.entries if isinstance(e, Marker)] == [
        (7, "ABORT"),
        (13, "COMMIT"),
        (14, "COMMIT"),
    ]
    c = committed_consumer(orders)
    assert offsets_values(drain(c, [TP])[TP]) == [
        (0, b"3"),
        (1, b"4"),
        (5, b"9"),
        (6, b"10"),
        (8, b"12"),
        (9, b"13"),
        (10, b"14"),
        (11, b"15"),
        (12, b"16"),
    ]
    assert c.position(TP) == 15
    assert [o for o, _ in read_all(orders, "orders", [0], "read_uncommitted")[0]] == [
        0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12,
    ]  # fmt: skip


def test_open_transaction_holds_back_later_committed_data(
    orders: Warehouse, make_producer: MakeProducer
) -> None:
    slow = make_producer(orders, transactional_id="slow")
    fast = make_producer(orders, transactional_id="fast")
    idem = make_producer(orders, enable_idempotence=True)
    slow.init_transactions()
    fast.init_transactions()
    slow.begin_transaction()
    assert send_batch(slow, b"s0") == [0]
    assert send_batch(idem, b"i1", b"i2") == [1, 2]
    fast.begin_transaction()
    assert send_batch(fast, b"f3") == [3]
    fast.commit_transaction()  # COMMIT at 4

    c = committed_consumer(orders)
    assert c.poll(timeout_ms=50) == {}
    assert c.position(TP) == 0
    assert c.end_offsets([TP]) == {TP: 0}
    u = committed_consumer(orders, "read_uncommitted")
    assert u.end_offsets([TP]) == {TP: 5}
    assert offsets_values(drain(u, [TP])[TP]) == [(0, b"s0"), (1, b"i1"), (2, b"i2"), (3, b"f3")]
    desc = orders.table("orders").describe().partitions[0]
    assert (desc.log_start_offset, desc.high_watermark, desc.last_stable_offset) == (0, 5, 0)
    assert [(t.producer_id, t.first_offset) for t in desc.open_transactions] == [
        (slow.producer_id, 0)
    ]

    slow.commit_transaction()  # COMMIT at 5
    got = c.poll(timeout_ms=0)
    assert offsets_values(got[TP]) == [(0, b"s0"), (1, b"i1"), (2, b"i2"), (3, b"f3")]
    assert c.position(TP) == 6
    assert c.end_offsets([TP]) == {TP: 6}
    desc = orders.table("orders").describe().partitions[0]
    assert (desc.high_watermark, desc.last_stable_offset, desc.open_transactions) == (6, 6, ())


def test_poll_waits_for_lso_to_advance(orders: Warehouse, make_producer: MakeProducer) -> None:
    """A committed reader's poll with a timeout sees the commit that happens while it waits."""
    import threading

    p = make_producer(orders, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    send_batch(p, b"x")
    c = committed_consumer(orders)
    timer = threading.Timer(0.2, p.commit_transaction)
    timer.start()
    try:
        got = c.poll(timeout_ms=10_000)
    finally:
        timer.join(30)
    assert not timer.is_alive()
    assert offsets_values(got[TP]) == [(0, b"x")]
