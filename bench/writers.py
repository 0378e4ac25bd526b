"""Many writers on one table (issue 17): throughput, fairness, failures and exactly-once.

    python bench/writers.py                                   # W = 1,4,16,64,256, 20 s each
    python bench/writers.py --writers 1,16 --seconds 10 --backend both --json out.json
    python bench/writers.py --quick                           # W = 1,4, 5 s (smoke test)
    python bench/writers.py --maintenance      # also 16 writers next to optimize/compact

For each number of writers W, a fresh table of 8 partitions and W writers, each with its
OWN ``Warehouse`` (own store stack: ``LocalStore`` -> ``LatencyStore`` (20 ms per request)
-> ``CountingStore``, all on one directory; or an ``S3Store`` on a moto server, whose HTTP
round trip is the latency) and its own transactional ``Producer`` (distinct transactional
ids, default settings), running small transactions back to back for the duration: begin,
10 records of 100 B, all to one partition chosen at random, commit. Writers are threads in
worker processes (one process up to 16 writers, then one per 16: two cores cannot run 256
Python threads of one process fairly); every process sets its writers up
(``init_transactions``), reports ready, and all start at the same instant.

A failed transaction is handled as Kafka's rules say: a commit that timed out
(``KafkaTimeoutError``, outcome unknown) is retried once, anything else is aborted, and if
the abort fails too the producer is closed and replaced (its ``init_transactions`` finishes
or aborts the transaction the old one left). Every transaction counts once: committed, or
failed with the class and message of its first error.

Reported per W: commits/s and records/s (commits returned within the duration, divided by
it), the ratio of commits/s to W=1's in the same run, requests per committed transaction
(every request of the writers' stores while running, by kind, over all committed
transactions), log versions per committed transaction, failed transactions and their
distinct errors, fairness (fewest commits of one writer, the mean, their ratio), and p50 /
p99 latency (begin_transaction to commit_transaction's return or raise, every transaction;
"p99 warm" without each writer's first transaction, which also loads the table, registers it
and elects a committer).
Then the table is read back ``read_committed`` (``Table.scan``) and checked: every
acknowledged record exactly once at the offset its future reported, nothing of an aborted
transaction visible, a transaction of unknown outcome all or nothing, no record that no
writer sent, offsets strictly increasing per partition. PASS/FAIL per W; the exit code is 1
if any check failed.

``--maintenance`` also runs 16 writers next to a thread running ``Table.optimize()`` and
``Table.compact()`` in a loop (a ``cleanup.policy=compact,delete`` table; every key is
unique, so compaction keeps every record and the check still applies), compared with 16
writers without maintenance in the same run.

Goals (issue 17, same run, same machine, 20 ms): commits/s at W=16 >= 8x W=1, at W=64 >=
24x; 0 failed transactions; slowest writer >= 0.5x the mean; p99 at W=16 <= 4x the p50 of
W=1; requests per transaction at W >= 16 <= 5; maintenance always completes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import queue
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from txntable import Producer, Warehouse
from txntable.errors import KafkaTimeoutError
from txntable.layout import COMMIT_DIR, COORDINATOR_DIR, INTENTS_DIR, LOG_DIR
from txntable.storage import CountingStore, LatencyStore, LocalStore, Store, open_store
from txntable.storage.s3 import (
    S3_ACCESS_KEY_ID,
    S3_ALLOW_HTTP,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
)
from txntable.storage.wrappers import REQUEST_KINDS

PARTITIONS = 8
RECORDS_PER_TXN = 10
VALUE_BYTES = 100
DEFAULT_WRITERS = "1,4,16,64,256"
QUICK_WRITERS = "1,4"
#: Writers per worker process when ``--processes`` is not given.
WRITERS_PER_PROCESS = 16
MAINTENANCE_WRITERS = 16
MAINTENANCE_CONFIG = {"cleanup.policy": "compact,delete"}
#: How long setting the writers up (init_transactions) may take, and a replaced producer's
#: init_transactions may keep failing past the end of the run, before the bench gives up.
SETUP_TIMEOUT_S = 300.0
REOPEN_GRACE_S = 120.0
#: How long the run may go on past its duration (transactions in flight finish).
FINISH_TIMEOUT_S = 900.0

COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"

MOTO_REGION = "us-east-1"
MOTO_ACCESS_KEY_ID = "testing"
MOTO_SECRET_ACCESS_KEY = "testing-secret-key-value"


# --- what a run is made of ------------------------------------------------------------------


@dataclass
class Backend:
    """Where the table lives and how a writer reaches it (picklable: sent to workers)."""

    kind: str  # "local" or "moto"
    url: str  # a directory, or s3://bucket/prefix
    options: dict[str, str]
    latency_ms: float  # 0: no latency wrapper
    group_commit: bool = True  # False: every commit races alone (as before group commit)

    def describe(self) -> str:
        what = "" if self.group_commit else ", group commit off"
        if self.kind == "local":
            return f"local disk + LatencyStore({self.latency_ms:g} ms){what}"
        return f"moto S3 server (own process, no latency wrapper){what}"


@dataclass
class Txn:
    """One transaction of one writer."""

    seq: int
    partition: int
    start: float
    end: float  # when commit_transaction returned or first raised
    outcome: str  # COMMITTED, ABORTED or UNKNOWN (abort failed: the producer was replaced)
    error: str | None = None  # "Class: message" of the first failure
    offsets: list[int] | None = None  # the futures' offsets, when committed
    recovery: list[str] = field(default_factory=list)  # what the writer did after a failure


@dataclass
class WriterResult:
    writer: int
    transactional_id: str
    txns: list[Txn]
    requests: dict[str, int]  # while running (setup excluded)
    producer_errors: list[str]  # failures outside a transaction (close, init_transactions)
    #: The group-commit counters of its producers' table handles (rounds, helps, ...).
    group_commit: dict[str, int] = field(default_factory=dict)
    #: Its requests while running by the object they were for (see :data:`OBJECTS`).
    objects: dict[str, int] = field(default_factory=dict)


@dataclass
class WorkerJob:
    """The writers one worker process runs."""

    index: int
    backend: Backend
    table: str
    writers: list[int]
    transactional_ids: list[str]
    seconds: float
    seed: int


@dataclass
class MaintenanceRun:
    operation: str  # "optimize" or "compact"
    start: float
    end: float
    error: str | None
    version: int | None  # the log version it wrote, if any


@dataclass
class Check:
    """The read_committed readback of one run."""

    passed: bool
    problems: list[str]
    records_read: int
    acknowledged: int
    aborted_txns: int
    unknown_txns_visible: int
    unknown_txns_invisible: int
    open_partitions: list[int]  # LSO below the high watermark at readback


@dataclass
class Run:
    label: str
    writers: int
    processes: int
    seconds: float
    start: float
    results: list[WriterResult]
    versions: int  # log versions written while it ran
    check: Check
    settled: dict[str, list[str]]  # what recover() finished after the run, by kind
    maintenance: list[MaintenanceRun] | None = None
    worker_errors: list[str] = field(default_factory=list)


# --- a writer ------------------------------------------------------------------------------


def describe_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def open_backend_store(backend: Backend) -> Store:
    """A bare store on the backend (no wrapper)."""
    if backend.kind == "local":
        return LocalStore(backend.url)
    return open_store(backend.url, backend.options)


#: What the writers' requests were for, by key (``requests/txn by object``: where they go).
OBJECTS = ("outcome record", "lease", "intents", "log", "coordinator", "segments", "other")


def object_of(key: str) -> str:
    """Which of :data:`OBJECTS` a key (or a listed prefix) is."""
    if f"/{INTENTS_DIR}/" in key:
        return "intents"
    if key.endswith(f"/{COMMIT_DIR}/outcomes.json"):
        return "outcome record"
    if key.endswith(f"/{COMMIT_DIR}/lease.json"):
        return "lease"
    if f"/{LOG_DIR}/" in key:
        return "log"
    if key.startswith(f"{COORDINATOR_DIR}/"):
        return "coordinator"
    if "/data/" in key:
        return "segments"
    return "other"


def build_writer_warehouse(backend: Backend) -> tuple[Warehouse, CountingStore]:
    """A writer's own warehouse: its own store, behind the latency wrapper, counted."""
    store = open_backend_store(backend)
    if backend.latency_ms > 0:
        store = LatencyStore(store, backend.latency_ms)
    counting = CountingStore(store, classify=object_of)
    return Warehouse(store=counting, group_commit=backend.group_commit), counting


