"""Producer batching, record fields and transaction bookkeeping through the public API."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from tableutil import log_versions, read_all

from txntable import (
    Consumer,
    Producer,
    RecordMetadata,
    TopicPartition,
    Warehouse,
)
from txntable.errors import InvalidTxnStateError
from txntable.protocol.actions import Batch, Marker
from txntable.storage.wrappers import LatencyStore

MakeProducer = Callable[..., Producer]
TP = TopicPartition("t", 0)


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=2)
    return wh


def test_a_send_that_waits_for_memory_is_stamped_when_it_was_called(
    t: Warehouse, make_producer: MakeProducer
) -> None:
    """The send time is read before ``send`` blocks on a full buffer (Kafka's producer takes
    it before waiting for memory): a record that waited is not stamped with when it got in."""
    slow = Warehouse(store=LatencyStore(t.store, latency_ms=150))  # a round: >= 300 ms
    p = make_producer(slow, linger_ms=600_000, batch_size=1 << 30, buffer_memory=64 * 1024)
    p.send("t", value=b"x" * 40_000, partition=0)  # most of the buffer
    called = int(time.time() * 1000)
    waited = p.send("t", value=b"y" * 40_000, partition=0)  # waits for the round to free it
    returned = int(time.time() * 1000)
    assert returned - called >= 250  # it did wait
    p.flush()
    # Stamped at the call, not when the wait ended (the midpoint: robust to a slow machine).
    assert called <= waited.result(timeout=30).timestamp <= called + (returned - called) // 2


def test_record_fields_round_trip(t: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(t)
    f1 = p.send("t", value=b"v", key=b"k", partition=0, headers=[("h", b"1"), ("n", None)],
                timestamp=1_700_000_000_123)  # fmt: skip
    f2 = p.send("t", value=None, key=None, partition=0)
    p.flush()
    assert f1.result(timeout=10) == RecordMetadata("t", 0, 0, 1_700_000_000_123)
    md2 = f2.result(timeout=10)
    assert (md2.topic, md2.partition, md2.offset) == ("t", 0, 1)
    c = Consumer(t)
    c.assign([TP])
    c.seek_to_beginning()
    r1, r2 = c.poll(timeout_ms=0)[TP]
    assert (r1.topic, r1.partition, r1.offset, r1.key, r1.value) == ("t", 0, 0, b"k", b"v")
    assert r1.headers == [("h", b"1"), ("n", None)] and r1.timestamp == 1_700_000_000_123
    assert (r2.offset, r2.key, r2.value, r2.headers, r2.timestamp) == (
        1,
        None,
        None,
        [],
        md2.timestamp,
    )


def test_keyed_records_use_kafka_partitioning(t: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(t)
    # Kafka: toPositive(murmur2(key)) % 2 is 0 for b"21" and b"foobar", 1 for b"abc".
    futures = {k: p.send("t", value=b"x", key=k) for k in (b"21", b"abc", b"foobar")}
    p.flush()
    assert {k: f.result(timeout=10).partition for k, f in futures.items()} == {
        b"21": 0,
        b"abc": 1,
        b"foobar": 0,
    }


def test_flush_of_empty_buffer_does_not_leak_into_next_send(
    t: Warehouse, make_producer: MakeProducer
) -> None:
    """Regression: flush()/commit with nothing buffered made the next record skip linger_ms."""
    p = make_producer(t)  # linger_ms is ten minutes
    for _ in range(5):
        p.flush()
        f = p.send("t", value=b"x", partition=0)
        time.sleep(0.05)
        assert not f.done()
        p.flush()
        assert f.done()
    tx = make_producer(t, transactional_id="tx")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("t", value=b"a", partition=1)
    tx.flush()
    tx.commit_transaction()  # waits on an empty buffer
    tx.begin_transaction()
    f = tx.send("t", value=b"b", partition=1)
    time.sleep(0.05)
    assert not f.done()
    tx.commit_transaction()
    assert f.result(timeout=10).offset == 2


def test_linger_and_batch_size_trigger_sends(t: Warehouse, make_producer: MakeProducer) -> None:
    lingering = make_producer(t, linger_ms=30)
    f = lingering.send("t", value=b"x", partition=0)
    assert f.result(timeout=10).offset == 0  # no flush: linger_ms expired
    full = make_producer(t, batch_size=100)  # linger is ten minutes
    small = full.send("t", value=b"y" * 10, partition=1)
    time.sleep(0.05)
    assert not small.done()
    big = full.send("t", value=b"z" * 100, partition=1)  # the buffer reaches batch_size
    assert big.result(timeout=10).offset == 1 and small.result(timeout=10).offset == 0


def test_batches_and_sequences(t: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(t)
    for values in ([b"a", b"b"], [b"c"], [b"d", b"e", b"f"]):
        for v in values:
            p.send("t", value=v, partition=0)
        p.send("t", value=v, partition=1)
        p.flush()
    batches = [
        a for _, acts in log_versions(t.table("t").log) for a in acts if isinstance(a, Batch)
    ]
    assert [(b.partition, b.baseOffset, b.count, b.baseSequence) for b in batches] == [
        (0, 0, 2, 0), (1, 0, 1, 0), (0, 2, 1, 2), (1, 1, 1, 1), (0, 3, 3, 3), (1, 2, 1, 2),
    ]  # fmt: skip
    assert len({b.producerId for b in batches}) == 1 and batches[0].producerId >= 0
    assert all(b.producerEpoch == 0 and not b.transactional for b in batches)


def test_abort_drops_unsent_records(t: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(t, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    sent = p.send("t", value=b"sent", partition=0)
    p.flush()
    unsent = p.send("t", value=b"unsent", partition=1)
    p.abort_transaction()
    assert sent.result(timeout=10).offset == 0
    with pytest.raises(InvalidTxnStateError, match="transaction aborted before send"):
        unsent.result(timeout=10)
    desc = t.table("t").describe()
    assert [(d.high_watermark, d.last_stable_offset) for d in desc.partitions] == [(2, 2), (0, 0)]
    assert read_all(t, "t", [0, 1], "read_uncommitted") == {0: [(0, b"sent")], 1: []}
    assert read_all(t, "t", [0, 1], "read_committed") == {0: [], 1: []}


def test_buffered_transaction_commits_in_one_version(
    t: Warehouse, make_producer: MakeProducer
) -> None:
    p = make_producer(t, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    futures = [p.send("t", value=f"v{i}".encode(), partition=i % 2) for i in range(4)]
    p.commit_transaction()
    assert [(f.result(timeout=10).partition, f.result().offset) for f in futures] == [
        (0, 0), (1, 0), (0, 1), (1, 1),
    ]  # fmt: skip
    versions = log_versions(t.table("t").log)
    assert len(versions) == 2
    kinds = [(type(a).__name__, a.partition, a.baseOffset) for a in versions[1][1]
             if isinstance(a, Batch | Marker)]  # fmt: skip
    assert kinds == [("Batch", 0, 0), ("Batch", 1, 0), ("Marker", 0, 2), ("Marker", 1, 2)]
    assert read_all(t, "t", [0, 1], "read_committed") == {
        0: [(0, b"v0"), (1, b"v2")],
        1: [(0, b"v1"), (1, b"v3")],
    }


def test_transaction_spanning_flushes_and_tables(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    wh.create_table("a", partitions=1)
    wh.create_table("b", partitions=1)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    fa = p.send("a", value=b"a0", partition=0)
    p.flush()
    fb = p.send("b", value=b"b0", partition=0)
    assert read_all(wh, "a", [0], "read_committed") == {0: []}
    p.commit_transaction()
    assert (fa.result(timeout=10).offset, fb.result(timeout=10).offset) == (0, 0)
    assert read_all(wh, "a", [0], "read_committed") == {0: [(0, b"a0")]}
    assert read_all(wh, "b", [0], "read_committed") == {0: [(0, b"b0")]}
    assert [d.high_watermark for d in wh.table("a").describe().partitions] == [2]
    assert [d.high_watermark for d in wh.table("b").describe().partitions] == [2]


def test_an_unexpected_sender_failure_fails_its_batch_typed(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txntable.errors import InternalError

    wh.create_table("t", partitions=1)
    p = Producer(wh, linger_ms=0)
    monkeypatch.setattr(p.sender, "write_segments", lambda *a: 1 / 0)
    future = p.send("t", value=b"v")
    with pytest.raises(InternalError, match="ZeroDivisionError") as info:
        future.result(timeout=10)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    monkeypatch.undo()  # the next batch is healthy: the sender goes on with it
    assert p.send("t", value=b"w").result(timeout=10).offset == 0
    assert p.sender.is_alive()
    p.close(timeout=10)


def test_close_aborts_an_incomplete_transaction(wh: Warehouse) -> None:
    wh.create_table("c", partitions=1)
    p = Producer(wh, transactional_id="closing")
    p.init_transactions()
    p.begin_transaction()
    p.send("c", value=b"flushed", partition=0)
    p.flush()
    p.send("c", value=b"buffered", partition=0)
    p.close()
    part = wh.table("c").describe().partitions[0]
    assert part.open_transactions == () and part.last_stable_offset == part.high_watermark == 2
    c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TopicPartition("c", 0)])
    assert c.poll(timeout_ms=0) == {}
