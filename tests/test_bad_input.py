"""Bad input gives a typed error, and nothing already committed is lost."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable

import pytest
from tableutil import read_all, write_batch

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    CorruptLogError,
    InvalidConfigurationError,
    InvalidTableNameError,
    MissingSegmentError,
    RecordTooLargeError,
    SchemaMismatchError,
    TableExistsError,
    TableNotFoundError,
    UnsupportedProtocolError,
)
from txntable.protocol.actions import Batch
from txntable.protocol.records import encode_segment
from txntable.structs import ProducerRecord

MakeProducer = Callable[..., Producer]
TP = TopicPartition("orders", 0)


@pytest.fixture
def orders(local_wh: Warehouse, make_producer: MakeProducer) -> Warehouse:
    """Two committed versions on local disk: offsets 0-1 and 2."""
    local_wh.create_table("orders", partitions=1)
    p = make_producer(local_wh)
    for values in ([b"a", b"b"], [b"c"]):
        futures = [p.send("orders", value=v, partition=0) for v in values]
        p.flush()
        [f.result(timeout=10) for f in futures]
    return local_wh


def lake_path(wh: Warehouse, key: str) -> pathlib.Path:
    return pathlib.Path(wh.store.url.removeprefix("file://"), key)


@pytest.mark.parametrize(
    "damage",
    [
        b'{"batch":{"partition":0,"baseOffset":3,"count":1,"pa',  # truncated
        b"not json at all\n",
        b'{"batch":{"partition":0,"baseOffset":9,"count":1,"path":"p","size":1}}\n',  # gap
    ],
)
def test_corrupt_log_version(orders: Warehouse, damage: bytes) -> None:
    key = "orders/_log/00000000000000000003.json"
    lake_path(orders, key).write_bytes(damage)
    with pytest.raises(CorruptLogError) as info:
        orders.table("orders").snapshot()
    assert info.value.path == key and key in str(info.value)
    consumer = Consumer(orders, isolation_level="read_uncommitted")
    with pytest.raises(CorruptLogError, match="00000000000000000003"):
        consumer.assign([TP])
    # Every earlier version still reads fine.
    log = orders.table("orders").log
    assert log.load(version=2).partition(0).high_watermark == 3
    assert log.load(version=1).partition(0).high_watermark == 2
    # A writer cannot get past the damaged version (it neither overwrites nor skips it).
    with pytest.raises(CorruptLogError):
        write_batch(orders.table("orders"), 0, [b"d"])
    assert not lake_path(orders, "orders/_log/00000000000000000004.json").exists()


def test_corrupt_version_seen_by_a_live_consumer(orders: Warehouse) -> None:
    consumer = Consumer(orders, isolation_level="read_committed")
    consumer.assign([TP])
    consumer.seek_to_beginning()
    assert [r.value for r in consumer.poll(timeout_ms=0)[TP]] == [b"a", b"b", b"c"]
    key = "orders/_log/00000000000000000003.json"
    lake_path(orders, key).write_bytes(b'{"marker": {"partition": 0}}\n')
    with pytest.raises(CorruptLogError, match="missing required field") as info:
        consumer.poll(timeout_ms=0)
    assert info.value.path == key


def test_protocol_from_the_future(orders: Warehouse) -> None:
    orders.store.put_if_absent(
        "orders/_log/00000000000000000003.json",
        b'{"protocol":{"minReaderVersion":99,"minWriterVersion":99}}\n',
    )
    with pytest.raises(UnsupportedProtocolError, match="reader version 99"):
        orders.table("orders").snapshot()
    c = Consumer(orders, isolation_level="read_uncommitted")
    with pytest.raises(UnsupportedProtocolError):
        c.assign([TP])
    assert orders.table("orders").log.load(version=2).partition(0).high_watermark == 3


def test_missing_segment(orders: Warehouse) -> None:
    snap = orders.table("orders").snapshot()
    first = snap.partition(0).entries[0]
    assert isinstance(first, Batch)
    os.unlink(lake_path(orders, first.path))
    c = Consumer(orders, isolation_level="read_uncommitted")
    c.assign([TP])
    c.seek_to_beginning()
    with pytest.raises(MissingSegmentError) as info:
        c.poll(timeout_ms=0)
    assert info.value.path == first.path and first.path in str(info.value)
    assert c.position(TP) == 0  # nothing skipped silently
    c.seek(TP, 2)  # the other segment is still there
    assert [(r.offset, r.value) for r in c.poll(timeout_ms=0)[TP]] == [(2, b"c")]


def test_missing_segment_of_aborted_batch_is_never_read(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("orders", value=b"gone", partition=0)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send("orders", value=b"kept", partition=0)
    p.commit_transaction()
    aborted = wh.table("orders").snapshot().partition(0).entries[0]
    assert isinstance(aborted, Batch)
    wh.store.delete(aborted.path)
    assert read_all(wh, "orders", [0], "read_committed") == {0: [(2, b"kept")]}
    with pytest.raises(MissingSegmentError):
        read_all(wh, "orders", [0], "read_uncommitted")


def test_damaged_segments(wh: Warehouse) -> None:
    table = wh.create_table("orders", partitions=1)
    write_batch(table, 0, [b"a", b"b"])
    entry = table.snapshot().partition(0).entries[0]
    assert isinstance(entry, Batch)
    wh.store.put(entry.path, b"PAR1 garbage")
    with pytest.raises(CorruptLogError, match="not readable Parquet") as info:
        read_all(wh, "orders", [0], "read_uncommitted")
    assert info.value.path == entry.path
    wh.store.put(entry.path, encode_segment([ProducerRecord(None, b"only one")]))
    with pytest.raises(SchemaMismatchError, match="has 1 records, its batch says 2"):
        read_all(wh, "orders", [0], "read_uncommitted")


BAD_NAMES = ["", "a/b", "/abs", "..", ".", "../up", "_x", "_log", "a b", "x\x00", "é", "a" * 250]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_table_names(wh: Warehouse, name: str) -> None:
    with pytest.raises(InvalidTableNameError):
        wh.create_table(name)
    with pytest.raises(InvalidTableNameError):
        wh.table(name)
    assert list(wh.store.list("")) == []


def test_table_existence(wh: Warehouse) -> None:
    wh.create_table("a.b-C_1", partitions=2)
    with pytest.raises(TableExistsError):
        wh.create_table("a.b-C_1", partitions=5)
    assert wh.table("a.b-C_1").num_partitions == 2
    with pytest.raises(TableNotFoundError):
        wh.table("missing")
    assert wh.list_tables() == ["a.b-C_1"]
    with pytest.raises(InvalidConfigurationError, match="partitions must be a positive integer"):
        wh.create_table("zero", partitions=0)


def test_record_too_large(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, max_request_size=1000)
    with pytest.raises(RecordTooLargeError, match="max_request_size 1000"):
        p.send("orders", value=b"x" * 1000, partition=0)
    with pytest.raises(RecordTooLargeError):
        p.send("orders", value=b"x", key=b"k" * 990, partition=0)
    p.flush()
    assert wh.table("orders").snapshot().version == 0
    assert [k for k in wh.store.list("orders/") if "/data/" in k] == []
    ok = p.send("orders", value=b"x" * 900, partition=0)
    p.flush()
    assert ok.result(timeout=10).offset == 0


def test_a_send_blocked_on_a_full_buffer_gets_it_sent(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    """A caller blocked on ``buffer_memory`` makes the sender send what is buffered at once,
    whatever ``linger_ms`` and ``batch_size`` say (Kafka's accumulator counts an exhausted
    buffer as ready), and goes ahead as soon as that frees the memory."""
    wh.create_table("orders", partitions=1)
    # Manual flush: records linger for an hour unless something asks for them.
    p = make_producer(wh, buffer_memory=300, max_block_ms=10_000)
    first = p.send("orders", value=b"x" * 100, partition=0)  # 121 + 140 bytes of memory
    start = time.monotonic()
    second = p.send("orders", value=b"y" * 100, partition=0)  # blocks until first is sent
    assert time.monotonic() - start < 5
    assert first.done() and first.result(timeout=0).offset == 0
    assert not second.done()
    batch = p.send_batch("orders", {"value": [b"b" * 100] * 3}, partition=0)  # waits too
    assert time.monotonic() - start < 5
    p.flush()
    assert second.result(timeout=10).offset == 1
    assert batch.result(timeout=10).counts == {0: 3}
    assert read_all(wh, "orders", [0], "read_uncommitted") == {
        0: [(0, b"x" * 100), (1, b"y" * 100)] + [(i, b"b" * 100) for i in (2, 3, 4)]
    }


def test_wrong_types_and_partitions(wh: Warehouse, make_producer: MakeProducer) -> None:
    from txntable.errors import IllegalStateError, UnknownTopicOrPartitionError

    wh.create_table("orders", partitions=1)
    p = make_producer(wh)
    with pytest.raises(TypeError):
        p.send("orders", value="text")  # type: ignore[arg-type]
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send("orders", value=b"x", partition=1)
    with pytest.raises(TableNotFoundError):
        p.send("nope", value=b"x")
    p.close()
    with pytest.raises(IllegalStateError):
        p.send("orders", value=b"x")
    assert wh.table("orders").snapshot().version == 0


def test_list_tables_names_only_tables(tmp_path) -> None:  # noqa: ANN001
    from txntable import Producer, Warehouse

    wh = Warehouse(tmp_path.as_uri())
    wh.create_table("b", partitions=1)
    wh.create_table("a.x", partitions=2)
    with Producer(wh, transactional_id="t") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("b", value=b"v")
        p.commit_transaction()
    (tmp_path / "stray").mkdir()
    assert wh.list_tables() == ["a.x", "b"]


def test_bad_checkpoint_interval_is_refused_at_create(tmp_path) -> None:  # noqa: ANN001
    from txntable import Warehouse
    from txntable.errors import InvalidConfigurationError

    wh = Warehouse(tmp_path.as_uri())
    with pytest.raises(InvalidConfigurationError, match="checkpoint.interval"):
        wh.create_table("t", configuration={"checkpoint.interval": "often"})
    with pytest.raises(InvalidConfigurationError, match="partitions"):
        wh.create_table("t", partitions=0)
    assert wh.list_tables() == []


def test_a_damaged_version_never_leaves_a_torn_snapshot(tmp_path) -> None:  # noqa: ANN001
    from txntable import Warehouse
    from txntable.errors import CorruptLogError
    from txntable.protocol.actions import Batch, encode_actions

    wh = Warehouse(tmp_path.as_uri())
    table = wh.create_table("t", partitions=2)
    snap = table.snapshot()
    # Version 1: a valid batch on partition 0, then one that does not continue partition 1.
    good = Batch(0, 0, 1, "t/data/0/a.parquet", 1)
    bad = Batch(1, 5, 1, "t/data/1/b.parquet", 1)
    wh.store.put_if_absent(table.log.version_key(1), encode_actions([good, bad]))
    with pytest.raises(CorruptLogError, match="does not continue"):
        table.snapshot()
    assert snap.torn
    # The half-applied batch is never served: every later call rebuilds and fails the same way.
    with pytest.raises(CorruptLogError, match="does not continue"):
        table.snapshot()
    with pytest.raises(CorruptLogError):
        snap.apply(1, [good])
    assert table.log.load(version=0).partition(0).log_end_offset == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"value": "text"},
        {"value": b"v", "key": 7},
        {"value": b"v", "headers": [("h", "not bytes")]},
        {"value": b"v", "headers": [(1, b"x")]},
        {"value": b"v", "headers": ["h"]},
        {"value": b"v", "timestamp": -1},
        {"value": b"v", "timestamp": 1.5},
    ],
)
def test_send_rejects_values_a_serializer_would(tmp_path, kwargs) -> None:  # noqa: ANN001
    from txntable import Producer, Warehouse
    from txntable.errors import SerializationError

    wh = Warehouse(tmp_path.as_uri())
    wh.create_table("t")
    with Producer(wh) as p:
        with pytest.raises(SerializationError):
            p.send("t", **kwargs)
        p.send("t", value=b"ok", headers=[("h", None), ("g", bytearray(b"x"))]).result()
    assert wh.table("t").describe().partitions[0].high_watermark == 1
