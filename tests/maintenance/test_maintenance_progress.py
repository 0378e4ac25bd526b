"""Long maintenance operations report their progress, ``(phase, done, total)`` in each
phase's unit, ending at the total they announced (what the command line draws)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from txntable import Producer, Warehouse

Calls = list[tuple[str, int, int]]


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    w = Warehouse(str(tmp_path / "lake"))
    w.create_table("t", partitions=2, configuration={"cleanup.policy": "compact"})
    p = Producer(w, linger_ms=600_000, batch_size=1 << 30)
    for _ in range(3):
        for k in range(4):
            p.send("t", key=b"k%d" % k, value=b"v" * 100, partition=k % 2)
        p.flush()
    p.close()
    # An unreferenced file from 1970: vacuum deletes it.
    w.store.put_data_file(f"t/data/0/{1000:013d}-{uuid.uuid4().hex}.parquet", b"x")
    return w


def test_optimize_reports_the_input_bytes_rewritten(wh: Warehouse) -> None:
    calls: Calls = []
    report = wh.table("t").optimize(progress=lambda *c: calls.append(c))
    assert report.bytes_read > 0
    assert [c[0] for c in calls] == ["rewrite", "rewrite"]  # one merged segment a partition
    assert calls[-1] == ("rewrite", report.bytes_read, report.bytes_read)
    assert 0 < calls[0][1] < report.bytes_read


def test_compact_reports_both_passes(wh: Warehouse) -> None:
    calls: Calls = []
    report = wh.table("t").compact(progress=lambda *c: calls.append(c))
    total = report.bytes_read
    assert [c for c in calls if c[0] == "keys"][-1] == ("keys", total, total)
    assert [c for c in calls if c[0] == "rewrite"][-1] == ("rewrite", total, total)


def test_checkpoint_vacuum_and_maintain_report(wh: Warehouse) -> None:
    calls: Calls = []
    report = wh.table("t").checkpoint(progress=lambda *c: calls.append(c))
    assert calls == [("write", 0, report.entries), ("write", report.entries, report.entries)]
    calls.clear()
    vacuumed = wh.table("t").vacuum(dry_run=True, progress=lambda *c: calls.append(c))
    assert len(vacuumed.deleted) == 1
    assert calls == [("list", 7, 7)]  # 6 segments and the old file; a dry run deletes nothing
    calls.clear()
    maintained = wh.table("t").maintain(progress=lambda *c: calls.append(c))
    assert maintained.errors == [] and maintained.vacuum is not None
    steps = [c for c in calls if c[0] == "steps"]
    assert steps == [("steps", i, 7) for i in range(8)]
    assert ("delete", 1, 1) in calls  # vacuum's deletion of the old file
    assert ("keys", maintained.rewrite.bytes_read, maintained.rewrite.bytes_read) in calls  # type: ignore[union-attr]