def record_value(writer: int, seq: int, index: int) -> bytes:
    """A record value naming its writer, transaction and place, padded to VALUE_BYTES."""
    return f"{writer}:{seq}:{index}:".encode().ljust(VALUE_BYTES, b".")


def parse_value(value: bytes) -> tuple[int, int, int] | None:
    parts = value.split(b":", 3)
    try:
        return int(parts[0]), int(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        return None


def close_producer(producer: Producer, errors: list[str]) -> None:
    try:
        producer.close(timeout=30)
    except Exception as e:  # a fenced producer refuses to flush; recorded, not fatal
        errors.append(f"close: {describe_error(e)}")


def open_producer(
    warehouse: Warehouse, transactional_id: str, give_up_at: float, errors: list[str]
) -> Producer:
    """A transactional producer with its transactions initialised; init_transactions is
    retried (on a new producer) until ``give_up_at``, every failure recorded."""
    while True:
        producer = Producer(warehouse, transactional_id=transactional_id)
        try:
            producer.init_transactions()
            return producer
        except Exception as e:
            errors.append(f"init_transactions: {describe_error(e)}")
            close_producer(producer, errors)
            if time.time() >= give_up_at:
                raise


def run_transaction(
    producer: Producer, table: str, writer: int, seq: int, partition: int, futures: list[Any]
) -> list[int]:
    """Begin, send RECORDS_PER_TXN records to ``partition``, commit; the records' offsets."""
    producer.begin_transaction()
    for i in range(RECORDS_PER_TXN):
        key = f"{writer}:{seq}:{i}".encode()  # unique: compaction keeps every record
        futures.append(
            producer.send(table, value=record_value(writer, seq, i), key=key, partition=partition)
        )
    producer.commit_transaction()
    return [f.get(timeout=60).offset for f in futures]


def settle_failed(
    producer: Producer,
    txn: Txn,
    error: Exception,
    futures: list[Any],
    reopen: Callable[[], Producer],
) -> Producer:
    """Finish a failed transaction by Kafka's rules; set its outcome; the producer to go on
    with (a new one if the old one could not abort)."""
    if isinstance(error, KafkaTimeoutError):  # outcome unknown: the commit must be retried
        try:
            producer.commit_transaction()
            txn.offsets = [f.get(timeout=60).offset for f in futures]
            txn.outcome = COMMITTED
            txn.recovery.append("commit retried: committed")
            return producer
        except Exception as e:
            txn.recovery.append(f"commit retried: {describe_error(e)}")
    try:
        producer.abort_transaction()
        txn.outcome = ABORTED
        txn.recovery.append("aborted")
        return producer
    except Exception as e:
        txn.recovery.append(f"abort: {describe_error(e)}")
    errors: list[str] = []
    close_producer(producer, errors)
    txn.recovery.extend(errors)
    txn.recovery.append("producer replaced")
    return reopen()


def writer_loop(
    writer: int,
    transactional_id: str,
    table: str,
    warehouse: Warehouse,
    counter: CountingStore,
    producer: Producer,
    deadline: float,
    seed: int,
) -> WriterResult:
    """Run transactions back to back until ``deadline``; the last one may end after it."""
    rng = random.Random(f"{seed}-{writer}")
    txns: list[Txn] = []
    errors: list[str] = []
    counts: Counter[str] = Counter()
    before, objects_before = counter.snapshot(), counter.objects()

    def reopen() -> Producer:
        return open_producer(warehouse, transactional_id, deadline + REOPEN_GRACE_S, errors)

    seq = 0
    try:
        while time.time() < deadline:
            partition = rng.randrange(PARTITIONS)
            futures: list[Any] = []
            start = time.time()
            try:
                offsets = run_transaction(producer, table, writer, seq, partition, futures)
                txns.append(Txn(seq, partition, start, time.time(), COMMITTED, offsets=offsets))
            except Exception as e:
                txn = Txn(seq, partition, start, time.time(), UNKNOWN, error=describe_error(e))
                txns.append(txn)
                replaced = settle_failed(producer, txn, e, futures, reopen)
                if replaced is not producer:
                    counts.update(group_commit_stats(producer, table))
                producer = replaced
            seq += 1
        close_producer(producer, errors)
    except Exception as e:  # the producer could not be replaced: this writer stops here
        errors.append(f"writer stopped: {describe_error(e)}")
    counts.update(group_commit_stats(producer, table))
    after, objects_after = counter.snapshot(), counter.objects()
    requests = {kind: after[kind] - before[kind] for kind in REQUEST_KINDS}
    objects = {
        name: objects_after.get(name, 0) - objects_before.get(name, 0) for name in OBJECTS
    }
    return WriterResult(writer, transactional_id, txns, requests, errors, counts, objects)


def group_commit_stats(producer: Producer, table: str) -> dict[str, int]:
    """The counters of the producer's group-commit handle of ``table`` (none if it never
    loaded the table, or writes without group commit)."""
    handle = producer.metadata.loaded(table)
    if handle is None or handle.group_commit is None:
        return {}
    return dict(handle.group_commit.stats)


# --- a worker process ----------------------------------------------------------------------


def process_worker(
    job: WorkerJob, reports: Any, go: Any, start_at: Any
) -> None:
    """Set up the job's writers, report ready, wait for the common start, run, report.

    Reports on ``reports``: ``("ready", index)``, then ``("done", index, results)``; or
    ``("error", index, traceback)``.
    """
    try:
        with ThreadPoolExecutor(len(job.writers)) as pool:

            def setup(i: int) -> tuple[Warehouse, CountingStore, Producer]:
                warehouse, counter = build_writer_warehouse(job.backend)
                producer = open_producer(
                    warehouse, job.transactional_ids[i], time.time() + SETUP_TIMEOUT_S, []
                )
                return warehouse, counter, producer

            writers = list(pool.map(setup, range(len(job.writers))))
        reports.put(("ready", job.index))
        if not go.wait(SETUP_TIMEOUT_S):
            raise TimeoutError("no start signal")
        start = start_at.value
        deadline = start + job.seconds
        time.sleep(max(0.0, start - time.time()))
        with ThreadPoolExecutor(len(job.writers)) as pool:
            futures = [
                pool.submit(
                    writer_loop,
                    wid,
                    job.transactional_ids[i],
                    job.table,
                    warehouse,
                    counter,
                    producer,
                    deadline,
                    job.seed,
                )
                for i, (wid, (warehouse, counter, producer)) in enumerate(
                    zip(job.writers, writers, strict=True)
                )
            ]
            results = [f.result() for f in futures]
        reports.put(("done", job.index, results))
    except BaseException:
        reports.put(("error", job.index, traceback.format_exc()))


# --- maintenance next to the writers ---------------------------------------------------------


def maintenance_loop(
    backend: Backend, table: str, start: float, deadline: float, runs: list[MaintenanceRun]
) -> None:
    """optimize() then compact(), in turn, from ``start`` until ``deadline``, as one more
    client behind the same latency."""
    warehouse, _ = build_writer_warehouse(backend)
    handle = warehouse.table(table)
    time.sleep(max(0.0, start - time.time()))
    operations: list[tuple[str, Callable[[], Any]]] = [
        ("optimize", handle.optimize),
        ("compact", handle.compact),
    ]
    turn = 0
    while time.time() < deadline:
        name, operation = operations[turn % 2]
        turn += 1
        t0 = time.time()
        try:
            report = operation()
            runs.append(MaintenanceRun(name, t0, time.time(), None, report.version))
        except Exception as e:
            runs.append(MaintenanceRun(name, t0, time.time(), describe_error(e), None))


# --- one run: W writers ----------------------------------------------------------------------


def reader_warehouse(backend: Backend) -> Warehouse:
    """A plain warehouse for creating and reading back tables (no latency, no counting, and
    no writes on a reader's behalf: a stuck transaction shows as such)."""
    return Warehouse(store=open_backend_store(backend), finish_stuck_transactions=False)


def auto_processes(writers: int) -> int:
    return max(1, math.ceil(writers / WRITERS_PER_PROCESS))


def run_writers(
    label: str,
    writers: int,
    processes: int,
    backend: Backend,
    seconds: float,
    seed: int,
    maintenance: bool = False,
) -> Run:
    """Create table ``label`` and run ``writers`` writers on it in ``processes`` processes
    (plus the maintenance loop if asked); then read it back."""
    reader = reader_warehouse(backend)
    reader.create_table(
        label, partitions=PARTITIONS, configuration=MAINTENANCE_CONFIG if maintenance else None
    )
    processes = max(1, min(processes, writers))
    jobs = [
        WorkerJob(
            index=p,
            backend=backend,
            table=label,
            writers=list(range(p, writers, processes)),
            # Unique: every bench run has a fresh warehouse, every W its own label.
            transactional_ids=[f"bench-{label}-{w}" for w in range(p, writers, processes)],
            seconds=seconds,
            seed=seed,
        )
        for p in range(processes)
    ]
    ctx = multiprocessing.get_context("spawn")
    reports = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=process_worker, args=(job, reports, go, start_at), daemon=True)
        for job in jobs
    ]
    for proc in procs:
        proc.start()
    worker_errors: list[str] = []
    results: list[WriterResult] = []
    maintenance_runs: list[MaintenanceRun] | None = [] if maintenance else None
    maintainer: threading.Thread | None = None
    start = time.time()
    versions_before = reader.table(label).snapshot().version
    try:
        ready = 0
        while ready < len(procs) and not worker_errors:
            message = reports.get(timeout=SETUP_TIMEOUT_S)
            if message[0] == "ready":
                ready += 1
            else:
                worker_errors.append(message[2])
        if not worker_errors:
            start = time.time() + 1.0
            start_at.value = start
            go.set()
            if maintenance_runs is not None:
                maintainer = threading.Thread(
                    target=maintenance_loop,
                    args=(backend, label, start, start + seconds, maintenance_runs),
                    daemon=True,
                )
                maintainer.start()
            done = 0
            while done < len(procs):
                message = reports.get(timeout=seconds + FINISH_TIMEOUT_S)
                done += 1
                if message[0] == "done":
                    results.extend(message[2])
                else:
                    worker_errors.append(message[2])
    except queue.Empty:
        worker_errors.append("a worker process did not report in time")
    finally:
        go.set()  # a worker still waiting for the start gives up promptly
        if maintainer is not None:
            maintainer.join(timeout=FINISH_TIMEOUT_S)
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    results.sort(key=lambda r: r.writer)
    versions = reader.table(label).snapshot().version - versions_before
    settled = settle_transactions(reader)
    check = readback_check(reader, label, results)
    if worker_errors:
        check.passed = False
        check.problems.insert(0, f"{len(worker_errors)} worker process(es) failed")
    for tid, error in settled.get("failed", {}).items():
        check.passed = False
        check.problems.append(f"recover() failed for {tid}: {error}")
    return Run(
        label, writers, processes, seconds, start, results, versions, check,
        {k: sorted(v) for k, v in settled.items()}, maintenance_runs, worker_errors,
    )


