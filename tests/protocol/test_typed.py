"""Typed tables (protocol v3): a record schema of the user's columns.

Round trips of every allowed Arrow type through ``send`` (dicts) and ``send_batch`` (Arrow,
pandas, dict of columns) back out of ``Table.scan``, ``poll`` and ``poll_arrow`` under both
isolation levels; validation errors naming column and row with nothing written; schema
evolution (add a nullable column, widen a type) read back with nulls and upcasts; refused
changes writing nothing; key columns used by the partitioner; protocol rules.
"""

from __future__ import annotations

import decimal
import json
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tableutil import MANUAL_FLUSH
from typedutil import ALL_TYPES, UTC, comparable, null_row, row

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    CorruptLogError,
    InvalidConfigurationError,
    SchemaMismatchError,
    SerializationError,
    UnsupportedProtocolError,
)
from txntable.producer.partitioner import partitions_for_keys
from txntable.protocol import actions
from txntable.protocol.actions import (
    Metadata,
    Protocol,
    decode_actions,
    encode_actions,
)
from txntable.protocol.schema import (
    Field,
    check_evolution,
    merge_schemas,
    normalize_schema,
    schema_from_json,
    schema_to_json,
)
from txntable.storage import MemoryStore


def normalized(record: dict[str, Any]) -> dict[str, Any]:
    out = dict(record)
    for name in ("ts_ms_utc", "ts_us_zone", "ts_ns"):
        if out.get(name) is not None:
            out[name] = out[name].astimezone(UTC)
    return out


@pytest.fixture
def warehouse(memory_store: MemoryStore) -> Warehouse:
    return Warehouse(store=memory_store)


def test_every_allowed_type_round_trips_through_the_json_form() -> None:
    schema = normalize_schema(ALL_TYPES, ["id"])
    fields = schema_to_json(schema)
    meta = Metadata("t", "t", 1, schema=fields, typed=True, keyColumns=("id",))
    (decoded,) = decode_actions(encode_actions([meta]))
    assert decoded == meta
    assert schema_from_json(decoded.schema) == schema
    # The JSON form names each type and nests children for list, map and struct.
    body = json.loads(encode_actions([meta]))["metadata"]
    by_name = {f["name"]: f for f in body["schema"]}
    assert by_name["amount"]["type"] == "decimal(12,3)"
    assert by_name["ts_us_zone"]["type"] == "timestamp(us,Asia/Kolkata)"
    assert by_name["ints"]["children"] == [{"name": "element", "nullable": True, "type": "int32"}]
    assert [c["name"] for c in by_name["attrs"]["children"]] == ["key", "value"]
    assert by_name["address"]["children"][0] == {
        "name": "street",
        "nullable": False,
        "type": "string",
    }
    assert body["typed"] is True and body["keyColumns"] == ["id"]


@pytest.mark.parametrize(
    ("schema", "key", "message"),
    [
        (pa.schema([("a", pa.uint32())]), [], "not allowed"),
        (pa.schema([("a", pa.float16())]), [], "not allowed"),
        (pa.schema([("a", pa.duration("s"))]), [], "not allowed"),
        (pa.schema([("a", pa.decimal128(5, 6))]), [], r"decimal scale 6 is not in \[0, 5\]"),
        (pa.schema([("a", pa.decimal128(5, -1))]), [], "decimal scale -1"),
        (pa.schema([("offset", pa.int64())]), [], "reserved"),
        (pa.schema([("timestamp", pa.int64())]), [], "reserved"),
        (pa.schema([("a", pa.int64()), ("a", pa.string())]), [], "repeated"),
        (pa.schema([("s", pa.struct([("x", pa.int8()), ("x", pa.int8())]))]), [], "repeated"),
        (pa.schema([]), [], "at least one"),
        (pa.schema([("a", pa.float64())]), ["a"], "key column 'a' has type"),
        (pa.schema([("a", pa.int64())]), ["b"], "not a column"),
    ],
)
def test_create_refuses_a_bad_schema_and_writes_nothing(
    warehouse: Warehouse, schema: pa.Schema, key: list[str], message: str
) -> None:
    with pytest.raises(SchemaMismatchError, match=message):
        warehouse.create_table("t", 1, schema=schema, key=key)
    assert warehouse.list_tables() == []


