"""bench/writers.py (issue 17's many-writers benchmark): its exactly-once readback sees every
planted anomaly, and a quick run of the whole benchmark finds none.

These are behaviour checks of the benchmark, never timed: speed claims live in bench/.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from txntable import Producer, Warehouse
from txntable.layout import (
    intent_key,
    lease_key,
    outcomes_key,
    segment_key,
    txn_key,
    version_key,
)
from txntable.storage import MemoryStore

BENCH = Path(__file__).resolve().parents[2] / "bench" / "writers.py"


def load_bench() -> ModuleType:
    name = "bench_writers"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


bw = load_bench()


@pytest.fixture
def written() -> tuple[Warehouse, list[int]]:
    """A table holding writer 0's transaction 0, committed on partition 3 (its offsets are
    returned), and transaction 1, aborted on partition 5."""
    wh = Warehouse(store=MemoryStore(f"bench-{uuid.uuid4().hex}"))
    wh.create_table("t", partitions=bw.PARTITIONS)
    producer = Producer(wh, transactional_id="bench-check")
    producer.init_transactions()
    committed = bw.run_transaction(producer, "t", 0, 0, 3, [])
    producer.begin_transaction()
    for i in range(bw.RECORDS_PER_TXN):
        producer.send("t", value=bw.record_value(0, 1, i), partition=5)
    producer.abort_transaction()
    producer.close()
    return wh, committed


def writer0(*txns: Any) -> list[Any]:
    return [bw.WriterResult(0, "bench-check", list(txns), {}, [])]


def committed_txn(offsets: list[int], seq: int = 0) -> Any:
    return bw.Txn(seq, 3, 0.0, 0.0, bw.COMMITTED, offsets=offsets)


def aborted_txn(seq: int = 1) -> Any:
    return bw.Txn(seq, 5, 0.0, 0.0, bw.ABORTED, error="X: y")


def problems(wh: Warehouse, *txns: Any) -> list[str]:
    check = bw.readback_check(wh, "t", writer0(*txns))
    assert check.passed is (not check.problems)
    return check.problems


def test_readback_passes_a_consistent_history(written: tuple[Warehouse, list[int]]) -> None:
    wh, offsets = written
    check = bw.readback_check(wh, "t", writer0(committed_txn(offsets), aborted_txn()))
    assert check.passed and check.problems == []
    assert (check.records_read, check.acknowledged, check.aborted_txns) == (10, 10, 1)
    assert check.open_partitions == []


def test_readback_sees_each_anomaly(written: tuple[Warehouse, list[int]]) -> None:
    wh, offsets = written
    shifted = [o + 1 for o in offsets]
    assert problems(wh, committed_txn(shifted), aborted_txn())[0] == (
        f"writer 0 txn 0: acknowledged at p3@{shifted[0]}, read at p3@{offsets[0]}"
    )
    lost = problems(wh, committed_txn(offsets), aborted_txn(), committed_txn(offsets, seq=7))
    assert lost[0] == f"writer 0 txn 7: acknowledged p3@{offsets[0]} lost"
    assert len(lost) == bw.RECORDS_PER_TXN
    assert problems(wh, aborted_txn(seq=0), aborted_txn()) == [
        "writer 0 txn 0: aborted, yet 10 record(s) visible"
    ]
    assert problems(wh, aborted_txn()) == [
        f"record (0, 0, {i}) at (3, {offsets[i]}): no writer recorded it"
        for i in range(bw.RECORDS_PER_TXN)
    ]


def test_readback_sees_a_partial_transaction(written: tuple[Warehouse, list[int]]) -> None:
    wh, offsets = written
    producer = Producer(wh, transactional_id="bench-partial")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(4):  # only 4 of transaction 2's records
        producer.send("t", value=bw.record_value(0, 2, i), partition=1)
    producer.commit_transaction()
    producer.close()
    unknown = bw.Txn(2, 1, 0.0, 0.0, bw.UNKNOWN, error="X: y")
    assert problems(wh, committed_txn(offsets), aborted_txn(), unknown) == [
        "writer 0 txn 2: outcome unknown and 4 of 10 records visible (not atomic)"
    ]


def test_readback_sees_a_duplicate(written: tuple[Warehouse, list[int]]) -> None:
    wh, offsets = written
    producer = Producer(wh, transactional_id="bench-dup")
    producer.init_transactions()
    again = bw.run_transaction(producer, "t", 0, 0, 6, [])  # writer 0's transaction 0 again
    producer.close()
    assert problems(wh, committed_txn(offsets), aborted_txn()) == [
        f"record (0, 0, {i}) read 2 times: [(3, {offsets[i]}), (6, {again[i]})]"
        for i in range(bw.RECORDS_PER_TXN)
    ]


def test_each_request_is_counted_once_by_its_kind_and_once_by_its_object(
    tmp_path: Path,
) -> None:
    assert [
        bw.object_of(k)
        for k in (
            outcomes_key("t"),
            lease_key("t"),
            intent_key("t", 1_700_000_000_000, uuid.uuid4().hex, None),
            "t/_commit/intents/",  # a listing
            version_key("t", 3),
            txn_key("tx"),
            segment_key("t", 2, "x.parquet"),
            "_tables/t.json",
        )
    ] == [
        "outcome record", "lease", "intents", "intents", "log", "coordinator", "segments",
        "other",
    ]
    # A writer's warehouse as the bench builds it: one transaction, counted both ways.
    wh, store = bw.build_writer_warehouse(bw.Backend("local", str(tmp_path), {}, 0))
    wh.create_table("t", partitions=bw.PARTITIONS)
    with Producer(wh, transactional_id="bench-objects") as producer:
        producer.init_transactions()
        store.reset()
        bw.run_transaction(producer, "t", 0, 0, 3, [])
    objects, kinds = store.objects(), store.snapshot()
    assert set(objects) <= set(bw.OBJECTS)
    assert objects["segments"] == kinds["PUT"] == 1  # its one segment, the only plain put
    assert objects["log"] >= 1 and objects["coordinator"] >= 1


@pytest.mark.slow
def test_quick_run_passes_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "writers.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(BENCH), "--quick", "--seconds", "2", "--backend", "local"),
            *("--maintenance", "--dir", str(tmp_path), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("exactly-once check: PASS"), proc.stdout
    rows = json.loads(out.read_text())["backends"]["local"]
    assert [(r["writers"], "maintenance" in r) for r in rows] == [(1, False), (4, False), (4, True)]
    for row in rows:
        assert row["check"] == "PASS", row["check_detail"]
        assert row["commits_total"] >= 1
        assert row["check_detail"]["acknowledged"] == row["commits_total"] * bw.RECORDS_PER_TXN
        by_object = row["requests_per_txn_by_object"]
        assert sum(by_object.values()) == pytest.approx(row["requests_per_txn"])
        assert by_object["segments"] >= 1 and by_object["log"] > 0, by_object
        # The writers' group-commit counters are reported (a committer's own commits are
        # in its rounds, so direct + followed may be fewer than the commits).
        counts = row["group_commit"]
        assert {"direct", "followed", "rounds", "helps"} <= counts.keys(), counts
        assert counts["direct"] + counts["followed"] >= 1, counts
    maintenance = rows[2]["maintenance"]
    assert maintenance["optimize"]["runs"] >= 1 and maintenance["compact"]["runs"] >= 1
