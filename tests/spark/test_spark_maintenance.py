"""Spark reads a maintained table exactly as before: merged segments (explicit offsets),
retention and compaction, on randomized histories (hypothesis, few examples: Spark is slow)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from maintutil import (
    HISTORY_FOR_CRASH,
    SPARSE,
    Op,
    compacted_table,
    op_lists,
    open_transaction,
    read_keys,
    run_history,
)

from txntable import Warehouse
from txntable.protocol.actions import Segment

pytestmark = [pytest.mark.slow, pytest.mark.spark]

_n = itertools.count()


def _rows(spark: Any, path: str, level: str, **options: str) -> list[tuple[int, int, bytes | None]]:
    reader = spark.read.format("txntable").option("isolation.level", level)
    for k, v in options.items():
        reader = reader.option(k, v)
    got = reader.load(path).select("partition", "offset", "value").collect()
    return sorted(
        (r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"]))
        for r in got
    )


def test_spark_reads_merged_segments_at_their_offsets(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/wh"
    wh = Warehouse(url)
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY_FOR_CRASH)
    opener = open_transaction(wh, "t", 1, 2)
    path = f"{url}/t"
    committed = _rows(spark, path, "read_committed")
    uncommitted = _rows(spark, path, "read_uncommitted")
    lso = {p.partition: p.last_stable_offset for p in wh.table("t").snapshot().partitions}
    version_before = wh.table("t").snapshot().version

    wh.table("t").optimize()

    assert _rows(spark, path, "read_committed") == committed
    after = _rows(spark, path, "read_uncommitted")
    assert [r for r in after if r[1] < lso[r[0]]] == committed
    assert [r for r in after if r[1] >= lso[r[0]]] == [r for r in uncommitted if r[1] >= lso[r[0]]]
    # A range starting inside a merged segment, and time travel to before the merge.
    start = committed[len(committed) // 2]
    ranged = _rows(
        spark, path, "read_committed", startingOffsets=f'{{"t": {{"{start[0]}": {start[1]}}}}}'
    )
    assert [r for r in ranged if r[0] == start[0]] == [
        r for r in committed if r[0] == start[0] and r[1] >= start[1]
    ]
    assert _rows(spark, path, "read_committed", versionAsOf=str(version_before)) == committed
    opener.abort_transaction()


def test_spark_reads_a_compacted_table_with_ranges_inside_its_gaps(
    spark: Any, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/wh"
    wh = Warehouse(url)
    compacted_table(wh, "t", partitions=2)  # offsets 4, 5, 10, 11 of [0, 13) per partition
    for start, end in ((0, 13), (5, 11), (6, 12)):
        got = _rows(
            spark,
            f"{url}/t",
            "read_committed",
            startingOffsets=json.dumps({"t": {"0": start, "1": start}}),
            endingOffsets=json.dumps({"t": {"0": end, "1": end}}),
        )
        scan = wh.table("t").scan(starting_offsets=start, ending_offsets={0: end, 1: end})
        expected = scan.to_arrow().select(["partition", "offset", "value"]).to_pylist()
        assert got == [tuple(r.values()) for r in expected]
        assert [o for p, o, _ in got if p == 0] == [o for o in SPARSE if start <= o < end]


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(history=op_lists(6), target=st.sampled_from([1, 3_000, 1 << 30]), keep=st.integers(0, 4_000))
def test_spark_read_committed_survives_maintenance(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, history: list[Op], target: int, keep: int
) -> None:
    url = f"file://{tmp_path_factory.mktemp(f'prop{next(_n)}')}/wh"
    wh = Warehouse(url)
    wh.create_table("t", partitions=2, configuration={"retention.ms": "-1"})
    run_history(wh, "t", [Op("idem", ((0, 1), (1, 1))), *history])
    path = f"{url}/t"
    before = _rows(spark, path, "read_committed")
    table = wh.table("t")
    table.optimize(target_bytes=target)
    from txntable.maintenance.retention import plan_retention

    table.commit(lambda s: plan_retention(s, 0, -1, keep))
    table.vacuum(retention_ms=3600 * 1000, dry_run=False)
    snap = wh.table("t").snapshot()
    start = {p.partition: p.log_start_offset for p in snap.partitions}
    assert _rows(spark, path, "read_committed") == [r for r in before if r[1] >= start[r[0]]]


def _keyed_rows(spark: Any, path: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    df = spark.read.format("txntable").load(path)
    got = df.select("partition", "offset", df.key.alias("k"), df.value.alias("v")).collect()
    return sorted(
        (r["partition"], r["offset"], *(None if r[c] is None else bytes(r[c]) for c in "kv"))
        for r in got
    )


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(history=op_lists(6), target=st.sampled_from([1, 3_000, 1 << 30]), twice=st.booleans())
def test_spark_compaction_keeps_every_keys_latest_committed_value(
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[Op],
    target: int,
    twice: bool,
) -> None:
    url = f"file://{tmp_path_factory.mktemp(f'compact{next(_n)}')}/wh"
    wh = Warehouse(url)
    wh.create_table(
        "t", partitions=2, configuration={"cleanup.policy": "compact", "segment.bytes": str(target)}
    )
    run_history(wh, "t", [Op("idem", ((0, 1), (1, 1))), *history], keys=3)
    path = f"{url}/t"
    before = _keyed_rows(spark, path)
    wh.table("t").compact(now=0)  # tombstone horizons in the future: tombstones stay
    if twice:  # compact a compacted segment again, with newer records
        run_history(wh, "t", [Op("commit", ((0, 2), (1, 1)))], keys=3)
        before = _keyed_rows(spark, path)
        wh.table("t").compact(now=0)
    after = _keyed_rows(spark, path)
    assert set(after) <= set(before)
    for p in (0, 1):
        latest_before = {k: (o, v) for q, o, k, v in before if q == p}
        latest_after = {k: (o, v) for q, o, k, v in after if q == p}
        assert latest_after == latest_before
    # Spark reads exactly what the Python consumer reads.
    python = read_keys(wh, "t")
    assert after == sorted((p, o, k, v) for p, rows in python.items() for o, k, v in rows)


def test_spark_stream_while_producer_and_maintainers_run(spark: Any, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys
    import time
    import uuid

    worker = Path(__file__).parents[1] / "maintenance" / "helpers" / "maint_worker.py"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(worker), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    url = f"file://{tmp_path}/wh"
    wh = Warehouse(url)
    wh.create_table("t", partitions=2, configuration={"segment.bytes": "4000"})
    stop = str(tmp_path / "stop")
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("txntable")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load(f"{url}/t")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    # Let the stream start its Python workers before four busy processes compete with it
    # for the cores (on a loaded machine a worker then failed to connect back in time).
    query.processAllAvailable()
    maintainers = [start("maintain", url, stop) for _ in range(2)]
    consumer = start("consume", url)
    try:
        producer = start("produce", url, "30")
        out, err = producer.communicate(timeout=600)
        assert producer.returncode == 0, err
        acked = sorted(tuple(json.loads(line))[:2] for line in out.splitlines())
        cout, cerr = consumer.communicate(timeout=600)
        assert consumer.returncode == 0, cerr
        polled = [tuple(json.loads(line))[:2] for line in cout.splitlines()]
        assert sorted(polled) == acked and len(set(polled)) == len(polled)
        deadline = time.monotonic() + 300
        got: list[tuple[int, int]] = []
        while time.monotonic() < deadline:
            query.processAllAvailable()
            got = sorted(
                (r["partition"], r["offset"])
                for r in spark.table(name).select("partition", "offset").collect()
            )
            if len(got) >= len(acked):
                break
            time.sleep(0.5)
        assert got == acked  # nothing lost, duplicated or moved
    finally:
        query.stop()
        Path(stop).touch()
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
        for m in maintainers:
            m.communicate(timeout=600)
    snap = wh.table("t").snapshot()
    assert any(isinstance(e, Segment) for part in snap.partitions for e in part.entries)