@pytest.mark.parametrize("zone", ["Mars/Olympus", "Europe/Pari", "utc", "+25:00", "-0800"])
def test_an_unknown_time_zone_is_refused_at_create_and_evolve(
    warehouse: Warehouse, zone: str
) -> None:
    # Readers convert zoned timestamps with the zone database: an unknown zone would make
    # every poll, scan and consume fail later.
    bad = pa.field("at", pa.timestamp("us", tz=zone))
    message = re.escape(f"column 'at': unknown time zone '{zone}'")
    with pytest.raises(SchemaMismatchError, match=message):
        warehouse.create_table("t", 1, schema=pa.schema([bad]))
    assert warehouse.list_tables() == []
    table = warehouse.create_table("t", 1, schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="unknown time zone"):
        table.evolve_schema(pa.schema([("a", pa.int64()), bad]))
    assert table.snapshot().version == 0
    good = [("a", pa.timestamp("ms", tz="Europe/Paris")), ("b", pa.timestamp("s", tz="+05:30"))]
    warehouse.create_table("u", 1, schema=pa.schema(good))


def test_an_unknown_time_zone_in_the_log_is_corrupt(warehouse: Warehouse) -> None:
    from txntable.protocol.schema import Field

    fields = (Field("at", "timestamp(us,Europe/Pari)"),)
    data = encode_actions([Protocol(3, 3), Metadata("id", "t", 1, schema=fields, typed=True)])
    warehouse.store.put_if_absent("t/_log/00000000000000000000.json", data)
    with pytest.raises(CorruptLogError, match="unknown time zone"):
        warehouse.table("t").snapshot()


def test_key_without_schema_is_refused(warehouse: Warehouse) -> None:
    with pytest.raises(InvalidConfigurationError):
        warehouse.create_table("t", 1, key=["a"])


