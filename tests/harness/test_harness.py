"""The exactly-once harness: its checker sees every anomaly class, and sized runs find none.

The runs (a CI-sized one on local disk; 16 writers of one table with the usual workload on
local disk and on a moto S3 server) start worker processes and inject faults (SIGKILL and
restart, zombies, storage outages, ambiguous / failed / late / slow storage requests,
transaction timeouts, the group committer killed or paused past its lease);
``tests/harness/run_long.py`` runs the same for longer. The planted-anomaly tests build a
small clean history by hand, check that it is clean, then break it one way at a time.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eo_chaos import ChaosConfig
from eo_checker import (
    ANOMALIES,
    Final,
    History,
    Init,
    JournalReader,
    Seen,
    Txn,
    Zombie,
    check,
)
from eo_driver import (
    FAULT_KINDS,
    HOT_TABLE,
    MANY_WRITER_FAULTS,
    Driver,
    HarnessConfig,
    Slot,
    run,
)

from txntable.layout import lease_key

# --- planted anomalies ----------------------------------------------------------------------

RC = ("rc_poll", "rc_arrow", "rc_scan")
RU = ("ru_poll", "ru_scan")


def clean() -> tuple[History, Final]:
    """A consistent history: one committed and one aborted transaction over two tables, an
    idempotent write, a live consumer with its positions and LSOs, describe() samples, a CTP
    output and its group offset, a deletion, and a zombie fenced by its successor."""
    h = History()
    h.txns["a.0.0"] = Txn(
        sends=[("a.0.0/0", "t0", 0), ("a.0.0/1", "t1", 1)],
        acks={"a.0.0/0": ("t0", 0, 0), "a.0.0/1": ("t1", 1, 0)},
        outcome="commit",
        decided_at=10.0,
        journal="txn-0-0",
    )
    h.txns["a.0.1"] = Txn(sends=[("a.0.1/0", "t0", 0)], outcome="abort", journal="txn-0-0")
    h.txns["a.0.2"] = Txn(
        sends=[("a.0.2/0", "t2", 0)],
        outcome="commit",
        acks={"a.0.2/0": ("t2", 0, 0)},
        decided_at=11.0,
        journal="txn-0-0",
    )
    h.idem["i0.0.0"] = ("t0", 1, 0)
    h.seen["consumer-0-0"] = [
        Seen("t0", 0, 0, "a.0.0/0", lso=2, ts=12.0),
        Seen("t0", 1, 0, "i0.0.0", lso=1, ts=12.0),
    ]
    # Past the commit marker of partition 0, and past the only record of partition 1.
    h.positions["consumer-0-0"] = {("t0", 0): 2, ("t0", 1): 1}
    h.samples["consumer-0-0"] = [
        ("t0", 3, [(0, 0, 2), (0, 0, 0)]),
        ("t0", 5, [(0, 4, 4), (0, 1, 1)]),
    ]
    h.deleted = [("t2", 0, 0, "a.0.2/0")]
    h.roles = {"txn", "idem", "ctp", "consumer", "maint"}
    h.progress = Counter(txn=2, idem=1, ctp=1, consumer=2, maint=1)
    h.ctp_txns = Counter(commit=1)
    # Paused after its last transaction; its successor initialised; it then exited fenced.
    h.zombies = [Zombie("txn-0-0", "txn-0-1")]
    h.inits = {"txn-0-0/a": [Init(1.0)], "txn-0-1/a": [Init(20.0)]}
    h.exits = {"txn-0-0": "fenced", "txn-0-1": "stop", "maint-0-0": "stop"}
    f = Final()
    ctp_out = "ctp|0|0|a.0.0/0"
    f.reads = {
        "t0": {
            "rc_poll": [(0, 0, "a.0.0/0"), (1, 0, "i0.0.0")],
            "ru_poll": [(0, 0, "a.0.0/0"), (0, 2, "a.0.1/0"), (1, 0, "i0.0.0")],
        },
        "t1": {"rc_poll": [(1, 0, "a.0.0/1")], "ru_poll": [(1, 0, "a.0.0/1")]},
        "t2": {"rc_poll": [], "ru_poll": []},
        "ctp": {"rc_poll": [(0, 0, ctp_out)], "ru_poll": [(0, 0, ctp_out)]},
    }
    for reads in f.reads.values():
        reads["rc_arrow"] = list(reads["rc_poll"])
        reads["rc_scan"] = list(reads["rc_poll"])
        reads["ru_scan"] = list(reads["ru_poll"])
    f.offsets = {"t0": [(0, 4, 4), (0, 1, 1)], "t1": [(0, 0, 0), (0, 2, 2)]}
    f.ctp_committed = {0: 1, 1: 0, 2: 0}
    return h, f


def _append(
    f: Final, table: str, row: tuple[int, int, str], readers: tuple[str, ...] = RC + RU
) -> None:
    for name in readers:
        f.reads[table][name] = sorted([*f.reads[table][name], row])


def _drop(f: Final, table: str, value: str) -> None:
    for name in RC + RU:
        f.reads[table][name] = [r for r in f.reads[table][name] if r[2] != value]


def _lose(h: History, f: Final) -> None:
    _drop(f, "t1", "a.0.0/1")


def _tear(h: History, f: Final) -> None:
    h.txns["a.0.0"].outcome = "unknown"  # killed while committing: either way, never half
    _drop(f, "t1", "a.0.0/1")


def _skip(h: History, f: Final) -> None:
    h.seen["consumer-0-0"].pop()  # i0.0.0 at t0[1]@0, below the journaled position 1


def _ctp_never_commits(h: History, f: Final) -> None:
    h.progress["ctp"] = 0
    h.ctp_txns.clear()
    f.ctp_committed = {0: 0, 1: 0, 2: 0}
    _drop(f, "ctp", "ctp|0|0|a.0.0/0")


#: Each anomaly planted into the clean history, with the exact number it must produce.
PLANTS: dict[str, tuple[Callable[[History, Final], object], int]] = {
    "aborted_read": (lambda h, f: _append(f, "t0", (0, 2, "a.0.1/0"), RC), 1),
    "lost_write": (_lose, 1),
    "duplicate": (lambda h, f: _append(f, "t0", (2, 0, "i0.0.0")), 1),
    "torn": (_tear, 1),
    "offset_mismatch": (lambda h, f: h.txns["a.0.0"].acks.update({"a.0.0/1": ("t1", 1, 7)}), 1),
    "reader_disagreement": (lambda h, f: f.reads["t1"].update(rc_scan=[]), 1),
    "rc_not_ru_minus_aborted": (lambda h, f: f.reads["t1"].update(ru_poll=[], ru_scan=[]), 1),
    "non_monotonic": (
        lambda h, f: h.seen["consumer-0-0"].append(Seen("t0", 0, 0, "a.0.0/0", 2, 12.5)),
        1,
    ),
    "lso_regression": (
        lambda h, f: h.samples["consumer-0-0"].append(("t0", 6, [(0, 3, 4), (0, 1, 1)])),
        1,
    ),
    "lso_above_hw": (
        lambda h, f: h.samples["consumer-0-0"].append(("t0", 6, [(0, 5, 4), (0, 1, 1)])),
        1,
    ),
    "ctp_skip": (lambda h, f: f.ctp_committed.update({1: 1}), 1),
    # Partition 2 keeps the group offsets moved, so only the repeat is reported.
    "ctp_repeat": (lambda h, f: f.ctp_committed.update({0: 0, 2: 1}), 1),
    "ctp_phantom": (lambda h, f: _append(f, "ctp", (1, 0, "ctp|0|2|a.0.1/0")), 1),
    "untyped_error": (
        lambda h, f: h.untyped.append("txn-0-0: send: ArrowInvalid: finalized"),
        1,
    ),
    "verify_error": (lambda h, f: f.verify_errors.append("t0: offsets.gap at version 3"), 1),
    "consumer_skip": (_skip, 1),
    # A poll returned a.0.0/0 (offset 0) from a snapshot whose LSO was still 0.
    "dirty_read": (
        lambda h, f: h.seen["consumer-0-0"].__setitem__(0, Seen("t0", 0, 0, "a.0.0/0", 0, 12.0)),
        1,
    ),
    "no_progress": (_ctp_never_commits, 1),
    # The successor initialised at 10.5: a.0.2, decided at 11.0, must not have committed.
    "zombie_commit": (lambda h, f: h.inits.update({"txn-0-1/a": [Init(10.5)]}), 1),
    "hung_worker": (lambda h, f: h.hung.append("idem-0-0"), 1),
    "worker_exit": (lambda h, f: h.exits.update({"maint-0-0": "error"}), 1),
}


def test_a_clean_history_has_no_anomaly() -> None:
    h, f = clean()
    report = check(h, f, "ctp")
    assert report.ok, report.summary()
    assert report.stats["transactions"] == {"commit": 2, "abort": 1}
    assert report.stats["idempotent"] == {"acknowledged": 1, "not_acknowledged": 0}
    assert report.stats["zombies"] == {"fenced": 1}


def test_every_anomaly_class_has_a_plant() -> None:
    assert sorted(PLANTS) == sorted(ANOMALIES)


@pytest.mark.parametrize("kind", ANOMALIES)
def test_each_planted_anomaly_is_reported_exactly(kind: str) -> None:
    h, f = copy.deepcopy(clean())
    plant, count = PLANTS[kind]
    plant(h, f)
    report = check(h, f, "ctp")
    assert +report.anomalies == Counter({kind: count}), report.summary()
    assert len(report.examples[kind]) == count


def test_a_read_before_its_transaction_decided_to_commit_is_dirty() -> None:
    """A read_committed consumer returned a record of a transaction that later committed,
    before its producer even asked to commit: only the journaled times show it."""
    h, f = clean()
    h.txns["a.0.0"].decided_at = 12.5  # the poll had returned at 12.0
    report = check(h, f, "ctp")
    assert +report.anomalies == Counter({"dirty_read": 1}), report.summary()
    assert "a.0.0/0" in report.examples["dirty_read"][0]


def test_a_visible_transaction_never_asked_to_commit_is_an_aborted_read() -> None:
    h, f = clean()
    h.txns["a.0.0"].outcome = "unknown"
    h.txns["a.0.0"].decided_at = None  # killed before it decided: recovery must abort it
    report = check(h, f, "ctp")
    # The final tables show it (aborted read); the live consumer returned one of its records.
    assert +report.anomalies == Counter({"aborted_read": 1, "dirty_read": 1}), report.summary()


def test_a_committed_read_that_later_vanished_is_a_lost_write() -> None:
    h, f = clean()
    _drop(f, "t0", "i0.0.0")
    h.idem.pop("i0.0.0")  # not journaled as acknowledged: only the live consumer saw it
    report = check(h, f, "ctp")
    assert +report.anomalies == Counter({"lost_write": 1}), report.summary()


def test_a_deleted_record_is_not_lost() -> None:
    h, f = clean()
    h.deleted = []
    assert +check(h, f, "ctp").anomalies == Counter({"lost_write": 1})


def test_an_aborted_attempt_of_a_ctp_output_is_not_a_duplicate() -> None:
    """CTP retries an input after an attempt that aborted with its output in the log: the
    same output twice read_uncommitted, once committed. A producer's value is unique per
    attempt, so for it the same is a duplicate."""
    h, f = clean()
    _append(f, "ctp", (0, 2, "ctp|0|0|a.0.0/0"), RU)  # the aborted attempt, then the retry
    assert check(h, f, "ctp").ok
    _append(f, "t1", (0, 5, "a.0.0/1"), RU)
    anomalies = check(h, f, "ctp").anomalies
    assert +anomalies == Counter({"duplicate": 1, "offset_mismatch": 1})  # RU != RC there


def test_a_consumer_may_miss_a_deleted_record_but_no_other() -> None:
    h, f = clean()
    _skip(h, f)
    h.deleted.append(("t0", 1, 0, "i0.0.0"))  # delete_records moved the log start past it
    assert check(h, f, "ctp").ok
    h.positions["consumer-0-0"][("t0", 0)] = 1  # nothing above the position is required
    assert check(h, f, "ctp").ok


def test_a_zombie_that_initialised_again_owns_its_id_again() -> None:
    h, f = clean()
    h.inits["txn-0-1/a"] = [Init(10.5)]
    # Resumed, failed, initialised again: fenced the successor.
    h.inits["txn-0-0/a"] = [Init(1.0), Init(10.8)]
    assert check(h, f, "ctp").ok
    h.inits["txn-0-0/b"] = h.inits.pop("txn-0-0/a")  # another id of that process did, not a
    assert +check(h, f, "ctp").anomalies == Counter({"zombie_commit": 1})
    h.inits["txn-0-0/a"] = h.inits.pop("txn-0-0/b")
    assert check(h, f, "ctp").ok
    # Initialised again in the millisecond of its next decision (journal times are rounded).
    h.inits["txn-0-0/a"] = [Init(1.0), Init(11.0)]
    assert check(h, f, "ctp").ok


def test_a_zombie_whose_init_overlapped_its_successors_is_ordered_by_epoch() -> None:
    """A zombie resumed while its successor initialised: both calls overlap, and the one
    that returns later may hold the older epoch (its fences took longer). The newer epoch
    owns the id, whichever returned first (seen in a run: the successor, epoch 18, returned
    after the zombie, epoch 19, and was fenced by it)."""
    h, f = clean()
    h.inits["txn-0-1/a"] = [Init(10.5, 7, 18)]
    h.inits["txn-0-0/a"] = [Init(10.2, 7, 19)]  # returned first, CAS'd last
    assert check(h, f, "ctp").ok
    h.inits["txn-0-0/a"] = [Init(10.2, 7, 17)]  # the older epoch: a zombie commit
    assert +check(h, f, "ctp").anomalies == Counter({"zombie_commit": 1})
    h.inits["txn-0-0/a"] = [Init(10.2, 7, 19)]
    h.inits["txn-0-1/a"] = [Init(10.5, 7, 18), Init(10.9, 7, 20)]  # the successor took it back
    assert +check(h, f, "ctp").anomalies == Counter({"zombie_commit": 1})
    h.inits["txn-0-1/a"] = [Init(10.5, 8, 0)]  # another producer id: epochs do not compare
    assert +check(h, f, "ctp").anomalies == Counter({"zombie_commit": 1})
    h.inits["txn-0-1/a"] = [Init(10.5)]  # a journal without epochs: the times decide
    assert +check(h, f, "ctp").anomalies == Counter({"zombie_commit": 1})


def test_the_journal_reader_folds_complete_lines_once(tmp_path: Path) -> None:
    """The driver reads journals while workers append: a half-written line waits for its end."""
    path = tmp_path / "txn-0-0.jsonl"
    lines = [
        {"e": "start", "role": "txn", "ts": 1.0},
        {"e": "begin", "txn": "tx0.0.0", "ts": 1.0},
        {"e": "send", "txn": "tx0.0.0", "t": "t0", "p": 1, "vs": ["tx0.0.0/0"], "ts": 1.1},
        {"e": "deciding", "txn": "tx0.0.0", "d": "commit", "ts": 1.2},
        {"e": "end", "txn": "tx0.0.0", "outcome": "commit", "ts": 1.3},
    ]
    text = "".join(json.dumps(e) + "\n" for e in lines)
    cut = text.index('"outcome"')
    path.write_text(text[:cut])
    reader = JournalReader(tmp_path)
    h = reader.feed()
    assert h.txns["tx0.0.0"].outcome == "unknown" and h.txns["tx0.0.0"].decided_at == 1.2
    with open(path, "a") as f:
        f.write(text[cut:])
    h = reader.feed()
    assert h.txns["tx0.0.0"].sends == [("tx0.0.0/0", "t0", 1)]
    assert h.txns["tx0.0.0"].outcome == "commit" and h.progress == Counter(txn=1)
    assert h.roles == {"txn"}


# --- quick runs -----------------------------------------------------------------------------

#: The CI-sized run's cap on driving (past its work it stops sooner), and its whole budget
#: (start, drive, stop, recover, read every table every way): within the suite's timeout.
CI_MAX_S = 240.0
CI_TIMEOUT_S = 420


def test_past_its_duration_the_driver_draws_only_the_faults_it_still_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer fault misses when no lease is live, so a required one could stay missing
    until the cap: past the duration the schedule draws only among the missing kinds."""
    driver = Driver(HarnessConfig(url=str(tmp_path / "wh"), workdir=tmp_path, writer_procs=1))
    drawn: list[str] = []
    monkeypatch.setattr(driver, "committer_fault", lambda kind, past_lease: drawn.append(kind))
    monkeypatch.setattr("eo_driver.set_outage", lambda *a: drawn.append("outage"))
    monkeypatch.setattr(driver, "slots", [])  # process faults find no victim: not drawn
    for _ in range(60):
        driver.fault()
    assert {"outage", "kill_committer", "pause_committer"} <= set(drawn)
    drawn.clear()
    driver.kinds_missing = {"pause_committer"}
    for _ in range(30):
        driver.fault()
    driver.driver_journal.close()
    assert drawn == ["pause_committer"] * 30


