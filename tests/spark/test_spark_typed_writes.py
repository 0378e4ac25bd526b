"""Spark writes into typed tables as Spark writes into tables of its own (issue 26): column
names resolved case-insensitively, the session time zone in TIMESTAMP ↔ TIMESTAMP_NTZ,
binary keys of any bytes, commits next to another client's schema evolution."""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest

from txntable import Producer, Warehouse
from txntable.producer.partitioner import partition_for_key

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_binary_key_column_takes_any_bytes(spark: Any, lake: str) -> None:
    """The key bytes of a binary key column are its own bytes, UTF-8 or not: through
    Spark, ``send_batch`` and ``send`` alike."""
    wh = Warehouse(lake)
    schema = pa.schema([pa.field("k", pa.binary(), nullable=False), ("v", pa.int32())])
    table = wh.create_table("t", 4, schema=schema, key=["k"])
    spark_keys = [b"\xff\xfe", b"\x00\x80\x81", b"plain", b"\xc3\x28"]
    spark.createDataFrame(
        [(bytearray(k), i) for i, k in enumerate(spark_keys)], "k binary, v int"
    ).write.format("txntable").mode("append").save(f"{lake}/t")
    with Producer(wh) as producer:
        producer.send_batch("t", {"k": [b"\xfe\xff", b"\x80"], "v": [10, 11]}).get()
        producer.send("t", {"k": b"\xe2\x82", "v": 12}).get()
    rows = table.scan(columns=["k", "v", "partition"]).to_arrow().sort_by("v").to_pylist()
    keys = [*spark_keys, b"\xfe\xff", b"\x80", b"\xe2\x82"]
    values = [0, 1, 2, 3, 10, 11, 12]
    assert [(r["k"], r["v"]) for r in rows] == list(zip(keys, values, strict=True))
    # Routed by the bytes themselves, as a Kafka producer routes a key.
    assert all(r["partition"] == partition_for_key(r["k"], 4) for r in rows)


def _evolving_to(lake: str, schema: pa.Schema) -> Any:
    """A ``mapInArrow`` function that, in each task, has another client evolve table ``t``
    to ``schema`` (the writer was created, with the older schema, when the job started)."""

    def run(batches: Any) -> Any:
        Warehouse(lake).table("t").evolve_schema(schema)  # idempotent across tasks
        yield from batches

    return run


