"""``txntable optimize | compact | retention | maintain`` end to end, in subprocesses."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliutil import ok_json, run_cli

from txntable import Producer, Warehouse
from txntable.protocol.actions import Segment

pytestmark = pytest.mark.slow

MANUAL = {"linger_ms": 600_000, "batch_size": 1 << 30}


def _fill(wh: Warehouse, table: str, keys: int, batches: int, timestamp: int | None = None) -> None:
    p = Producer(wh, **MANUAL)  # type: ignore[arg-type]
    for i in range(batches):
        for k in range(keys):
            p.send(table, key=f"k{k}".encode(), value=f"v{i}".encode(), partition=0,
                   timestamp=timestamp)
        p.flush()
    p.close()


def test_maintenance_commands(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/lake"
    wh = Warehouse(url)
    wh.create_table("m", partitions=1)
    _fill(wh, "m", keys=2, batches=3)
    report = ok_json("optimize", url, "m", "--json")
    assert report["segments_written"] == 1 and report["entries_replaced"] == 3
    assert report["records_kept"] == 6 and report["records_dropped"] == 0
    assert isinstance(wh.table("m").snapshot().partition(0).entries[0], Segment)
    again = ok_json("optimize", url, "m", "--json")
    assert again["version"] is None and again["segments_written"] == 0

    wh.create_table("c", partitions=1, configuration={"cleanup.policy": "compact"})
    _fill(wh, "c", keys=2, batches=3)
    report = ok_json("compact", url, "c", "--json")
    assert report["records_kept"] == 2 and report["records_dropped"] == 4
    proc = run_cli("compact", url, "c")
    assert proc.returncode == 0 and b"Compacted c:" in proc.stdout
    refused = run_cli("compact", url, "m")  # cleanup.policy=delete: records would go
    assert refused.returncode == 1 and b"PolicyViolationError" in refused.stderr
    forced = ok_json("compact", url, "m", "--ignore-cleanup-policy", "--json")
    assert forced["records_kept"] == 2 and forced["records_dropped"] == 4

    wh.create_table("r", partitions=1, configuration={"retention.ms": "3600000"})
    _fill(wh, "r", keys=1, batches=2, timestamp=1_000)  # far older than an hour
    _fill(wh, "r", keys=1, batches=1)
    report = ok_json("retention", url, "r", "--json")
    assert report["log_start_offsets"] == {"0": 2}
    proc = run_cli("retention", url, "r")
    assert proc.returncode == 0 and b"nothing to delete" in proc.stdout

    report = ok_json("maintain", url, "m", "--json")
    assert report["errors"] == [] and report["checkpoint"]["version"] >= 1
    assert report["vacuum"]["deleted"] == []
    proc = run_cli("maintain", url, "m", "--no-vacuum")
    assert proc.returncode == 0 and b"checkpoint: version" in proc.stdout
    verified = ok_json("verify", url, "m", "c", "r", "--json")
    assert verified["ok"] and len(verified["tables"]) == 3, verified

    missing = run_cli("optimize", url, "nope")
    assert missing.returncode == 1 and b"TableNotFoundError" in missing.stderr