def settle_transactions(reader: Warehouse) -> dict[str, Any]:
    """Finish every decision the coordinator holds, as an operator's ``recover()`` (or the
    next ``init_transactions`` of each id) would, so that the readback sees the table's
    final state: a transaction prepared to commit becomes visible now, even if its
    producer reported it failed or aborted (which the check then reports)."""
    report = reader.recover()
    return {
        "committed": report.committed,
        "aborted": report.aborted,
        "timed_out": report.timed_out,
        "failed": report.failed,
    }


# --- the exactly-once check ------------------------------------------------------------------


def readback_check(reader: Warehouse, table_name: str, results: list[WriterResult]) -> Check:
    """Read the table back read_committed and check it against what the writers recorded."""
    table = reader.table(table_name)
    snapshot = table.snapshot()
    open_partitions = [
        p.partition for p in snapshot.partitions if p.last_stable_offset < p.high_watermark
    ]
    data = table.scan("read_committed", columns=["partition", "offset", "value"]).to_arrow()
    partitions = data.column("partition").to_pylist()
    offsets = data.column("offset").to_pylist()
    values = data.column("value").to_pylist()

    problems: list[str] = []
    seen: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    last_offset: dict[int, int] = {}
    for partition, offset, value in zip(partitions, offsets, values, strict=True):
        if offset <= last_offset.get(partition, -1):
            problems.append(f"p{partition}: offset {offset} read after {last_offset[partition]}")
        last_offset[partition] = offset
        ident = parse_value(value)
        if ident is None:
            problems.append(f"p{partition}@{offset}: a value no writer sent: {value[:40]!r}")
            continue
        seen.setdefault(ident, []).append((partition, offset))

    expected: set[tuple[int, int, int]] = set()
    acknowledged = aborted = unknown_visible = unknown_invisible = 0
    for result in results:
        for txn in result.txns:
            idents = [(result.writer, txn.seq, i) for i in range(RECORDS_PER_TXN)]
            expected.update(idents)
            visible = [i for i in idents if i in seen]
            where = f"writer {result.writer} txn {txn.seq}"
            if txn.outcome == COMMITTED:
                assert txn.offsets is not None
                for ident, offset in zip(idents, txn.offsets, strict=True):
                    acknowledged += 1
                    if ident not in seen:
                        problems.append(f"{where}: acknowledged p{txn.partition}@{offset} lost")
                    elif seen[ident][0] != (txn.partition, offset):
                        problems.append(
                            f"{where}: acknowledged at p{txn.partition}@{offset}, "
                            f"read at p{seen[ident][0][0]}@{seen[ident][0][1]}"
                        )
            elif txn.outcome == ABORTED:
                aborted += 1
                if visible:
                    problems.append(f"{where}: aborted, yet {len(visible)} record(s) visible")
            else:
                if len(visible) == RECORDS_PER_TXN:
                    unknown_visible += 1
                elif not visible:
                    unknown_invisible += 1
                else:
                    problems.append(
                        f"{where}: outcome unknown and {len(visible)} of "
                        f"{RECORDS_PER_TXN} records visible (not atomic)"
                    )
    for ident, places in seen.items():
        if len(places) > 1:
            problems.append(f"record {ident} read {len(places)} times: {places}")
        if ident not in expected:
            problems.append(f"record {ident} at {places[0]}: no writer recorded it")
    return Check(
        passed=not problems,
        problems=problems,
        records_read=len(values),
        acknowledged=acknowledged,
        aborted_txns=aborted,
        unknown_txns_visible=unknown_visible,
        unknown_txns_invisible=unknown_invisible,
        open_partitions=open_partitions,
    )


