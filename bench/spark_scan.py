"""Spark scan benchmark: the ``txntable`` source vs ``spark.read.parquet`` on the same segments.

Builds a local table of ``--records`` records (default 5M) in segments of
``--segment-records``, every segment its own transaction, ``--abort-fraction`` of them
aborted. Then times, best of ``--runs`` after one warm-up each:

* ``txntable`` read_committed (skips the aborted segments without opening them);
* ``spark.read.parquet`` over exactly the segment files read_committed returns (the
  Parquet reader's cost for the same data: Spark's native, JVM-side reader);
* ``txntable`` read_uncommitted (every segment).

Each query aggregates over key, value, headers and timestamp so every column is read.

Run: ``python bench/spark_scan.py --records 1000000``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa

from txntable.protocol.actions import Batch
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


def timed(label: str, fn: Any, runs: int) -> tuple[float, Any]:
    """Best wall time of ``runs`` runs after one warm-up."""
    result = fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    print(f"{label:<34} {best:7.2f}s  {result}")
    return best, result


def main() -> None:
    """Parse arguments, build the table, run the three scans, print ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--segment-records", type=int, default=20_000)
    ap.add_argument("--abort-every", type=int, default=10, help="abort every Nth segment")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="where to build (default: a temp dir)")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txntable_spark

    root = args.dir or tempfile.mkdtemp(prefix="txntable-bench-")
    lake = os.path.join(root, "lake")
    try:
        build(lake, args.records, args.partitions, args.segment_records, args.abort_every)
        snap = Warehouse(lake).table("bench").snapshot()
        from txntable_spark.options import parse_read_options
        from txntable_spark.planning import plan_scan

        t0 = time.perf_counter()
        groups = plan_scan(snap, parse_read_options({"path": f"{lake}/bench"}))
        plan_s = time.perf_counter() - t0
        visible = [os.path.join(lake, s.path) for g in groups for s in g]
        total = sum(1 for p in snap.partitions for e in p.entries if isinstance(e, Batch))
        print(f"planning: {plan_s * 1000:.1f} ms, {len(visible)}/{total} segments visible")

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

        def committed() -> Any:
            return agg(spark.read.format("txntable").load(f"{lake}/bench"))

        def uncommitted() -> Any:
            df = spark.read.format("txntable").option("isolation.level", "read_uncommitted")
            return agg(df.load(f"{lake}/bench"))

        def parquet() -> Any:
            return agg(spark.read.parquet(*visible))

        # One untimed pass over everything first: the JVM's JIT warms up over the first
        # queries, which would otherwise penalise whichever scan runs first.
        for fn in (uncommitted, parquet, committed):
            fn()
        t_c, r_c = timed("txntable read_committed", committed, args.runs)
        t_p, r_p = timed("spark.read.parquet (same segments)", parquet, args.runs)
        t_u, r_u = timed("txntable read_uncommitted", uncommitted, args.runs)
        assert r_c == r_p, (r_c, r_p)
        n = r_c[0]
        print(f"read_committed throughput: {n / t_c / 1e6:.2f} M records/s")
        print(f"ratio txntable read_committed / parquet:  {t_c / t_p:.2f}x")
        print(
            f"ratio read_committed / read_uncommitted:  {t_c / t_u:.2f}x "
            f"({r_c[0]:,} vs {r_u[0]:,} records)"
        )
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