def test_a_zombie_that_holds_the_lease_is_the_committer_a_fault_kills(tmp_path: Path) -> None:
    """A zombie (a paused-then-resumed predecessor) whose handle holds the hot table's live
    lease is the committer: kill_committer SIGKILLs it and restarts nothing. Before, the
    driver looked only at the slots' current processes, missed every committer fault while
    a zombie kept the lease, and the run lasted until its cap (a CI run, 240 s)."""
    driver = Driver(HarnessConfig(url=str(tmp_path / "wh"), workdir=tmp_path, writer_procs=1))
    lease = {"owner": "h1", "epoch": 3, "expiresMs": int(time.time() * 1000) + 60_000}
    driver.store.put(lease_key(HOT_TABLE), json.dumps(lease).encode())
    (tmp_path / "journals" / "mw-0-0.jsonl").write_text(
        json.dumps({"e": "gc", "id": "h1", "t": HOT_TABLE, "ts": 1.0}) + "\n"
    )
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    current, zombie = subprocess.Popen(sleep), subprocess.Popen(sleep)
    slot = Slot("mw", 0, proc=current, inc=1, zombies=[(0, zombie)])
    driver.slots = [slot]
    try:
        found = driver.committer()
        assert found is not None and found.proc is zombie and found.slot is slot
        driver.committer_fault("kill_committer", past_lease=1.5)
        assert zombie.wait(timeout=10) == -signal.SIGKILL
        assert current.poll() is None and slot.proc is current and slot.inc == 1
        assert driver.committer() is None  # the lease names a process that is gone
    finally:
        driver.driver_journal.close()
        for proc in (current, zombie):
            proc.kill()
            proc.wait()
    faults = [json.loads(line) for line in (tmp_path / "journals" / "driver.jsonl").open()]
    assert [(f["e"], f["kind"], f.get("zombie")) for f in faults] == [
        ("driver_fault", "kill_committer", True)
    ]


