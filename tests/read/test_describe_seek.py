"""describe(), end offsets under both isolation levels, seek and position semantics."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tableutil import offsets_values

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    IllegalStateError,
    InvalidOffsetError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TableNotFoundError,
    UnknownTopicOrPartitionError,
)
from txntable.protocol.actions import Batch, CommitPlan, LogStart, Segment
from txntable.table import OpenTransaction, PartitionDescription, ProducerDescription
from txntable.txn.coordinator import TransactionCoordinator
from txntable.util import now_ms

MakeProducer = Callable[..., Producer]
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def send(p: Producer, partition: int, *values: bytes) -> list[int]:
    futures = [p.send("t", value=v, partition=partition) for v in values]
    p.flush()
    return [f.result(timeout=10).offset for f in futures]


@pytest.fixture
def scenario(wh: Warehouse, make_producer: MakeProducer) -> tuple[Warehouse, Producer, Producer]:
    """p0: 3 idempotent records (0-2), then txn A open at 3-4.
    p1: txn A at 0, then txn B commits 1-2 with its marker at 3."""
    wh.create_table("t", partitions=2)
    idem = make_producer(wh)
    a = make_producer(wh, transactional_id="A")
    b = make_producer(wh, transactional_id="B")
    a.init_transactions()
    b.init_transactions()
    assert send(idem, 0, b"i0", b"i1", b"i2") == [0, 1, 2]
    a.begin_transaction()
    assert send(a, 0, b"a3", b"a4") == [3, 4]
    assert send(a, 1, b"a0") == [0]
    b.begin_transaction()
    assert send(b, 1, b"b1", b"b2") == [1, 2]
    b.commit_transaction()
    return wh, a, b


def test_describe_exact(scenario: tuple[Warehouse, Producer, Producer]) -> None:
    wh, a, b = scenario
    table = wh.table("t")
    desc = table.describe()
    assert desc.name == "t" and desc.table_id
    snap = table.snapshot()
    batches = [[e for e in p.entries if isinstance(e, Batch)] for p in snap.partitions]
    idem, a0 = batches[0]  # p0: the idempotent batch 0-2, then A's 3-4
    a1, b1 = batches[1]  # p1: A's 0, then B's 1-2

    loaded = TransactionCoordinator(wh.store).load("A")
    assert loaded is not None
    started = loaded[0].txn_start_timestamp  # the coordinator's, not a record's timestamp

    def producers(*states: tuple[Batch, int, int | None]) -> tuple[ProducerDescription, ...]:
        """(batch, last sequence, open transaction's first offset) of each producer, by id."""
        return tuple(
            ProducerDescription(b.producerId, 0, seq, b.maxTimestamp, first)
            for b, seq, first in sorted(states, key=lambda s: s[0].producerId)
        )

    assert desc.partitions == (
        PartitionDescription(
            0, 0, 5, 3, (OpenTransaction(a.producer_id, 3, "A", a0.minTimestamp, started),),
            producers=producers((idem, 2, None), (a0, 1, 3)),
            segments=2,
            segment_bytes=idem.size + a0.size,
        ),
        PartitionDescription(
            1, 0, 4, 0, (OpenTransaction(a.producer_id, 0, "A", a1.minTimestamp, started),),
            producers=producers((a1, 0, 0), (b1, 1, None)),
            segments=2,
            segment_bytes=a1.size + b1.size,
        ),
    )
    assert a0.producerId == a1.producerId == a.producer_id != b1.producerId
    version = desc.version
    a.abort_transaction()  # ABORT markers: p0 at 5, p1 at 4, in one version
    desc = wh.table("t").describe()
    assert desc.version == version + 1
    assert [
        (p.partition, p.log_start_offset, p.high_watermark, p.last_stable_offset,
         p.open_transactions, p.segments)
        for p in desc.partitions
    ] == [(0, 0, 6, 6, (), 2), (1, 0, 5, 5, (), 2)]


def test_describe_counts_merged_segments(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("t", partitions=2)
    p = make_producer(wh)
    for i in range(3):
        send(p, 0, b"x%d" % i)
    table = wh.table("t")
    table.optimize()
    (merged,) = table.snapshot().partition(0).entries
    assert isinstance(merged, Segment)
    send(p, 0, b"after")
    (after,) = [e for e in table.snapshot().partition(0).entries if isinstance(e, Batch)]
    d = table.describe()
    assert [(q.segments, q.segment_bytes) for q in d.partitions] == [
        (2, merged.size + after.size), (0, 0),
    ]


def test_an_open_transaction_starts_when_its_coordinator_says(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    # Record timestamps are the producer's (here 5 ms after the epoch): not a start time.
    wh.create_table("t", partitions=1)
    p = make_producer(wh, transactional_id="old-stamps")
    p.init_transactions()
    before = now_ms()
    p.begin_transaction()
    future = p.send("t", value=b"v", partition=0, timestamp=5)
    p.flush()
    future.result(timeout=10)
    (opened,) = wh.table("t").describe().partitions[0].open_transactions
    assert opened.start_timestamp == 5
    assert opened.txn_start_timestamp is not None
    assert before <= opened.txn_start_timestamp <= now_ms()
    p.abort_transaction()


def test_end_offsets_both_isolation_levels(scenario: tuple[Warehouse, Producer, Producer]) -> None:
    wh, a, _ = scenario
    rc = Consumer(wh, isolation_level="read_committed")
    ru = Consumer(wh, isolation_level="read_uncommitted")
    assert rc.end_offsets([T0, T1]) == {T0: 3, T1: 0}
    assert ru.end_offsets([T0, T1]) == {T0: 5, T1: 4}
    assert rc.beginning_offsets([T0, T1]) == {T0: 0, T1: 0}
    # auto_offset_reset=latest starts at the end offset of the isolation level.
    rc.assign([T0, T1])
    ru.assign([T0, T1])
    assert (rc.position(T0), rc.position(T1)) == (3, 0)
    assert (ru.position(T0), ru.position(T1)) == (5, 4)
    a.commit_transaction()
    assert rc.end_offsets([T0, T1]) == {T0: 6, T1: 5}
    assert ru.end_offsets([T0, T1]) == {T0: 6, T1: 5}
    got = rc.poll(timeout_ms=0)
    assert offsets_values(got[T0]) == [(3, b"a3"), (4, b"a4")]
    assert offsets_values(got[T1]) == [(0, b"a0"), (1, b"b1"), (2, b"b2")]
    assert (rc.position(T0), rc.position(T1)) == (6, 5)


def test_seek_into_middle_of_batch(scenario: tuple[Warehouse, Producer, Producer]) -> None:
    wh, _, _ = scenario
    for level in ("read_committed", "read_uncommitted"):
        c = Consumer(wh, isolation_level=level)
        c.assign([T0])
        c.seek(T0, 1)
        assert c.position(T0) == 1
        got = c.poll(timeout_ms=0)
        expected = [(1, b"i1"), (2, b"i2")]
        if level == "read_uncommitted":
            expected += [(3, b"a3"), (4, b"a4")]
        assert offsets_values(got[T0]) == expected
        assert c.position(T0) == (3 if level == "read_committed" else 5)
        c.seek(T0, 4)
        got = c.poll(timeout_ms=0)
        assert offsets_values(got.get(T0, [])) == (
            [] if level == "read_committed" else [(4, b"a4")]
        )


def test_max_records_splits_a_batch(scenario: tuple[Warehouse, Producer, Producer]) -> None:
    wh, _, _ = scenario
    c = Consumer(wh, isolation_level="read_uncommitted")
    c.assign([T0])
    c.seek_to_beginning()
    assert offsets_values(c.poll(timeout_ms=0, max_records=2)[T0]) == [(0, b"i0"), (1, b"i1")]
    assert c.position(T0) == 2
    assert offsets_values(c.poll(timeout_ms=0, max_records=2)[T0]) == [(2, b"i2"), (3, b"a3")]
    assert offsets_values(c.poll(timeout_ms=0, max_records=2)[T0]) == [(4, b"a4")]
    assert c.poll(timeout_ms=0) == {}
    assert c.position(T0) == 5


def test_seek_into_aborted_range_skips_it(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("t", partitions=2)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    assert send(p, 0, b"x0", b"x1", b"x2") == [0, 1, 2]
    assert send(p, 0, b"x3") == [3]
    p.abort_transaction()  # ABORT at 4
    p.begin_transaction()
    assert send(p, 0, b"c5", b"c6") == [5, 6]
    p.commit_transaction()  # COMMIT at 7
    for start in (1, 3, 4):
        c = Consumer(wh, isolation_level="read_committed")
        c.assign([T0])
        c.seek(T0, start)
        assert offsets_values(c.poll(timeout_ms=0)[T0]) == [(5, b"c5"), (6, b"c6")], start
        assert c.position(T0) == 8
    c = Consumer(wh, isolation_level="read_committed")
    c.assign([T0])
    c.seek(T0, 6)
    assert offsets_values(c.poll(timeout_ms=0)[T0]) == [(6, b"c6")]
    c.seek(T0, 7)  # the COMMIT marker itself
    assert c.poll(timeout_ms=0) == {} and c.position(T0) == 8
    u = Consumer(wh, isolation_level="read_uncommitted")
    u.assign([T0])
    u.seek(T0, 2)
    assert [o for o, _ in offsets_values(u.poll(timeout_ms=0)[T0])] == [2, 3, 5, 6]


def test_position_out_of_range(wh: Warehouse, make_producer: MakeProducer) -> None:
    table = wh.create_table("t", partitions=2)
    p = make_producer(wh)
    assert send(p, 0, b"a", b"b", b"c") == [0, 1, 2]
    strict = Consumer(wh, isolation_level="read_uncommitted", auto_offset_reset="none")
    strict.assign([T0])
    with pytest.raises(NoOffsetForPartitionError):
        strict.position(T0)
    strict.seek(T0, 4)
    with pytest.raises(OffsetOutOfRangeError, match="offset 4 outside"):
        strict.poll(timeout_ms=0)
    strict.seek(T0, 3)  # the high watermark itself is a valid position
    assert strict.poll(timeout_ms=0) == {}
    earliest = Consumer(wh, auto_offset_reset="earliest")
    earliest.assign([T0])
    earliest.seek(T0, 99)
    assert [r.offset for r in earliest.poll(timeout_ms=0)[T0]] == [0, 1, 2]
    with pytest.raises(InvalidOffsetError, match="got -1"):
        earliest.seek(T0, -1)
    # Moving the log start offset (delete-records) shows in describe and seek_to_beginning.
    snap = table.snapshot()
    table.log.commit(snap, lambda s: CommitPlan([LogStart(0, 2)], None))
    assert wh.table("t").describe().partitions[0].log_start_offset == 2
    earliest.seek_to_beginning([T0])
    assert earliest.position(T0) == 2
    assert [r.offset for r in earliest.poll(timeout_ms=0)[T0]] == [2]
    strict.seek(T0, 1)
    with pytest.raises(OffsetOutOfRangeError):
        strict.poll(timeout_ms=0)


def test_assignment_errors(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2)
    c = Consumer(wh)
    with pytest.raises(UnknownTopicOrPartitionError):
        c.assign([TopicPartition("t", 2)])
    with pytest.raises(TableNotFoundError):
        c.assign([TopicPartition("nope", 0)])
    c.assign([T0])
    assert c.assignment() == {T0}
    with pytest.raises(IllegalStateError):
        c.seek(T1, 0)
    c.close()
    with pytest.raises(IllegalStateError):
        c.poll(timeout_ms=0)


def test_poll_rotates_partitions_so_none_starves(wh: Warehouse) -> None:
    from txntable import Consumer, Producer, TopicPartition

    wh.create_table("r", partitions=3)
    with Producer(wh) as p:
        for part in range(3):
            for i in range(10):
                p.send("r", value=b"%d-%d" % (part, i), partition=part)
    c = Consumer(wh, auto_offset_reset="earliest")
    tps = [TopicPartition("r", part) for part in range(3)]
    c.assign(tps)
    firsts = [next(iter(c.poll(max_records=2))) for _ in range(3)]
    assert sorted(tp.partition for tp in firsts) == [0, 1, 2]


def test_delete_records_moves_the_log_start_offset(wh: Warehouse) -> None:
    from txntable import Consumer, Producer, TopicPartition
    from txntable.errors import OffsetOutOfRangeError

    wh.create_table("d", partitions=2)
    with Producer(wh) as p:
        for i in range(6):
            p.send("d", value=b"%d" % i, partition=0)
    table = wh.table("d")
    with pytest.raises(OffsetOutOfRangeError):
        table.delete_records({0: 7})
    assert table.delete_records({0: 4, 1: -1}) == {0: 4, 1: 0}
    assert table.delete_records({0: 2}) == {0: 4}  # never moves backwards
    assert [p.log_start_offset for p in table.describe().partitions] == [4, 0]
    tp = TopicPartition("d", 0)
    c = Consumer(wh, auto_offset_reset="earliest")
    c.assign([tp])
    c.seek(tp, 1)  # below the log start: reset to earliest = 4
    assert [(r.offset, r.value) for r in c.poll(max_records=10)[tp]] == [(4, b"4"), (5, b"5")]
    c.seek_to_beginning()
    assert c.position(tp) == 4


def test_delete_records_on_a_stale_handle_validates_against_the_newest_version(
    wh: Warehouse,
) -> None:
    wh.create_table("d", partitions=1)
    stale = wh.table("d")
    assert stale.describe().partitions[0].high_watermark == 0  # cached: high watermark 0
    with Producer(Warehouse(store=wh.store)) as p:
        for i in range(7):
            p.send("d", value=b"%d" % i)
    assert stale.delete_records({0: 5}) == {0: 5}
    assert stale.delete_records({0: -1}) == {0: 7}
    assert wh.table("d").describe().partitions[0].log_start_offset == 7
    # Out of range against the newest version too: still refused, and nothing written.
    version = stale.describe().version
    with pytest.raises(OffsetOutOfRangeError, match="high watermark is 7"):
        stale.delete_records({0: 8})
    assert wh.table("d").describe().version == version
