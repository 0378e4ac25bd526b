"""Streaming writes from Spark drivers in their own processes: a driver SIGKILLed and
restarted with its checkpoint, and drivers started from other working directories.

Each run is ``helpers/stream_mirror.py`` (a fresh JVM, ~10-20 s) in a new session, so a kill
takes the Python driver, its JVM and its Python workers at once, as a crash of the machine
running the driver would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparkutil import TableWriter, rec

from txntable.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.alone]

MIRROR = Path(__file__).parent / "helpers" / "stream_mirror.py"
RUN_TIMEOUT = 240.0


def _start(
    source: str, target: str, checkpoint: str, cwd: Path, max_offsets: int
) -> subprocess.Popen[str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.Popen(
        [sys.executable, str(MIRROR), source, target, checkpoint, str(max_offsets)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the kill reaches the JVM too
    )


def _run(source: str, target: str, checkpoint: str, cwd: Path, max_offsets: int = 1000) -> None:
    """One driver run to completion."""
    proc = _start(source, target, checkpoint, cwd, max_offsets)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        _kill(proc)
    assert proc.returncode == 0, out[-4000:]


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the driver's whole process group (Python driver, JVM, Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


def _values(wh: Warehouse, table: str) -> list[bytes]:
    return sorted(wh.table(table).scan().to_arrow().column("value").to_pylist())


def _query_id(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


def test_killed_driver_restarts_exactly_once_and_a_same_named_checkpoint_is_another_query(
    lake: str, tmp_path: Path
) -> None:
    """Query A (``checkpointLocation=ckpt`` in directory ``a``) is SIGKILLed mid-stream
    and restarted: each of its batches lands once. Query B, given the same relative
    ``ckpt`` in directory ``b``, is another query: its batches land too (issue 24). One test,
    because every driver run starts a JVM."""
    wh = Warehouse(lake)
    src_a, src_b = TableWriter(wh, "in_a", 3), TableWriter(wh, "in_b", 1)
    for i in range(15):
        src_a.batch(i % 3, [rec(i * 20 + j, b"k%d" % j) for j in range(20)])
    src_b.batch(0, [rec(1000 + i) for i in range(10)])
    wh.create_table("out", partitions=2)
    out = wh.table("out")
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    dir_a.mkdir()
    dir_b.mkdir()
    source_a, target = f"{wh.url}/in_a", f"{wh.url}/out"

    def last_batch() -> int:
        return max((a.version for a in out.snapshot().app_txns.values()), default=-1)

    # 300 records, 20 per micro-batch: killed once three batches have landed.
    proc = _start(source_a, target, "ckpt", dir_a, max_offsets=20)
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while last_batch() < 2 and proc.poll() is None:
            assert time.monotonic() < deadline, "the driver made no progress"
            time.sleep(0.05)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL, "the driver finished before the kill"
    assert 0 < last_batch() < 14
    app_a = f"spark-query-{_query_id(dir_a / 'ckpt')}"
    # Query B runs beside A's restart (each driver run is ~30 s of JVM and Python worker
    # start-ups): two queries writing one table, each with its own application id.
    proc_b = _start(f"{wh.url}/in_b", target, "ckpt", dir_b, max_offsets=1000)
    try:
        # The batch in flight at the kill is replayed with the offsets it logged; the rest
        # comes in one batch (a micro-batch costs seconds of Python worker start-ups).
        _run(source_a, target, "ckpt", dir_a, max_offsets=1000)
        out_b, _ = proc_b.communicate(timeout=RUN_TIMEOUT)
    finally:
        _kill(proc_b)
    assert proc_b.returncode == 0, out_b[-4000:]
    # Every record once: none lost by the kill, none written twice by a replayed batch.
    a_values = sorted(r[3] for r in src_a.expected())
    b_values = sorted(r[3] for r in src_b.expected())
    assert _values(wh, "out") == sorted(a_values + b_values)
    app_b = f"spark-query-{_query_id(dir_b / 'ckpt')}"
    assert app_b != app_a
    assert sorted(out.snapshot().app_txns) == sorted([app_a, app_b])
