"""Consume benchmark: ``Table.scan`` and ``Consumer.poll`` vs ``pyarrow.dataset`` on the same files.

Builds, with the producer (``send_batch`` when the producer has it, else ``send``), a table of
``--records`` records (16-byte keys, 100-byte values) on ``--partitions`` partitions in
``--txns`` transactions on local disk, and a second one with 30% of the transactions
aborted. Then, in ``--rounds`` interleaved rounds, reports medians and ratios of:

1. ``Table.scan().to_arrow()`` read_committed vs a ``pyarrow.dataset`` scan
   (``to_table()``) of exactly the segment files the scan reads (goal >= 0.8x);
2. ``Consumer.poll()`` of every record (default ``max_poll_records``) vs that dataset scan
   followed by ``.to_pylist()`` (goal >= 0.8x); ``poll_arrow()`` alongside;
3. with 30% of the transactions aborted: read_committed vs read_uncommitted, for the scan
   and for ``poll()`` (goal: read_committed no slower);
4. the same table on the moto S3 server (``ThreadedMotoServer`` on 127.0.0.1, in a child
   process so its request handling does not compete for this process's GIL), reached
   through a store wrapper adding ``--latency-ms`` (20) to every request:
   ``Table.scan().to_arrow()`` vs the same scan on local disk (goal: within 3x), with the
   request counts of one scan.

Ratios are throughput ratios (>1: txntable is faster). The table handle is opened before
timing; every timed scan or consumer reads the newest snapshot (one GET of the next log
version) and then the segments.

Run: ``python bench/consume.py`` (``--records 200000 --rounds 3`` for a quick look;
``--no-s3`` to skip the S3 part, ``--parts s3`` (or ``local``, ``aborted``) to run only
some; ``--dir D --reuse`` to time again the tables a former run with ``--dir D`` built).
Needs the ``dev`` extra (moto) for the S3 part.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.dataset as ds

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.storage import CountingStore, LatencyStore, S3Store
from txntable.table import Table

TABLE = "bench"
KEY_BYTES = 16
VALUE_BYTES = 100


def build(path: str, records: int, partitions: int, txns: int, aborted: set[int]) -> float:
    """Write the table with a transactional producer; return the seconds it took."""
    wh = Warehouse(path)
    wh.create_table(TABLE, partitions=partitions)
    producer = Producer(wh, transactional_id="bench-writer")
    producer.init_transactions()
    per_txn = -(-records // txns)
    bulk = hasattr(producer, "send_batch")
    t0 = time.perf_counter()
    for t in range(txns):
        ids = range(t * per_txn, min(records, (t + 1) * per_txn))
        keys = [b"%016d" % i for i in ids]
        values = [os.urandom(VALUE_BYTES // 2).hex().encode() for _ in ids]
        producer.begin_transaction()
        if bulk:
            producer.send_batch(TABLE, pa.table({"key": keys, "value": values}))
        else:
            for k, v in zip(keys, values, strict=True):
                producer.send(TABLE, key=k, value=v)
        if t in aborted:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
    producer.close()
    return time.perf_counter() - t0


def interleaved(cases: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Run every case once per round, in turn; return each case's median seconds."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    rows: dict[str, int] = {}
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            rows[name] = fn()
            times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, median in medians.items():
        rate = rows[name] / median if median else float("inf")
        print(f"  {name:<52} {median:8.3f} s  {rate / 1e6:6.2f} M rec/s  ({rows[name]} rows)")
    return medians


def ratio(label: str, baseline: float, measured: float, goal: str) -> None:
    """Print ``baseline / measured`` (a throughput ratio) with its goal."""
    print(f"  => {label}: {baseline / measured:.2f}x   (goal {goal})")


def drain(wh: Warehouse, partitions: int, isolation_level: str, arrow: bool = False) -> int:
    """Poll every record of the table from the beginning; return how many."""
    consumer = Consumer(wh, isolation_level=isolation_level, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(TABLE, p) for p in range(partitions)])
    n = 0
    poll: Callable[..., dict[Any, Any]] = consumer.poll_arrow if arrow else consumer.poll
    while batch := poll(0):
        n += sum(len(v) for v in batch.values())
    consumer.close()
    return n


def segment_files(table: Table, root: str) -> list[str]:
    """Local paths of the segments a read_committed scan reads."""
    return [os.path.join(root, s.path) for s in table.scan().slices]


def local_part(root: str, partitions: int, rounds: int) -> float:
    wh = Warehouse(root)
    table = wh.table(TABLE)
    files = segment_files(table, root)
    size = sum(os.path.getsize(f) for f in files)
    print(f"\n[local] {len(files)} segment files, {size / 1e6:.1f} MB")
    medians = interleaved(
        {
            "pyarrow.dataset(files).to_table()": lambda: ds.dataset(files).to_table().num_rows,
            "Table.scan(read_committed).to_arrow()": lambda: table.scan().to_arrow().num_rows,
            "pyarrow.dataset(files).to_table().to_pylist()": lambda: len(
                ds.dataset(files).to_table().to_pylist()
            ),
            "Consumer.poll() read_committed, every record": lambda: drain(
                wh, partitions, "read_committed"
            ),
            "Consumer.poll_arrow() read_committed": lambda: drain(
                wh, partitions, "read_committed", arrow=True
            ),
        },
        rounds,
    )
    ratio(
        "scan.to_arrow() vs dataset",
        medians["pyarrow.dataset(files).to_table()"],
        medians["Table.scan(read_committed).to_arrow()"],
        ">= 0.8x",
    )
    ratio(
        "poll() vs dataset + to_pylist()",
        medians["pyarrow.dataset(files).to_table().to_pylist()"],
        medians["Consumer.poll() read_committed, every record"],
        ">= 0.8x",
    )
    return medians["Table.scan(read_committed).to_arrow()"]


def aborted_part(root: str, partitions: int, rounds: int) -> None:
    wh = Warehouse(root)
    table = wh.table(TABLE)
    rc, ru = table.scan(), table.scan(isolation_level="read_uncommitted")
    print(f"\n[30% aborted] read_committed {rc.count()} rows, read_uncommitted {ru.count()} rows")
    medians = interleaved(
        {
            "Table.scan(read_committed).to_arrow()": lambda: table.scan().to_arrow().num_rows,
            "Table.scan(read_uncommitted).to_arrow()": lambda: table.scan(
                isolation_level="read_uncommitted"
            )
            .to_arrow()
            .num_rows,
            "Consumer.poll() read_committed": lambda: drain(wh, partitions, "read_committed"),
            "Consumer.poll() read_uncommitted": lambda: drain(wh, partitions, "read_uncommitted"),
        },
        rounds,
    )
    ratio(
        "scan read_committed vs read_uncommitted",
        medians["Table.scan(read_uncommitted).to_arrow()"],
        medians["Table.scan(read_committed).to_arrow()"],
        ">= 1x",
    )
    ratio(
        "poll read_committed vs read_uncommitted",
        medians["Consumer.poll() read_uncommitted"],
        medians["Consumer.poll() read_committed"],
        ">= 1x",
    )


MOTO_SERVER = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]))
server.start()
print("ready", flush=True)
sys.stdin.read()  # until the parent closes the pipe
server.stop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_part(root: str, local_scan: float, rounds: int, latency_ms: float) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", MOTO_SERVER, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # one log line per request
        text=True,
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:  # moto prints a banner first
            if line.strip() == "ready":
                break
        endpoint = f"http://127.0.0.1:{port}"
        creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
        client.create_bucket(Bucket="bench")
        uploaded = 0
        for dirpath, _, names in os.walk(os.path.join(root, TABLE)):
            for name in names:
                full = os.path.join(dirpath, name)
                key = "wh/" + os.path.relpath(full, root)
                client.upload_file(full, "bench", key)
                uploaded += 1
        options = {
            "s3.endpoint": endpoint,
            "s3.region": "us-east-1",
            "s3.access-key-id": creds["aws_access_key_id"],
            "s3.secret-access-key": creds["aws_secret_access_key"],
            "s3.allow-http": "true",
        }
        store = CountingStore(LatencyStore(S3Store("s3://bench/wh", options), latency_ms))
        wh = Warehouse(store=store)
        table = wh.table(TABLE)
        local = Warehouse(root).table(TABLE)
        print(f"\n[S3] moto server, {latency_ms:g} ms added per request, {uploaded} objects")
        medians = interleaved(
            {
                "local Table.scan().to_arrow()": lambda: local.scan().to_arrow().num_rows,
                "S3 Table.scan().to_arrow()": lambda: table.scan().to_arrow().num_rows,
            },
            rounds,
        )
        store.reset()
        table.scan().to_arrow()
        counts = {k: v for k, v in store.snapshot().items() if v}
        print(f"  requests of one S3 scan: {counts}")
        s3, here = medians["S3 Table.scan().to_arrow()"], medians["local Table.scan().to_arrow()"]
        above = "" if local_scan != local_scan else (  # NaN: the local part did not run
            f", {s3 / local_scan:.2f}x that of the local part above"
        )
        print(
            f"  => S3 / local: {s3 / here:.2f}x the time of the local scan in these rounds"
            f"{above} (goal <= 3x)"
        )
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--txns", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 part")
    parser.add_argument(
        "--parts", default="local,aborted,s3", help="which parts to run (comma-separated)"
    )
    parser.add_argument("--dir", help="where to build the tables (default: a temp dir)")
    parser.add_argument(
        "--reuse", action="store_true", help="with --dir: read the tables a former run built"
    )
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="txntable-consume-")
    plain, aborted = os.path.join(base, "plain"), os.path.join(base, "aborted")
    try:
        n_aborted = round(args.txns * 0.3)
        every = set(range(0, args.txns, max(1, args.txns // max(n_aborted, 1))))
        aborted_txns = set(sorted(every)[:n_aborted])
        writer = "send_batch" if hasattr(Producer, "send_batch") else "send"
        print(
            f"{args.records} records ({KEY_BYTES} B keys, {VALUE_BYTES} B values), "
            f"{args.partitions} partitions, {args.txns} transactions, written with {writer}()"
        )
        if args.reuse and all(os.path.isdir(os.path.join(p, TABLE)) for p in (plain, aborted)):
            print(f"  reusing the tables in {base}")
        else:
            for path in (plain, aborted):
                shutil.rmtree(path, ignore_errors=True)
            took = build(plain, args.records, args.partitions, args.txns, set())
            print(f"  built in {took:.1f} s")
            took = build(aborted, args.records, args.partitions, args.txns, aborted_txns)
            print(f"  built the 30%-aborted table (aborted {sorted(aborted_txns)}): {took:.1f} s")
        parts = set(args.parts.split(","))
        local_scan = float("nan")
        if "local" in parts:
            local_scan = local_part(plain, args.partitions, args.rounds)
        if "aborted" in parts:
            aborted_part(aborted, args.partitions, args.rounds)
        if "s3" in parts and not args.no_s3:
            s3_part(plain, local_scan, args.rounds, args.latency_ms)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