# --- the report ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``nan`` when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def error_kind(error: str) -> str:
    """An error with its numbers blanked, so that the same failure groups together."""
    return re.sub(r"\d+", "N", error)[:160]


def summarise(run: Run, baseline_commits_per_s: float | None) -> dict[str, Any]:
    """The numbers of one run (one table row), JSON-ready."""
    deadline = run.start + run.seconds
    txns = [t for r in run.results for t in r.txns]
    committed = [t for t in txns if t.outcome == COMMITTED]
    in_window = sum(1 for t in committed if t.end <= deadline)
    commits_per_s = in_window / run.seconds
    per_writer = [sum(1 for t in r.txns if t.outcome == COMMITTED) for r in run.results]
    mean = sum(per_writer) / len(per_writer) if per_writer else 0.0
    fewest = min(per_writer) if per_writer else 0
    requests: Counter[str] = Counter()
    objects: Counter[str] = Counter()
    group_commit: Counter[str] = Counter()
    for r in run.results:
        requests.update(r.requests)
        objects.update(r.objects)
        group_commit.update(r.group_commit)
    per_txn = max(1, len(committed))
    failed = [t for t in txns if t.error is not None]
    errors = Counter(error_kind(t.error) for t in failed if t.error is not None)
    producer_errors = Counter(error_kind(e) for r in run.results for e in r.producer_errors)
    outcomes = Counter(t.outcome for t in failed)
    latencies = [t.end - t.start for t in txns]
    # Each writer's first transaction also loads the table, registers it with the
    # coordinator, imports what the first encode needs and elects a committer: the
    # steady state is measured without it (both are printed).
    warm = [t.end - t.start for r in run.results for t in r.txns[1:]]
    maintenance_versions = sum(
        1 for m in run.maintenance or () if m.error is None and m.version is not None
    )
    last_end = max((t.end for t in txns), default=deadline)
    summary: dict[str, Any] = {
        "label": run.label,
        "writers": run.writers,
        "processes": run.processes,
        "seconds": run.seconds,
        "commits_in_window": in_window,
        "commits_total": len(committed),
        "commits_per_s": commits_per_s,
        "records_per_s": commits_per_s * RECORDS_PER_TXN,
        "ratio_to_w1": (
            commits_per_s / baseline_commits_per_s if baseline_commits_per_s else None
        ),
        "requests_per_txn": sum(requests.values()) / per_txn,
        "requests_per_txn_by_kind": {k: requests[k] / per_txn for k in REQUEST_KINDS},
        "requests_per_txn_by_object": {k: objects[k] / per_txn for k in OBJECTS},
        "versions_per_txn": (run.versions - maintenance_versions) / per_txn,
        "group_commit": dict(sorted(group_commit.items())),
        "failed": len(failed),
        "failed_outcomes": dict(outcomes),
        "errors": dict(errors.most_common()),
        "producer_errors": dict(producer_errors.most_common()),
        "fairness_min": fewest,
        "fairness_mean": mean,
        "fairness_ratio": fewest / mean if mean else 0.0,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "p99_warm_ms": percentile(warm, 0.99) * 1000,
        "overrun_s": max(0.0, last_end - deadline),
        "check": "PASS" if run.check.passed else "FAIL",
        "check_detail": asdict(run.check),
        "settled_after_run": run.settled,
        "worker_errors": run.worker_errors,
    }
    if run.maintenance is not None:
        summary["maintenance"] = summarise_maintenance(run.maintenance)
    return summary


