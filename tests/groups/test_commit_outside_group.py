"""Offset commits of a consumer outside the group (``assign()``) while the group has live
members: refused, as Kafka refuses a commit without a generation to a non-empty group
(UNKNOWN_MEMBER_ID, a CommitFailedException); accepted again once the group is empty."""

from __future__ import annotations

import pytest

from txntable import Consumer, OffsetAndMetadata, Producer, TopicPartition, Warehouse
from txntable.errors import CommitFailedError, IllegalGenerationError
from txntable.groups import member
from txntable.groups.state import empty_group

T = "orders"
TP = TopicPartition(T, 0)


@pytest.fixture
def filled(wh: Warehouse) -> Warehouse:
    wh.create_table(T, partitions=1)
    with Producer(wh) as p:
        for i in range(10):
            p.send(T, value=b"%d" % i, partition=0)
    return wh


def _member(wh: Warehouse) -> Consumer:
    c = Consumer(wh, group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=50)
    c.subscribe([T])
    for _ in range(50):
        c.poll(10, max_records=1)
        if c.assignment() == {TP}:
            return c
    raise AssertionError("the member was never assigned the partition")


def test_assign_commit_is_refused_while_the_group_has_members(filled: Warehouse) -> None:
    live = _member(filled)
    live.commit({TP: OffsetAndMetadata(3)})
    outsider = Consumer(filled, group_id="g")
    outsider.assign([TP])

    with pytest.raises(CommitFailedError, match="live member"):
        outsider.commit({TP: OffsetAndMetadata(5)})

    assert live.committed(TP) == OffsetAndMetadata(3)
    live.close()  # a dynamic member leaves: the group is empty
    outsider.commit({TP: OffsetAndMetadata(5)})
    assert outsider.committed(TP) == OffsetAndMetadata(5)
    outsider.close()


def test_a_member_joining_after_the_check_fences_the_commit(
    filled: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The outsider saw the group empty; a member joined and fenced its generation before
    # the outsider's commit landed: the commit must not overwrite what the member reads.
    live = _member(filled)
    live.commit({TP: OffsetAndMetadata(3)})
    stale = (empty_group("g"), None)
    monkeypatch.setattr("txntable.consumer.load_group", lambda store, group: stale)
    outsider = Consumer(filled, group_id="g")
    outsider.assign([TP])

    with pytest.raises(IllegalGenerationError):
        outsider.commit({TP: OffsetAndMetadata(5)})

    assert live.committed(TP) == OffsetAndMetadata(3)
    live.close()
    outsider.close()


def test_a_group_without_members_takes_assign_commits(filled: Warehouse) -> None:
    c = Consumer(filled, group_id="fresh")
    c.assign([TP])
    c.commit({TP: OffsetAndMetadata(4)})
    assert c.committed(TP) == OffsetAndMetadata(4)
    assert member.load_group(filled.store, "fresh")[1] is None  # nothing was joined or created
    c.close()


def test_seek_in_on_partitions_assigned_wins_over_the_committed_offset(filled: Warehouse) -> None:
    from txntable.groups.subscription import ConsumerRebalanceListener

    setup = Consumer(filled, group_id="g")
    setup.assign([TP])
    setup.commit({TP: OffsetAndMetadata(2)})
    setup.close()
    c = Consumer(filled, group_id="g", auto_offset_reset="earliest")

    class SeekTo7(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            for tp in assigned:
                c.seek(tp, 7)

    c.subscribe([T], listener=SeekTo7())
    values = []
    for _ in range(50):
        for records in c.poll(10).values():
            values.extend(r.value for r in records)
        if values:
            break
    assert values == [b"7", b"8", b"9"]
    c.close()
