"""One local SparkSession for the whole test session (starting one costs ~9 s)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the ``txntable`` data source registered."""
    pytest.importorskip("pyspark")
    # Inside a venv, Spark's Python workers must run the same interpreter or they crash.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import txntable_spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("txntable-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    txntable_spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Any) -> str:
    """A fresh local warehouse path."""
    path = tmp_path / "lake"
    path.mkdir()
    return str(path)
