"""PySpark data source ``txntable``: batch and streaming reads and writes of txntable tables.

Usage::

    import txntable_spark
    txntable_spark.register(spark)
    df = spark.read.format("txntable").load("s3://bucket/lake/orders")

See :mod:`txntable_spark.options` for the options and :mod:`txntable_spark.schema` for the
columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .source import FORMAT_NAME, TxnTableDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT_NAME", "TxnTableDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``txntable`` data source with ``spark`` (idempotent)."""
    spark.dataSource.register(TxnTableDataSource)