def test_typed_tables_need_protocol_3_and_untyped_ones_stay_readable_by_v2(
    warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    typed = warehouse.create_table("typed", 1, schema=pa.schema([("a", pa.int64())]))
    warehouse.create_table("plain", 1)
    assert typed.snapshot().protocol == Protocol(3, 3)
    assert warehouse.table("plain").snapshot().protocol == Protocol(1, 1)
    # A v2 client: refuses the typed table, reads the untyped one.
    monkeypatch.setattr(actions, "READER_VERSION", 2)
    monkeypatch.setattr(actions, "WRITER_VERSION", 2)
    with pytest.raises(UnsupportedProtocolError):
        warehouse.table("typed").snapshot()
    assert warehouse.table("plain").scan().to_arrow().num_rows == 0


def test_a_decimal_scale_outside_the_precision_in_a_log_is_corrupt() -> None:
    # Issue 21.15: Arrow takes any scale; Parquet and Spark only 0 <= scale <= precision.
    fields = (Field("d", "decimal(10,11)"),)
    data = encode_actions([Protocol(3, 3), Metadata("id", "t", 1, schema=fields, typed=True)])
    with pytest.raises(CorruptLogError, match="decimal scale 11"):
        decode_actions(data, "v")


def test_a_typed_metadata_under_protocol_1_is_corrupt(warehouse: Warehouse) -> None:
    fields = schema_to_json(pa.schema([("a", pa.int64())]))
    data = encode_actions([Protocol(1, 1), Metadata("id", "t", 1, schema=fields, typed=True)])
    warehouse.store.put_if_absent("t/_log/00000000000000000000.json", data)
    with pytest.raises(CorruptLogError, match="protocol version 3"):
        warehouse.table("t").snapshot()


@pytest.mark.parametrize("how", ["send", "arrow", "pandas", "columns"])
def test_every_type_round_trips_through_send_and_every_reader(
    warehouse: Warehouse, how: str
) -> None:
    table = warehouse.create_table("t", 2, schema=ALL_TYPES, key=["id"])
    records = [row(i) for i in range(5)] + [null_row(i) for i in range(5, 8)]
    with Producer(warehouse) as producer:
        if how == "send":
            for r in records:
                producer.send("t", r, timestamp=1000 + r["id"])
        else:
            data = pa.Table.from_pylist([comparable(r) for r in records], schema=ALL_TYPES)
            data = data.append_column("timestamp", pa.array([1000 + r["id"] for r in records]))
            arg: object = data
            if how == "pandas":
                arg = data.select(["id", "text", "f64", "timestamp"]).to_pandas()
                records = [
                    {k: r.get(k) for k in ("id", "text", "f64")} for r in records
                ]
            elif how == "columns":
                arg = data.select(["id", "text", "ints", "timestamp"]).to_pydict()
                records = [{k: r.get(k) for k in ("id", "text", "ints")} for r in records]
            producer.send_batch("t", arg).get()
    expected = {r["id"]: comparable(r) for r in records}

    scanned = table.scan().to_arrow()
    assert scanned.schema.names == [*ALL_TYPES.names, "partition", "offset", "timestamp"]
    assert scanned.schema.field("ts_us_zone").type == pa.timestamp("us", tz="Asia/Kolkata")
    got = scanned.to_pylist()
    assert {r["id"]: normalized({k: r[k] for k in ALL_TYPES.names}) for r in got} == expected
    assert sorted(round(r["timestamp"].timestamp() * 1000) for r in got) == sorted(
        1000 + i for i in expected
    )
    # Offsets are dense per partition, in send order.
    for p in (0, 1):
        mine = [r for r in got if r["partition"] == p]
        assert [r["offset"] for r in mine] == list(range(len(mine)))

    consumer = Consumer(warehouse, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    polled = [rec for recs in consumer.poll(max_records=100).values() for rec in recs]
    assert {rec.value["id"]: normalized(rec.value) for rec in polled} == expected
    assert all(rec.key == {"id": rec.value["id"]} and rec.headers == [] for rec in polled)
    consumer.seek_to_beginning()
    arrow = pa.concat_tables(consumer.poll_arrow(max_records=100).values())
    assert arrow.schema == scanned.schema
    assert arrow.num_rows == len(records)
    consumer.close()


def test_both_isolation_levels_see_typed_transactions(warehouse: Warehouse) -> None:
    table = warehouse.create_table("t", 1, schema=pa.schema([("n", pa.int32())]))
    producer = Producer(warehouse, transactional_id="tx", **MANUAL_FLUSH)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_batch("t", {"n": [1, 2]})
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("t", {"n": 3})
    producer.flush()  # written, then aborted
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send("t", {"n": 4})
    producer.flush()  # written, not committed
    committed = table.scan("read_committed").to_arrow()
    uncommitted = table.scan("read_uncommitted").to_arrow()
    assert committed.column("n").to_pylist() == [1, 2]
    assert committed.column("offset").to_pylist() == [0, 1]
    assert uncommitted.column("n").to_pylist() == [1, 2, 3, 4]
    assert uncommitted.column("offset").to_pylist() == [0, 1, 3, 5]
    producer.abort_transaction()
    producer.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"id": "1"}, "column 'id': expected int"),
        ({"id": 1, "i8": 200}, "column 'i8': 200 is out of range"),
        ({"id": 1, "f64": "x"}, "column 'f64': expected float"),
        ({"id": 1, "flag": 1}, "column 'flag': expected bool"),
        ({"id": 1, "amount": decimal.Decimal("1.0001")}, "column 'amount'"),
        ({"id": 1, "address": {"lines": []}}, "column 'address': field 'street' is null"),
        ({"id": 1, "ints": [1, "2"]}, "column 'ints': expected int"),
        ({"id": 1, "nope": 1}, "unknown column 'nope'"),
        ({"text": "no id"}, "column 'id' is null or missing"),
        (b"bytes", "record schema"),
    ],
)
def test_send_refuses_a_bad_record_naming_the_column(
    warehouse: Warehouse, value: object, message: str
) -> None:
    table = warehouse.create_table("t", 1, schema=ALL_TYPES)
    with Producer(warehouse) as producer:
        with pytest.raises(SerializationError, match=message):
            producer.send("t", value)  # type: ignore[arg-type]
        producer.flush()
    assert table.snapshot().version == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": [1, 2], "i8": [1, 300]}, "column 'i8', row 1"),
        ({"id": [1, None, 3]}, "column 'id', row 1: null in a not-null column"),
        ({"id": [1], "text": [5]}, "column 'text' has type int64"),
        ({"id": [1], "nope": [1]}, "unknown column 'nope'"),
        ({"text": ["x"]}, "column 'id' is missing"),
        (
            pa.table(
                {
                    "id": [1, 2],
                    "address": pa.array(
                        [{"street": "a"}, {"street": None}],
                        pa.struct([("street", pa.string())]),
                    ),
                }
            ),
            "column 'address', row 1: .*'street'",
        ),
        ("not a table", "not a table"),
    ],
)
def test_send_batch_refuses_bad_data_naming_column_and_row(
    warehouse: Warehouse, data: object, message: str
) -> None:
    table = warehouse.create_table("t", 1, schema=ALL_TYPES)
    with Producer(warehouse) as producer:
        with pytest.raises(SerializationError, match=message):
            producer.send_batch("t", data)
        producer.flush()
    assert table.snapshot().version == 0
    assert table.scan().to_arrow().num_rows == 0


