"""The harness driver: start the worker processes, inject process faults, then check.

:func:`run` creates the tables, starts the workers (``eo_workers.py``), and until the deadline
injects faults at random: SIGKILL of a producer or the consume-transform-produce worker and
a restart with the same transactional id; a zombie (SIGSTOP, a successor with the same
transactional id initialises, SIGCONT: the old instance must be fenced); storage outages of
seconds. With many writers (``writer_procs``) also: SIGKILL of the process holding the hot
table's committer lease, or SIGSTOP of it past its lease (and SIGKILL of the helper that
took the lease meanwhile, mid-round, before the paused one resumes). Storage faults
(ambiguous and failed writes, late writes, slow requests) come from each worker's
:class:`eo_chaos.ChaosStore`. Then it stops the workers, aborts what killed workers left
open, reads the final tables and runs :func:`eo_checker.check`.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eo_chaos import ChaosConfig, set_outage
from eo_checker import History, JournalReader, Report, check, collect, journal_name

from txntable import Warehouse
from txntable.config import COMMIT_LEASE_MS_DEFAULT
from txntable.errors import TxnTableError
from txntable.layout import lease_key
from txntable.storage import open_store

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "eo_workers.py"
TABLES = {"t0": 3, "t1": 2, "t2": 2}
CTP_TABLE, CTP_PARTITIONS, CTP_GROUP = "ctp", 3, "ctp-group"
HOT_TABLE, HOT_PARTITIONS = "hot", 8
#: Every fault kind, as the checker counts them (``History.faults``); ``zombie_fenced``: a
#: zombie that exited fenced.
FAULT_KINDS = (
    "sigkill",
    "zombie",
    "zombie_fenced",
    "outage",
    "store_before",
    "store_after",
    "store_late",
    "store_slow",
    "txn_stall",
)
#: The many-writers run's own faults: SIGKILL and SIGSTOP past its lease of the process
#: holding the hot table's committer lease, ambiguous writes of log versions and of
#: group-commit objects, and a writer killed after deciding to commit, before its ack.
MANY_WRITER_FAULTS = (
    "kill_committer",
    "pause_committer",
    "store_after_log",
    "store_after_commit",
    "killed_while_committing",
)

#: The fault kinds the driver's schedule draws, by the fault the checker counts for each
#: (the rest are the workers' own).
SCHEDULED_AS = {
    "sigkill": "kill",
    "zombie": "zombie",
    "zombie_fenced": "zombie",
    "outage": "outage",
    "kill_committer": "kill_committer",
    "pause_committer": "pause_committer",
}
#: How long a committer fault looks for a live lease before it counts as missed.
COMMITTER_WAIT_S = 3.0


@dataclass
class HarnessConfig:
    """One harness run."""

    url: str
    workdir: Path
    options: Mapping[str, str] = field(default_factory=dict)
    duration_s: float = 30.0
    txn_workers: int = 3
    idem_workers: int = 1
    ctp: bool = True
    consumer: bool = True
    maintenance: bool = True
    #: Seconds between process faults (uniform in this range); None: no process faults.
    fault_interval_s: tuple[float, float] | None = (2.0, 5.0)
    outages: bool = True
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    #: Short transaction timeout of the stalling worker (the others use 30 s).
    short_timeout_ms: int = 2000
    seed: int = 0
    #: A SparkSession with the txntable source registered: the Spark source reads too.
    spark: Any = None
    #: Many writers of one table (issue 17): this many processes of ``writer_threads``
    #: writers each on table ``hot`` (8 partitions); their committer is killed and paused.
    writer_procs: int = 0
    writer_threads: int = 4
    #: Group-commit timings of every worker (``GroupCommitConfig`` fields; None: defaults).
    group_commit: Mapping[str, int] | None = None
    #: Keep running past ``duration_s`` until the transactional workers ended this many
    #: transactions with a commit and at least one with an abort, every worker kind made
    #: progress and every fault kind in ``require_faults`` happened (a run sized by work,
    #: not by time, so a slow machine still checks enough history) ...
    min_commits: int = 0
    require_faults: tuple[str, ...] = ()
    #: ... and this many transactions ended in all (any outcome) ...
    min_transactions: int = 0
    #: ... but never longer than this.
    max_duration_s: float = 600.0


@dataclass
class Slot:
    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
    inc: int = 0
    #: Paused-then-resumed predecessors, with their incarnation numbers.
    zombies: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def journal(self) -> str:
        return journal_name(self.role, self.index, self.inc)


@dataclass
class Committer:
    """A worker process whose group-commit handle holds the hot table's live lease."""

    slot: Slot
    #: The slot's current process, or one of its zombies (a paused-then-resumed
    #: predecessor, whose committer thread runs rounds until the process exits).
    proc: subprocess.Popen[bytes]