def harness_seed() -> int:
    """``TXNTABLE_HARNESS_SEED`` replays a reported run's fault schedule; else a fresh one."""
    given = os.environ.get("TXNTABLE_HARNESS_SEED")
    return int(given) if given else int.from_bytes(os.urandom(3), "big")


def _quick(
    url: str,
    options: dict[str, str],
    workdir: Path,
    seconds: float,
    workers: int,
    commits: int,
    max_seconds: float = 180.0,
    transactions: int = 0,
    require_faults: tuple[str, ...] = (),
    store: str = "local",
    **more: Any,
) -> dict:
    # Sized by work: past ``seconds`` the driver runs until ``commits`` commits, an abort,
    # progress of every worker kind and every fault kind of ``require_faults`` are
    # journaled, so a loaded machine checks as much history as a quiet one.
    seed = harness_seed()
    cfg = HarnessConfig(
        url=url,
        options=options,
        workdir=workdir,
        duration_s=seconds,
        txn_workers=workers,
        fault_interval_s=more.pop("fault_interval_s", (1.5, 3.5)),
        seed=seed,
        min_commits=commits,
        min_transactions=transactions,
        max_duration_s=max_seconds,
        require_faults=require_faults,
        **more,
    )
    report = run(cfg)
    summary = report.summary()
    journals = workdir / "journals"
    if not report.ok:
        # pytest keeps only its last few base directories, and other sessions of the same
        # user rotate them: the journals that explain a failure go where nothing rotates.
        kept = Path(tempfile.gettempdir()) / f"txntable-harness-{seed}"
        shutil.copytree(journals, kept, dirs_exist_ok=True)
        journals = kept
    # Printed, so a failing run names what replays it.
    replay = (
        f"harness seed {seed}, journals in {journals}; replay the fault schedule with "
        f"TXNTABLE_HARNESS_SEED={seed} or run_long.py --store {store} --seed {seed}"
    )
    print(replay)
    print(json.dumps(summary, indent=1))
    assert report.ok, (replay, summary)
    tx = summary["transactions"]
    assert tx.get("commit", 0) >= commits and tx.get("abort", 0) >= 1, (replay, summary)
    assert summary["progress"].keys() >= {"txn", "idem", "ctp", "consumer", "maint"}, summary
    assert summary["faults_missing"] == [], (replay, summary)
    return summary


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(CI_TIMEOUT_S)
def test_ci_sized_run_local_disk(tmp_path: Path) -> None:
    """The issue's CI-sized run: hundreds of transactions under every fault kind, no anomaly.

    Every fault kind must have happened (a zombie fenced, an ambiguous and a late write, a
    stall past the transaction timeout, ...), and most outcomes must be known: a run whose
    clients mostly ended in errors would check little.
    """
    summary = _quick(
        str(tmp_path / "wh"),
        {},
        tmp_path,
        seconds=40,
        workers=5,
        commits=300,
        max_seconds=CI_MAX_S,
        require_faults=FAULT_KINDS,
        # Sized by transactions ended as well: a commit decided before a fault finishes
        # instead of aborting, so fewer transactions end per commit than they did.
        transactions=500,
    )
    assert summary["transactions_total"] >= 500, summary
    assert summary["zombies"].get("fenced", 0) >= 1, summary
    unknown = summary["unknown_share"]
    assert unknown["transactions"] <= 0.2 and unknown["ctp_transactions"] <= 0.4, summary


