"""A producer committing, a consumer polling and two maintainers merging, all in separate
processes on one local table: nothing is lost, duplicated or moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from txntable import Warehouse
from txntable.protocol.actions import Segment

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "helpers" / "maint_worker.py"
REPO = Path(__file__).resolve().parents[2]


def _start(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_producer_consumer_and_maintainers_in_parallel(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/wh"
    wh = Warehouse(url)
    # Tiny segments: every maintenance round has something to merge.
    wh.create_table("t", partitions=2, configuration={"segment.bytes": "4000"})
    stop = str(tmp_path / "stop")
    # The maintainers loop until the stop file exists: whatever fails, they are stopped
    # (and every child reaped) before the test ends.
    maintainers = [_start("maintain", url, stop) for _ in range(2)]
    consumer = _start("consume", url)
    producer = _start("produce", url, "40")
    try:
        out, err = producer.communicate(timeout=600)
        assert producer.returncode == 0, err
        acked = sorted(tuple(json.loads(line))[:2] for line in out.splitlines())
        cout, cerr = consumer.communicate(timeout=600)
        assert consumer.returncode == 0, cerr
        Path(stop).touch()
        merged = 0
        for m in maintainers:
            mout, merr = m.communicate(timeout=600)
            assert m.returncode == 0, merr
            lines = [json.loads(line) for line in mout.splitlines()]
            assert not [x for x in lines if "errors" in x], lines
            merged += lines[-1]["merged"]
    finally:
        Path(stop).touch()
        for proc in (*maintainers, consumer, producer):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    seen = [tuple(json.loads(line)) for line in cout.splitlines()]
    # Exactly the committed records, each once, at the offset the producer was told.
    assert sorted((p, o) for p, o, _ in seen) == acked
    assert len(set(seen)) == len(seen)
    for p in (0, 1):
        offsets = [o for q, o, _ in seen if q == p]
        assert offsets == sorted(offsets)
    assert merged > 0
    snap = wh.table("t").snapshot()
    assert any(isinstance(e, Segment) for part in snap.partitions for e in part.entries)
    # And a fresh reader after everything agrees.
    from maintutil import read

    final = read(wh, "t", "read_committed")
    assert sorted((p, o) for p, rs in final.items() for o, _ in rs) == acked
