"""A transaction through the coordinator (several logs) costs its writes, not reads first
or one participant after the other: the coordinator's steps put on the copy of the
transaction object they last read or wrote (read only when another client changed it), the
producer and its coordinator write a log through one handle (neither is behind the other's
last commit), a round's tables join the transaction in one step, and the participants'
markers are written at once."""

from __future__ import annotations

import pathlib
import threading
import time
from dataclasses import replace

import pytest
from tableutil import RecordingStore, read_all

from txntable import Producer, TopicPartition, Warehouse
from txntable.errors import ProducerFencedError
from txntable.storage.base import StoreWrapper
from txntable.storage.local import LocalStore
from txntable.structs import OffsetAndMetadata
from txntable.txn.coordinator import TransactionCoordinator

OBJECT = "_coordinator/txn/etl.json"


@pytest.fixture
def store(tmp_path: pathlib.Path) -> RecordingStore:
    local = LocalStore(str(tmp_path))
    wh = Warehouse(store=local)
    wh.create_table("a", partitions=1)
    wh.create_table("b", partitions=1)
    return RecordingStore(local)


def two_table_transaction(producer: Producer, value: bytes) -> None:
    producer.begin_transaction()
    producer.send("a", value=value, partition=0)
    producer.send("b", value=value, partition=0)
    producer.commit_transaction()


def test_a_transaction_over_two_tables_never_reads_its_object(store: RecordingStore) -> None:
    """AddPartitionsToTxn (twice) and EndTxn (prepare, complete): four CAS each, and no
    read of the object first (it was three reads a transaction, a round trip each)."""
    wh = Warehouse(store=store)
    with Producer(wh, transactional_id="etl", linger_ms=0) as producer:
        producer.init_transactions()
        two_table_transaction(producer, b"warm")
        store.reset()
        for i in range(3):
            two_table_transaction(producer, b"v%d" % i)
        assert [k for k in store.gets if k.startswith("_coordinator/")] == []
    committed = [(0, b"warm"), (2, b"v0"), (4, b"v1"), (6, b"v2")]
    assert read_all(wh, "a", [0], "read_committed") == {0: committed}
    assert read_all(wh, "b", [0], "read_committed") == {0: committed}


def test_an_object_changed_by_another_client_is_read_again(store: RecordingStore) -> None:
    """Another client's write (here: the same object with a later update time) makes the
    known copy stale: the put on it fails, the object is read once, and the step is done on
    what it holds."""
    wh = Warehouse(store=store)
    with Producer(wh, transactional_id="etl", linger_ms=0) as producer:
        producer.init_transactions()
        two_table_transaction(producer, b"warm")
        other = TransactionCoordinator(LocalStore(store.inner.root))
        loaded = other.load("etl")
        assert loaded is not None
        meta, etag = loaded
        other.cas(replace(meta, last_update_timestamp=meta.last_update_timestamp + 1), etag)
        store.reset()
        two_table_transaction(producer, b"after")
        assert store.gets.count(OBJECT) == 1
    assert read_all(wh, "a", [0], "read_committed") == {0: [(0, b"warm"), (2, b"after")]}


def test_a_fenced_producer_learns_it_from_storage(store: RecordingStore) -> None:
    """A new instance fenced the producer: its known copy names its epoch, the put on it
    fails, and the object read then fences it (ProducerFencedError, nothing committed)."""
    wh = Warehouse(store=store)
    old = Producer(wh, transactional_id="etl", linger_ms=0)
    old.init_transactions()
    two_table_transaction(old, b"warm")
    with Producer(Warehouse(store=LocalStore(store.inner.root)), transactional_id="etl") as new:
        new.init_transactions()
        old.begin_transaction()
        old.send("a", value=b"zombie", partition=0)
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
    old.close()
    assert read_all(wh, "a", [0], "read_committed") == {0: [(0, b"warm")]}


def test_consume_transform_produce_never_loses_a_race_on_the_group_log(
    store: RecordingStore,
) -> None:
    """The offsets (send_offsets_to_transaction) and the COMMIT marker of the group's offset
    log go through the producer's one handle of that log: each is put once. With a handle of
    its own for the markers, each was a version behind the other and lost a race every
    transaction (a put, two reads and a lease read more: 300 -> 152 ms at 20 ms a request)."""
    wh = Warehouse(store=store)
    tp = TopicPartition("a", 0)
    with Producer(wh, transactional_id="etl", linger_ms=0) as producer:
        producer.init_transactions()
        for i in range(4):
            if i == 1:
                store.reset()
            producer.begin_transaction()
            producer.send("b", value=b"v%d" % i, partition=0)
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(i + 1)}, "g")
            producer.commit_transaction()
        # No refresh after a lost race (the group log), no read before a CAS (the object).
        assert [k for k in store.gets if k.startswith(("_groups/g/", "_coordinator/"))] == []
    committed = [(0, b"v0"), (2, b"v1"), (4, b"v2"), (6, b"v3")]
    assert read_all(wh, "b", [0], "read_committed") == {0: committed}


class _SlowLogPuts(StoreWrapper):
    """Log versions take 30 ms to put; counts the most in flight at once and the puts on
    the coordinator object."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.in_flight = self.most_in_flight = self.object_puts = 0
        self._lock = threading.Lock()

    def put_if_absent(self, key: str, data: bytes) -> str:
        if "/_log/0" not in key:
            return super().put_if_absent(key, data)
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(0.03)
            return super().put_if_absent(key, data)
        finally:
            with self._lock:
                self.in_flight -= 1

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        if key == OBJECT:
            with self._lock:
                self.object_puts += 1
        return super().put_if_match(key, data, etag)


def test_a_round_of_two_tables_joins_in_one_step_and_their_markers_go_at_once(
    tmp_path: pathlib.Path,
) -> None:
    """Records of two tables sent together: one AddPartitionsToTxn for both, then EndTxn's
    prepare and complete (three puts of the object, not four); the two COMMIT markers are
    in flight together (a round trip, not one per table)."""
    local = LocalStore(str(tmp_path))
    wh = Warehouse(store=local)
    wh.create_table("a", partitions=1)
    wh.create_table("b", partitions=1)
    store = _SlowLogPuts(local)
    with Producer(Warehouse(store=store), transactional_id="etl") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("a", value=b"a0", partition=0)
        producer.send("b", value=b"b0", partition=0)
        producer.flush()  # one round holding both tables
        store.most_in_flight = store.object_puts = 0
        producer.commit_transaction()
        assert store.most_in_flight == 2 and store.object_puts == 2  # prepare, complete
        producer.begin_transaction()
        producer.send("a", value=b"a1", partition=0)
        producer.send("b", value=b"b1", partition=0)
        store.object_puts = 0
        producer.commit_transaction()
        assert store.object_puts == 3  # both tables added at once, prepare, complete
    assert read_all(wh, "a", [0], "read_committed") == {0: [(0, b"a0"), (2, b"a1")]}
    assert read_all(wh, "b", [0], "read_committed") == {0: [(0, b"b0"), (2, b"b1")]}
