"""Running worker processes that report through a queue (the multi-process tests)."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Sequence
from typing import Any

import pytest


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