def test_write_commits_next_to_another_clients_schema_evolution(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    v1 = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    table = wh.create_table("t", 2, schema=v1, key=["id"])
    v2 = v1.append(pa.field("note", pa.string()))
    df = spark.createDataFrame([(i, f"s{i}") for i in range(6)], "id bigint, s string")
    # The job holds v1; a nullable column is added while it runs: it commits unchanged.
    df.mapInArrow(_evolving_to(lake, v2), df.schema).write.format("txntable").mode("append").save(
        f"{lake}/t"
    )
    table.snapshot()  # refresh the handle
    assert table.schema == v2
    rows = table.scan(columns=["id", "s", "note"]).to_arrow().sort_by("id").to_pylist()
    assert rows == [{"id": i, "s": f"s{i}", "note": None} for i in range(6)]
    # A mergeSchema job adding qty while another client adds tag: both columns land.
    v3 = v2.append(pa.field("tag", pa.string()))
    extra = spark.createDataFrame([(10, "x", 7)], "id bigint, s string, qty int")
    extra.mapInArrow(_evolving_to(lake, v3), extra.schema).write.format("txntable").mode(
        "append"
    ).option("mergeSchema", "true").save(f"{lake}/t")
    table.snapshot()
    assert table.schema == v3.append(pa.field("qty", pa.int32()))
    last = table.scan().to_arrow().filter(pa.compute.field("id") == 10).to_pylist()
    assert [(r["s"], r["note"], r["tag"], r["qty"]) for r in last] == [("x", None, None, 7)]


def test_column_names_resolve_as_spark_does(spark: Any, lake: str) -> None:
    """``spark.sql.caseSensitive=false`` (the default): ``Customer`` writes the table's
    ``customer`` (its key: the row is routed by it), and mergeSchema never adds a column
    that differs from an existing one only by case."""
    wh = Warehouse(lake)
    schema = pa.schema([("customer", pa.string()), ("amount", pa.int64())])
    table = wh.create_table("t", 4, schema=schema, key=["customer"])
    path = f"{lake}/t"
    df = spark.createDataFrame([("alice", 5), ("bob", 6)], "Customer string, AMOUNT bigint")
    df.write.format("txntable").mode("append").save(path)
    df.write.format("txntable").mode("append").option("mergeSchema", "true").save(path)
    carol = spark.createDataFrame(
        [("carol", 7, "n")], "CUSTOMER string, amount bigint, Note string"
    )
    carol.write.format("txntable").mode("append").option("mergeSchema", "true").save(path)
    table.snapshot()
    assert table.schema == schema.append(pa.field("Note", pa.string()))
    got = table.scan(columns=["customer", "amount", "Note", "partition"]).to_arrow().to_pylist()
    assert sorted((r["customer"], r["amount"], r["Note"]) for r in got) == [
        ("alice", 5, None),
        ("alice", 5, None),
        ("bob", 6, None),
        ("bob", 6, None),
        ("carol", 7, "n"),
    ]
    assert all(r["partition"] == partition_for_key(r["customer"].encode(), 4) for r in got)
    version = table.snapshot().version
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        for merge in ("false", "true"):
            with pytest.raises(Exception, match="SchemaMismatchError") as info:
                df.write.format("txntable").mode("append").option("mergeSchema", merge).save(path)
            assert "'Customer'" in str(info.value)
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
    assert table.snapshot().version == version  # refused: nothing written
    assert table.schema == schema.append(pa.field("Note", pa.string()))


def test_timestamp_kinds_convert_in_the_session_time_zone(spark: Any, lake: str) -> None:
    """TIMESTAMP into a naive column stores its wall clock in the session time zone, and
    TIMESTAMP_NTZ into a zoned column is read in it: what Spark's own casts give."""
    wh = Warehouse(lake)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("wall", pa.timestamp("us")),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
    table = wh.create_table("t", 1, schema=schema)
    literals = [
        (1, "2024-01-01 00:00:00", "2024-01-01 00:00:00"),
        (2, "2024-07-01 12:00:00", "2024-03-10 02:30:00"),  # 'at' in the DST gap
    ]
    select = " union all ".join(
        f"select {i}L as id, timestamp'{w}' as wall, timestamp_ntz'{a}' as at"
        for i, w, a in literals
    )
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        spark.sql(select).write.format("txntable").mode("append").save(f"{lake}/t")
        # Spark's casts, for reference, as epoch microseconds.
        casts = (
            spark.sql(
                f"select id, unix_micros(cast(at as timestamp)) as at_us, "
                f"cast(wall as timestamp_ntz) as w "
                f"from ({select})"
            )
            .orderBy("id")
            .collect()
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    got = table.scan(columns=["id", "wall", "at"]).to_arrow().sort_by("id").to_pylist()
    assert [r["wall"] for r in got] == [c["w"] for c in casts]  # Spark's own wall clocks
    assert [r["wall"] for r in got] == [
        datetime.datetime(2024, 1, 1, 0, 0),
        datetime.datetime(2024, 7, 1, 12, 0),
    ]
    at_us = [int(r["at"].timestamp() * 1_000_000) for r in got]
    assert at_us == [c["at_us"] for c in casts]
    assert [r["at"] for r in got] == [
        datetime.datetime(2024, 1, 1, 5, 0, tzinfo=datetime.UTC),
        datetime.datetime(2024, 3, 10, 7, 30, tzinfo=datetime.UTC),  # 03:30 EDT, as Java
    ]


def test_errors_speak_of_what_the_spark_user_did(spark: Any, lake: str) -> None:
    """Write errors name the Spark write (not ``send_batch``, a Python API the user never
    called); Overwrite's refusal says append is the only mode; options no read accepts are
    refused at ``load()``, before the stream starts (issue 26 item 7)."""
    wh = Warehouse(lake)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    wh.create_table("t", 1, schema=schema)
    path = f"{lake}/t"
    nulls = spark.createDataFrame([(1, "a"), (None, "b")], "id bigint, s string")
    with pytest.raises(Exception, match=r"txntable write: column 'id', row \d+: null") as info:
        nulls.write.format("txntable").mode("append").save(path)
    assert "send_batch" not in str(info.value)
    ok = spark.createDataFrame([(1, "a")], "id bigint, s string")
    with pytest.raises(Exception, match="append-only") as info:
        ok.write.format("txntable").mode("overwrite").save(path)
    message = str(info.value)
    assert 'mode("append"), the only save mode' in message and "ErrorIfExists" in message
    stream = spark.readStream.format("txntable")
    with pytest.raises(Exception, match="unknown option 'bogus'"):
        stream.option("bogus", "1").load(path)  # at load(): no start() needed
    with pytest.raises(Exception, match="maxOffsetsPerTrigger"):
        spark.readStream.format("txntable").option("maxOffsetsPerTrigger", "many").load(path)
    assert wh.table("t").snapshot().version == 0