# --- many writers of one table (issue 17: group commit) -------------------------------------

#: 16 writers (4 processes of 4 threads) on the 8 partitions of table ``hot``, next to the
#: usual workload; leases of 2 s so that a committer paused past its lease costs seconds.
MANY_WRITERS: dict[str, Any] = {
    "writer_procs": 4,
    "writer_threads": 4,
    "group_commit": {"lease_ms": 2000},
    "chaos": ChaosConfig(after_hot=0.02),
}
MW_MAX_S = 240.0
MW_TIMEOUT_S = 420


def _many_writers(summary: dict) -> None:
    assert summary["progress"].get("mw", 0) > 0, summary
    # Rounds were committed for others, and followers helped when a committer was gone.
    assert summary["group_commit"].get("rounds", 0) > 0, summary
    assert summary["group_commit"].get("helps", 0) > 0, summary


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(MW_TIMEOUT_S)
def test_many_writers_local_disk(tmp_path: Path) -> None:
    """16 writers under the committer's SIGKILL and SIGSTOP past its lease, writers killed
    between deciding and their ack, ambiguous writes of log versions and intents: every
    acknowledged record once, nothing aborted or fenced visible, offsets dense (verify),
    LSO monotone, every consumer complete."""
    summary = _quick(
        str(tmp_path / "wh"),
        {},
        tmp_path,
        seconds=30,
        workers=1,
        commits=100,
        max_seconds=MW_MAX_S,
        require_faults=("sigkill", *MANY_WRITER_FAULTS),
        **MANY_WRITERS,
    )
    _many_writers(summary)


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.alone
@pytest.mark.timeout(MW_TIMEOUT_S)
def test_many_writers_moto_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on S3, and the suite's run of the whole workload on S3: a moto server in a
    process of its own (one Python process serves every request; in the test's process it
    would share the driver's interpreter lock)."""
    from eo_moto import moto_env, moto_process
    from storeutil import create_bucket, s3_options

    for name, value in moto_env().items():
        monkeypatch.setenv(name, value)
    with moto_process() as endpoint:
        summary = _quick(
            f"s3://{create_bucket(endpoint)}/wh",
            s3_options(endpoint),
            tmp_path,
            seconds=30,
            workers=1,
            commits=20,
            max_seconds=MW_MAX_S,
            require_faults=(
                "sigkill",
                "store_before",
                "kill_committer",
                "store_after_log",
                "store_after_commit",
            ),
            store="s3",
            # The same 16 writers in 2 processes, and process faults half as often: the
            # server's process needs the CPU, and each kill costs 8 writers a restart.
            **{**MANY_WRITERS, "writer_procs": 2, "writer_threads": 8},
            fault_interval_s=(3.0, 7.0),
        )
    _many_writers(summary)
