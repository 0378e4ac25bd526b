"""Spark's time-based positions agree with a scan: startingTimestamp & co. and timestampAsOf.

The resolution (driver side, no Spark) runs on random histories; one Spark test reads
through a real SparkSession.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sparkutil import raises_in_spark

from txntable import Producer, Warehouse
from txntable.errors import NoOffsetForPartitionError, VersionNotFoundError
from txntable.read.planning import LATEST
from txntable.read.timestamps import commit_timestamp, timestamps_ms, version_at_timestamp
from txntable.storage import MemoryStore
from txntable_spark.options import parse_read_options
from txntable_spark.timepos import resolve_time_options


def _first_at(wh: Warehouse, p: int, ts: int, level: str = "read_committed") -> int | None:
    rows = wh.table("t").scan(level, partitions=[p]).to_arrow()
    stamps = timestamps_ms(rows.column("timestamp")).to_pylist()
    hits = [o for o, t in zip(rows.column("offset").to_pylist(), stamps, strict=True) if t >= ts]
    return min(hits) if hits else None


def _history(wh: Warehouse, batches: list[tuple[int, list[int], bool]]) -> None:
    wh.create_table("t", partitions=2)
    plain = Producer(wh)
    for i, (p, stamps, aborted) in enumerate(batches):
        if aborted:
            tx = Producer(wh, transactional_id=f"a{i}")
            tx.init_transactions()
            tx.begin_transaction()
            for ts in stamps:
                tx.send("t", value=b"x", partition=p, timestamp=ts)
            tx.abort_transaction()
            tx.close()
        else:
            for ts in stamps:
                plain.send("t", value=b"v", partition=p, timestamp=ts)
            plain.flush()
    plain.close()


HISTORY = st.lists(
    st.tuples(
        st.integers(0, 1), st.lists(st.integers(100, 160), min_size=1, max_size=3), st.booleans()
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HISTORY, st.integers(95, 165), st.integers(95, 165), st.sampled_from(["error", "latest"]))
def test_timestamp_options_resolve_like_a_scan(
    batches: list[tuple[int, list[int], bool]], start: int, end: int, strategy: str
) -> None:
    name = f"ts-{uuid.uuid4().hex}"
    wh = Warehouse(store=MemoryStore(name))
    try:
        _history(wh, batches)
        table = wh.table("t")
        snap = table.snapshot()
        opts = parse_read_options(
            {
                "path": "memory://x/t",
                "startingTimestamp": str(start),
                "endingOffsetsByTimestamp": '{"t": {"1": ' + str(end) + "}}",
                "startingOffsetsByTimestampStrategy": strategy,
            }
        )
        want_start = {p: _first_at(wh, p, start) for p in (0, 1)}
        if strategy == "error" and None in want_start.values():
            with pytest.raises(NoOffsetForPartitionError):
                resolve_time_options(table, snap, opts)
            return
        got = resolve_time_options(table, snap, opts)
        for p in (0, 1):
            assert got.starting.for_partition(p) == (
                LATEST if want_start[p] is None else want_start[p]
            )
        want_end = _first_at(wh, 1, end)
        assert got.ending.for_partition(1) == (LATEST if want_end is None else want_end)
        assert got.ending.for_partition(0) == LATEST  # not listed: endingOffsets' default
    finally:
        MemoryStore.drop(name)


def test_version_at_timestamp_is_deltas_rule(tmp_path: Path) -> None:
    wh = Warehouse(f"file://{tmp_path}/lake")
    _history(wh, [(0, [1], False), (1, [2], False), (0, [3], False)])
    table = wh.table("t")
    latest = table.snapshot().version
    stamps = [commit_timestamp(table, v) for v in range(latest + 1)]
    assert all(s is not None for s in stamps)
    for ts in stamps:
        assert ts is not None
        # The last version committed at or before ts (several may share a millisecond).
        assert version_at_timestamp(table, ts) == max(i for i, s in enumerate(stamps) if s == ts)
    first = stamps[0]
    assert first is not None
    with pytest.raises(VersionNotFoundError, match="before the earliest"):
        version_at_timestamp(table, first - 1)
    last = stamps[-1]
    assert last is not None
    with pytest.raises(VersionNotFoundError, match="after the latest"):
        version_at_timestamp(table, last + 1)


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[str]:
    yield f"file://{tmp_path}/lake"


@pytest.mark.slow
@pytest.mark.spark
def test_spark_reads_by_timestamp_and_time_travels(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    _history(
        wh, [(0, [100, 130], False), (1, [120], True), (1, [110, 150], False), (0, [125], False)]
    )
    table = wh.table("t")
    path = f"{lake}/t"

    def read(**options: str) -> list[tuple[int, int]]:
        reader = spark.read.format("txntable")
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted((r["partition"], r["offset"]) for r in reader.load(path).collect())

    def expected(start: int, end: int | None) -> list[tuple[int, int]]:
        out = []
        for p in (0, 1):
            lo = _first_at(wh, p, start)
            if lo is None:
                continue
            hi = None if end is None else _first_at(wh, p, end)
            rows = table.scan(partitions=[p]).to_arrow().column("offset").to_pylist()
            out += [(p, o) for o in rows if o >= lo and (hi is None or o < hi)]
        return sorted(out)

    assert read(startingTimestamp="115", endingTimestamp="140") == expected(115, 140)
    assert read(startingOffsetsByTimestamp='{"t": {"0": 126, "1": 0}}') == sorted(
        [(0, o) for o in (1, 2) if _first_at(wh, 0, 126) is not None and o >= _first_at(wh, 0, 126)]  # type: ignore[operator]
        + [(1, o) for o in table.scan(partitions=[1]).to_arrow().column("offset").to_pylist()]
    )
    with raises_in_spark(NoOffsetForPartitionError):
        read(startingTimestamp="999")
    assert read(startingTimestamp="999", startingOffsetsByTimestampStrategy="latest") == []
    v1 = 2  # after the first batch of partition 0
    ts = commit_timestamp(table, v1)
    assert ts is not None
    version = version_at_timestamp(table, ts)
    want = sorted(
        (r["partition"], r["offset"]) for r in table.scan(version=version).to_arrow().to_pylist()
    )
    assert read(timestampAsOf=str(ts)) == want