class Driver:
    def __init__(self, cfg: HarnessConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.journals = cfg.workdir / "journals"
        self.journals.mkdir(parents=True, exist_ok=True)
        self.stop_file = str(cfg.workdir / "stop")
        self.outage_file = str(cfg.workdir / "outage")
        self.slots: list[Slot] = []
        #: Past the duration, the scheduled fault kinds the run still waits for.
        self.kinds_missing: set[str] = set()
        self.driver_journal = open(self.journals / "driver.jsonl", "a")  # noqa: SIM115
        self.reader = JournalReader(self.journals)
        self.extra_tables = {HOT_TABLE: HOT_PARTITIONS} if cfg.writer_procs else {}
        self.store = open_store(cfg.url, dict(cfg.options))  # the driver's own, no faults

    def note(self, **entry: Any) -> None:
        self.driver_journal.write(json.dumps({**entry, "ts": round(time.time(), 3)}) + "\n")
        self.driver_journal.flush()

    def worker_cfg(self, slot: Slot) -> dict[str, Any]:
        chaos = asdict(self.cfg.chaos)
        chaos["outage_file"] = self.outage_file
        cfg: dict[str, Any] = {
            "extra_tables": self.extra_tables,
            "group_commit": dict(self.cfg.group_commit) if self.cfg.group_commit else None,
            "role": slot.role,
            "slot": slot.index,
            "inc": slot.inc,
            "url": self.cfg.url,
            "options": dict(self.cfg.options),
            "chaos": chaos,
            "seed": self.cfg.seed * 1000 + slot.index * 100 + slot.inc,
            "stop_file": self.stop_file,
            "journal": str(self.journals / f"{slot.journal}.jsonl"),
        }
        if slot.role == "txn":
            cfg["tid"] = f"tx{slot.index}"
            short = slot.index == 0
            cfg["txn_timeout_ms"] = self.cfg.short_timeout_ms if short else 30_000
            cfg["stall_rate"] = 0.05 if short else 0.0
            cfg["exit_when_fenced"] = True
        elif slot.role == "ctp":
            cfg["txn_timeout_ms"] = 30_000
            cfg["exit_when_fenced"] = True
        elif slot.role == "mw":
            cfg["threads"] = self.cfg.writer_threads
            cfg["txn_timeout_ms"] = 30_000
        return cfg

    def start(self, slot: Slot) -> subprocess.Popen[bytes]:
        log = open(self.cfg.workdir / f"{slot.journal}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(WORKERS), json.dumps(self.worker_cfg(slot))],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(HERE),
        )
        log.close()
        slot.proc = proc
        return proc

    def restart(self, slot: Slot) -> None:
        slot.inc += 1
        self.start(slot)

    def setup(self) -> None:
        wh = Warehouse(store=open_store(self.cfg.url, dict(self.cfg.options)))
        for name, parts in {**TABLES, CTP_TABLE: CTP_PARTITIONS, **self.extra_tables}.items():
            wh.create_table(name, partitions=parts)
        roles = ["txn"] * self.cfg.txn_workers + ["idem"] * self.cfg.idem_workers
        roles += ["mw"] * self.cfg.writer_procs
        if self.cfg.ctp:
            roles.append("ctp")
        if self.cfg.consumer:
            roles.append("consumer")
        if self.cfg.maintenance:
            roles.append("maint")
        counts: dict[str, int] = {}
        for role in roles:
            slot = Slot(role, counts.get(role, 0))
            counts[role] = slot.index + 1
            self.slots.append(slot)
            self.start(slot)

    def fault(self) -> None:
        # Every random draw is made up front, whatever the fault turns out to hit, so the
        # same seed replays the same schedule (``run_long.py --seed N``).
        rng = self.rng
        kinds = ["kill", "kill", "zombie"] + (["outage"] if self.cfg.outages else [])
        if self.cfg.writer_procs:
            kinds += ["kill_committer", "kill_committer", "pause_committer"]
        kind = rng.choice(kinds)
        steer, pick, outage_s, kill_delay_s, pause_s, past_lease = (
            rng.random(),
            rng.random(),
            rng.uniform(1.0, 4.0),
            rng.uniform(0, 0.5),
            rng.uniform(1.0, 3.0),
            rng.uniform(1.2, 2.0),
        )
        # Past the run's duration, a required fault of the driver's own that has not happened
        # yet is what the run waits for: draw only among those (a committer fault misses
        # whenever no lease is live, so one would otherwise be left to luck within the cap).
        wanted = [k for k in dict.fromkeys(kinds) if k in self.kinds_missing]
        if wanted:
            kind = wanted[int(steer * len(wanted))]
        if kind == "outage":
            set_outage(self.outage_file, outage_s)
            self.note(e="driver_fault", kind="outage", seconds=round(outage_s, 2))
            return
        if kind in ("kill_committer", "pause_committer"):
            self.committer_fault(kind, past_lease)
            return
        roles = ("txn", "ctp", "mw") if kind == "zombie" else ("txn", "idem", "ctp", "mw")
        victims = [s for s in self.slots if s.role in roles]
        if not victims:
            return
        slot = victims[int(pick * len(victims))]
        proc = slot.proc
        assert proc is not None
        if proc.poll() is not None:
            return
        if kind == "kill":
            time.sleep(kill_delay_s)
            self.kill(slot, "sigkill")
        else:
            proc.send_signal(signal.SIGSTOP)
            self.note(
                e="driver_fault", kind="zombie", role=slot.role, slot=slot.index, inc=slot.inc
            )
            slot.zombies.append((slot.inc, proc))
            self.restart(slot)  # the successor initialises with the same transactional id
            time.sleep(pause_s)
            proc.send_signal(signal.SIGCONT)

    def kill(
        self, slot: Slot, kind: str, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        """SIGKILL the slot's process, then start its next incarnation; or SIGKILL one of
        its zombies (``proc``), which nothing restarts."""
        current = proc is None or proc is slot.proc
        victim = slot.proc if proc is None else proc
        assert victim is not None
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        zombie = {} if current else {"zombie": True}
        self.note(e="driver_fault", kind=kind, role=slot.role, slot=slot.index, **zombie)
        if current:
            self.restart(slot)

    def committer(self, wait_s: float = 0.0) -> Committer | None:
        """The worker whose group-commit handle holds a live lease on the hot table: the
        lease names a handle, the workers' journals name the process that opened it.
        Looked for up to ``wait_s``: between rounds of solo writers no lease is live."""
        end = time.monotonic() + wait_s
        while True:
            found = self._live_committer()
            if found is not None or time.monotonic() >= end:
                return found
            time.sleep(0.1)

    def _live_committer(self) -> Committer | None:
        try:
            lease = json.loads(self.store.get(lease_key(HOT_TABLE)).data)
        except (TxnTableError, ValueError):
            return None  # no lease yet (solo writers), or unreadable: no committer to hit
        if lease.get("expiresMs", 0) <= time.time() * 1000:
            return None
        journal = self.reader.feed().committers.get(lease.get("owner", ""))
        for slot in self.slots:
            if slot.journal == journal and slot.proc is not None and slot.proc.poll() is None:
                return Committer(slot, slot.proc)
            for inc, proc in slot.zombies:
                # A zombie can keep the lease for the rest of the run (it renews it while
                # rounds come): not looking at zombies missed every committer fault then.
                if journal_name(slot.role, slot.index, inc) == journal and proc.poll() is None:
                    return Committer(slot, proc)
        return None

    def committer_fault(self, kind: str, past_lease: float) -> None:
        """SIGKILL the committer's process (and restart it), or SIGSTOP it for longer than
        its lease (a zombie committer: another takes over; it resumes where it stopped)."""
        committer = self.committer(wait_s=COMMITTER_WAIT_S)
        if committer is None:
            self.note(e="committer_fault_missed", kind=kind)
            return
        if kind == "kill_committer":
            self.kill(committer.slot, kind, committer.proc)
            return
        lease_ms = (self.cfg.group_commit or {}).get("lease_ms", COMMIT_LEASE_MS_DEFAULT)
        paused = committer.proc
        paused.send_signal(signal.SIGSTOP)
        self.note(
            e="driver_fault", kind=kind, role=committer.slot.role, slot=committer.slot.index
        )
        time.sleep(lease_ms / 1000 * past_lease)
        # Past the lease a follower helped and took it: kill that helper too, mid-round,
        # before the zombie resumes.
        helper = self.committer()
        if helper is not None and helper.proc is not paused:
            self.kill(helper.slot, "kill_helper", helper.proc)
        paused.send_signal(signal.SIGCONT)

    def supervise(self) -> None:
        """Restart workers that exited on their own (fenced, or a fatal error)."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                self.note(e="exited", journal=slot.journal, code=slot.proc.returncode)
                self.restart(slot)

    def wait_started(self, timeout: float = 90) -> None:
        """Wait until every worker has started (imports take seconds on a loaded machine)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.supervise()
            started = [(self.journals / f"{s.journal}.jsonl").exists() for s in self.slots]
            if all(started):
                return
            time.sleep(0.2)

    def run(self) -> None:
        self.setup()
        self.wait_started()
        start = time.monotonic()
        deadline = start + self.cfg.duration_s
        cap = start + max(self.cfg.duration_s, self.cfg.max_duration_s)
        interval = self.cfg.fault_interval_s
        next_fault = time.monotonic() + (self.rng.uniform(*interval) if interval else 1e9)
        next_count = deadline
        while time.monotonic() < cap:
            now = time.monotonic()
            if now >= deadline and now >= next_count:
                missing = self.missing_work() if self.sized_by_work() else []
                if not missing:
                    break
                self.kinds_missing = {SCHEDULED_AS[m] for m in missing if m in SCHEDULED_AS}
                next_count = now + 2.0
            time.sleep(0.2)
            self.supervise()
            if time.monotonic() >= next_fault and interval is not None:
                self.fault()
                next_fault = time.monotonic() + self.rng.uniform(*interval)
        self.stop()

    def sized_by_work(self) -> bool:
        return (
            self.cfg.min_commits > 0
            or self.cfg.min_transactions > 0
            or bool(self.cfg.require_faults)
        )

    def missing_work(self) -> list[str]:
        """What the journals so far lack of ``min_commits`` commits and an abort, progress of
        every worker kind and every fault kind of ``require_faults``."""
        h = self.reader.feed()
        outcomes = Counter(t.outcome for t in h.txns.values())
        faults = fault_counts(h)
        missing = [f"commits {outcomes['commit']}/{self.cfg.min_commits}"] * (
            outcomes["commit"] < self.cfg.min_commits
        )
        missing += ["abort"] * (outcomes["abort"] < 1)
        ended = sum(1 for t in h.txns.values() if t.ended)
        missing += [f"transactions {ended}/{self.cfg.min_transactions}"] * (
            ended < self.cfg.min_transactions
        )
        missing += [f"progress of {r}" for r in sorted(h.roles) if not h.progress[r]]
        missing += [f for f in self.cfg.require_faults if not faults[f]]
        return missing

    def stop(self) -> None:
        Path(self.stop_file).touch()
        procs = [(s.journal, s.proc) for s in self.slots if s.proc is not None]
        procs += [
            (journal_name(s.role, s.index, inc), z) for s in self.slots for inc, z in s.zombies
        ]
        end = time.monotonic() + 60
        for journal, proc in procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.note(e="stuck_at_stop", journal=journal, pid=proc.pid)
        if not self.driver_journal.closed:
            if self.cfg.min_commits > 0 or self.cfg.require_faults:
                self.note(e="missing_work", missing=self.missing_work())
            self.driver_journal.close()


def fault_counts(h: History) -> Counter[str]:
    """The faults of ``h`` and the outcomes that show some took effect: a zombie that
    exited fenced, a writer killed between deciding to commit and its end."""
    killed = sum(1 for t in h.txns.values() if t.decided_at is not None and not t.ended)
    return h.faults + Counter(
        zombie_fenced=h.zombie_outcomes()["fenced"], killed_while_committing=killed
    )


def run(cfg: HarnessConfig) -> Report:
    """Run the workload, then check it; the report's ``ok`` says whether anything broke."""
    started = time.monotonic()
    driver = Driver(cfg)
    try:
        driver.run()
    except BaseException:
        driver.stop()
        raise
    wh = Warehouse(store=open_store(cfg.url, dict(cfg.options)))
    # Abort what killed workers left open (as their timeout would), then read.
    wh.recover(now=int(time.time() * 1000) + 3_600_000)
    final = collect(
        wh,
        {**TABLES, CTP_TABLE: CTP_PARTITIONS, **driver.extra_tables},
        CTP_GROUP if cfg.ctp else None,
        spark=cfg.spark,
        options=dict(cfg.options),
    )
    history = driver.reader.feed(final=True)
    report = check(history, final, CTP_TABLE if cfg.ctp else None)
    report.stats["seconds"] = round(time.monotonic() - started, 1)
    faults = fault_counts(history)
    report.stats["faults_missing"] = [f for f in cfg.require_faults if not faults[f]]
    report.stats["seed"] = cfg.seed
    report.stats["workdir"] = str(cfg.workdir)
    return report