def test_kafka_record_tables_refuse_dicts(warehouse: Warehouse) -> None:
    warehouse.create_table("plain", 1)
    with Producer(warehouse) as producer, pytest.raises(SerializationError):
        producer.send("plain", {"a": 1})  # type: ignore[arg-type]


def test_key_columns_drive_the_partitioner(warehouse: Warehouse) -> None:
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    table = warehouse.create_table("t", 8, schema=schema, key=["user"])
    users = [f"user-{i}" for i in range(40)]
    with Producer(warehouse) as producer:
        producer.send_batch("t", {"user": users, "n": list(range(40))}).get()
        for i, u in enumerate(users):
            producer.send("t", {"user": u, "n": 100 + i})
    got = table.scan().to_arrow().to_pylist()
    # The same partition as Kafka's murmur2 of the key's UTF-8 bytes.
    expected = partitions_for_keys(pa.array([u.encode() for u in users]), 8)
    where = dict(zip(users, expected.tolist(), strict=True))
    assert len(got) == 80
    assert all(r["partition"] == where[r["user"]] for r in got)
    assert len(set(where.values())) > 1


def test_multi_column_and_integer_keys(warehouse: Warehouse) -> None:
    schema = pa.schema([("a", pa.int32()), ("b", pa.string())])
    table = warehouse.create_table("t", 4, schema=schema, key=["a", "b"])
    with Producer(warehouse) as producer:
        producer.send_batch("t", {"a": [1, 1, 7], "b": ["x", "x", None]}).get()
    got = table.scan().to_arrow().to_pylist()
    key = partitions_for_keys(pa.array([b"1\x1fx"]), 4)[0]
    assert [r["partition"] for r in got if r["b"] == "x"] == [key, key]


