"""kafka-python's forms of the client calls, accepted beside this client's own: a program
written for kafka-python's ``KafkaProducer`` / ``KafkaConsumer`` keeps working."""

from __future__ import annotations

import time

import pytest

from txntable import Consumer, OffsetAndMetadata, Producer, TopicPartition, Warehouse
from txntable.errors import (
    IllegalStateError,
    InvalidArgumentTypeError,
    KafkaTimeoutError,
)
from txntable.storage.wrappers import LatencyStore
from txntable.structs import ConsumerRecord

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)

#: kafka-python's ConsumerRecord namedtuple, field for field (kafka/consumer/fetcher.py).
KAFKA_PYTHON_FIELDS = (
    "topic", "partition", "leader_epoch", "offset", "timestamp", "timestamp_type", "key",
    "value", "headers", "checksum", "serialized_key_size", "serialized_value_size",
    "serialized_header_size",
)  # fmt: skip


@pytest.fixture
def filled(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=2)
    with Producer(wh) as p:
        p.send("t", value=b"v0", key=b"k0", partition=0, timestamp_ms=1000)
        p.send("t", value=b"v1", partition=0, headers=[("h", b"xy"), ("\u00e9", None)])
        p.send("t", value=None, key=b"k", partition=0)
        p.send("t", value=b"w0", partition=1)
    return wh


def test_consumer_record_has_kafka_pythons_fields_in_order(filled: Warehouse) -> None:
    assert ConsumerRecord._fields == KAFKA_PYTHON_FIELDS
    c = Consumer(filled, auto_offset_reset="earliest")
    c.assign([T0])
    records = c.poll(timeout_ms=100)[T0]
    first = records[0]
    assert tuple(first)[:8] == ("t", 0, -1, 0, 1000, 0, b"k0", b"v0")
    assert first[3] == first.offset == 0 and first[7] == first.value
    assert [tuple(r)[8:] for r in records] == [
        ([], None, 2, 2, -1),
        ([("h", b"xy"), ("\u00e9", None)], None, -1, 2, 1 + 2 + 2),  # é is 2 UTF-8 bytes
        ([], None, 1, -1, -1),
    ]
    c.close()


def test_varargs_partitions_and_metadata(filled: Warehouse) -> None:
    c = Consumer(filled)
    assert c.topics() == {"t"}
    assert c.partitions_for_topic("t") == {0, 1}
    assert c.partitions_for_topic("missing") == set()
    c.assign([T0, T1])
    c.seek_to_beginning(T0, T1)  # kafka-python's form
    assert (c.position(T0), c.position(T1)) == (0, 0)
    c.seek_to_end(T0)
    assert c.position(T0) == 3
    c.seek_to_beginning([T0])  # this client's form still works
    c.seek_to_beginning()  # and no argument: every assigned partition
    c.pause(T0)
    assert c.paused() == {T0}
    assert set(c.poll(timeout_ms=100)) == {T1}
    c.resume(T0)
    assert c.paused() == set()
    assert c.highwater(T0) == 3 and c.highwater(T1) == 1
    with pytest.raises(IllegalStateError):
        c.highwater(TopicPartition("t", 5))
    with pytest.raises(InvalidArgumentTypeError):
        c.pause(("t", 0))  # type: ignore[arg-type]
    c.close()


def test_iterating_a_consumer_moves_positions_record_by_record(filled: Warehouse) -> None:
    c = Consumer(filled, group_id="it", auto_offset_reset="earliest", consumer_timeout_ms=300,
                 enable_auto_commit=False)  # fmt: skip
    c.assign([T0, T1])
    seen = []
    for record in c:
        seen.append((record.partition, record.offset))
        if (record.partition, record.offset) == (0, 0):
            assert c.position(T0) == 1  # past this record only, not the whole poll
            c.commit()
    assert sorted(seen) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert (c.position(T0), c.position(T1)) == (3, 1)
    assert c.committed(T0) == OffsetAndMetadata(1)
    started = time.monotonic()
    assert list(c) == []  # nothing new: stops after consumer_timeout_ms
    assert time.monotonic() - started >= 0.25
    c.close()
    assert list(c) == []  # a closed consumer stops at once


def test_producer_flush_timeout_and_timestamp_ms(filled: Warehouse) -> None:
    with Producer(filled, linger_ms=0) as p:
        meta = p.send("t", value=b"x", partition=1, timestamp_ms=42).get(timeout=10)
        assert meta.timestamp == 42
        with pytest.raises(InvalidArgumentTypeError):
            p.send("t", value=b"x", timestamp=1, timestamp_ms=2)
        p.send("t", value=b"y", partition=1)
        p.flush(timeout=10)  # kafka-python's argument, seconds
        with pytest.raises(InvalidArgumentTypeError):
            p.flush(timeout=-1)


def test_flush_raises_a_timeout_when_records_are_still_in_flight(filled: Warehouse) -> None:
    slow = Warehouse(store=LatencyStore(filled.store, latency_ms=150))  # every request: 150 ms
    p = Producer(slow, linger_ms=0)
    future = p.send("t", value=b"slow", partition=0)
    with pytest.raises(KafkaTimeoutError, match="still in flight"):
        p.flush(timeout=0.05)
    p.flush(timeout=30)  # the records were still sent
    assert future.get(timeout=0).offset == 3
    p.close()
