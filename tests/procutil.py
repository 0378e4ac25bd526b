"""Running worker processes that report through a queue (the multi-process tests)."""

from __future__ import annotations

import json
import multiprocessing
import queue
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def run_workers(
    target: Callable[..., None], args: Sequence[tuple[Any, ...]], timeout: float = 90
) -> list[Any]:
    """Start one spawned process per ``args`` entry; return what each put on the queue.

    Each process is called as ``target(*args_i, barrier, results)``: it waits on ``barrier``
    so that all start racing together, and puts exactly one report on ``results``. Fails the
    test if a process does not report in time; every process is joined (killed if stuck).
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(*a, barrier, results), daemon=True) for a in args
    ]
    for proc in procs:
        proc.start()
    reports: list[Any] = []
    try:
        for _ in procs:
            reports.append(results.get(timeout=timeout))
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {len(procs)} worker processes reported")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    return reports


def pause_and_resume(
    zombie: subprocess.Popen[str], while_paused: Callable[[], T], command: str
) -> tuple[T, str]:
    """SIGSTOP a helper process, run ``while_paused`` (a successor takes over), SIGCONT it,
    send it ``command`` on stdin and read its ``{"outcome": ...}`` line; the process must
    exit 0 (it is killed if anything fails). Returns ``while_paused``'s value and the
    outcome."""
    assert zombie.stdin is not None and zombie.stdout is not None
    try:
        zombie.send_signal(signal.SIGSTOP)
        value = while_paused()
        zombie.send_signal(signal.SIGCONT)
        zombie.stdin.write(command + "\n")
        zombie.stdin.flush()
        outcome = json.loads(zombie.stdout.readline())["outcome"]
        assert zombie.wait(timeout=60) == 0
    finally:
        zombie.kill()
        zombie.wait()
    return value, str(outcome)