def test_scan_columns_returns_exactly_those_and_reads_only_them(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse = Warehouse(str(tmp_path))
    table = warehouse.create_table("t", 1, schema=ALL_TYPES)
    with Producer(warehouse) as producer:
        producer.send_batch("t", pa.Table.from_pylist([comparable(row(1))], ALL_TYPES)).get()
    read: list[Any] = []
    original = pq.ParquetFile.read

    def spy(self: pq.ParquetFile, columns: Any = None, **kwargs: Any) -> pa.Table:
        read.append(columns)
        return original(self, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", spy)
    got = table.scan(columns=["offset", "text"]).to_arrow()
    assert got.schema.names == ["offset", "text"]
    assert got.to_pylist() == [{"offset": 0, "text": "héllo 1"}]
    assert read == [["text"]]
    with pytest.raises(SchemaMismatchError, match="no column 'nope'"):
        table.scan(columns=["nope"])


def test_evolution_add_column_and_widen_read_back_everywhere(warehouse: Warehouse) -> None:
    v1 = pa.schema([pa.field("id", pa.int32(), nullable=False), ("price", pa.float32())])
    table = warehouse.create_table("t", 1, schema=v1)
    with Producer(warehouse) as producer:
        producer.send("t", {"id": 1, "price": 1.5})
        producer.send_batch("t", {"id": [2], "price": [2.5]}).get()
    v2 = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), ("price", pa.float64()), ("note", pa.string())]
    )
    assert table.evolve_schema(v2) == v2
    assert warehouse.table("t").schema == v2
    with Producer(warehouse) as producer:
        producer.send("t", {"id": 2**40, "price": 3.25, "note": "new"})
    got = table.scan().to_arrow()
    assert got.schema.field("id").type == pa.int64()
    assert got.schema.field("price").type == pa.float64()
    assert got.select(["id", "price", "note", "offset"]).to_pylist() == [
        {"id": 1, "price": 1.5, "note": None, "offset": 0},
        {"id": 2, "price": 2.5, "note": None, "offset": 1},
        {"id": 2**40, "price": 3.25, "note": "new", "offset": 2},
    ]
    consumer = Consumer(warehouse, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0)])
    values = [r.value for r in consumer.poll()[TopicPartition("t", 0)]]
    assert values == [
        {"id": 1, "price": 1.5, "note": None},
        {"id": 2, "price": 2.5, "note": None},
        {"id": 2**40, "price": 3.25, "note": "new"},
    ]
    consumer.close()


@pytest.mark.parametrize(
    "new",
    [
        pa.schema([("id", pa.int32())]),  # a column dropped
        pa.schema([("id", pa.string()), ("price", pa.float32())]),  # a type changed
        pa.schema([("id", pa.int16()), ("price", pa.float32())]),  # narrowed
        pa.schema([("price", pa.float32()), ("id", pa.int32())]),  # reordered
        pa.schema([("id", pa.int32()), ("price", pa.float32()), pa.field("x", pa.int8(), False)]),
        pa.schema([pa.field("id", pa.int32(), False), ("price", pa.float32())]),  # not null
    ],
)
def test_an_incompatible_change_is_refused_with_nothing_written(
    warehouse: Warehouse, new: pa.Schema
) -> None:
    old = pa.schema([("id", pa.int32()), ("price", pa.float32())])
    table = warehouse.create_table("t", 1, schema=old)
    with pytest.raises(SchemaMismatchError, match="schema change refused"):
        table.evolve_schema(new)
    assert warehouse.table("t").snapshot().version == 0
    assert warehouse.table("t").schema == old


def test_evolving_a_kafka_record_table_is_refused(warehouse: Warehouse) -> None:
    table = warehouse.create_table("t", 1)
    with pytest.raises(SchemaMismatchError, match="no record schema"):
        table.evolve_schema(pa.schema([("a", pa.int8())]))
    assert table.snapshot().version == 0


def test_nested_evolution_and_merge() -> None:
    old = pa.schema([("s", pa.struct([("a", pa.int32())])), ("l", pa.list_(pa.float32()))])
    new = pa.schema(
        [("s", pa.struct([("a", pa.int64()), ("b", pa.string())])), ("l", pa.list_(pa.float64()))]
    )
    check_evolution(normalize_schema(old), normalize_schema(new))
    merged = merge_schemas(
        normalize_schema(pa.schema([("a", pa.int32())])),
        pa.schema([("a", pa.int64()), ("b", pa.string()), ("timestamp", pa.int64())]),
    )
    assert merged == pa.schema([("a", pa.int64()), ("b", pa.string())])
    with pytest.raises(SchemaMismatchError):
        merge_schemas(
            normalize_schema(pa.schema([("a", pa.int64())])), pa.schema([("a", pa.string())])
        )


