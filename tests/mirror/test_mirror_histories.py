"""Seeded random histories: at every version the Delta mirror shows exactly read_committed.

Each history writes 1-4 partitions with plain batches, transactions that commit (values
``C:``), abort (``A:``, about 30%) or stay open (``O:``, holding the LSO back while later
data piles up above it), merges, compactions and retention (``delete_records`` at entry
boundaries). After every step the table is published and the mirror read back with
delta-rs; at the end with Polars (also time travel to every older mirror version) and
DuckDB. A mirror row is never aborted or open data, and every offset a merged file carries
is the record's offset.
"""

from __future__ import annotations

import os
import random
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator

import duckdb
import pytest
from mirrorutil import (
    committed,
    comparable,
    duckdb_connection,
    read_deltalake,
    read_duckdb,
    read_polars,
)

from txntable import Warehouse
from txntable.layout import new_segment_name
from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.records import encode_segment
from txntable.structs import ProducerRecord
from txntable.table import Table

pytestmark = pytest.mark.slow


class History:
    """Drives one table with hand-made producers (one fresh producer id per transaction)."""

    def __init__(self, table: Table, rng: random.Random) -> None:
        self.table = table
        self.rng = rng
        self.n = 0
        self.next_pid = 0
        #: pid -> (outcome prefix, partition -> next sequence)
        self.open: dict[int, tuple[str, dict[int, int]]] = {}

    def _segment(self, partition: int, prefix: str, count: int) -> tuple[str, int, int]:
        records = []
        for _ in range(count):
            key = f"k{self.rng.randrange(6)}".encode()
            records.append(ProducerRecord(key, f"{prefix}:{self.n}".encode(), (), 1_000 + self.n))
            self.n += 1
        data = encode_segment(records)
        path = self.table.segment_key(partition, new_segment_name())
        self.table.store.put_data_file(path, data)
        return path, len(data), records[0].timestamp

    def plain(self, partition: int) -> None:
        count = self.rng.randint(1, 4)
        path, size, ts = self._segment(partition, "C", count)
        self.table.append([PendingBatch(partition, path, count, size, min_timestamp=ts,
                                        max_timestamp=ts + count - 1)])

    def begin(self) -> None:
        outcome = self.rng.choices(["C", "A", "O"], [5, 3, 1])[0]
        self.open[self.next_pid] = (outcome, {})
        self.next_pid += 1

    def write(self, pid: int, partition: int) -> None:
        outcome, seqs = self.open[pid]
        count = self.rng.randint(1, 3)
        path, size, ts = self._segment(partition, outcome, count)
        seq = seqs.get(partition, 0)
        seqs[partition] = seq + count
        batch = PendingBatch(partition, path, count, size, pid, 0, seq, True, ts, ts + count - 1)
        self.table.append([batch])

    def end(self, pid: int) -> None:
        outcome, seqs = self.open.pop(pid)
        kind = "COMMIT" if outcome == "C" else "ABORT"
        self.table.append([], [PendingMarker(p, pid, 0, kind) for p in sorted(seqs)])  # type: ignore[arg-type]

    def delete_to_boundary(self) -> None:
        snap = self.table.snapshot()
        part = self.rng.choice(snap.partitions)
        bounds = [e.baseOffset for e in part.entries if e.baseOffset <= part.last_stable_offset]
        if bounds:
            self.table.delete_records({part.partition: self.rng.choice(bounds)})

    def step(self) -> None:
        partitions = self.table.num_partitions
        choice = self.rng.random()
        endable = [pid for pid, (o, _) in self.open.items() if o != "O"]
        if choice < 0.3:
            self.plain(self.rng.randrange(partitions))
        elif choice < 0.45 or not self.open:
            self.begin()
            self.write(self.next_pid - 1, self.rng.randrange(partitions))
        elif choice < 0.7:
            self.write(self.rng.choice(list(self.open)), self.rng.randrange(partitions))
        elif choice < 0.88 and endable:
            self.end(self.rng.choice(endable))
        elif choice < 0.93:
            self.table.optimize(target_bytes=self.rng.choice([1, 3000, 1 << 20]))
        elif choice < 0.96:
            self.table.compact()
        else:
            self.delete_to_boundary()


def check(mirror: Counter, expected: Counter, where: str) -> None:
    got, want = comparable(mirror, expected)
    assert not [r for r in got if r[1][:2] in (b"A:", b"O:")], where
    assert got == want, where


def new_history(tmp: str, seed: int) -> tuple[History, str]:
    """A fresh table for seed ``seed`` under ``tmp`` and its history; the table's path."""
    rng = random.Random(seed)
    wh = Warehouse(f"file://{tmp}/lake-{seed}", group_commit=rng.random() < 0.5)
    name = f"t{uuid.uuid4().hex[:6]}"
    table = wh.create_table(
        name,
        partitions=rng.randint(1, 4),
        # Histories compact and delete records: the table allows both.
        configuration={"cleanup.policy": "compact,delete"},
    )
    return History(table, rng), f"{tmp}/lake-{seed}/{name}"


def run(tmp: str, seed: int, steps: int, deep: bool, con: object) -> None:
    history, path = new_history(tmp, seed)
    table = history.table
    published: dict[int, int] = {}  # Delta version -> txntable version
    for _ in range(steps):
        history.step()
        report = table.publish()
        version = report.txntable_version
        if report.delta_version is not None:
            published[report.delta_version] = version
        if published:
            check(read_deltalake(path), committed(table, version), f"seed {seed} v{version}")
    if not published:
        return
    latest = table.snapshot().version
    expected = committed(table, latest)
    check(read_duckdb(con, path), expected, f"seed {seed} duckdb")  # type: ignore[arg-type]
    check(read_polars(path), expected, f"seed {seed} polars")
    if deep:
        for delta_version, version in published.items():
            check(read_polars(path, delta_version), committed(table, version),
                  f"seed {seed} polars at Delta version {delta_version}")
    # A publisher starting from nothing lists exactly what the incremental one did.
    rebuilt = Warehouse(f"file://{tmp}/lake-{seed}").table(table.name)
    assert rebuilt.publish().delta_version is None


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return duckdb_connection()  # loading the extension takes a second: once


@pytest.fixture
def scratch() -> Iterator[str]:
    """A directory in memory where there is one: the histories fsync every write."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield d


@pytest.mark.parametrize("block", range(10))
def test_random_histories_mirror_read_committed(
    scratch: str, con: duckdb.DuckDBPyConnection, block: int
) -> None:
    for seed in range(block * 20, block * 20 + 20):
        run(scratch, seed, steps=10, deep=seed % 10 == 0, con=con)
