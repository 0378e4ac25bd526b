"""Streaming reads and exactly-once streaming writes through a real local SparkSession."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import pytest
from sparkutil import Row, TableWriter, rec, run_to_end, spark_rows

from txntable.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _stream(spark: Any, path: str, **options: str) -> Any:
    reader = spark.readStream.format("txntable")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def test_stream_sees_transaction_only_after_commit(spark: Any, lake: str) -> None:
    tw = TableWriter(Warehouse(lake), "orders", 2)
    tw.batch(0, [rec(i, b"a") for i in range(3)])
    tw.batch(1, [rec(10 + i, b"b") for i in range(2)], pid=1, txn=True)  # open
    tw.batch(1, [rec(20 + i, b"c") for i in range(2)])  # behind the open txn
    tw.batch(0, [rec(30 + i, b"d") for i in range(2)], pid=2, txn=True)  # will abort
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(spark, f"{lake}/orders", startingOffsets="earliest")
        .writeStream.format("memory")
        .queryName(name)
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark_rows(spark.table(name)) == tw.expected()
        assert {r[3] for r in spark_rows(spark.table(name))} == {b"v0", b"v1", b"v2"}
        tw.end_txn(1, commit=True)
        tw.end_txn(2, commit=False)
        tw.batch(0, [rec(40, b"e")])
        query.processAllAvailable()
        got = spark_rows(spark.table(name))
        assert got == tw.expected()
        assert b"v10" in {r[3] for r in got} and b"v30" not in {r[3] for r in got}
        progress = query.lastProgress["sources"][0]
        assert json.loads(progress["endOffset"]) == {"0": tw.lso(0), "1": tw.lso(1)}
    finally:
        query.stop()


def _forget_commit(checkpoint: str, batch_id: int) -> None:
    """Make Spark believe ``batch_id`` never finished (as after a crash): it is re-run."""
    for name in (str(batch_id), f".{batch_id}.crc"):
        path = os.path.join(checkpoint, "commits", name)
        if os.path.exists(path):
            os.remove(path)


def _collect_batches(spark: Any, path: str, checkpoint: str, seen: dict[int, list[Row]]) -> Any:
    def sink(df: Any, batch_id: int) -> None:
        seen[batch_id] = spark_rows(df)

    return (
        _stream(spark, path, startingOffsets="earliest", maxOffsetsPerTrigger="4")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def test_available_now_rate_limit_and_restart_replay(spark: Any, lake: str, tmp_path: Any) -> None:
    tw = TableWriter(Warehouse(lake), "orders", 2)
    for i in range(5):
        tw.batch(i % 2, [rec(i * 10 + j) for j in range(3)])
    checkpoint = str(tmp_path / "ckpt")
    seen: dict[int, list[Row]] = {}
    run_to_end(_collect_batches(spark, f"{lake}/orders", checkpoint, seen))
    # 4 offsets a trigger, shared in proportion to what each partition has left (9 and 6),
    # each share rounded down, as Spark's Kafka source does.
    assert [len(seen[b]) for b in sorted(seen)] == [3, 3, 3, 4, 2]
    assert sorted(r for rows in seen.values() for r in rows) == tw.expected()

    # Crash after the last batch ran but before Spark recorded it: it is replayed on restart.
    last = max(seen)
    first_run = dict(seen)
    _forget_commit(checkpoint, last)
    tw.batch(0, [rec(100 + j) for j in range(2)], pid=7, txn=True)
    tw.end_txn(7, commit=True)
    tw.batch(1, [rec(200 + j) for j in range(2)])
    replayed: dict[int, list[Row]] = {}
    run_to_end(_collect_batches(spark, f"{lake}/orders", checkpoint, replayed))
    assert min(replayed) == last
    assert replayed[last] == first_run[last]  # same offsets -> same records
    merged = {**first_run, **replayed}
    everything = sorted(r for rows in merged.values() for r in rows)
    assert everything == tw.expected()  # nothing lost, nothing twice


def test_streaming_write_exactly_once_across_restart(spark: Any, lake: str, tmp_path: Any) -> None:
    wh = Warehouse(lake)
    src = TableWriter(wh, "src", 2)
    for i in range(4):
        src.batch(i % 2, [rec(i * 10 + j, b"k%d" % j) for j in range(3)])
    wh.create_table("dst", partitions=3)
    checkpoint = str(tmp_path / "ckpt-w")

    def run() -> None:
        query = (
            _stream(spark, f"{lake}/src", startingOffsets="earliest", maxOffsetsPerTrigger="5")
            .selectExpr("key", "value", "headers", "timestamp")
            .writeStream.format("txntable")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(f"{lake}/dst")
        )
        run_to_end(query)

    run()
    dst = wh.table("dst")
    snap = dst.snapshot()
    (app,) = snap.app_txns.values()
    assert app.appId == f"spark-query-{_query_id(checkpoint)}"
    last = app.version
    version_before = snap.version
    # Forget that the last batch committed: Spark replays it, the sink must skip it.
    _forget_commit(checkpoint, last)
    run()
    snap = dst.snapshot()
    assert snap.version == version_before  # the replay wrote no version
    src.batch(0, [rec(500 + j, b"new") for j in range(2)])
    run()
    got = spark_rows(spark.read.format("txntable").load(f"{lake}/dst"))
    values = sorted(r[3] for r in got)
    assert values == sorted(r[3] for r in src.expected())  # each source record exactly once
    assert dst.snapshot().app_txns[app.appId].version > last
    # The replayed batch's segments were deleted: every data file is referenced by the log.
    referenced = {
        e.path for p in dst.snapshot().partitions for e in p.entries if hasattr(e, "path")
    }
    on_disk = set(dst.store.list("dst/data/"))
    assert on_disk == referenced


def test_streaming_write_with_explicit_app_id(spark: Any, lake: str, tmp_path: Any) -> None:
    wh = Warehouse(lake)
    src = TableWriter(wh, "src", 1)
    src.batch(0, [rec(j, b"k") for j in range(3)])
    wh.create_table("dst", partitions=1)
    query = (
        _stream(spark, f"{lake}/src", startingOffsets="earliest")
        .select("key", "value")
        .writeStream.format("txntable")
        .option("checkpointLocation", str(tmp_path / "c"))
        .option("txnAppId", "my-pipeline")
        .trigger(availableNow=True)
        .start(f"{lake}/dst")
    )
    run_to_end(query)
    assert wh.table("dst").snapshot().app_txns["my-pipeline"].version == 0


def test_max_files_per_trigger_in_a_running_query(spark: Any, lake: str, tmp_path: Any) -> None:
    tw = TableWriter(Warehouse(lake), "orders", 2)
    for i in range(5):
        tw.batch(i % 2, [rec(i * 10 + j) for j in range(3)])  # 5 segments of 3 records
    seen: dict[int, list[Row]] = {}

    def sink(df: Any, batch_id: int) -> None:
        seen[batch_id] = spark_rows(df)

    run_to_end(
        _stream(spark, f"{lake}/orders", startingOffsets="earliest", maxFilesPerTrigger="2")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    sizes = [len(seen[b]) for b in sorted(seen) if seen[b]]
    assert sizes == [6, 6, 3]  # two segments per micro-batch, then the last one
    assert sorted(r for rows in seen.values() for r in rows) == tw.expected()


def _mirror(spark: Any, source: str, target: str, checkpoint: str) -> None:
    """Run a streaming copy of ``source`` into ``target`` until it has read everything."""
    query = (
        _stream(spark, source, startingOffsets="earliest", maxOffsetsPerTrigger="4")
        .select("key", "value")
        .writeStream.format("txntable")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination(120)
    assert query.exception() is None


def _values(spark: Any, path: str) -> list[bytes]:
    return sorted(r[3] for r in spark_rows(spark.read.format("txntable").load(path)))


def _query_id(checkpoint: str) -> str:
    with open(os.path.join(checkpoint, "metadata")) as f:
        return str(json.load(f)["id"])


def test_stream_started_over_with_a_fresh_checkpoint_lands_all_batches(
    spark: Any, lake: str, tmp_path: Any
) -> None:
    """Deleting the checkpoint starts a new query (a new id): its batches must land even
    though its batch ids start at 0 again (issue 24)."""
    wh = Warehouse(lake)
    first, second = TableWriter(wh, "in1", 1), TableWriter(wh, "in2", 1)
    first.batch(0, [rec(i) for i in range(10)])
    second.batch(0, [rec(100 + i) for i in range(10)])
    wh.create_table("out", partitions=2)
    checkpoint = str(tmp_path / "ckpt")
    _mirror(spark, f"{lake}/in1", f"{lake}/out", checkpoint)
    old_id = _query_id(checkpoint)
    assert len(_values(spark, f"{lake}/out")) == 10
    shutil.rmtree(checkpoint)
    _mirror(spark, f"{lake}/in2", f"{lake}/out", checkpoint)
    new_id = _query_id(checkpoint)
    assert new_id != old_id
    expected = sorted(r[3] for r in first.expected() + second.expected())
    assert _values(spark, f"{lake}/out") == expected  # all 20, once each
    app_txns = wh.table("out").snapshot().app_txns
    assert sorted(app_txns) == sorted([f"spark-query-{old_id}", f"spark-query-{new_id}"])


def test_one_query_with_its_checkpoint_spelled_four_ways_writes_each_batch_once(
    spark: Any, lake: str, tmp_path: Any
) -> None:
    """``/x``, ``file:/x``, ``file:///x`` and a path relative to the driver's working
    directory are one checkpoint to Spark, so one query to the sink: a batch replayed
    under another spelling is skipped."""
    wh = Warehouse(lake)
    src = TableWriter(wh, "src", 1)
    wh.create_table("dst", partitions=1)
    checkpoint = str(tmp_path / "ckpt")
    driver_cwd = spark.sparkContext._jvm.System.getProperty("user.dir")
    spellings = [
        f"file://{checkpoint}",
        checkpoint,
        f"file:{checkpoint}/",
        os.path.relpath(checkpoint, driver_cwd),
    ]
    for round_, spelling in enumerate(spellings):
        src.batch(0, [rec(10 * round_ + i) for i in range(3)])
        if round_:
            # Spark forgets the last batch committed (a crash): the new run replays it.
            done = [int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()]
            _forget_commit(checkpoint, max(done))
        _mirror(spark, f"{lake}/src", f"{lake}/dst", spelling)
        assert _values(spark, f"{lake}/dst") == sorted(r[3] for r in src.expected()), spelling
    assert list(wh.table("dst").snapshot().app_txns) == [f"spark-query-{_query_id(checkpoint)}"]
