"""Exactly-once consume-transform-produce, with the worker killed (SIGKILL) again and again.

The driver creates a local-disk warehouse with table ``in`` (3 partitions, pre-filled with
``--records`` records) and tables ``out_a`` and ``out_b``; then it runs the worker as a
subprocess, kills it with SIGKILL after a random time, and restarts it, until a worker
finishes on its own. Finally it reads ``out_a`` and ``out_b`` read_committed and checks
that every input record appears exactly once across them (even values in ``out_a``, odd
ones in ``out_b``); the exit code is 0 only if so.

The worker reads ``in`` as member of group ``ctp`` and processes small transactions: for
each poll it writes the records to ``out_a``/``out_b`` and adds the consumed offsets to
the same transaction (``send_offsets_to_transaction``). A restarted worker calls
``init_transactions()``, which fences the killed instance and aborts (or, if it was
already decided, completes) its open transaction, and resumes from the group's committed
offsets, so nothing is lost and nothing is written twice.

Usage::

    python examples/consume_transform_produce.py [--records N] [--warehouse DIR]
        [--seed S] [--max-kills K] [--batch B]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import UnstableOffsetCommitError
from txntable.structs import OffsetAndMetadata

INPUT, OUT_EVEN, OUT_ODD = "in", "out_a", "out_b"
PARTITIONS = 3
GROUP = "ctp"
TRANSACTIONAL_ID = "ctp-worker"


# --- the worker ------------------------------------------------------------------------------


def worker(url: str, batch: int) -> int:
    """Process ``in`` to ``out_a``/``out_b`` until every input record is done."""
    wh = Warehouse(url)
    producer = Producer(wh, transactional_id=TRANSACTIONAL_ID, transaction_timeout_ms=30_000)
    # Fences a killed predecessor and finishes its transaction (abort, or roll forward).
    producer.init_transactions()
    print("ready", flush=True)  # the driver's cue: kills from now on hit real work
    consumer = Consumer(
        wh,
        isolation_level="read_committed",
        group_id=GROUP,
        auto_offset_reset="earliest",
        unstable_offset_timeout_ms=10_000,
        enable_auto_commit=False,  # the offsets commit with the transactions, never alone
    )
    tps = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    ends = consumer.end_offsets(tps)
    processed = 0
    while True:
        got = consumer.poll(max_records=batch, timeout_ms=100)
        if not got:
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            continue
        producer.begin_transaction()
        offsets = {}
        for tp, records in got.items():
            for r in records:
                assert r.value is not None
                out = OUT_EVEN if int(r.value) % 2 == 0 else OUT_ODD
                producer.send(out, value=r.value, key=r.key, partition=tp.partition)
            offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, f"pid {os.getpid()}")
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
        processed += sum(len(rs) for rs in got.values())
    producer.close()
    print(f"worker {os.getpid()}: done, processed {processed} records", flush=True)
    return 0


# --- the driver ------------------------------------------------------------------------------


def committed_progress(wh: Warehouse) -> str:
    consumer = Consumer(wh, group_id=GROUP)
    total = 0
    for p in range(PARTITIONS):
        try:
            om = consumer.committed(TopicPartition(INPUT, p))
        except UnstableOffsetCommitError:
            return "a transactional offset commit is pending (unstable)"
        total += om.offset if om else 0
    return f"{total} input records committed"


def read_committed(wh: Warehouse, tables: list[str], level: str = "read_committed") -> list[bytes]:
    consumer = Consumer(wh, isolation_level=level, auto_offset_reset="earliest")
    tps = [TopicPartition(t, p) for t in tables for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    out: list[bytes] = []
    while True:
        got = consumer.poll(max_records=100_000)
        if not got:
            return out
        out.extend(r.value for rs in got.values() for r in rs if r.value is not None)


def run_workers(url: str, args: argparse.Namespace, rng: random.Random) -> bool:
    """Start, kill and restart the worker until one finishes; False if a worker failed.

    Most kills come a random time after the worker reported ``ready`` (its
    ``init_transactions`` is done), so they land in the middle of transactions; one in
    five comes at a random time from the start, possibly during the recovery itself.
    """
    kills = 0
    wh = Warehouse(url)
    command = [sys.executable, os.path.abspath(__file__), "--worker", url]
    command += ["--batch", str(args.batch)]
    while True:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        started = time.monotonic()
        if kills < args.max_kills:
            early = rng.random() < 0.2
            if not early:
                proc.stdout.readline()  # "ready" (or "" if it died)
            delay = rng.uniform(args.min_delay, args.max_delay)
            try:
                rc = proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                proc.stdout.close()
                kills += 1
                when = "after start" if early else "after ready"
                print(
                    f"killed worker {proc.pid} with SIGKILL {delay:.2f}s {when} "
                    f"({committed_progress(wh)})",
                    flush=True,
                )
                continue
        else:
            rc = proc.wait(timeout=args.worker_timeout)
        output = proc.stdout.read()
        proc.stdout.close()
        elapsed = time.monotonic() - started
        if rc != 0:
            print(f"worker {proc.pid} failed with exit code {rc}", file=sys.stderr)
            return False
        print(output.replace("ready\n", ""), end="")
        print(f"worker {proc.pid} finished in {elapsed:.2f}s after {kills} kills", flush=True)
        return True


def verify(wh: Warehouse, records: int) -> bool:
    expected = {b"%06d" % i for i in range(records)}
    outputs = {t: read_committed(wh, [t]) for t in (OUT_EVEN, OUT_ODD)}
    counts = Counter(outputs[OUT_EVEN] + outputs[OUT_ODD])
    missing = expected - set(counts)
    duplicated = {v: n for v, n in counts.items() if n > 1}
    unexpected = set(counts) - expected
    misrouted = [v for v in outputs[OUT_EVEN] if int(v) % 2] + [
        v for v in outputs[OUT_ODD] if int(v) % 2 == 0
    ]
    uncommitted = len(read_committed(wh, [OUT_EVEN, OUT_ODD], "read_uncommitted"))
    print(
        f"read_committed: {sum(counts.values())} records in {OUT_EVEN}+{OUT_ODD} for "
        f"{records} inputs; read_uncommitted: {uncommitted} (the difference is aborted "
        "work of killed workers)"
    )
    offsets_ok = True
    consumer = Consumer(wh, group_id=GROUP)
    ends = Consumer(wh, isolation_level="read_committed").end_offsets(
        [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
    )
    for tp, end in ends.items():
        om = consumer.committed(tp)
        if om is None or om.offset != end:
            print(f"group {GROUP}: committed offset of {tp} is {om}, expected {end}")
            offsets_ok = False
    for name in (OUT_EVEN, OUT_ODD):
        for p in wh.table(name).describe().partitions:
            if p.open_transactions or p.last_stable_offset != p.high_watermark:
                print(f"{name}[{p.partition}] still has open transactions: {p}")
                offsets_ok = False
    ok = not (missing or duplicated or unexpected or misrouted) and offsets_ok
    if ok:
        print(f"OK: every one of the {records} input records appears exactly once")
    else:
        print(
            f"FAILED: {len(missing)} missing, {len(duplicated)} duplicated, "
            f"{len(unexpected)} unexpected, {len(misrouted)} misrouted records"
        )
    return ok


def driver(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    if args.warehouse:
        root = Path(args.warehouse).resolve()
        shutil.rmtree(root, ignore_errors=True)
        cleanup = None
    else:
        cleanup = tempfile.mkdtemp(prefix="ctp-")
        root = Path(cleanup) / "lake"
    try:
        wh = Warehouse(root.as_uri())
        for name in (INPUT, OUT_EVEN, OUT_ODD):
            wh.create_table(name, partitions=PARTITIONS)
        feeder = Producer(wh)
        for i in range(args.records):
            feeder.send(INPUT, key=b"k%d" % i, value=b"%06d" % i, partition=i % PARTITIONS)
        feeder.close()
        print(f"warehouse {wh.url}: {args.records} records in '{INPUT}'")
        if not run_workers(wh.url, args, rng):
            return 1
        return 0 if verify(wh, args.records) else 1
    finally:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=2000, help="input records")
    parser.add_argument("--batch", type=int, default=50, help="records per transaction")
    parser.add_argument("--warehouse", help="warehouse directory (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kill delays")
    parser.add_argument("--max-kills", type=int, default=6, help="kills before letting it run")
    parser.add_argument("--min-delay", type=float, default=0.05, help="seconds before a kill")
    parser.add_argument("--max-delay", type=float, default=1.5, help="seconds before a kill")
    parser.add_argument("--worker-timeout", type=float, default=300.0)
    parser.add_argument("--worker", metavar="WAREHOUSE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.batch)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
