"""Seeded random histories: at every version the Iceberg mirror shows exactly read_committed.

The histories of ``test_mirror_histories`` (commits ``C:``, aborts ``A:``, open
transactions ``O:`` holding the LSO back, merges, compactions, retention) published as an
Iceberg mirror and read back with pyiceberg after every step; at the end with DuckDB's
``iceberg_scan`` and Polars' ``scan_iceberg``, every older metadata version (time travel)
with pyiceberg, and a publisher starting from nothing finds nothing to write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import duckdb
import pytest
from mirrorutil import (
    committed,
    duckdb_iceberg_connection,
    read_duckdb_iceberg,
    read_polars_iceberg,
    read_pyiceberg,
)
from test_mirror_histories import check, new_history

from txntable.mirror.iceberg import IcebergPublisher

pytestmark = pytest.mark.slow


def run(tmp: str, seed: int, steps: int, deep: bool, con: duckdb.DuckDBPyConnection) -> None:
    history, path = new_history(tmp, seed)
    table = history.table
    published: dict[int, int] = {}  # metadata version -> txntable version
    for _ in range(steps):
        history.step()
        report = table.publish(["iceberg"]).iceberg
        assert report is not None
        if report.metadata_version is not None:
            published[report.metadata_version] = report.txntable_version
        check(read_pyiceberg(path), committed(table, report.txntable_version),
              f"seed {seed} v{report.txntable_version}")
    latest = table.snapshot().version
    expected = committed(table, latest)
    check(read_duckdb_iceberg(con, path), expected, f"seed {seed} duckdb")
    check(read_polars_iceberg(path), expected, f"seed {seed} polars")
    if deep:
        for metadata_version, version in published.items():
            check(read_pyiceberg(path, metadata_version), committed(table, version),
                  f"seed {seed} pyiceberg at metadata v{metadata_version}")
    # A publisher starting from nothing lists exactly what the incremental one did.
    assert IcebergPublisher(table.store, table.name).publish().metadata_version is None


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return duckdb_iceberg_connection()


@pytest.fixture
def scratch() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield d


@pytest.mark.parametrize("block", range(8))
def test_random_histories_iceberg_mirror_read_committed(
    scratch: str, con: duckdb.DuckDBPyConnection, block: int
) -> None:
    for seed in range(block * 10, block * 10 + 10):
        run(scratch, seed, steps=10, deep=seed % 5 == 0, con=con)
