"""The Delta mirror's publisher: racing publishers, checkpoints and their hint, vacuum next
to pinned mirror readers, foreign commits, typed tables and the background publish."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from mirrorutil import (
    committed,
    comparable,
    duckdb_connection,
    read_deltalake,
    read_duckdb,
    write_batch,
)

from txntable import Warehouse
from txntable.errors import MirrorConflictError, MirrorUnsupportedError, StorageError
from txntable.mirror.publisher import (
    CHECKPOINT_INTERVAL,
    MirrorPublisher,
    delta_checkpoint_key,
    delta_version_key,
    last_checkpoint_key,
    load_state,
)
from txntable.protocol.append import PendingBatch
from txntable.protocol.mirror import app_id
from txntable.storage import StoreWrapper
from txntable.storage.base import Store
from txntable.table import Table
from txntable.util import now_ms

HOUR = 3_600_000


def lake(tmp_path: Path) -> Warehouse:
    return Warehouse(f"file://{tmp_path}/lake", group_commit=False)


def delta_log(tmp_path: Path, name: str) -> list[list[dict]]:
    """Every Delta commit of the mirror, decoded, from version 0 on."""
    out = []
    d = tmp_path / "lake" / name / "_delta_log"
    v = 0
    while (d / f"{v:020d}.json").exists():
        out.append([json.loads(x) for x in (d / f"{v:020d}.json").read_text().splitlines()])
        v += 1
    return out


def txn_versions(commits: list[list[dict]]) -> list[int]:
    return [a["txn"]["version"] for c in commits for a in c if "txn" in a]


def test_publish_lists_committed_files_with_stats_and_relative_hive_paths(
    tmp_path: Path,
) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2)
    write_batch(table, 1, [b"a", b"b", b"c"])
    report = table.publish()
    assert (report.delta_version, report.added, report.txntable_version) == (0, 1, 1)
    (commit,) = delta_log(tmp_path, "t")
    assert commit[0] == {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    (add,) = [a["add"] for a in commit if "add" in a]
    assert add["path"].startswith("data/partition=1/") and add["partitionValues"] == {
        "partition": "1"
    }
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 3 and stats["nullCount"] == {"timestamp": 0, "offset": 3}
    assert stats["minValues"]["timestamp"] == "1970-01-01T00:00:01.000Z"
    assert stats["maxValues"]["timestamp"] == "1970-01-01T00:00:01.002Z"
    (txn,) = [a["txn"] for a in commit if "txn" in a]
    assert (txn["appId"], txn["version"]) == (app_id(table.snapshot().metadata.tableId), 1)
    assert table.publish().delta_version is None  # nothing new: nothing written


def test_two_racing_publishers_give_one_linear_log(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2)
    publishers = [MirrorPublisher(wh.store, "t") for _ in range(2)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish(p: MirrorPublisher) -> None:
        try:
            while not stop.is_set():
                p.publish()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(p,)) for p in publishers]
    for t in threads:
        t.start()
    for i in range(40):
        write_batch(table, i % 2, [f"v{i}".encode()])
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    final = table.publish()
    commits = delta_log(tmp_path, "t")
    versions = txn_versions(commits)
    assert versions == sorted(set(versions)) and versions[-1] == final.txntable_version
    # A publisher that finds S published already writes nothing.
    assert [p.publish().delta_version for p in publishers] == [None, None]
    assert txn_versions(delta_log(tmp_path, "t")) == versions
    path = str(tmp_path / "lake" / "t")
    got, want = comparable(read_deltalake(path), committed(table, final.txntable_version))
    assert got == want and sum(want.values()) == 40


class FailHint(StoreWrapper):
    """Crashes (an error) on the put of ``_last_checkpoint``: the checkpoint is written,
    its hint is not."""

    def put(self, key: str, data: bytes) -> str:
        if key.endswith("_delta_log/_last_checkpoint"):
            raise StorageError(f"injected failure putting {key}")
        return self.inner.put(key, data)


def test_crash_between_checkpoint_and_its_hint_is_harmless(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    store = wh.store
    publisher = MirrorPublisher(store, "t")
    for i in range(CHECKPOINT_INTERVAL + 1):
        write_batch(table, 0, [f"v{i}".encode()])
        publisher.publish()
    assert store.exists(last_checkpoint_key("t"))
    hint = json.loads(store.get(last_checkpoint_key("t")).data)
    assert hint["version"] == CHECKPOINT_INTERVAL
    failing = MirrorPublisher(FailHint(store), "t")
    for i in range(CHECKPOINT_INTERVAL):
        write_batch(table, 0, [f"w{i}".encode()])
        report = failing.publish()
    assert report.delta_version == 2 * CHECKPOINT_INTERVAL and not report.checkpoint
    assert store.exists(delta_checkpoint_key("t", 2 * CHECKPOINT_INTERVAL))
    assert json.loads(store.get(last_checkpoint_key("t")).data) == hint  # stale hint
    path = str(tmp_path / "lake" / "t")
    expected = committed(table, table.snapshot().version)
    for got in (read_deltalake(path), read_duckdb(duckdb_connection(), path)):
        assert comparable(got, expected)[0] == comparable(got, expected)[1]
    # A cold publisher follows the stale hint and replays the tail: same state.
    cold = load_state(store, "t", table.snapshot().metadata.tableId)
    assert cold.version == 2 * CHECKPOINT_INTERVAL and set(cold.files) == set(
        failing.state().files
    )
    write_batch(table, 0, [b"after"])
    assert MirrorPublisher(store, "t").publish().delta_version == 2 * CHECKPOINT_INTERVAL + 1


def test_vacuum_keeps_files_a_pinned_mirror_reader_may_read(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1, configuration={"version.retention.ms": HOUR})
    for i in range(4):
        write_batch(table, 0, [f"v{i}".encode()])
    start = now_ms()
    # The mirror lags: it removes the merged-away files an hour and a half from now.
    publisher = MirrorPublisher(wh.store, "t", clock=lambda: start + 90 * 60_000)
    publisher.publish()
    table.optimize()
    report = publisher.publish()
    assert (report.delta_version, report.removed, report.added) == (1, 4, 1)
    path = str(tmp_path / "lake" / "t")
    pinned = DeltaTable(path, version=0)
    # Two hours from now txntable alone would delete the four files: no version inside
    # the window references them, and they are older than the period.
    two_hours = start + 2 * HOUR
    kept = table.vacuum(retention_ms=HOUR, dry_run=True)
    assert not kept.deleted
    from txntable.maintenance.vacuum import vacuum
    from txntable.storage.wrappers import ClockAheadStore

    def later(ms: int) -> Table:
        # Vacuum trusts the store's clock, not its own: move the store's.
        return Warehouse(store=ClockAheadStore(wh.store, ms)).table("t")

    assert vacuum(later(2 * HOUR), HOUR, now=two_hours).deleted == []
    assert sorted(pinned.to_pyarrow_table()["value"].to_pylist()) == [b"v0", b"v1", b"v2", b"v3"]
    # Once the mirror's removal is older than the period, they go.
    gone = vacuum(later(4 * HOUR), HOUR, now=start + 4 * HOUR)
    assert len(gone.deleted) == 4
    assert sorted(DeltaTable(path).to_pyarrow_table()["value"].to_pylist()) == [
        b"v0", b"v1", b"v2", b"v3"
    ]


def test_a_foreign_commit_is_refused(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    table.publish()
    foreign = {"commitInfo": {"timestamp": 1, "operation": "WRITE"}}
    wh.store.put_if_absent(delta_version_key("t", 1), (json.dumps(foreign) + "\n").encode())
    write_batch(table, 0, [b"b"])
    with pytest.raises(MirrorConflictError, match="foreign writer"):
        Warehouse(f"file://{tmp_path}/lake").table("t").publish()
    with pytest.raises(MirrorConflictError):
        table.vacuum(retention_ms=HOUR)  # what the mirror lists is unknown: delete nothing


def test_a_delta_table_of_another_table_is_refused(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    other = wh.create_table("u", partitions=1)
    write_batch(other, 0, [b"b"])
    other.publish()
    os.rename(tmp_path / "lake" / "u" / "_delta_log", tmp_path / "lake" / "t" / "_delta_log")
    with pytest.raises(MirrorConflictError):
        table.publish()


def test_rebuild_from_scratch_equals_the_incremental_mirror(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2)
    for i in range(12):
        write_batch(table, i % 2, [f"v{i}".encode()] * (1 + i % 3))
        table.publish()
        if i == 6:
            table.optimize()
            table.delete_records({1: table.snapshot().partitions[1].entries[0].next_offset})
    incremental = MirrorPublisher(wh.store, "t").state()
    os.rename(tmp_path / "lake" / "t" / "_delta_log", tmp_path / "old_delta_log")
    Warehouse(f"file://{tmp_path}/lake").table("t").publish()
    rebuilt = MirrorPublisher(wh.store, "t").state()
    assert rebuilt.files == incremental.files
    assert rebuilt.txn_version == incremental.txn_version


def test_a_typed_table_is_mirrored_with_its_columns(tmp_path: Path) -> None:
    from txntable import Producer

    wh = lake(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    wh.create_table("typed", partitions=2, schema=schema, key="id")
    with Producer(wh, transactional_id="tx") as producer:
        producer.init_transactions()
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            for i in range(5):
                producer.send("typed", value={"id": i, "name": f"{outcome}-{i}"})
            producer.flush()
            getattr(producer, f"{outcome}_transaction")()
    table = wh.table("typed")
    table.publish()
    path = str(tmp_path / "lake" / "typed")
    dt = DeltaTable(path)
    names = [f.name for f in dt.schema().fields]
    assert names == ["id", "name", "partition", "offset", "timestamp"]
    got = sorted(dt.to_pyarrow_table()["name"].to_pylist())
    assert got == sorted([f"commit-{i}" for i in range(5)] * 2)
    assert got == sorted(table.scan().to_arrow()["name"].to_pylist())


def test_a_naive_timestamp_column_cannot_be_mirrored(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("n", schema=pa.schema([("at", pa.timestamp("us"))]))
    with pytest.raises(MirrorUnsupportedError, match="timestampNtz"):
        table.publish()


def test_writers_publish_in_the_background_after_commits(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table(
        "t", partitions=1, configuration={"mirror.delta": "true", "mirror.interval.ms": 50}
    )
    for i in range(5):
        write_batch(table, 0, [f"v{i}".encode()])
    deadline = time.monotonic() + 30
    path = tmp_path / "lake" / "t" / "_delta_log"
    while time.monotonic() < deadline:
        table.wait_for_mirror(timeout=5)
        if txn_versions(delta_log(tmp_path, "t"))[-1:] == [5]:
            break
        time.sleep(0.05)
    assert path.exists() and txn_versions(delta_log(tmp_path, "t"))[-1] == 5
    got, want = comparable(read_deltalake(str(tmp_path / "lake" / "t")), committed(table, 5))
    assert got == want


def test_no_background_publish_without_the_key(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    assert table._auto_publisher is None
    assert not (tmp_path / "lake" / "t" / "_delta_log").exists()


def test_a_segment_outside_the_table_directory_is_refused(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table: Table = wh.create_table("t", partitions=1)
    store: Store = wh.store
    store.put_data_file("elsewhere/x.parquet", b"PAR1")
    table.append([PendingBatch(0, "elsewhere/x.parquet", 1, 4)])
    with pytest.raises(MirrorUnsupportedError, match="relative paths"):
        table.publish()


def test_cli_publish(tmp_path: Path) -> None:
    from txntable.cli import main

    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    url = f"file://{tmp_path}/lake"
    assert main(["publish", url, "t", "--json"]) == 0
    assert txn_versions(delta_log(tmp_path, "t")) == [1]
    assert main(["publish", url, "t"]) == 0  # up to date: writes nothing
    assert len(delta_log(tmp_path, "t")) == 1
