"""One-log commits across processes: a producer SIGKILLed at each step of CommitOneLog and
restarted (``init_transactions`` of a new instance), and a zombie paused (SIGSTOP) at its
append while a successor initialises, then resumed (SIGCONT).

``helpers/one_log_producer.py`` commits t1 (``t1-0``, ``t1-1`` to ``orders``) and then stops
t2 at the point named. Afterwards every committed record is visible exactly once, nothing of
a transaction that did not commit is, no partition has an open transaction, and the old
epoch is refused in every table the id registered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from procutil import pause_and_resume
from txnutil import HELPERS, REPO, assert_no_open_transactions, read_all, run_python

from txntable import Producer, Warehouse
from txntable.protocol.actions import Marker
from txntable.txn.coordinator import TransactionCoordinator, TxnState

pytestmark = pytest.mark.slow  # starts Python processes

HELPER = HELPERS / "one_log_producer.py"
T1 = [b"t1-0", b"t1-1"]
T2 = [b"t2-0", b"t2-1"]


@pytest.fixture
def tables(wh: Warehouse) -> Warehouse:
    wh.create_table("orders", partitions=2)
    wh.create_table("other", partitions=2)
    return wh


def fences(wh: Warehouse, table: str) -> list[tuple[int, str, int]]:
    """``(partition, type, epoch)`` of the table's ABORT markers."""
    t = wh.table(table)
    t.snapshot()
    return [
        (e.partition, e.type, e.producerEpoch)
        for p in range(t.num_partitions)
        for e in t.snapshot().partition(p).entries
        if isinstance(e, Marker) and e.type == "ABORT"
    ]


@pytest.mark.parametrize("point", ["registered", "segments_written", "appended"])
def test_a_producer_killed_in_a_one_log_commit_is_exactly_once_after_restart(
    tables: Warehouse, point: str
) -> None:
    wh = tables
    proc = run_python([str(HELPER), wh.url, point])
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    started = json.loads(proc.stdout.splitlines()[0])
    landed = point == "appended"
    # What the crash left: nothing pins an LSO (the data is in no log before its markers).
    loaded = TransactionCoordinator(wh.store).load("one")
    assert loaded is not None and loaded[0].state is TxnState.EMPTY
    registered = ("orders", "other") if point == "registered" else ("orders",)
    assert loaded[0].tables == registered
    for name in ("orders", "other"):
        assert_no_open_transactions(wh.table(name))
    assert Counter(read_all(wh, ["orders", "other"])) == Counter(T1 + (T2 if landed else []))

    successor = Producer(Warehouse(wh.url), transactional_id="one")
    successor.init_transactions()
    epoch = started["epoch"] + 1
    assert (successor.producer_id, successor.producer_epoch) == (started["pid"], epoch)
    for name in registered:  # each registered table holds the new epoch's fence
        assert fences(wh, name) == [(0, "ABORT", epoch)]
        assert wh.table(name).snapshot().producer_epochs[started["pid"]] == epoch
    successor.begin_transaction()
    successor.send("orders", value=b"t3", partition=1)
    successor.commit_transaction()
    successor.close()
    expected = T1 + (T2 if landed else []) + [b"t3"]
    got = read_all(wh, ["orders", "other"])
    assert Counter(got) == Counter(expected) and len(got) == len(expected)
    unfinished = read_all(wh, ["orders", "other"], "read_uncommitted")
    assert Counter(unfinished) == Counter(expected)  # nothing else ever reached a log
    for name in ("orders", "other"):
        assert_no_open_transactions(wh.table(name))


def _run_zombie(wh: Warehouse, point: str) -> tuple[dict[str, int], str, Producer]:
    """Start the helper, SIGSTOP it at ``point``, initialise a successor, SIGCONT it; once
    it is done the successor commits ``s-0``. The zombie's outcome and the successor."""
    zombie = subprocess.Popen(
        [sys.executable, str(HELPER), wh.url, point],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert zombie.stdout is not None
    started = json.loads(zombie.stdout.readline())
    assert json.loads(zombie.stdout.readline()) == {"paused": True}

    def take_over() -> Producer:
        successor = Producer(Warehouse(wh.url), transactional_id="one")
        successor.init_transactions()  # and nothing else: only its fence is in the table
        return successor

    successor, outcome = pause_and_resume(zombie, take_over, "go")
    successor.begin_transaction()
    successor.send("orders", value=b"s-0", partition=0)
    successor.commit_transaction()
    return started, outcome, successor


def test_a_resumed_zombie_one_log_commit_is_fenced_and_invisible(tables: Warehouse) -> None:
    """Paused with its segments written and its append not made: the successor's
    init_transactions fences the table, so the resumed append is refused whole."""
    wh = tables
    started, outcome, successor = _run_zombie(wh, "pause_before_append")
    assert outcome == "ProducerFencedError"
    assert successor.producer_epoch == started["epoch"] + 1
    assert read_all(wh, ["orders"]) == [b"t1-0", b"s-0", b"t1-1"]
    assert Counter(read_all(wh, ["orders"], "read_uncommitted")) == Counter([*T1, b"s-0"])
    successor.begin_transaction()  # the successor is unharmed by the zombie's attempt
    successor.send("orders", value=b"s-1", partition=1)
    successor.commit_transaction()
    successor.close()
    assert Counter(read_all(wh, ["orders"])) == Counter([*T1, b"s-0", b"s-1"])
    assert_no_open_transactions(wh.table("orders"))


def test_a_zombie_one_log_commit_that_landed_before_the_successor_is_kept(
    tables: Warehouse,
) -> None:
    """Paused after its append landed: it committed before the successor existed (as in
    Kafka when EndTxn beats InitProducerId), and init_transactions returned after it."""
    wh = tables
    started, outcome, successor = _run_zombie(wh, "pause_after_append")
    assert outcome == "committed"
    successor.close()
    assert Counter(read_all(wh, ["orders"])) == Counter([*T1, *T2, b"s-0"])
    t = wh.table("orders").snapshot().partition(0)
    fence = next(e for e in t.entries if isinstance(e, Marker) and e.type == "ABORT")
    assert fence.producerEpoch == started["epoch"] + 1
    t2 = next(e for e in t.entries if not isinstance(e, Marker) and e.baseOffset > 1)
    assert t2.baseOffset < fence.offset  # the zombie's commit, then the fence
