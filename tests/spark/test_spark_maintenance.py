"""Spark reads a maintained table exactly as before: merged segments (explicit offsets),
retention and compaction, on randomized histories (hypothesis, few examples: Spark is slow)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from core.maintutil import HISTORY_FOR_CRASH, Op, op_lists, open_transaction, run_history
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txntable import Warehouse

pytestmark = [pytest.mark.slow, pytest.mark.spark]

_n = itertools.count()


def _rows(
    spark: Any, path: str, level: str, **options: str
) -> list[tuple[int, int, bytes | None]]:
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
    from txntable.retention import plan_retention

    table.commit(lambda s: plan_retention(s, 0, -1, keep))
    table.vacuum(retention_ms=3600 * 1000)
    snap = wh.table("t").snapshot()
    start = {p.partition: p.log_start_offset for p in snap.partitions}
    assert _rows(spark, path, "read_committed") == [r for r in before if r[1] >= start[r[0]]]