def test_a_producer_holding_the_older_schema_rebases_and_reloads(warehouse: Warehouse) -> None:
    table = warehouse.create_table("t", 1, schema=pa.schema([("a", pa.int32())]))
    producer = Producer(warehouse, **MANUAL_FLUSH)
    producer.send("t", {"a": 1})  # the producer now holds schema v1
    other = warehouse.table("t")
    other.evolve_schema(pa.schema([("a", pa.int64()), ("b", pa.string())]))
    # Records checked under v1 commit after the change (readers upcast them) ...
    producer.send("t", {"a": 2})
    producer.flush()
    # ... and a column only the new schema has makes the producer reload it.
    producer.send("t", {"a": 2**40, "b": "x"})
    producer.send_batch("t", {"a": [4], "b": ["y"]})
    producer.flush()
    producer.close()
    assert table.scan(columns=["a", "b"]).to_arrow().to_pylist() == [
        {"a": 1, "b": None},
        {"a": 2, "b": None},
        {"a": 2**40, "b": "x"},
        {"a": 4, "b": "y"},
    ]
    with Producer(warehouse) as fresh, pytest.raises(SerializationError, match="unknown column"):
        fresh.send("t", {"c": 1})


def test_an_illegal_schema_change_in_the_log_is_corrupt(warehouse: Warehouse) -> None:
    table = warehouse.create_table("t", 1, schema=pa.schema([("a", pa.int64())]))
    meta = table.snapshot().metadata
    assert meta is not None
    from dataclasses import replace

    bad = replace(meta, schema=schema_to_json(pa.schema([("a", pa.string())])))
    warehouse.store.put_if_absent("t/_log/00000000000000000001.json", encode_actions([bad]))
    with pytest.raises(CorruptLogError, match="illegally"):
        warehouse.table("t").snapshot()


def test_describe_shows_the_schema(warehouse: Warehouse) -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    warehouse.create_table("t", 1, schema=schema, key="a")
    d = warehouse.table("t").describe()
    assert d.schema == schema and d.key_columns == ("a",)
    assert warehouse.create_table("plain", 1).describe().schema is None


def test_maintenance_of_a_typed_table_across_an_evolution(warehouse: Warehouse) -> None:
    v1 = pa.schema([("user", pa.string()), ("n", pa.int32())])
    table = warehouse.create_table(
        "t", 1, schema=v1, key=["user"], configuration={"cleanup.policy": "compact"}
    )
    with Producer(warehouse, transactional_id="tx") as producer:
        producer.init_transactions()
        for i in range(3):  # three v1 segments, the last one aborted
            producer.begin_transaction()
            producer.send_batch("t", {"user": ["a", "b"], "n": [i, 10 + i]})
            if i < 2:
                producer.commit_transaction()
            else:
                producer.flush()
                producer.abort_transaction()
    table.evolve_schema(pa.schema([("user", pa.string()), ("n", pa.int64()), ("tag", pa.string())]))
    with Producer(warehouse) as producer:
        producer.send("t", {"user": "a", "n": 2**40, "tag": "v2"})
        producer.send("t", {"user": None, "n": 7})  # no key: kept by compaction
    before = table.scan().to_arrow()
    assert table.verify().ok

    merged = table.optimize()
    assert merged.segments_written == 1
    after = warehouse.table("t").scan().to_arrow()
    assert after.equals(before)
    assert warehouse.table("t").verify().ok

    compacted = warehouse.table("t").compact(force=True)
    assert compacted.version is not None
    rows = warehouse.table("t").scan(columns=["user", "n", "tag", "offset"]).to_arrow()
    assert rows.to_pylist() == [
        {"user": "b", "n": 11, "tag": None, "offset": 4},
        {"user": "a", "n": 2**40, "tag": "v2", "offset": 9},
        {"user": None, "n": 7, "tag": None, "offset": 10},
    ]
    assert warehouse.table("t").verify().ok
    assert warehouse.table("t").snapshot().protocol == Protocol(3, 3)
