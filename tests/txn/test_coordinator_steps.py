"""A transaction through the coordinator (several logs) costs its writes, not reads first:
the coordinator's steps put on the copy of the transaction object they last read or wrote
(read only when another client changed it), and the producer and its coordinator write a
log through one handle (neither is behind the other's last commit)."""

from __future__ import annotations

import pathlib
from dataclasses import replace

import pytest
from tableutil import RecordingStore, read_all

from txntable import Producer, TopicPartition, Warehouse
from txntable.errors import ProducerFencedError
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