def summarise_maintenance(runs: list[MaintenanceRun]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("optimize", "compact"):
        mine = [m for m in runs if m.operation == name]
        durations = [m.end - m.start for m in mine]
        out[name] = {
            "runs": len(mine),
            "completed": sum(1 for m in mine if m.error is None),
            "versions_written": sum(1 for m in mine if m.error is None and m.version is not None),
            "failed": sum(1 for m in mine if m.error is not None),
            "errors": dict(Counter(error_kind(m.error) for m in mine if m.error).most_common()),
            "p50_s": percentile(durations, 0.5),
            "max_s": max(durations, default=math.nan),
        }
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'W':>4} {'proc':>4} {'commits/s':>9} {'records/s':>9} {'xW=1':>5} {'req/txn':>7} "
        f"{'vers/txn':>8} {'failed':>6} {'min/mean commits':>18} {'p50 ms':>7} {'p99 ms':>8} "
        f"{'p99 warm':>8} check"
    )
    lines = [header]
    for r in rows:
        ratio = "-" if r["ratio_to_w1"] is None else f"{r['ratio_to_w1']:.2f}"
        fairness = f"{r['fairness_min']}/{r['fairness_mean']:.1f} ({r['fairness_ratio']:.2f})"
        name = f"{r['writers']}{'+m' if 'maintenance' in r else ''}"
        lines.append(
            f"{name:>4} {r['processes']:>4} {r['commits_per_s']:>9.1f} {r['records_per_s']:>9.0f} "
            f"{ratio:>5} {r['requests_per_txn']:>7.1f} {r['versions_per_txn']:>8.2f} "
            f"{r['failed']:>6} {fairness:>18} {r['p50_ms']:>7.0f} {r['p99_ms']:>8.0f} "
            f"{r['p99_warm_ms']:>8.0f} {r['check']}"
        )
    return "\n".join(lines)


