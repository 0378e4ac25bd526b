"""Zombie fencing across processes: a producer process paused (SIGSTOP) while a successor
with its transactional id initialises, then resumed (SIGCONT), cannot commit, and nothing it
wrote becomes visible — the harness's zombie fault, pinned down in one deterministic run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procutil import pause_and_resume
from tableutil import read_all

from txntable import Producer, Warehouse

pytestmark = pytest.mark.slow  # starts a Python process

HELPER = Path(__file__).parent / "helpers" / "zombie_producer.py"


def test_a_resumed_zombie_process_is_fenced_and_invisible(wh: Warehouse) -> None:
    wh.create_table("orders", partitions=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    zombie = subprocess.Popen(
        [sys.executable, str(HELPER), wh.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert zombie.stdin is not None and zombie.stdout is not None
    started = json.loads(zombie.stdout.readline())

    def take_over() -> Producer:
        successor = Producer(wh, transactional_id="zombie")
        successor.init_transactions()  # aborts the paused one's open transaction
        assert successor.producer_id == started["pid"]
        assert successor.producer_epoch > started["epoch"]
        successor.begin_transaction()
        successor.send("orders", value=b"s-0", partition=1)
        successor.commit_transaction()
        return successor

    successor, outcome = pause_and_resume(zombie, take_over, "commit")
    assert outcome == "ProducerFencedError"
    # Committed: the successor's record only. The zombie's flushed record stays in the log,
    # aborted (offset 0, its ABORT marker at 1); its buffered one never reached the log.
    assert read_all(wh, "orders", [0, 1], "read_committed") == {0: [], 1: [(0, b"s-0")]}
    assert read_all(wh, "orders", [0, 1], "read_uncommitted") == {
        0: [(0, b"z-flushed")],
        1: [(0, b"s-0")],
    }
    successor.begin_transaction()  # the successor is unharmed by the zombie's attempt
    successor.send("orders", value=b"s-1", partition=0)
    successor.commit_transaction()
    successor.close()
    assert read_all(wh, "orders", [0, 1], "read_committed") == {0: [(2, b"s-1")], 1: [(0, b"s-0")]}
