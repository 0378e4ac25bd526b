"""Typed tables through a real local SparkSession: Python ↔ Spark round trips of every
allowed type, both isolation levels, column selection, writes matching or evolving the
schema (``mergeSchema``), and refused writes that leave nothing behind."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from sparkutil import raises_in_spark, run_to_end
from typedutil import ALL_TYPES, comparable, null_row, row

from txntable import Producer, Warehouse
from txntable.errors import InvalidConfigurationError, SchemaMismatchError, SerializationError
from txntable.protocol.schema import TypedLayout
from txntable_spark.schema import to_spark_batches, typed_arrow_schema, typed_spark_schema

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def by_offset(table: pa.Table) -> pa.Table:
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")])


def spark_view(table: pa.Table, layout: TypedLayout, columns: list[str] | None = None) -> pa.Table:
    """What Spark must return for the rows of ``Table.scan``: the same values in Spark's
    Arrow types (timestamps in microseconds, UTC)."""
    return by_offset(
        to_spark_batches(table, typed_arrow_schema(typed_spark_schema(layout, columns)))
    )


def write_all_types(wh: Warehouse, name: str) -> None:
    wh.create_table(name, 2, schema=ALL_TYPES, key=["id"])
    data = pa.Table.from_pylist(
        [comparable(row(i)) for i in range(6)] + [comparable(null_row(i)) for i in range(6, 9)],
        schema=ALL_TYPES,
    )
    with Producer(wh) as producer:
        producer.send_batch(name, data).get()
        producer.send(name, row(9))


def test_python_to_spark_every_type(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    write_all_types(wh, "t")
    table = wh.table("t")
    layout = table.layout
    assert layout is not None
    df = spark.read.format("txntable").load(f"{lake}/t")
    assert df.schema == typed_spark_schema(layout)
    assert df.schema["ts_s"].dataType.simpleString() == "timestamp_ntz"
    assert df.schema["ts_us_zone"].dataType.simpleString() == "timestamp"
    got = by_offset(df.toArrow())
    assert got.num_rows == 10
    assert got.equals(spark_view(table.scan().to_arrow(), layout))


def test_spark_to_python_every_type_and_back(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    write_all_types(wh, "src")
    wh.create_table("dst", 3, schema=ALL_TYPES, key=["id"])
    # A DataFrame read from a typed table writes back as is (partition, offset ignored...).
    src = spark.read.format("txntable").load(f"{lake}/src")
    src.drop("partition", "offset").write.format("txntable").mode("append").save(f"{lake}/dst")
    dst = wh.table("dst")
    assert dst.snapshot().version == 1  # every task's segments in one version
    original = wh.table("src").scan().to_arrow().sort_by("id")
    copied = dst.scan().to_arrow().sort_by("id")
    # ... with every value and timestamp (Spark's microseconds; ts_ns holds none below).
    for name in [*ALL_TYPES.names, "timestamp"]:
        assert copied.column(name).equals(original.column(name)), name
    # Rows are routed by the key column, as the Python producer routes them.
    again = wh.create_table("again", 3, schema=ALL_TYPES, key=["id"])
    with Producer(wh) as producer:
        producer.send_batch("again", original.select(ALL_TYPES.names)).get()
    where = {
        r["id"]: r["partition"]
        for r in again.scan(columns=["id", "partition"]).to_arrow().to_pylist()
    }
    assert {r["id"]: r["partition"] for r in copied.to_pylist()} == where


def test_both_isolation_levels(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    table = wh.create_table("t", 1, schema=pa.schema([("n", pa.int32())]))
    producer = Producer(wh, transactional_id="tx", linger_ms=600_000, batch_size=1 << 30)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_batch("t", {"n": [1, 2]})
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("t", {"n": 3})
    producer.flush()
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send("t", {"n": 4})
    producer.flush()  # open: pins the LSO
    try:
        committed = spark.read.format("txntable").load(f"{lake}/t")
        uncommitted = (
            spark.read.format("txntable").option("isolation.level", "read_uncommitted")
        ).load(f"{lake}/t")
        assert [(r.n, r.offset) for r in committed.orderBy("offset").collect()] == [(1, 0), (2, 1)]
        assert [(r.n, r.offset) for r in uncommitted.orderBy("offset").collect()] == [
            (1, 0),
            (2, 1),
            (3, 3),
            (4, 5),
        ]
        assert table.scan("read_uncommitted").to_arrow().num_rows == 4
    finally:
        producer.abort_transaction()
        producer.close()


def test_column_selection_by_option_and_by_schema(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    write_all_types(wh, "t")
    layout = wh.table("t").layout
    assert layout is not None
    want = spark_view(wh.table("t").scan().to_arrow(), layout).select(
        ["text", "offset", "partition"]
    )
    by_option = spark.read.format("txntable").option("columns", "text,offset,partition")
    got = by_offset(by_option.load(f"{lake}/t").toArrow())
    assert got.schema.names == ["text", "offset", "partition"]
    assert got.schema.field("offset").nullable is False  # the table's columns, as declared
    assert got.equals(want)
    by_schema = spark.read.format("txntable").schema("text string, offset bigint, partition int")
    # A given schema is Spark's to declare (nullable here); the values are the same.
    assert by_offset(by_schema.load(f"{lake}/t").toArrow()).to_pylist() == want.to_pylist()
    with raises_in_spark(
        InvalidConfigurationError, "column text is string in the table, not bigint"
    ):
        spark.read.format("txntable").schema("text bigint").load(f"{lake}/t").collect()
    with raises_in_spark(
        InvalidConfigurationError, "column nope of the given schema is not a column of"
    ):
        spark.read.format("txntable").schema("nope string").load(f"{lake}/t").collect()
    with raises_in_spark(SchemaMismatchError, "no column 'nope'"):
        spark.read.format("txntable").option("columns", "nope").load(f"{lake}/t").collect()


def test_evolution_from_python_and_spark(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    v1 = pa.schema([pa.field("id", pa.int32(), nullable=False), ("price", pa.float32())])
    table = wh.create_table("t", 2, schema=v1, key=["id"])
    with Producer(wh) as producer:
        producer.send_batch("t", {"id": [1, 2], "price": [1.5, 2.5]}).get()
    table.evolve_schema(
        pa.schema(
            [
                pa.field("id", pa.int64(), nullable=False),
                ("price", pa.float64()),
                ("note", pa.string()),
            ]
        )
    )
    with Producer(wh) as producer:
        producer.send("t", {"id": 3, "price": 3.25, "note": "python v2"})
    # Spark writes a matching DataFrame, then one with a new column under mergeSchema.
    spark.createDataFrame(
        [(4, 4.5, "spark v2")], "id bigint, price double, note string"
    ).write.format("txntable").mode("append").save(f"{lake}/t")
    before = table.snapshot().version
    extra = spark.createDataFrame(
        [(5, None, "v3", 7)], "id int, price double, note string, qty int"
    )
    with raises_in_spark(SchemaMismatchError, "mergeSchema"):
        extra.write.format("txntable").mode("append").save(f"{lake}/t")
    assert wh.table("t").snapshot().version == before  # refused: nothing written
    extra.write.format("txntable").mode("append").option("mergeSchema", "true").save(f"{lake}/t")
    snap = wh.table("t").snapshot()
    assert snap.version == before + 1  # the new schema and the data in one version
    assert wh.table("t").schema == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("price", pa.float64()),
            ("note", pa.string()),
            ("qty", pa.int32()),
        ]
    )
    expected = [
        (1, 1.5, None, None),
        (2, 2.5, None, None),
        (3, 3.25, "python v2", None),
        (4, 4.5, "spark v2", None),
        (5, None, "v3", 7),
    ]
    got = spark.read.format("txntable").load(f"{lake}/t").orderBy("id").collect()
    assert [(r.id, r.price, r.note, r.qty) for r in got] == expected
    py = wh.table("t").scan(columns=["id", "price", "note", "qty"]).to_arrow().sort_by("id")
    assert [tuple(r.values()) for r in py.to_pylist()] == expected


def test_spark_write_refusals_write_nothing(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    wh.create_table(
        "t", 1, schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    )
    bad_type = spark.createDataFrame([("x", "y")], "id string, s string")
    with raises_in_spark(SchemaMismatchError, "cannot be stored"):
        bad_type.write.format("txntable").mode("append").save(f"{lake}/t")
    nulls = spark.createDataFrame([(1, "a"), (None, "b")], "id bigint, s string")
    with raises_in_spark(SerializationError, r"column 'id', row \d+: null"):
        nulls.write.format("txntable").mode("append").save(f"{lake}/t")
    narrowing = spark.createDataFrame([("x",)], "id string")
    with raises_in_spark(SchemaMismatchError, "cannot hold"):
        narrowing.write.format("txntable").mode("append").option("mergeSchema", "true").save(
            f"{lake}/t"
        )
    assert wh.table("t").snapshot().version == 0
    assert list(wh.store.list("t/data/")) == []


def test_streaming_read_and_write_of_typed_tables(spark: Any, lake: str, tmp_path: Any) -> None:
    wh = Warehouse(lake)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    wh.create_table("src", 2, schema=schema, key=["id"])
    dst = wh.create_table("dst", 2, schema=schema, key=["id"])
    with Producer(wh) as producer:
        producer.send_batch("src", {"id": list(range(20)), "s": [f"r{i}" for i in range(20)]})

    def run() -> None:
        query = (
            spark.readStream.format("txntable")
            .option("startingOffsets", "earliest")
            .load(f"{lake}/src")
            .drop("partition", "offset")
            .writeStream.format("txntable")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start(f"{lake}/dst")
        )
        run_to_end(query)

    run()
    with Producer(wh) as producer:
        producer.send("src", {"id": 20, "s": "late"})
    run()  # resumes from its checkpoint: exactly the new record
    got = dst.scan(columns=["id", "s", "partition"]).to_arrow().sort_by("id").to_pylist()
    src = wh.table("src").scan(columns=["id", "s", "partition"]).to_arrow().sort_by("id")
    assert got == src.to_pylist()  # same values, and routed to the same partitions by key
    assert len(got) == 21


def test_typed_stream_stops_clearly_when_the_schema_changes_and_a_restart_reads_on(
    spark: Any, lake: str, tmp_path: Any
) -> None:
    """A query keeps the schema it started with: when the table's changes (a column added,
    one widened), the next trigger fails saying to restart, instead of dropping the new
    column or failing on the first value the old type cannot hold; the restarted query
    reads on from its checkpoint with the new schema (issue 26 item 6)."""
    wh = Warehouse(lake)
    v1 = pa.schema([pa.field("id", pa.int32(), nullable=False), ("s", pa.string())])
    table = wh.create_table("t", 1, schema=v1)
    with Producer(wh) as producer:
        producer.send_batch("t", {"id": [0, 1, 2], "s": ["a", "b", "c"]}).get()
    seen: list[dict[str, Any]] = []

    def start() -> Any:
        return (
            spark.readStream.format("txntable")
            .option("startingOffsets", "earliest")
            .load(f"{lake}/t")
            .drop("partition", "timestamp")
            .writeStream.foreachBatch(lambda df, _: seen.extend(r.asDict() for r in df.collect()))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )

    query = start()
    try:
        query.processAllAvailable()
        table.evolve_schema(
            pa.schema(
                [pa.field("id", pa.int64(), nullable=False), ("s", pa.string()), ("n", pa.string())]
            )
        )
        with Producer(wh) as producer:
            producer.send("t", {"id": 2**40, "s": "d", "n": "new"}).get()
        with raises_in_spark(SchemaMismatchError, "changed while this stream ran") as info:
            query.processAllAvailable()
        message = str(info.value)
        assert "n added" in message and "id int32 -> int64" in message
        assert "restart the query" in message
    finally:
        query.stop()
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert [(r["id"], r["s"], r.get("n"), r["offset"]) for r in seen] == [
        (0, "a", None, 0),
        (1, "b", None, 1),
        (2, "c", None, 2),
        (2**40, "d", "new", 3),
    ]