def format_details(r: dict[str, Any]) -> str:
    name = f"W={r['writers']}{' + maintenance' if 'maintenance' in r else ''}"
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in r["requests_per_txn_by_kind"].items() if v)
    check = r["check_detail"]
    lines = [
        f"{name}: {r['commits_total']} commits ({r['commits_in_window']} within the "
        f"{r['seconds']:g} s, last transaction ended {r['overrun_s']:.1f} s after); "
        f"requests/txn: {kinds}",
    ]
    objects = ", ".join(f"{k} {v:.2f}" for k, v in r["requests_per_txn_by_object"].items() if v)
    if objects:
        lines.append(f"  requests/txn by object: {objects}")
    if any(r["group_commit"].values()):
        counts = ", ".join(f"{k} {v}" for k, v in r["group_commit"].items() if v)
        lines.append(f"  group commit (every writer's handle): {counts}")
    if r["failed"]:
        outcomes = ", ".join(f"{v} {k}" for k, v in sorted(r["failed_outcomes"].items()))
        lines.append(f"  failed transactions: {r['failed']} (then {outcomes})")
        lines.extend(f"    {n} x {e}" for e, n in r["errors"].items())
    if r["producer_errors"]:
        lines.append("  producer errors outside transactions:")
        lines.extend(f"    {n} x {e}" for e, n in r["producer_errors"].items())
    lines.append(
        f"  readback {r['check']}: {check['records_read']} records read, "
        f"{check['acknowledged']} acknowledged, {check['aborted_txns']} aborted txns, "
        f"unknown-outcome txns {check['unknown_txns_visible']} visible / "
        f"{check['unknown_txns_invisible']} not"
        + (f"; partitions with an open transaction: {check['open_partitions']}"
           if check["open_partitions"] else "")
    )
    settled = {k: len(v) for k, v in r["settled_after_run"].items() if v}
    if settled:
        lines.append(
            "  recover() after the run finished: "
            + ", ".join(f"{n} {kind}" for kind, n in settled.items())
        )
    problem_kinds = Counter(error_kind(p) for p in check["problems"])
    if len(check["problems"]) > 10:
        lines.extend(f"    ! {n} x {kind}" for kind, n in problem_kinds.most_common())
        lines.append("    first ones:")
    lines.extend(f"    ! {problem}" for problem in check["problems"][:10])
    for error in r["worker_errors"]:
        lines.append("  worker error:\n" + error)
    if "maintenance" in r:
        for op, m in r["maintenance"].items():
            errors = "; ".join(f"{n} x {e}" for e, n in m["errors"].items())
            lines.append(
                f"  {op}: {m['runs']} runs, {m['completed']} completed "
                f"({m['versions_written']} wrote a version), {m['failed']} failed, "
                f"p50 {m['p50_s']:.2f} s, max {m['max_s']:.2f} s"
                + (f" ({errors})" if errors else "")
            )
    return "\n".join(lines)


