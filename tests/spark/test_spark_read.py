"""Batch reads through a real local SparkSession."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from sparkutil import Row, TableWriter, arrow_rows, raises_in_spark, rec, spark_rows

from txntable.errors import (
    InvalidConfigurationError,
    OffsetOutOfRangeError,
    TableNotFoundError,
    VersionNotFoundError,
)
from txntable.protocol.actions import Batch
from txntable.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _mixed(lake: str) -> TableWriter:
    """Interleaved committed and aborted transactions, plain batches and an open transaction."""
    tw = TableWriter(Warehouse(lake), "orders", 3)
    tw.batch(0, [rec(i, b"k%d" % (i % 3), headers=2) for i in range(5)])
    tw.batch(0, [rec(100 + i, b"a") for i in range(4)], pid=1, txn=True)
    tw.batch(1, [rec(200 + i, b"c", headers=1) for i in range(3)], pid=2, txn=True)
    tw.batch(0, [rec(300 + i, b"c") for i in range(2)], pid=2, txn=True)
    tw.batch(1, [rec(400 + i, None) for i in range(2)], pid=1, txn=True)
    tw.end_txn(1, commit=False)
    tw.batch(2, [rec(500 + i) for i in range(6)])
    tw.end_txn(2, commit=True)
    tw.batch(1, [rec(600 + i, b"open") for i in range(3)], pid=3, txn=True)  # stays open
    tw.batch(1, [rec(700 + i, b"late") for i in range(2)])  # above partition 1's LSO
    tw.batch(0, [rec(800 + i, b"z") for i in range(3)])
    return tw


def _load(spark: Any, path: str, **options: str) -> Any:
    reader = spark.read.format("txntable")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def test_read_committed_and_uncommitted(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    path = f"{lake}/orders"
    got = spark_rows(_load(spark, path))
    assert got == tw.expected(read_committed=True)
    assert not any(r[3].startswith(b"v1") and len(r[3]) == 4 for r in got)  # aborted 100..103
    uncommitted = spark_rows(_load(spark, path, **{"isolation.level": "read_uncommitted"}))
    assert uncommitted == tw.expected(read_committed=False)
    assert len(uncommitted) > len(got)
    # file:// URLs and the warehouse/table options name the same table.
    assert spark_rows(_load(spark, f"file://{path}")) == got
    df = spark.read.format("txntable").option("warehouse", lake).option("table", "orders").load()
    assert df.count() == len(got)
    assert {r["topic"] for r in df.select("topic").distinct().collect()} == {"orders"}
    # Aborted segments are never opened: with their files gone read_committed still works.
    snap = tw.table.snapshot()
    for part in snap.partitions:
        for e in part.entries:
            if isinstance(e, Batch) and e.producerId == 1:
                os.remove(os.path.join(lake, e.path))
    assert spark_rows(_load(spark, path)) == got


def test_spark_and_table_scan_return_the_same_rows(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    path = f"{lake}/orders"
    start, end = {0: 3}, {0: 10, 1: 2}
    spark_start = '{"orders": {"0": 3}}'
    spark_end = '{"orders": {"0": 10, "1": 2}}'
    for level in ("read_committed", "read_uncommitted"):
        scan = tw.table.scan(isolation_level=level)
        assert spark_rows(_load(spark, path, **{"isolation.level": level})) == arrow_rows(
            scan.to_arrow()
        )
        ranged = tw.table.scan(isolation_level=level, starting_offsets=start, ending_offsets=end)
        options = {"isolation.level": level, "startingOffsets": spark_start}
        got = _load(spark, path, endingOffsets=spark_end, **options)
        assert spark_rows(got) == arrow_rows(ranged.to_arrow())


def test_offsets_and_time_travel(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    path = f"{lake}/orders"
    start = '{"orders": {"0": 3, "2": -2}}'
    end = '{"orders": {"0": 10, "1": 2, "2": -1}}'
    got = spark_rows(_load(spark, path, startingOffsets=start, endingOffsets=end))
    assert got == tw.expected(start={0: 3}, end={0: 10, 1: 2})
    old_version = tw.table.snapshot().version
    before = tw.expected()
    tw.batch(2, [rec(900 + i) for i in range(4)])
    tw.end_txn(3, commit=True)
    assert spark_rows(_load(spark, path, versionAsOf=str(old_version))) == before
    now = spark_rows(_load(spark, path))
    assert now == tw.expected() and len(now) == len(before) + 4 + 3 + 2


def test_small_partitions_and_many_segments(spark: Any, lake: str) -> None:
    tw = TableWriter(Warehouse(lake), "many", 2)
    for i in range(40):
        tw.batch(i % 2, [rec(i * 10 + j, b"k%d" % j) for j in range(5)])
    df = _load(spark, f"{lake}/many", maxBytesPerPartition="2000")
    assert df.rdd.getNumPartitions() > 2
    assert spark_rows(df) == tw.expected()
    df = _load(spark, f"{lake}/many", minPartitions="5")
    assert df.rdd.getNumPartitions() >= 5


def test_count_per_key_aggregation(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    counts = {
        (None if r["key"] is None else bytes(r["key"])): r["count"]
        for r in _load(spark, f"{lake}/orders").groupBy("key").count().collect()
    }
    want: dict[bytes | None, int] = {}
    for row in tw.expected():
        want[row[2]] = want.get(row[2], 0) + 1
    assert counts == want


def test_bad_options_fail_with_typed_error(spark: Any, lake: str) -> None:
    _mixed(lake)
    with raises_in_spark(InvalidConfigurationError, "isolation.level must be read_committed"):
        _load(spark, f"{lake}/orders", **{"isolation.level": "dirty"}).collect()
    with raises_in_spark(TableNotFoundError, "no table 'nope'"):
        _load(spark, f"{lake}/nope").collect()
    with raises_in_spark(OffsetOutOfRangeError):
        _load(spark, f"{lake}/orders", startingOffsets='{"orders": {"0": 999}}').collect()


def test_matches_python_consumer(spark: Any, lake: str) -> None:
    """Real Producer writes, real Consumer reads; Spark must return the same records."""
    from txntable import Consumer, Producer, TopicPartition

    wh = Warehouse(lake)
    wh.create_table("events", partitions=2)
    plain = Producer(wh)
    txn = Producer(wh, transactional_id="etl-1")
    txn.init_transactions()
    for round_ in range(4):
        txn.begin_transaction()
        for i in range(6):
            key = f"k{i % 3}".encode()
            headers = [("round", str(round_).encode()), ("n", None)]
            txn.send(
                "events", value=f"t{round_}-{i}".encode(), key=key, headers=headers, partition=i % 2
            )
        plain.send("events", value=f"p{round_}".encode(), key=None, partition=round_ % 2)
        plain.flush()
        if round_ % 2:
            txn.abort_transaction()
        else:
            txn.commit_transaction()
    txn.begin_transaction()  # left open: holds the LSO back on both partitions
    txn.send("events", value=b"open-0", partition=0).result()
    txn.send("events", value=b"open-1", partition=1).result()
    plain.send("events", value=b"after-open", partition=0).result()

    expected: list[Row] = []
    consumer = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    consumer.assign([TopicPartition("events", 0), TopicPartition("events", 1)])
    consumer.seek_to_beginning()
    while batch := consumer.poll(timeout_ms=0, max_records=1000):
        for records in batch.values():
            expected.extend(
                (r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
                for r in records
            )
    consumer.close()
    expected.sort(key=lambda r: (r[0], r[1]))
    assert len(expected) == 2 * 6 + 4  # two committed rounds + four plain records

    got = spark_rows(_load(spark, f"{lake}/events"))
    assert got == expected
    uncommitted = spark_rows(
        _load(spark, f"{lake}/events", **{"isolation.level": "read_uncommitted"})
    )
    assert {b"open-0", b"open-1", b"after-open"} <= {r[3] for r in uncommitted}
    txn.abort_transaction()
    txn.close()
    plain.close()


@pytest.mark.s3
def test_read_committed_from_s3(spark: Any, s3_store: Any) -> None:
    """The same read against S3 (moto): storage options travel as ``storage.*`` options."""
    wh = Warehouse(store=s3_store)
    tw = TableWriter(wh, "orders", 2)
    tw.batch(0, [rec(i, b"k") for i in range(4)])
    tw.batch(1, [rec(10 + i) for i in range(3)], pid=1, txn=True)
    tw.end_txn(1, commit=False)
    tw.batch(1, [rec(20 + i) for i in range(2)], pid=2, txn=True)
    tw.end_txn(2, commit=True)
    tw.batch(0, [rec(30)], pid=3, txn=True)  # open
    reader = spark.read.format("txntable")
    for k, v in s3_store.storage_options().items():
        reader = reader.option(f"storage.{k}", v)
    df = reader.load(f"{s3_store.url}/orders")
    assert spark_rows(df) == tw.expected()
    plan = df._jdf.queryExecution().toString()
    assert "testing-secret" not in plan


def test_read_options_are_honoured_or_refused(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    path = f"{lake}/orders"
    # Spark's Kafka-source spelling of the isolation level.
    got = spark_rows(_load(spark, path, **{"kafka.isolation.level": "read_uncommitted"}))
    assert got == tw.expected(read_committed=False)
    # includeHeaders=false: no headers column, the rest unchanged.
    df = _load(spark, path, includeHeaders="false")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp"]
    want = [(r[0], r[1], r[3]) for r in tw.expected()]
    got_rows = sorted(
        (r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"]))
        for r in df.collect()
    )
    assert got_rows == want
    # Never ignored: refused with the reason or the accepted options.
    for options, message in (
        ({"subscribe": "orders"}, "names the one table"),
        ({"startingTimestamp": "yesterday"}, "startingTimestamp must be a timestamp in ms"),
        ({"kafka.bootstrap.servers": "b:9092"}, "unknown option .* accepted: "),
        ({"maxOffsetsPerTrigger": "5"}, "does not apply to a batch read"),
    ):
        with raises_in_spark(InvalidConfigurationError, message):
            _load(spark, path, **options).collect()


def test_version_as_of_beyond_the_newest_is_version_not_found(spark: Any, lake: str) -> None:
    tw = _mixed(lake)
    newest = tw.table.snapshot().version
    with raises_in_spark(VersionNotFoundError, re.escape(f"available versions: 0..{newest}")):
        _load(spark, f"{lake}/orders", versionAsOf=str(newest + 1)).collect()
