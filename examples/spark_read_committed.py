"""Produce transactionally, abort some transactions, then count records per key with Spark.

Run: ``python examples/spark_read_committed.py`` (needs Java 17 and pyspark). The warehouse
lives in a temporary directory and is deleted at the end.

Spark reads with ``isolation.level=read_committed`` (the default): records of aborted
transactions and of the still-open transaction are not counted; read_uncommitted counts
them all.
"""

from __future__ import annotations

import os
import sys
import tempfile

from txntable import Producer, Warehouse


def build(lake: str) -> dict[str, int]:
    """Write 5 transactions of 12 records (keys k0..k3) and return the committed counts."""
    wh = Warehouse(lake)
    wh.create_table("orders", partitions=3)
    producer = Producer(wh, transactional_id="orders-etl")
    producer.init_transactions()
    committed: dict[str, int] = {}
    for txn in range(5):
        producer.begin_transaction()
        sent: dict[str, int] = {}
        for i in range(12):
            key = f"k{(txn + i) % 4}"
            producer.send("orders", key=key.encode(), value=f"order-{txn}-{i}".encode())
            sent[key] = sent.get(key, 0) + 1
        producer.flush()  # the records reach the table log before the outcome is decided
        if txn in (1, 3):
            producer.abort_transaction()
            print(f"transaction {txn}: aborted")
        else:
            producer.commit_transaction()
            for k, n in sent.items():
                committed[k] = committed.get(k, 0) + n
            print(f"transaction {txn}: committed")
    producer.close()
    return committed


def main() -> None:
    """Build the warehouse, read it with Spark, print counts per key."""
    # Spark's Python workers must run this interpreter (a venv's python, typically).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import txntable_spark

    with tempfile.TemporaryDirectory() as tmp:
        lake = os.path.join(tmp, "lake")
        expected = build(lake)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("txntable-example")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        txntable_spark.register(spark)
        try:
            df = spark.read.format("txntable").load(f"{lake}/orders")
            counts = (
                df.groupBy(F.col("key").cast("string").alias("key"))
                .count()
                .orderBy("key")
                .collect()
            )
            print("read_committed count per key:")
            for row in counts:
                print(f"  {row['key']}: {row['count']}")
            got = {row["key"]: row["count"] for row in counts}
            assert got == expected, (got, expected)
            everything = (
                spark.read.format("txntable")
                .option("isolation.level", "read_uncommitted")
                .load(f"{lake}/orders")
                .count()
            )
            print(f"read_committed records: {sum(got.values())}, read_uncommitted: {everything}")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
