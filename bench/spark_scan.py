"""Spark scan benchmark: the ``txntable`` source vs ``spark.read.parquet`` on the same segments.

Builds, for each of ``--sizes`` (``RECORDS:SEGMENT_RECORDS``), a local table of that many
records in segments of that many records, every segment its own transaction, every
``--abort-every``-th one aborted. Then, in interleaved rounds (medians of ``--rounds``, after
one warm-up pass over every case), times per size:

* ``txntable`` read_committed (skips the aborted segments without opening them);
* ``spark.read.parquet`` over exactly the segment files read_committed returns (the
  Parquet reader's cost for the same data: Spark's native, JVM-side reader);
* with ``--uncommitted``, ``txntable`` read_uncommitted (every segment).

Each query aggregates over key, value, headers and timestamp so every column is read. It
prints both readers' input partition counts and the throughput ratio (> 1: txntable is
faster).

Run: ``python bench/spark_scan.py [--sizes 100000:2000,1000000:5000] [--rounds 3]``. Not part
of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa

from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.records import SEGMENT_SCHEMA
from txntable.warehouse import Warehouse
from txntable_spark.writer import encode_table

PAD = b"x" * 90


def segment(first: int, n: int) -> pa.Table:
    """``n`` records numbered from ``first``: 8-byte keys, ~100-byte values, one header."""
    ids = range(first, first + n)
    return pa.table(
        {
            "key": pa.array([b"k%07d" % (i % 1000) for i in ids], pa.binary()),
            "value": pa.array([b"%010d" % i + PAD for i in ids], pa.binary()),
            "headers": pa.array(
                [[{"key": "src", "value": b"bench"}]] * n, SEGMENT_SCHEMA.field("headers").type
            ),
            "timestamp": pa.array(
                [1_700_000_000_000 + i for i in ids], SEGMENT_SCHEMA.field("timestamp").type
            ),
        },
        schema=SEGMENT_SCHEMA,
    )


def build(lake: str, records: int, partitions: int, seg_records: int, abort_every: int) -> None:
    """Write the table: one round = one transactional segment per partition + its marker."""
    wh = Warehouse(lake)
    table = wh.create_table("bench", partitions=partitions)
    pid = 0
    written = 0
    rnd = 0
    t0 = time.perf_counter()
    while written < records:
        batches, markers = [], []
        for p in range(partitions):
            n = min(seg_records, records - written)
            if n <= 0:
                break
            data = encode_table(segment(written, n))
            path = table.segment_key(p, f"{uuid.uuid4().hex}.parquet")
            table.store.put(path, data)
            batches.append(PendingBatch(p, path, n, len(data), pid, 0, 0, True))
            aborted = abort_every > 0 and (rnd * partitions + p) % abort_every == abort_every - 1
            markers.append(PendingMarker(p, pid, 0, "ABORT" if aborted else "COMMIT"))
            pid += 1
            written += n
        table.append(batches, markers)
        rnd += 1
    print(f"built {written:,} records in {pid} segments in {time.perf_counter() - t0:.1f}s")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``RECORDS:SEGMENT_RECORDS,...`` -> [(records, segment records), ...]."""
    out = []
    for item in text.split(","):
        records, _, seg = item.partition(":")
        out.append((int(records), int(seg or 20_000)))
    return out


def main() -> None:
    """Parse arguments, build the tables, run the scans interleaved, print ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--sizes",
        default="100000:2000,1000000:5000,5000000:20000",
        help="tables to read, RECORDS:SEGMENT_RECORDS, comma-separated",
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--abort-every", type=int, default=10, help="abort every Nth segment")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uncommitted", action="store_true", help="also read_uncommitted")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="where to build (default: a temp dir)")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txntable_spark
    from txntable_spark.options import parse_read_options
    from txntable_spark.planning import plan_scan

    root = args.dir or tempfile.mkdtemp(prefix="txntable-bench-")
    try:
        spark = (
            SparkSession.builder.master(args.master)
            .appName("txntable-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "4g")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        txntable_spark.register(spark)

        def agg(df: Any) -> Any:
            row = df.agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.length("key") + F.length("value") + F.size("headers")).alias("bytes"),
                F.max("timestamp").alias("ts"),
            ).collect()[0]
            return (row["n"], row["bytes"])

        cases: dict[str, Any] = {}
        pairs: list[tuple[str, str]] = []
        for records, seg in parse_sizes(args.sizes):
            lake = os.path.join(root, f"lake-{records}-{seg}")
            if not os.path.isdir(os.path.join(lake, "bench")):
                build(lake, records, args.partitions, seg, args.abort_every)
            table = f"{lake}/bench"
            snap = Warehouse(lake).table("bench").snapshot()
            groups = plan_scan(snap, parse_read_options({"path": table}))
            visible = [os.path.join(lake, s.path) for g in groups for s in g]
            mb = sum(os.path.getsize(p) for p in visible) / 1e6
            native = spark.read.parquet(*visible).rdd.getNumPartitions()
            label = f"{records:,}/{seg:,}"
            print(f"{label}: {len(visible)} segments visible, {mb:.0f} MB; input partitions: "
                  f"txntable {len(groups)}, spark.read.parquet {native}")  # fmt: skip
            cases[f"txntable {label}"] = lambda t=table: agg(spark.read.format("txntable").load(t))
            cases[f"parquet {label}"] = lambda v=visible: agg(spark.read.parquet(*v))
            pairs.append((f"txntable {label}", f"parquet {label}"))
            if args.uncommitted:
                cases[f"read_uncommitted {label}"] = lambda t=table: agg(
                    spark.read.format("txntable").option("isolation.level", "read_uncommitted")
                    .load(t)
                )  # fmt: skip

        # One untimed pass over everything first: the JVM's JIT warms up over the first
        # queries, which would otherwise penalise whichever scan runs first.
        results = {name: fn() for name, fn in cases.items()}
        for a, b in pairs:
            assert results[a] == results[b], (a, results[a], results[b])
        times: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.rounds):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: " + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in cases),
                  flush=True)  # fmt: skip
        median = {n: statistics.median(t) for n, t in times.items()}
        print(f"\nmedian of {args.rounds} interleaved rounds ({args.master}); load average "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        for a, b in pairs:
            print(f"{a:<30} {median[a]:6.2f}s  {b:<30} {median[b]:6.2f}s  "
                  f"throughput ratio {median[b] / median[a]:.2f}x")  # fmt: skip
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