def format_maintenance_comparison(plain: dict[str, Any], busy: dict[str, Any]) -> str:
    ratio = busy["commits_per_s"] / plain["commits_per_s"] if plain["commits_per_s"] else math.nan
    return (
        f"maintenance next to {busy['writers']} writers: commits/s {busy['commits_per_s']:.1f} "
        f"vs {plain['commits_per_s']:.1f} without ({ratio:.2f}x), failed transactions "
        f"{busy['failed']} vs {plain['failed']}"
    )


# --- backends --------------------------------------------------------------------------------


def start_moto_server() -> tuple[subprocess.Popen[str], str]:
    """bench/moto_server.py in its own process; its endpoint URL."""
    launcher = Path(__file__).with_name("moto_server.py")
    proc = subprocess.Popen(
        [sys.executable, str(launcher)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"moto server did not start (said {endpoint!r})")
    return proc, endpoint


def stop_moto_server(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def moto_backend(endpoint: str) -> Backend:
    """A fresh bucket on the moto server; the warehouse is ``s3://<bucket>/wh``."""
    import boto3

    bucket = f"bench-writers-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_ACCESS_KEY_ID,
        aws_secret_access_key=MOTO_SECRET_ACCESS_KEY,
    )
    client.create_bucket(Bucket=bucket)
    client.close()
    options = {
        S3_ENDPOINT: endpoint,
        S3_REGION: MOTO_REGION,
        S3_ACCESS_KEY_ID: MOTO_ACCESS_KEY_ID,
        S3_SECRET_ACCESS_KEY: MOTO_SECRET_ACCESS_KEY,
        S3_ALLOW_HTTP: "true",
    }
    return Backend("moto", f"s3://{bucket}/wh", options, 0.0)


# --- main ------------------------------------------------------------------------------------


def run_backend(
    backend: Backend, counts: list[int], args: argparse.Namespace, maintenance_writers: int
) -> tuple[list[dict[str, Any]], bool]:
    """Every W on one backend, then the maintenance comparison if asked; print as it goes."""
    print(f"\n== {backend.describe()}: {args.seconds:g} s per W, {PARTITIONS} partitions, "
          f"{RECORDS_PER_TXN} records of {VALUE_BYTES} B per transaction", flush=True)
    rows: list[dict[str, Any]] = []
    baseline: float | None = None

    def one(writers: int, maintenance: bool) -> dict[str, Any]:
        nonlocal baseline
        processes = args.processes or auto_processes(writers)
        label = f"w{writers}{'m' if maintenance else ''}"
        print(f"-- {writers} writers in {min(processes, writers)} process(es)"
              f"{' + maintenance' if maintenance else ''} ...", flush=True)
        run = run_writers(label, writers, processes, backend, args.seconds, args.seed, maintenance)
        row = summarise(run, baseline)
        if writers == 1 and not maintenance:
            baseline = row["commits_per_s"]
            row["ratio_to_w1"] = 1.0
        rows.append(row)
        print(format_details(row), flush=True)
        return row

    for writers in counts:
        one(writers, False)
    if args.solo_rounds:
        compare_solo(backend, args)
    if args.maintenance:
        plain = next(
            (r for r in rows if r["writers"] == maintenance_writers), None
        ) or one(maintenance_writers, False)
        busy = one(maintenance_writers, True)
        print(format_maintenance_comparison(plain, busy))
    print(f"\n{backend.describe()}")
    print(format_table(rows), flush=True)
    return rows, all(r["check"] == "PASS" for r in rows)


def compare_solo(backend: Backend, args: argparse.Namespace) -> None:
    """One writer with group commit on and off, in interleaved rounds: the ratio of medians
    (issue 17: a lone writer must be no slower than before group commit)."""
    off = replace(backend, group_commit=False)
    rates: dict[bool, list[float]] = {True: [], False: []}
    p50s: dict[bool, list[float]] = {True: [], False: []}
    seconds = max(3.0, args.seconds / 2)
    for i in range(args.solo_rounds):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            run = run_writers(f"solo{int(on)}-{i}", 1, 1, backend if on else off, seconds,
                              args.seed + i, False)
            row = summarise(run, None)
            rates[on].append(row["commits_per_s"])
            p50s[on].append(row["p50_ms"])
    on_rate, off_rate = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"\nW=1, {args.solo_rounds} interleaved rounds of {seconds:g} s: commits/s group commit "
          f"on {on_rate:.1f} / off {off_rate:.1f} = {on_rate / off_rate:.2f}x; p50 on "
          f"{statistics.median(p50s[True]):.0f} ms / off {statistics.median(p50s[False]):.0f} ms",
          flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--writers", help=f"comma-separated W (default {DEFAULT_WRITERS})")
    parser.add_argument("--seconds", type=float, help="duration per W (default 20, quick 5)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="local backend latency")
    parser.add_argument("--backend", choices=("local", "moto", "both"), default="local")
    parser.add_argument(
        "--processes", type=int, default=0,
        help=f"worker processes per W (default: one per {WRITERS_PER_PROCESS} writers)",
    )
    parser.add_argument("--maintenance", action="store_true",
                        help=f"also {MAINTENANCE_WRITERS} writers next to optimize/compact")
    parser.add_argument("--quick", action="store_true", help=f"W = {QUICK_WRITERS}, 5 s")
    parser.add_argument("--json", help="write every number to this file")
    parser.add_argument("--dir", help="directory of the local warehouse (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the local warehouse")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--no-group-commit", action="store_true",
                        help="every commit races alone (the behaviour before group commit)")
    parser.add_argument("--solo-rounds", type=int, default=0,
                        help="also compare one writer with group commit on and off, in this "
                             "many interleaved rounds")
    args = parser.parse_args(argv)
    if args.writers is None:
        args.writers = QUICK_WRITERS if args.quick else DEFAULT_WRITERS
    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 20.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(w) for w in args.writers.split(",")]
    # Quick runs compare maintenance next to as many writers as they run at most.
    maintenance_writers = max(counts) if args.quick else MAINTENANCE_WRITERS
    report: dict[str, Any] = {"args": vars(args), "started": time.time(), "backends": {}}
    passed = True
    if args.backend in ("local", "both"):
        root = args.dir or tempfile.mkdtemp(prefix="txntable-writers-")
        backend = Backend("local", str(Path(root) / f"wh-{uuid.uuid4().hex[:8]}"), {},
                          args.latency_ms, not args.no_group_commit)
        try:
            rows, ok = run_backend(backend, counts, args, maintenance_writers)
            report["backends"]["local"] = rows
            passed = passed and ok
        finally:
            if not args.keep:
                shutil.rmtree(backend.url, ignore_errors=True)
                if args.dir is None:
                    shutil.rmtree(root, ignore_errors=True)
    if args.backend in ("moto", "both"):
        proc, endpoint = start_moto_server()
        try:
            moto = replace(moto_backend(endpoint), group_commit=not args.no_group_commit)
            rows, ok = run_backend(moto, counts, args, maintenance_writers)
            report["backends"]["moto"] = rows
            passed = passed and ok
        finally:
            stop_moto_server(proc)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print(f"\nexactly-once check: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
