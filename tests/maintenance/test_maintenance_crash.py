"""A merge SIGKILLed before each of its storage writes leaves the table readable, and the
next run finishes the job; what the dead run wrote is garbage that vacuum deletes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from maintutil import HISTORY_FOR_CRASH, read, run_history

from txntable import Warehouse
from txntable.maintenance.vacuum import RETENTION_MS_MIN, referenced_paths, vacuum
from txntable.protocol.actions import Segment
from txntable.storage import ClockAheadStore

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "helpers" / "crash_merge.py"
REPO = Path(__file__).resolve().parents[2]


def _run(url: str, n: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, str(SCRIPT), url, str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sigkill_at_every_write_of_a_merge(tmp_path: Path) -> None:
    base = tmp_path / "base"
    wh = Warehouse(f"file://{base}")
    wh.create_table("t", partitions=2, configuration={"checkpoint.interval": "0"})
    run_history(wh, "t", HISTORY_FOR_CRASH)
    committed = read(wh, "t", "read_committed")
    finished = False
    for n in range(1, 30):
        copy = tmp_path / f"crash{n}"
        shutil.copytree(base, copy)
        url = f"file://{copy}"
        result = _run(url, n)
        if result.returncode == 0:
            finished = True
            break
        assert result.returncode == -9, result.stderr
        crashed = Warehouse(url)
        assert read(crashed, "t", "read_committed") == committed, n
        table = crashed.table("t")
        table.optimize()  # the next run finishes the job
        snap = crashed.table("t").snapshot()
        for part in snap.partitions:
            assert isinstance(part.entries[0], Segment), n
            assert part.entries[0].endOffset == part.last_stable_offset
        assert read(crashed, "t", "read_committed") == committed, n
        # Whatever the dead run wrote is unreferenced, and vacuum may delete it.
        files = set(crashed.store.list("t/data/"))
        garbage = files - referenced_paths(snap)
        later = Warehouse(store=ClockAheadStore(crashed.store, 10**15)).table("t")
        report = vacuum(later, RETENTION_MS_MIN, now=10**15)  # everything is old by then
        assert garbage == set(report.deleted), n
        assert read(crashed, "t", "read_committed") == committed, n
    assert finished and n > 4  # two segments, the version, the checkpoint and its hint
