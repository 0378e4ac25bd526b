"""Consumer.subscribe in one process: assignment spread, listeners, rebalances, fencing.

Several consumers of one group (threads of this process share nothing but the warehouse)
subscribe to a 6-partition table; each test polls them until the group is stable.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from txntable import (
    Consumer,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    CommitFailedError,
    FencedInstanceIdError,
    IllegalGenerationError,
    IllegalStateError,
)
from txntable.groups.member import load_group
from txntable.groups.subscription import ConsumerRebalanceListener
from txntable.storage import MemoryStore

T = "orders"
ALL = {TopicPartition(T, p) for p in range(6)}


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", set(assigned)))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.events.append(("lost", set(lost)))


@pytest.fixture
def wh() -> Iterator[Warehouse]:
    name = f"groups-{uuid.uuid4().hex}"
    w = Warehouse(store=MemoryStore(name))
    w.create_table(T, partitions=6)
    with Producer(w) as p:
        for i in range(60):
            p.send(T, value=b"%d" % i, partition=i % 6)
    yield w
    MemoryStore.drop(name)


def _consumer(wh: Warehouse, **kw: object) -> Consumer:
    args: dict[str, object] = dict(
        group_id="g",
        auto_offset_reset="earliest",
        session_timeout_ms=1500,
        heartbeat_interval_ms=50,
        partition_assignment_strategy="cooperative-sticky",
    )
    args.update(kw)
    return Consumer(wh, **args)  # type: ignore[arg-type]


def _settle(consumers: list[Consumer], wh: Warehouse, rounds: int = 50) -> None:
    for _ in range(rounds):
        for c in consumers:
            c.poll(0, max_records=1)
        state, _ = load_group(wh.store, "g")
        if (
            all(m.acked_generation == state.generation for m in state.members.values())
            and (sum(len(m.assignment) for m in state.members.values()) == 6)
            and all(
                c._subscription and c._subscription.generation == state.generation
                for c in consumers
            )
        ):
            return
        time.sleep(0.02)
    raise AssertionError(f"group did not settle: {load_group(wh.store, 'g')[0]}")


def _take_over_from(a: Consumer, wh: Warehouse) -> Consumer:
    """``a`` stops heartbeating (as if SIGSTOPped); a new member b joins, a's session
    expires and b takes every partition. Returns b."""
    assert a._subscription is not None
    a._subscription.stop_heartbeat()
    b = _consumer(wh)
    b.subscribe([T])
    time.sleep(1.6)
    for _ in range(20):
        b.poll(0, max_records=1)
        if b.assignment() == ALL:
            break
        time.sleep(0.05)
    assert b.assignment() == ALL
    return b


def test_three_consumers_two_partitions_each_and_cooperative_join(wh: Warehouse) -> None:
    listeners = [Recorder() for _ in range(4)]
    cs = [_consumer(wh) for _ in range(3)]
    try:
        for c, lis in zip(cs, listeners, strict=False):
            c.subscribe([T], listener=lis)
        _settle(cs, wh)
        parts = [c.assignment() for c in cs]
        assert sorted(len(p) for p in parts) == [2, 2, 2]
        assert set().union(*parts) == ALL
        for lis in listeners[:3]:
            lis.events.clear()
        # A fourth joins: exactly one partition moves, from one member to the new one;
        # every listener sees exactly that (cooperative: nothing else is revoked).
        d = _consumer(wh)
        d.subscribe([T], listener=listeners[3])
        cs.append(d)
        _settle(cs, wh)
        after = [c.assignment() for c in cs]
        moved = [before - now for before, now in zip(parts, after[:3], strict=True)]
        assert sorted(len(m) for m in moved) == [0, 0, 1]
        (moved_tp,) = set().union(*moved)
        assert after[3] == {moved_tp}
        for lis, m, before, now in zip(listeners[:3], moved, parts, after[:3], strict=True):
            revokes = [e for e in lis.events if e[0] == "revoked"]
            assert revokes == ([("revoked", m)] if m else [])
            assert all(e[1] == set() for e in lis.events if e[0] == "assigned")
            assert now == before - m
        assert [e for e in listeners[3].events if e[1]] == [("assigned", {moved_tp})]
    finally:
        for c in cs:
            c.close()


def test_every_record_once_across_rebalances_with_commits(wh: Warehouse) -> None:
    seen: list[bytes] = []
    a = _consumer(wh, enable_auto_commit=True, auto_commit_interval_ms=0)
    a.subscribe([T])
    try:
        for _ in range(5):
            for recs in a.poll(0, max_records=7).values():
                seen.extend(r.value for r in recs if r.value is not None)
        b = _consumer(wh, enable_auto_commit=True, auto_commit_interval_ms=0)
        b.subscribe([T])
        for _ in range(200):
            for c in (a, b):
                for recs in c.poll(0, max_records=3).values():
                    seen.extend(r.value for r in recs if r.value is not None)
            if len(seen) >= 60:
                break
        assert sorted(seen) == sorted(b"%d" % i for i in range(60))
        b.close()
    finally:
        a.close()


def test_stale_member_cannot_commit_after_its_partitions_moved(wh: Warehouse) -> None:
    a = _consumer(wh)
    a.subscribe([T])
    _settle([a], wh)
    a.poll(0, max_records=10)
    stale_gen = a.group_metadata().generation_id
    b = _take_over_from(a, wh)
    b.commit({TopicPartition(T, 0): OffsetAndMetadata(1)})
    with pytest.raises(CommitFailedError):
        a.commit({TopicPartition(T, 0): OffsetAndMetadata(5)})
    with pytest.raises(IllegalGenerationError):
        a.commit_for_generation({TopicPartition(T, 1): OffsetAndMetadata(5)}, stale_gen)
    assert b.committed(TopicPartition(T, 0)) == OffsetAndMetadata(1)
    # a's next poll finds itself out of the group: its partitions are lost, then it rejoins.
    lost = Recorder()
    a._subscription.listener = lost
    a.poll(0)
    assert lost.events and lost.events[0][0] == "lost"
    a.close()
    b.close()


def test_close_leaves_and_partitions_move_at_once(wh: Warehouse) -> None:
    a, b = _consumer(wh, session_timeout_ms=60_000), _consumer(wh, session_timeout_ms=60_000)
    a.subscribe([T])
    b.subscribe([T])
    _settle([a, b], wh)
    a.close()
    _settle([b], wh)
    assert b.assignment() == ALL
    b.close()
    state, _ = load_group(wh.store, "g")
    assert state.members == {}


def test_static_member_restart_keeps_its_partitions(wh: Warehouse) -> None:
    kw = dict(partition_assignment_strategy="range", session_timeout_ms=60_000)
    a = _consumer(wh, group_instance_id="host-a", **kw)
    b = _consumer(wh, group_instance_id="host-b", **kw)
    a.subscribe([T])
    b.subscribe([T])
    _settle([a, b], wh)
    mine = a.assignment()
    a.close()  # a static member does not leave
    state, _ = load_group(wh.store, "g")
    assert len(state.members) == 2
    a2 = _consumer(wh, group_instance_id="host-a", **kw)
    a2.subscribe([T])
    _settle([a2, b], wh)
    assert a2.assignment() == mine
    a2.close()
    b.close()


def test_a_duplicate_group_instance_id_fences_the_older_process(wh: Warehouse) -> None:
    # Kafka: the older process gets a fatal FencedInstanceIdError; it never re-joins (which
    # would fence the newer one in turn, rebalancing forever with both reading).
    kw = dict(partition_assignment_strategy="range", session_timeout_ms=60_000)
    lost = Recorder()
    old = _consumer(wh, group_instance_id="host-a", **kw)
    old.subscribe([T], listener=lost)
    _settle([old], wh)
    new = _consumer(wh, group_instance_id="host-a", **kw)
    new.subscribe([T])
    _settle([new], wh)
    generation = load_group(wh.store, "g")[0].generation

    with pytest.raises(FencedInstanceIdError):
        for _ in range(40):  # the fence is seen at the next heartbeat or poll
            old.poll(10)
    with pytest.raises(FencedInstanceIdError):
        old.poll(0)  # fatal: every later call raises too
    with pytest.raises(FencedInstanceIdError):
        old.commit({TopicPartition(T, 0): OffsetAndMetadata(1)})
    assert old.assignment() == set() and lost.events[-1] == ("lost", ALL)
    for _ in range(20):
        new.poll(10)
    state, _ = load_group(wh.store, "g")
    assert state.generation == generation and new.assignment() == ALL
    assert [m.group_instance_id for m in state.members.values()] == ["host-a"]
    old.close()
    new.close()


def test_pause_resume_and_api_misuse(wh: Warehouse) -> None:
    c = _consumer(wh)
    c.subscribe([T])
    _settle([c], wh)
    tp = TopicPartition(T, 0)
    c.pause([tp])
    assert c.paused() == {tp}
    got = {}
    for _ in range(10):
        got.update(c.poll(0, max_records=100))
    assert tp not in got and len(got) == 5
    c.resume([tp])
    assert tp in c.poll(0, max_records=100)
    with pytest.raises(IllegalStateError):
        c.assign([tp])
    c.unsubscribe()
    assert c.assignment() == set()
    c.assign([tp])
    with pytest.raises(IllegalStateError):
        c.subscribe([T])
    c.close()
    with pytest.raises(IllegalStateError):
        Consumer(wh).subscribe([T])


def test_pattern_subscription_picks_up_new_tables(wh: Warehouse) -> None:
    c = _consumer(wh, metadata_max_age_ms=0)
    c.subscribe(pattern=r"ord.*")
    _settle([c], wh)
    assert c.subscription() == {T} and c.assignment() == ALL
    wh.create_table("ordersx", partitions=2)
    wh.create_table("other", partitions=1)
    for _ in range(20):
        c.poll(0)
        if len(c.assignment()) == 8:
            break
    assert c.assignment() == ALL | {TopicPartition("ordersx", p) for p in range(2)}
    assert c.subscription() == {T, "ordersx"}
    c.close()


def test_a_subscribed_table_created_later_is_picked_up(wh: Warehouse) -> None:
    # Kafka refreshes metadata: subscribe(["t"]) before t exists receives t once created.
    c = _consumer(wh, heartbeat_interval_ms=50)
    c.subscribe(["later"])
    c.poll(10)
    assert c.assignment() == set()
    wh.create_table("later", partitions=2)
    with Producer(wh) as p:
        p.send("later", value=b"x", partition=1)
    got = []
    for _ in range(100):
        for records in c.poll(20).values():
            got.extend((r.partition, r.offset, r.value) for r in records)
        if got:
            break
    assert got == [(1, 0, b"x")]
    assert c.assignment() == {TopicPartition("later", 0), TopicPartition("later", 1)}
    c.close()


def test_a_consumer_that_stops_polling_leaves_and_loses_its_partitions(wh: Warehouse) -> None:
    slow = _consumer(wh, max_poll_interval_ms=400, session_timeout_ms=60_000)
    fast = _consumer(wh, session_timeout_ms=60_000)
    lost = Recorder()
    slow.subscribe([T], listener=lost)
    fast.subscribe([T])
    _settle([slow, fast], wh)
    assert len(slow.assignment()) == 3
    before = slow.assignment()
    time.sleep(0.8)  # no poll: its heartbeat thread leaves the group
    for _ in range(40):
        fast.poll(0, max_records=1)
        if fast.assignment() == ALL:
            break
        time.sleep(0.02)
    assert fast.assignment() == ALL
    with pytest.raises(CommitFailedError):
        slow.commit({next(iter(before)): OffsetAndMetadata(1)})
    slow.poll(0)  # finds itself out: lost, then joins again as a new member
    assert ("lost", before) in lost.events
    slow.close()
    fast.close()


def test_commit_before_joining_is_refused(wh: Warehouse) -> None:
    c = _consumer(wh)
    c.subscribe([T])
    with pytest.raises(CommitFailedError):
        c.commit({TopicPartition(T, 0): OffsetAndMetadata(1)})
    c.close()


def test_a_member_that_lost_a_rebalance_cannot_commit_offsets_in_a_transaction(
    wh: Warehouse,
) -> None:
    """KIP-447 with a real rebalance: consume-transform-produce by a member whose partitions
    moved while it was not polling; its transactional offset commit carries its old group
    metadata and is refused, and its transaction aborts with nothing visible."""
    wh.create_table("out", partitions=1)
    a = _consumer(wh, enable_auto_commit=False)  # its offsets go in transactions
    a.subscribe([T])
    _settle([a], wh)
    got = a.poll(0, max_records=60)
    stale = a.group_metadata()
    b = _take_over_from(a, wh)
    assert b.group_metadata().generation_id > stale.generation_id

    producer = Producer(wh, transactional_id="ctp-a")
    producer.init_transactions()
    producer.begin_transaction()
    for records in got.values():
        for r in records:
            producer.send("out", value=r.value, partition=0)
    offsets = {tp: OffsetAndMetadata(a.position(tp)) for tp in got}
    # Refused before the new owner committed anything: applying generation 2 fenced 1.
    with pytest.raises(IllegalGenerationError):
        producer.send_offsets_to_transaction(offsets, stale)
    producer.abort_transaction()
    producer.close()
    assert all(b.committed(TopicPartition(T, p)) is None for p in range(6))
    assert wh.table("out").scan(isolation_level="read_committed").to_arrow().num_rows == 0
    a.close()
    b.close()


def test_a_rebalance_elsewhere_does_not_fail_a_members_transaction(wh: Warehouse) -> None:
    # b keeps its partitions while c joins a and splits theirs (generations move, c fences
    # its own): b's next transaction commits its offsets without waiting for a heartbeat.
    wh.create_table("other", partitions=2)
    mine = {TopicPartition("other", p) for p in range(2)}
    a = _consumer(wh)
    b = _consumer(wh, session_timeout_ms=120_000, heartbeat_interval_ms=60_000,
                  enable_auto_commit=False)  # fmt: skip
    a.subscribe([T])
    b.subscribe(["other"])
    for _ in range(100):  # members see new generations at their heartbeats (50 ms)
        a.poll(10)
        b.poll(10)
        if a.assignment() == ALL and b.assignment() == mine:
            break
    assert a.assignment() == ALL and b.assignment() == mine
    stale = b.group_metadata()
    c = _consumer(wh)
    c.subscribe([T])
    for _ in range(100):
        a.poll(10)
        c.poll(10)
        if len(c.assignment()) == 3:
            break
    assert len(c.assignment()) == 3  # c was given a's released partitions and fenced
    assert load_group(wh.store, "g")[0].generation > stale.generation_id
    p = Producer(wh, transactional_id="b-txn")
    p.init_transactions()
    p.begin_transaction()
    offsets = {TopicPartition("other", 0): OffsetAndMetadata(0)}
    p.send_offsets_to_transaction(offsets, b.group_metadata())
    p.commit_transaction()
    assert b.committed(TopicPartition("other", 0)) == OffsetAndMetadata(0)
    b.poll(0)  # the next poll applies the generation it learnt, revoking nothing
    assert b.assignment() == mine
    p.close()
    for consumer in (a, b, c):
        consumer.close()
