"""Typed-table column pruning benchmark: Spark selecting 1 of 10 columns.

Builds a typed table of ``--records`` records (10 columns: ids, doubles, strings, a
timestamp, a flag) with the Python producer (``send_batch``), then, in interleaved rounds
(median of ``--rounds``, after one warm-up of each), times:

* ``txntable`` selecting one column (``option("columns", "c3")``: only that column's
  chunks are read from each segment);
* ``spark.read.parquet`` over the same segment files selecting the same column (Spark's
  native JVM reader, which prunes columns itself);
* ``txntable`` reading every column (the full scan).

Bytes read are the Parquet bytes a reader fetches from each segment: the column chunks of
the columns read plus the footer (from each file's metadata; pyarrow reads exactly those
ranges from a local file). Goals (issue 12): one column ≤ 0.2x the bytes of a full scan,
and ≥ 0.8x as fast as ``spark.read.parquet`` selecting the same column.

Run: ``python bench/typed.py --records 2000000``. Deletes its table when done. Not part of
the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from txntable import Producer, Warehouse

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("customer", pa.string()),
        ("c2", pa.float64()),
        ("c3", pa.float64()),
        ("c4", pa.float64()),
        ("c5", pa.float64()),
        ("region", pa.string()),
        ("qty", pa.int32()),
        ("placed", pa.timestamp("us", tz="UTC")),
        ("flag", pa.bool_()),
    ]
)
COLUMN = "c3"


def chunk(first: int, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` records numbered from ``first``."""
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "customer": pa.array([f"customer-{i % 50_000:08d}" for i in range(first, first + n)]),
            "c2": rng.random(n),
            "c3": rng.random(n),
            "c4": rng.normal(size=n),
            "c5": rng.exponential(size=n),
            "region": pa.array(["eu-west", "us-east", "ap-south", "sa-east"] * (n // 4 + 1))[:n],
            "qty": rng.integers(0, 1000, n, dtype=np.int32),
            "placed": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
            "flag": rng.random(n) < 0.5,
        },
        schema=SCHEMA,
    )


def build(lake: str, records: int, partitions: int, per_call: int) -> None:
    wh = Warehouse(lake)
    wh.create_table("bench", partitions, schema=SCHEMA, key=["id"])
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    with Producer(wh, max_request_size=64 << 20, buffer_memory=512 << 20, linger_ms=0) as p:
        for first in range(0, records, per_call):
            p.send_batch("bench", chunk(first, min(per_call, records - first), rng)).get()
    print(f"built {records:,} records in {time.perf_counter() - t0:.1f}s")


def bytes_read(paths: list[str], columns: list[str] | None) -> int:
    """Parquet bytes fetched to read ``columns`` (all if None) of every file: the chunks of
    those columns plus the footer (its length field and magic included)."""
    total = 0
    for path in paths:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(size - 8)
            footer = struct.unpack("<I", f.read(4))[0] + 8
        meta = pq.ParquetFile(path).metadata
        total += footer
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for c in range(group.num_columns):
                col = group.column(c)
                if columns is None or col.path_in_schema in columns:
                    total += col.total_compressed_size
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--per-call", type=int, default=400_000, help="rows per send_batch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txntable_spark

    root = tempfile.mkdtemp(prefix="typed-bench-", dir="/tmp")
    lake = os.path.join(root, "lake")
    spark = None
    try:
        build(lake, args.records, args.partitions, args.per_call)
        table = Warehouse(lake).table("bench")
        files = [os.path.join(lake, s.path) for s in table.scan().slices]
        full = bytes_read(files, None)
        one = bytes_read(files, [COLUMN])
        print(f"{len(files)} segments, {sum(os.path.getsize(f) for f in files):,} bytes on disk")
        print(f"bytes read, full scan:        {full:>14,}")
        print(f"bytes read, column {COLUMN!r}:    {one:>14,}")
        print(f"ratio one column / full scan: {one / full:.3f}x (goal <= 0.2x)")

        spark = (
            SparkSession.builder.master(args.master)
            .appName("txntable-typed-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        txntable_spark.register(spark)
        path = f"{lake}/bench"

        def agg(df: Any, column: str = COLUMN) -> tuple[int, float]:
            row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(column).alias("s")).collect()[0]
            return int(row["n"]), round(float(row["s"]), 3)

        def txn_one() -> tuple[int, float]:
            return agg(spark.read.format("txntable").option("columns", COLUMN).load(path))

        def parquet_one() -> tuple[int, float]:
            return agg(spark.read.parquet(*files).select(COLUMN))

        def txn_full() -> tuple[int, float]:
            # Every column goes through the source (Spark does not prune a Python source).
            df = spark.read.format("txntable").load(path)
            row = df.agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(COLUMN).alias("s"),
                F.sum(F.length("customer") + F.length("region") + F.col("qty")),
                F.max("placed"),
                F.sum(F.col("c2") + F.col("c4") + F.col("c5") + F.col("id")),
                F.sum(F.col("flag").cast("int")),
            ).collect()[0]
            return int(row["n"]), round(float(row["s"]), 3)

        cases: dict[str, Callable[[], tuple[int, float]]] = {
            "txntable, 1 column": txn_one,
            "spark.read.parquet, 1 column": parquet_one,
            "txntable, all 10 columns": txn_full,
        }
        results = {name: fn() for name, fn in cases.items()}  # warm-up (JIT, workers)
        assert len(set(results.values())) == 1, results
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):  # interleaved, so load changes hit every case alike
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        for name, t in med.items():
            print(f"{name:<30} median {t:6.2f}s  ({', '.join(f'{x:.2f}' for x in times[name])})")
        speed = med["spark.read.parquet, 1 column"] / med["txntable, 1 column"]
        print(f"speed txntable / spark.read.parquet (1 column): {speed:.2f}x (goal >= 0.8x)")
        print(
            "speed 1 column / full scan (txntable): "
            f"{med['txntable, all 10 columns'] / med['txntable, 1 column']:.2f}x"
        )
        print(f"load average: {os.getloadavg()}")
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
