"""Offset commits for tables or partitions that do not exist are refused (issue 25 item 6).

Kafka's broker answers an OffsetCommit / TxnOffsetCommit for an unknown topic partition with
UNKNOWN_TOPIC_OR_PARTITION; here the client checks before it writes, so nothing reaches the
group log and ``committed()`` never reports such an offset.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from txntable import Consumer, Producer, TopicPartition, Warehouse
from txntable.errors import UnknownTopicOrPartitionError
from txntable.groups.offsets import open_group_table
from txntable.protocol.actions import OffsetCommit
from txntable.structs import OffsetAndMetadata

MakeProducer = Callable[..., Producer]
GOOD = TopicPartition("t", 1)
BAD = [TopicPartition("t", 2), TopicPartition("t", -1), TopicPartition("nope", 0)]


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=2)
    return wh


def offset_commits(wh: Warehouse, group: str) -> list[tuple[str, int, int]]:
    table = open_group_table(wh.store, group, create=False)
    if table is None:
        return []
    snap = table.snapshot()
    return [
        (a.table, a.partition, a.offset)
        for v in range(1, snap.version + 1)
        for a in table.log.read_version(v) or []
        if isinstance(a, OffsetCommit)
    ]


@pytest.mark.parametrize("bad", BAD, ids=str)
def test_consumer_commit_refuses_unknown_partitions(t: Warehouse, bad: TopicPartition) -> None:
    c = Consumer(t, group_id="g")
    with pytest.raises(UnknownTopicOrPartitionError, match=bad.topic):
        c.commit({GOOD: OffsetAndMetadata(3), bad: OffsetAndMetadata(5)})
    with pytest.raises(UnknownTopicOrPartitionError):
        c.commit_async({bad: OffsetAndMetadata(5)}).result(timeout=10)
    assert offset_commits(t, "g") == []  # not even the good one: all or nothing
    assert c.committed(bad) is None
    c.commit({GOOD: OffsetAndMetadata(3)})
    assert c.committed(GOOD) == OffsetAndMetadata(3)
    assert offset_commits(t, "g") == [("t", 1, 3)]
    c.close()


@pytest.mark.parametrize("bad", BAD, ids=str)
def test_send_offsets_to_transaction_refuses_unknown_partitions(
    t: Warehouse, make_producer: MakeProducer, bad: TopicPartition
) -> None:
    p = make_producer(t, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"v", partition=0)
    with pytest.raises(UnknownTopicOrPartitionError, match=bad.topic):
        p.send_offsets_to_transaction({bad: OffsetAndMetadata(5)}, "g")
    # Refused before anything was written: the transaction goes on and commits.
    p.send_offsets_to_transaction({GOOD: OffsetAndMetadata(7)}, "g")
    p.commit_transaction()
    c = Consumer(t, group_id="g")
    assert c.committed(GOOD) == OffsetAndMetadata(7)
    assert c.committed(bad) is None
    assert offset_commits(t, "g") == [("t", 1, 7)]
