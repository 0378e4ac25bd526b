"""Long-lived tables: cold load, first poll and Spark planning against the number of versions,
before and after ``optimize``, next to delta-rs loading a Delta table with as many versions.

    python bench/long_lived.py                          # 100, 1,000, 10,000, 100,000 versions
    python bench/long_lived.py --versions 100,1000 --rounds 5 --no-spark

For each version count N it builds, on local disk, in the same run:

* a txntable table with N versions of small transactions — each version one transactional
  batch of 10 records on partition 0 of 4 and its COMMIT marker (the short path's shape),
  with checkpoints exactly where the library's writer would put them (``checkpoint_due``);
* a Delta table with N versions, each adding one file, checkpointed at its latest version
  (``DeltaTable.create_checkpoint``).

Writing 100,000 versions through a producer takes hours here, so both logs are generated
directly: txntable versions with the library's own encoder (``encode_actions``) and snapshot
(``TableSnapshot.apply``, which also decides the checkpoints), written as plain files (no
conditional put, no fsync); every batch gets its own segment file (the same small Parquet
bytes, so a first poll and the merge really read files). Delta versions are written as JSON
commit files (protocol, metaData, add); delta-rs only reads the log when loading, so its data
files are not created.

Measured, as medians of interleaved rounds: txntable cold load (``Warehouse.table(t).
snapshot()`` on a fresh handle), first poll (a fresh read_committed consumer's first
``poll``), Spark planning (a fresh ``spark.read...load(path)`` until its number of input
partitions is known, i.e. the driver loads the snapshot and plans), and
``deltalake.DeltaTable(path)``; then ``Table.optimize()`` (which also checkpoints) and the
txntable numbers again; then log cleanup (``maintenance.clean_log``) run with the clock one
retention window (``version.retention.ms`` + 1 day) later, as a week of maintenance would,
reporting how many ``_log`` files it deleted and the load after it. Goals (issue 10):
after optimize, load at 100,000 versions <= 2x load at 100 and <= delta-rs at 100,000;
Spark planning <= 1 s at 100,000. Each version count's tables are deleted once measured
(``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txntable import Consumer, TopicPartition, Warehouse
from txntable.config import VERSION_RETENTION_MS_DEFAULT
from txntable.log.log import Log, checkpoint_due
from txntable.maintenance.maintain import clean_log
from txntable.protocol.actions import (
    Batch,
    CommitInfo,
    Marker,
    encode_actions,
)
from txntable.protocol.records import encode_segment
from txntable.storage import ClockAheadStore
from txntable.structs import ProducerRecord
from txntable.util import now_ms

PARTITIONS = 4
RECORDS = 10
T0 = 1_700_000_000_000


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def build_txntable(root: Path, versions: int) -> float:
    """Generate a table of ``versions`` versions (see the module doc); return seconds."""
    start = time.perf_counter()
    segment = encode_segment(
        [ProducerRecord(f"k{i}".encode(), f"v{i}".encode(), (), T0 + i) for i in range(RECORDS)]
    )
    wh = Warehouse(f"file://{root}")
    wh.create_table("t", partitions=PARTITIONS)
    log = Log(wh.store, "t")
    snap = log.load()
    offsets = [0] * PARTITIONS
    for v in range(1, versions + 1):
        p = v % PARTITIONS
        path = f"t/data/{p}/{T0 + v:013d}-{uuid.uuid4().hex}.parquet"
        _write(root / path, segment)
        pid = 1000 + v % 50
        epoch = v // 50
        actions = [
            Batch(p, offsets[p], RECORDS, path, len(segment), pid, epoch, 0, True, T0 + v, T0 + v,
                  f"tid-{pid}"),
            Marker(p, offsets[p] + RECORDS, pid, epoch, "COMMIT", 0, T0 + v),
            CommitInfo(T0 + v, "WRITE", uuid.uuid4().hex, transactionalId=f"tid-{pid}"),
        ]
        offsets[p] += RECORDS + 1
        _write(root / log.version_key(v), encode_actions(actions))
        snap.apply(v, actions)
        entries = sum(len(part.entries) for part in snap.partitions)
        if checkpoint_due(v, log.checkpoint_interval, entries):
            log.write_checkpoint(snap)
    return time.perf_counter() - start


def build_delta(root: Path, versions: int) -> float:
    """Generate a Delta table of ``versions`` commits of one add each, checkpointed at the end."""
    from deltalake import DeltaTable

    start = time.perf_counter()
    log = root / "_delta_log"
    log.mkdir(parents=True)
    schema = {
        "type": "struct",
        "fields": [
            {"name": "key", "type": "binary", "nullable": True, "metadata": {}},
            {"name": "value", "type": "binary", "nullable": True, "metadata": {}},
        ],
    }
    v0 = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": T0,
            }
        },
        {"commitInfo": {"timestamp": T0, "operation": "CREATE TABLE"}},
    ]
    _write(log / f"{0:020d}.json", "\n".join(json.dumps(a) for a in v0).encode() + b"\n")
    for v in range(1, versions + 1):
        add = {
            "add": {
                "path": f"part-{v:08d}-{uuid.uuid4()}.parquet",
                "partitionValues": {},
                "size": 900,
                "modificationTime": T0 + v,
                "dataChange": True,
                "stats": json.dumps({"numRecords": RECORDS}),
            }
        }
        info = {"commitInfo": {"timestamp": T0 + v, "operation": "WRITE"}}
        _write(log / f"{v:020d}.json", (json.dumps(add) + "\n" + json.dumps(info) + "\n").encode())
    DeltaTable(str(root)).create_checkpoint()
    return time.perf_counter() - start


def cold_load(url: str) -> int:
    return Warehouse(url).table("t").snapshot().version


def first_poll(url: str) -> int:
    c = Consumer(Warehouse(url), isolation_level="read_committed", auto_offset_reset="earliest")
    tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
    c.assign(tps)
    got = c.poll(timeout_ms=0, max_records=500)
    c.close()
    return sum(len(v) for v in got.values())


def spark_plan(spark: Any, url: str) -> int:
    return int(spark.read.format("txntable").load(f"{url}/t").rdd.getNumPartitions())


def delta_load(path: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(path).version())


def median_of_rounds(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Interleaved rounds (every function once per round), medians in seconds."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def start_spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import txntable_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    txntable_spark.register(spark)
    return spark


def _ms(r: dict[str, float], key: str) -> str:
    return f"{r[key + '_before'] * 1000:8.1f} -> {r[key + '_after'] * 1000:7.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default="100,1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the tables of each count")
    args = ap.parse_args()
    counts = [int(x) for x in args.versions.split(",")]
    work = Path(args.dir or tempfile.mkdtemp(prefix="txntable-long-lived-"))
    spark = None if args.no_spark else start_spark()
    results: dict[int, dict[str, float]] = {}
    try:
        for n in counts:
            root = work / f"n{n}"
            shutil.rmtree(root, ignore_errors=True)
            url = f"file://{root}/wh"
            built = build_txntable(root / "wh", n)
            delta_built = build_delta(root / "delta", n)
            print(f"# {n} versions: txntable built in {built:.1f} s, delta in {delta_built:.1f} s",
                  flush=True)
            fns: dict[str, Callable[[], object]] = {
                "load": lambda u=url: cold_load(u),
                "poll": lambda u=url: first_poll(u),
                "delta": lambda d=str(root / "delta"): delta_load(d),
            }
            if spark is not None:
                spark_plan(spark, url)  # warm the worker
                fns["spark"] = lambda u=url: spark_plan(spark, u)
            before = median_of_rounds(fns, args.rounds)
            t = time.perf_counter()
            report = Warehouse(url).table("t").optimize()
            opt = time.perf_counter() - t
            after = median_of_rounds({k: v for k, v in fns.items() if k != "delta"}, args.rounds)
            log_files = len(os.listdir(root / "wh" / "t" / "_log"))
            later = now_ms() + VERSION_RETENTION_MS_DEFAULT + 86_400_000
            # A week later on the store's clock too: cleanup measures versions' ages on it.
            aged = ClockAheadStore(Warehouse(url).store, later - now_ms())
            cleaned = clean_log(Warehouse(store=aged).table("t"), now=later)
            cleaned_load = median_of_rounds({"load": fns["load"]}, args.rounds)["load"]
            results[n] = {
                **{f"{k}_before": v for k, v in before.items()},
                **{f"{k}_after": v for k, v in after.items()},
                "optimize": opt,
                "replaced": report.entries_replaced,
                "log_files": log_files,
                "log_deleted": cleaned.versions_deleted + cleaned.checkpoints_deleted,
                "load_cleaned": cleaned_load,
            }
            r = results[n]
            line = f"{n:>7} versions | load {_ms(r, 'load')} | first poll {_ms(r, 'poll')}"
            if "spark_before" in r:
                line += f" | spark plan {_ms(r, 'spark')}"
            line += f" | delta-rs load {r['delta_before'] * 1000:8.1f} ms"
            line += f" | optimize {opt:6.1f} s ({report.entries_replaced} entries)"
            line += (f" | log cleanup a week later: {r['log_deleted']} of {log_files} _log files"
                     f" deleted, load {cleaned_load * 1000:.1f} ms")
            print(line, flush=True)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        lo, hi = min(counts), max(counts)
        if lo != hi:
            a, b = results[lo], results[hi]
            print(f"\nload after optimize, {hi} vs {lo} versions: "
                  f"{b['load_after'] / a['load_after']:.2f}x (goal <= 2)")
            print(f"load after optimize vs delta-rs at {hi}: "
                  f"{b['load_after'] / b['delta_before']:.2f}x (goal <= 1)")
            if "spark_after" in b:
                print(f"spark planning at {hi} after optimize: {b['spark_after']:.3f} s "
                      f"(goal <= 1 s)")
    finally:
        if spark is not None:
            spark.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
