"""A consumer call reads each log once, however many of its partitions it looks at.

Kafka's ListOffsets and OffsetFetch are one request per broker for all partitions; here a
log read is a round trip to storage, so ``end_offsets`` of 8 partitions, a seek of all of
them, or the first poll of 8 newly assigned partitions must not read the table's log (or
the group's) once per partition: that was 8 round trips in a row each.
"""

from __future__ import annotations

import pathlib
import threading
from collections import Counter

import pytest

from txntable import Consumer, OffsetAndMetadata, Producer, TopicPartition, Warehouse
from txntable.storage.base import Store, StoredObject, StoreWrapper
from txntable.storage.local import LocalStore

PARTITIONS = 8
TPS = [TopicPartition("t", p) for p in range(PARTITIONS)]


class _LogReads(StoreWrapper):
    """Counts reads of log versions, by log (the table's, the group's)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get(self, key: str) -> StoredObject:
        if "/_log/0" in key:
            with self._lock:
                self.reads["group" if key.startswith("_groups/") else "table"] += 1
        return super().get(key)


@pytest.fixture
def lake(tmp_path: pathlib.Path) -> str:
    """Table ``t`` of 8 partitions; partition p holds p + 1 records."""
    url = str(tmp_path / "lake")
    wh = Warehouse(url)
    wh.create_table("t", partitions=PARTITIONS)
    with Producer(wh) as producer:
        for p in range(PARTITIONS):
            for i in range(p + 1):
                producer.send("t", value=b"%d-%d" % (p, i), partition=p)
    return url


def test_offset_lookups_and_seeks_read_the_table_log_once(lake: str) -> None:
    store = _LogReads(LocalStore(lake))
    consumer = Consumer(Warehouse(store=store))
    consumer.assign(TPS)
    assert consumer.end_offsets(TPS) == {tp: tp.partition + 1 for tp in TPS}  # loads the table
    store.reads.clear()
    assert consumer.end_offsets(TPS) == {tp: tp.partition + 1 for tp in TPS}
    assert store.reads == {"table": 1}  # one probe of the next version, not eight
    store.reads.clear()
    assert consumer.beginning_offsets(TPS) == {tp: 0 for tp in TPS}
    assert store.reads == {"table": 1}
    store.reads.clear()
    consumer.seek_to_end()
    assert store.reads == {"table": 1}
    assert [consumer.position(tp) for tp in TPS] == [p + 1 for p in range(PARTITIONS)]
    store.reads.clear()
    consumer.seek_to_beginning()
    assert store.reads == {"table": 1}
    assert [consumer.position(tp) for tp in TPS] == [0] * PARTITIONS
    consumer.close()


def test_a_first_poll_reads_the_group_log_and_the_table_log_once(lake: str) -> None:
    """Eight partitions without positions, half with committed offsets: one read of each
    log for all of them, and each partition starts where it must."""
    committer = Consumer(Warehouse(lake), group_id="g")
    committer.assign(TPS)
    committer.commit({tp: OffsetAndMetadata(1) for tp in TPS[:4]})  # past the first record of 0..3
    committer.close()

    store = _LogReads(LocalStore(lake))
    consumer = Consumer(Warehouse(store=store), group_id="g", auto_offset_reset="earliest")
    consumer.assign(TPS)
    assert consumer.committed(TPS[0]) is not None  # loads the group's log
    assert consumer.end_offsets(TPS[:1])  # loads the table
    store.reads.clear()
    polled = consumer.poll(5000, max_records=1000)
    assert store.reads == {"table": 1, "group": 1}
    got = {tp.partition: [r.value for r in records] for tp, records in polled.items()}
    want = {p: [b"%d-%d" % (p, i) for i in range(1 if p < 4 else 0, p + 1)] for p in range(8)}
    assert got == {p: v for p, v in want.items() if v}
    consumer.close()


def test_each_pass_of_a_waiting_poll_reads_the_log_again(lake: str) -> None:
    """The once-per-call rule never hides new data: a poll that waits reads the log on each
    pass, and returns a record committed while it waits."""
    consumer = Consumer(Warehouse(lake))
    consumer.assign([TPS[0]])
    consumer.seek_to_end()
    assert consumer.poll(0) == {}

    def produce_later() -> None:
        with Producer(Warehouse(lake)) as producer:
            producer.send("t", value=b"late", partition=0).result(timeout=10)

    writer = threading.Timer(0.3, produce_later)
    writer.start()
    try:
        polled = consumer.poll(10_000)
    finally:
        writer.join()
    assert [(r.offset, r.value) for r in polled[TPS[0]]] == [(1, b"late")]
    consumer.close()



def test_a_step_is_the_calling_thread_s_own(lake: str) -> None:
    """What a step read serves only the thread that runs it: another thread's lookup during
    a poll (an application thread, a ``commit_async``) reads the log itself."""
    consumer = Consumer(Warehouse(lake))
    consumer.assign([TPS[0]])
    assert consumer.end_offsets([TPS[0]]) == {TPS[0]: 1}
    seen: dict[TopicPartition, int] = {}
    with consumer._step():  # as inside a poll's pass, which has read the table
        assert consumer.end_offsets([TPS[0]]) == {TPS[0]: 1}
        with Producer(Warehouse(lake)) as producer:
            producer.send("t", value=b"new", partition=0).result(timeout=10)
        assert consumer.end_offsets([TPS[0]]) == {TPS[0]: 1}  # this step read it already
        other = threading.Thread(target=lambda: seen.update(consumer.end_offsets([TPS[0]])))
        other.start()
        other.join()
    assert seen == {TPS[0]: 2}
    assert consumer.end_offsets([TPS[0]]) == {TPS[0]: 2}
    consumer.close()
