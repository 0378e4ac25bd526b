"""Batch writes through a real local SparkSession: routing, round trip and atomicity."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import pytest
from sparkutil import raises_in_spark, spark_rows

from txntable.errors import (
    InvalidConfigurationError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from txntable.producer.partitioner import partition_for_key
from txntable.protocol.actions import Batch
from txntable.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _data_files(wh: Warehouse, table: str) -> set[str]:
    return set(wh.store.list(f"{table}/data/"))


def test_write_round_trip_is_one_version(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    wh.create_table("out", partitions=3)
    ts = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)
    rows = [
        (f"key{i % 7}" if i % 5 else None, f"value-{i}", [("h", bytearray(b"x%d" % i))], ts)
        for i in range(60)
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value string, headers array<struct<key:string,value:binary>>, "
        "timestamp timestamp",
    ).repartition(4)
    version_before = wh.table("out").snapshot().version
    df.write.format("txntable").mode("append").save(f"{lake}/out")

    snap = wh.table("out").snapshot()
    assert snap.version == version_before + 1  # all tasks' segments in one version
    batches = [e for p in snap.partitions for e in p.entries if isinstance(e, Batch)]
    assert all(b.producerId == -1 and not b.transactional for b in batches)
    assert sum(b.count for b in batches) == 60

    got = spark_rows(spark.read.format("txntable").load(f"{lake}/out"))
    assert sorted(r[3] for r in got) == sorted(f"value-{i}".encode() for i in range(60))
    for partition, _offset, key, value, headers, stamp in got:
        i = int(value.split(b"-")[1])
        if key is not None:
            assert partition == partition_for_key(key, 3)  # Kafka's murmur2 partitioner
            assert key == f"key{i % 7}".encode()
        assert headers == (("h", b"x%d" % i),)
        assert stamp == int(ts.timestamp() * 1000)
    # Offsets are dense per partition.
    for p in range(3):
        offsets = sorted(r[1] for r in got if r[0] == p)
        assert offsets == list(range(len(offsets)))
    assert set(wh.store.list("out/data/")) == {b.path for b in batches}


def test_write_explicit_partition_and_binary(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    wh.create_table("bin", partitions=4)
    df = spark.createDataFrame(
        [(bytearray(b"k"), bytearray(b"\x00\x01"), 2), (None, bytearray(b"\xff"), 3)],
        "key binary, value binary, partition int",
    )
    df.write.format("txntable").mode("append").save(f"{lake}/bin")
    got = spark_rows(spark.read.format("txntable").load(f"{lake}/bin"))
    assert [(r[0], r[2], r[3]) for r in got] == [(2, b"k", b"\x00\x01"), (3, None, b"\xff")]
    # Round trip: a DataFrame read from a table can be written back as is.
    spark.read.format("txntable").load(f"{lake}/bin").write.format("txntable").mode("append").save(
        f"{lake}/bin"
    )
    again = spark_rows(spark.read.format("txntable").load(f"{lake}/bin"))
    assert [(r[0], r[1], r[2], r[3]) for r in again] == [
        (2, 0, b"k", b"\x00\x01"),
        (2, 1, b"k", b"\x00\x01"),
        (3, 0, None, b"\xff"),
        (3, 1, None, b"\xff"),
    ]


def test_failed_job_leaves_nothing(spark: Any, lake: str) -> None:
    from pyspark.sql import functions as F

    wh = Warehouse(lake)
    wh.create_table("atomic", partitions=2)
    spark.createDataFrame([("a", "seed")], "key string, value string").write.format(
        "txntable"
    ).mode("append").save(f"{lake}/atomic")
    version_before = wh.table("atomic").snapshot().version
    files_before = _data_files(wh, "atomic")

    @F.udf("string")
    def explode_on_13(v):  # type: ignore[no-untyped-def]
        if v == "v13":
            raise RuntimeError("injected task failure")
        return v

    df = (
        spark.range(0, 16, 1, 4)
        .select(F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"))
        .withColumn("value", explode_on_13("value"))
    )
    with raises_in_spark(RuntimeError, "injected task failure"):
        df.write.format("txntable").mode("append").save(f"{lake}/atomic")
    snap = wh.table("atomic").snapshot()
    assert snap.version == version_before  # no new version
    # Written segments are deleted: by abort, or by a cancelled task that was still
    # running (Spark does not wait for those), moments later.
    deadline = time.monotonic() + 30
    while _data_files(wh, "atomic") != files_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _data_files(wh, "atomic") == files_before
    assert [r[3] for r in spark_rows(spark.read.format("txntable").load(f"{lake}/atomic"))] == [
        b"seed"
    ]


def test_write_rejects_bad_input(spark: Any, lake: str) -> None:
    Warehouse(lake).create_table("bad", partitions=1)
    with raises_in_spark(SchemaMismatchError, "needs a 'value' column"):
        spark.createDataFrame([(1,)], "key int").write.format("txntable").mode("append").save(
            f"{lake}/bad"
        )
    with raises_in_spark(InvalidConfigurationError):
        spark.createDataFrame([("v",)], "value string").write.format("txntable").mode(
            "overwrite"
        ).save(f"{lake}/bad")
    with raises_in_spark(UnknownTopicOrPartitionError, "partition 5 is outside"):
        spark.createDataFrame([("v", 5)], "value string, partition int").write.format(
            "txntable"
        ).mode("append").save(f"{lake}/bad")
    assert Warehouse(lake).table("bad").snapshot().version == 0


def test_batch_write_with_txn_version_lands_once(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    wh.create_table("idem", partitions=2)
    df = spark.createDataFrame([("a",), ("b",)], "value string")

    def write(version: int) -> None:
        (
            df.write.format("txntable")
            .mode("append")
            .option("txnAppId", "nightly")
            .option("txnVersion", str(version))
            .save(f"{lake}/idem")
        )

    write(1)
    write(1)  # the job re-run: skipped
    assert sorted(
        bytes(r[3]) for r in spark_rows(spark.read.format("txntable").load(f"{lake}/idem"))
    ) == [b"a", b"b"]
    write(2)
    assert sorted(
        bytes(r[3]) for r in spark_rows(spark.read.format("txntable").load(f"{lake}/idem"))
    ) == [b"a", b"a", b"b", b"b"]
    assert wh.table("idem").snapshot().app_txns["nightly"].version == 2
    with raises_in_spark(InvalidConfigurationError, "both txnAppId and txnVersion"):
        df.write.format("txntable").mode("append").option("txnAppId", "x").save(f"{lake}/idem")


def test_write_refuses_columns_a_record_cannot_hold(spark: Any, lake: str) -> None:
    Warehouse(lake).create_table("extra", partitions=1)
    df = spark.createDataFrame(
        [(1, "ann", 9.5, "v")], "id int, name string, score double, value string"
    )
    with raises_in_spark(SchemaMismatchError, re.escape("['id', 'name', 'score']")):
        df.write.format("txntable").mode("append").save(f"{lake}/extra")
    with raises_in_spark(InvalidConfigurationError, "unknown option 'compression'"):
        df.select("value").write.format("txntable").mode("append").option(
            "compression", "zstd"
        ).save(f"{lake}/extra")
    assert Warehouse(lake).table("extra").snapshot().version == 0
    # Round trip: what a read returns (topic, offset included) can be written back.
    df.select("value").write.format("txntable").mode("append").save(f"{lake}/extra")
    back = spark.read.format("txntable").load(f"{lake}/extra")
    back.write.format("txntable").mode("append").save(f"{lake}/extra")
    assert Warehouse(lake).table("extra").describe().partitions[0].high_watermark == 2


def test_pre_1970_timestamps_are_floored_to_milliseconds_as_spark_does(
    spark: Any, lake: str
) -> None:
    """Spark floors microseconds to Kafka's milliseconds (-1.5 ms is -2 ms, not -1), in a
    record's timestamp and in a typed table's millisecond columns (issue 26 item 8)."""
    import pyarrow as pa

    wh = Warehouse(lake)
    records = wh.create_table("records", partitions=1)
    micros = [-1500, -1000, -1, 1500]
    select = " union all ".join(
        f"select 'v{i}' as value, timestamp_micros({m}L) as timestamp, "
        f"timestamp_micros({m}L) as at, cast(timestamp_micros({m}L) as timestamp_ntz) as wall"
        for i, m in enumerate(micros)
    )
    df = spark.sql(select)
    df.select("value", "timestamp").write.format("txntable").mode("append").save(f"{lake}/records")
    got = records.scan().to_arrow().sort_by("value")
    assert got.column("timestamp").cast(pa.int64()).to_pylist() == [-2000, -1000, -1000, 1000]

    schema = pa.schema(
        [("value", pa.string()), ("at", pa.timestamp("ms", tz="UTC")), ("wall", pa.timestamp("ms"))]
    )
    typed = wh.create_table("typed", 1, schema=schema)
    df.select("value", "at", "wall").write.format("txntable").mode("append").save(f"{lake}/typed")
    rows = typed.scan(columns=["value", "at", "wall"]).to_arrow().sort_by("value")
    assert rows.column("at").cast(pa.int64()).to_pylist() == [-2, -1, -1, 1]
    assert rows.column("wall").cast(pa.int64()).to_pylist() == [-2, -1, -1, 1]
