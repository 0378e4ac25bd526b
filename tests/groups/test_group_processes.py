"""Group members as real processes: kill -9, SIGSTOP, exactly-once across the group.

Worker processes (``helpers/group_worker.py``) subscribe to a 6-partition table on a local
warehouse and report their assignment in status files; the test kills or stops them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import storeutil

from txntable import Producer, TopicPartition, Warehouse

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "helpers" / "group_worker.py"
PER_PARTITION = 30


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    url = f"file://{tmp_path}/lake"
    wh = Warehouse(url)
    wh.create_table("in", partitions=6)
    wh.create_table("out", partitions=1)
    with Producer(wh) as p:
        for i in range(6 * PER_PARTITION):
            p.send("in", value=b"%d" % i, partition=i % 6)
    status = tmp_path / "status"
    status.mkdir()
    yield url, status


def _start(
    url: str,
    status: Path,
    name: str,
    mode: str,
    session_ms: int,
    strategy: str,
    options: dict[str, str] | None = None,
    pause_s: float = 1.0,
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            url,
            name,
            str(status),
            mode,
            str(session_ms),
            strategy,
            json.dumps(options or {}),
            str(pause_s),
        ],
        env=env,
    )


def _status(status: Path, name: str) -> dict[str, object]:
    try:
        return json.loads((status / f"{name}.json").read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _stop(status: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    (status / "stop").touch()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_kill_one_of_three_partitions_move_and_exactly_once(
    lake: tuple[str, Path], strategy: str
) -> None:
    url, status = lake
    names = ["w0", "w1", "w2"]
    procs = [_start(url, status, n, "ctp", 3000, strategy) for n in names]
    try:

        def two_each() -> bool:
            parts = [_status(status, n).get("assignment") for n in names]
            gens = {_status(status, n).get("generation") for n in names}
            return (
                all(p is not None and len(p) == 2 for p in parts)
                and len(gens) == 1
                and (sorted(sum((p for p in parts if p), [])) == list(range(6)))
            )

        _wait(two_each, 60, "2 partitions each")
        victim = _status(status, "w1")["assignment"]
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()

        def moved() -> bool:
            parts = [_status(status, n).get("assignment") or [] for n in ("w0", "w2")]
            return sorted(parts[0] + parts[1]) == list(range(6))

        _wait(moved, 60, "the killed member's partitions to move")
        survivors = set(_status(status, "w0")["assignment"]) | set(
            _status(status, "w2")["assignment"]
        )  # type: ignore[arg-type]
        assert set(victim) <= survivors  # type: ignore[arg-type]
        wh = Warehouse(url)

        def all_out() -> bool:
            return wh.table("out").scan().to_arrow().num_rows >= 6 * PER_PARTITION

        _wait(all_out, 90, "every record processed")
        _stop(status, [procs[0], procs[2]])
        rows = wh.table("out").scan().to_arrow().column("value").to_pylist()
        expected = sorted(f"{p}:{o}".encode() for p in range(6) for o in range(PER_PARTITION))
        assert sorted(rows) == expected  # each input record exactly once, read_committed
        from txntable.consumer import Consumer

        c = Consumer(wh, group_id="g")
        for p in range(6):
            committed = c.committed(TopicPartition("in", p))
            assert committed is not None and committed.offset == PER_PARTITION
        c.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def s3_lake(moto_server: str, tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    # On S3 a conditional put is one request: a stopped process holds nothing. (The local
    # backend serialises its compare-and-swap with flock: a process stopped inside one blocks
    # every other writer of that object until it resumes.)
    options = storeutil.s3_options(moto_server)
    url = f"s3://{storeutil.create_bucket(moto_server)}/wh"
    wh = Warehouse(url, options)
    wh.create_table("in", partitions=6)
    with Producer(wh) as p:
        for i in range(6 * PER_PARTITION):
            p.send("in", value=b"%d" % i, partition=i % 6)
    status = tmp_path / "status"
    status.mkdir()
    yield url, status, options


@pytest.mark.s3
def test_sigstopped_member_cannot_commit_after_losing_partitions(
    s3_lake: tuple[str, Path, dict[str, str]],
) -> None:
    url, status, options = s3_lake
    s = _start(url, status, "s", "stall", 2000, "cooperative-sticky", options)
    r = None
    try:
        _wait(lambda: len(_status(status, "s").get("assignment") or []) == 6, 60, "s owns all")
        # r pauses briefly: it only has to commit every record before s resumes (with s's
        # 1 s pause per 7 records that wait was most of this test's 90 s).
        r = _start(url, status, "r", "stall", 2000, "cooperative-sticky", options, pause_s=0.05)
        # Stopped inside its processing pause, with time to spare: a status that still says
        # "processing" while its commit runs would let the stop miss the pause, and s, stopped
        # anywhere else, never tries a commit after the stop (r commits everything).
        _wait(
            lambda: (
                len(_status(status, "r").get("assignment") or []) == 3
                and _status(status, "s").get("phase") == "processing"
                and float(_status(status, "s").get("until") or 0) - time.time() > 0.5  # type: ignore[arg-type]
            ),
            60,
            "r and s share the partitions, s early in its processing pause",
        )
        s.send_signal(signal.SIGSTOP)
        _wait(lambda: len(_status(status, "r").get("assignment") or []) == 6, 60, "r takes over")
        wh = Warehouse(url, options)
        from txntable.consumer import Consumer

        probe = Consumer(wh, group_id="g")

        def r_done() -> bool:
            for p in range(6):
                c = probe.committed(TopicPartition("in", p))
                if c is None or c.offset != PER_PARTITION:
                    return False
            return True

        _wait(r_done, 90, "r to commit everything")
        s.send_signal(signal.SIGCONT)

        def s_reported() -> bool:
            commits = _status(status, "s").get("commits") or []
            return any(c["stalled"] for c in commits)  # type: ignore[index]

        _wait(s_reported, 60, "s to try its commit after the stop")
        stalled = [c for c in _status(status, "s")["commits"] if c["stalled"]]  # type: ignore[union-attr]
        assert stalled[0]["outcome"] in ("IllegalGenerationError", "CommitFailedError")
        assert r_done()  # nothing of s's stale commit is visible
        probe.close()
    finally:
        s.send_signal(signal.SIGCONT)
        _stop(status, [s] + ([r] if r else []))
