"""A Spark driver running one streaming copy between two txntable tables (for the tests
that kill a driver or start it elsewhere).

    python stream_mirror.py SOURCE_URL TARGET_URL CHECKPOINT [MAX_OFFSETS_PER_TRIGGER]

Runs from the caller's working directory, so a relative ``CHECKPOINT`` is resolved as Spark
resolves it for a user. Reads ``SOURCE_URL`` from the earliest offset with
``trigger(availableNow=True)`` and exits 0 when it has copied everything; the caller may
SIGKILL its process group at any moment instead.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    source, target, checkpoint = sys.argv[1:4]
    max_offsets = sys.argv[4] if len(sys.argv) > 4 else "1000000"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import txntable_spark

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("txntable-stream-mirror")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    txntable_spark.register(spark)
    query = (
        spark.readStream.format("txntable")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .load(source)
        .select("key", "value")
        .writeStream.format("txntable")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    print("started", query.id, flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main()
