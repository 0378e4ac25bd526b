"""The Iceberg mirror's publisher: what a snapshot holds, racing publishers, foreign
snapshots, typed tables, time travel, rebuilds, vacuum next to pinned readers, snapshot
expiry, the background publish and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from mirrorutil import (
    committed,
    comparable,
    duckdb_iceberg_connection,
    iceberg_metadata,
    read_duckdb_iceberg,
    read_polars_iceberg,
    read_pyiceberg,
    read_pyiceberg_snapshot,
    write_batch,
)
from pyiceberg.table import StaticTable

from txntable import Warehouse
from txntable.errors import MirrorConflictError, MirrorDependencyError, MirrorUnsupportedError
from txntable.mirror.iceberg import IcebergPublisher, metadata_key
from txntable.table import Table
from txntable.util import now_ms

HOUR = 3_600_000


def lake(tmp_path: Path) -> Warehouse:
    return Warehouse(f"file://{tmp_path}/lake", group_commit=False)


def publish(table: Table):  # type: ignore[no-untyped-def]
    report = table.publish(["iceberg"]).iceberg
    assert report is not None
    return report


def snapshots(tmp_path: Path, name: str) -> list[dict]:
    """The snapshots of the newest metadata file, oldest first."""
    meta = json.loads(Path(iceberg_metadata(str(tmp_path / "lake" / name))).read_text())
    return sorted(meta["snapshots"], key=lambda s: s["sequence-number"])


def test_a_snapshot_lists_committed_segments_in_place_with_exact_stats(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2)
    write_batch(table, 1, [b"a", b"b", b"c"])
    report = publish(table)
    assert (report.metadata_version, report.added, report.txntable_version) == (1, 1, 1)
    path = str(tmp_path / "lake" / "t")
    meta = json.loads(Path(f"{path}/metadata/v1.metadata.json").read_text())
    assert meta["format-version"] == 2 and meta["location"] == path
    assert meta["table-uuid"] == table.snapshot().metadata.tableId
    assert [f["name"] for f in meta["schemas"][0]["fields"]] == [
        "key", "value", "partition", "offset", "timestamp", "headers"
    ]
    (spec,) = meta["partition-specs"]
    assert [(f["name"], f["transform"]) for f in spec["fields"]] == [("partition", "identity")]
    mapping = json.loads(meta["properties"]["schema.name-mapping.default"])
    assert {m["names"][0] for m in mapping} >= {"key", "value", "timestamp", "headers"}
    (snap,) = meta["snapshots"]
    assert snap["summary"]["operation"] == "append"
    assert snap["summary"]["txntable.table-id"] == table.snapshot().metadata.tableId
    assert snap["summary"]["txntable.version"] == "1"
    assert Path(f"{path}/metadata/version-hint.text").read_text() == "1"
    # The data file is the segment itself, with the log's exact statistics.
    st = StaticTable.from_metadata(f"{path}/metadata/v1.metadata.json")
    (task,) = st.scan().plan_files()
    df = task.file
    segment = table.snapshot().partitions[1].entries[0]
    assert df.file_path == f"{path}/{segment.path[len('t/'):]}"
    assert (df.record_count, df.file_size_in_bytes, df.partition[0]) == (3, segment.size, 1)
    ts = st.schema().find_field("timestamp").field_id
    off = st.schema().find_field("offset").field_id
    assert int.from_bytes(df.lower_bounds[ts], "little") == 1_000_000  # microseconds
    assert int.from_bytes(df.upper_bounds[ts], "little") == 1_002_000
    assert df.null_value_counts[off] == 3  # a batch's file has no offset column
    assert publish(table).metadata_version is None  # nothing new: nothing written


def test_two_racing_publishers_give_one_linear_history(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2)
    publishers = [IcebergPublisher(wh.store, "t") for _ in range(2)]
    stop = threading.Event()
    errors: list[BaseException] = []
    conflicts = [0, 0]

    def run(i: int) -> None:
        try:
            while not stop.is_set():
                conflicts[i] += publishers[i].publish().conflicts
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for i in range(30):
        write_batch(table, i % 2, [f"v{i}".encode()])
    stop.set()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert not errors
    final = publish(table)
    versions = [int(s["summary"]["txntable.version"]) for s in snapshots(tmp_path, "t")]
    assert versions == sorted(set(versions)) and versions[-1] == final.txntable_version
    # Each metadata version's snapshot is the child of the one before: one linear history.
    chain = snapshots(tmp_path, "t")
    for parent, child in zip(chain, chain[1:], strict=False):
        assert child["parent-snapshot-id"] == parent["snapshot-id"]
    assert [p.publish().metadata_version for p in publishers] == [None, None]
    path = str(tmp_path / "lake" / "t")
    got, want = comparable(read_pyiceberg(path), committed(table, final.txntable_version))
    assert got == want and sum(want.values()) == 30


def test_a_foreign_snapshot_is_refused(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    publish(table)
    # Another writer commits v2 with a snapshot of its own (pyiceberg's own append).
    path = tmp_path / "lake" / "t"
    meta = json.loads((path / "metadata" / "v1.metadata.json").read_text())
    (snap,) = meta["snapshots"]
    foreign = dict(snap, **{"snapshot-id": 42, "parent-snapshot-id": snap["snapshot-id"],
                            "sequence-number": snap["sequence-number"] + 1,
                            "summary": {"operation": "append"}})
    meta["snapshots"].append(foreign)
    meta["current-snapshot-id"] = 42
    meta["refs"] = {"main": {"snapshot-id": 42, "type": "branch"}}
    meta["last-sequence-number"] = foreign["sequence-number"]
    wh.store.put_if_absent(metadata_key("t", 2), json.dumps(meta).encode())
    write_batch(table, 0, [b"b"])
    with pytest.raises(MirrorConflictError, match="foreign writer"):
        publish(Warehouse(f"file://{tmp_path}/lake").table("t"))
    with pytest.raises(MirrorConflictError):
        table.vacuum(retention_ms=HOUR)  # what the mirror lists is unknown: delete nothing


def test_metadata_of_another_table_is_refused(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    other = wh.create_table("u", partitions=1)
    write_batch(other, 0, [b"b"])
    publish(other)
    os.rename(tmp_path / "lake" / "u" / "metadata", tmp_path / "lake" / "t" / "metadata")
    with pytest.raises(MirrorConflictError, match="uuid"):
        publish(table)


def test_time_travel_to_older_snapshots_and_metadata_versions(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2, configuration={"cleanup.policy": "compact,delete"})
    seen: dict[int, int] = {}  # snapshot id -> txntable version
    for i in range(6):
        write_batch(table, i % 2, [f"v{i}".encode()])
        if i == 3:
            table.optimize()
        report = publish(table)
        assert report.snapshot_id is not None
        seen[report.snapshot_id] = report.txntable_version
    path = str(tmp_path / "lake" / "t")
    for snapshot_id, version in seen.items():
        got, want = comparable(
            read_pyiceberg_snapshot(path, snapshot_id), committed(table, version)
        )
        assert got == want
    got, want = comparable(read_pyiceberg(path, 2), committed(table, 2))
    assert got == want and sum(want.values()) == 2


def test_a_merge_is_an_overwrite_and_retention_a_delete(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact,delete"})
    for i in range(4):
        write_batch(table, 0, [f"v{i}".encode()])
    publish(table)
    table.optimize()
    merged = publish(table)
    assert (merged.added, merged.removed) == (1, 4)
    table.delete_records({0: 4})
    write_batch(table, 0, [b"w"])
    write_batch(table, 0, [b"x"])
    publish(table)
    table.delete_records({0: 5})
    deleted = publish(table)
    assert (deleted.added, deleted.removed) == (0, 1)
    ops = [(s["summary"]["operation"], s["summary"]["txntable.data-change"])
           for s in snapshots(tmp_path, "t")]
    assert ops == [("append", "true"), ("overwrite", "false"), ("overwrite", "true"),
                   ("delete", "true")]
    path = str(tmp_path / "lake" / "t")
    assert sorted(read_pyiceberg(path)) == [(0, None, b"x")]


def test_rebuild_from_scratch_equals_the_incremental_mirror(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=2, configuration={"cleanup.policy": "compact,delete"})
    for i in range(12):
        write_batch(table, i % 2, [f"v{i}".encode()] * (1 + i % 3))
        publish(table)
        if i == 6:
            table.optimize()
            table.delete_records({1: table.snapshot().partitions[1].entries[0].next_offset})
    incremental = IcebergPublisher(wh.store, "t").state()
    shutil.move(tmp_path / "lake" / "t" / "metadata", tmp_path / "old_metadata")
    publish(Warehouse(f"file://{tmp_path}/lake").table("t"))
    rebuilt = IcebergPublisher(wh.store, "t").state()
    assert {p: f.records for p, f in rebuilt.files.items()} == {
        p: f.records for p, f in incremental.files.items()
    }
    assert rebuilt.txn_version == incremental.txn_version


def test_a_typed_table_is_mirrored_with_its_columns(tmp_path: Path) -> None:
    from txntable import Producer

    wh = lake(tmp_path)
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        ("name", pa.string()),
        ("at", pa.timestamp("us")),  # no zone: fine for Iceberg (not for Delta reader 1)
        ("tags", pa.list_(pa.string())),
    ])
    wh.create_table("typed", partitions=2, schema=schema, key="id")
    with Producer(wh, transactional_id="tx") as producer:
        producer.init_transactions()
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            for i in range(5):
                producer.send("typed", value={"id": i, "name": f"{outcome}-{i}", "at": None,
                                              "tags": [outcome]})
            producer.flush()
            getattr(producer, f"{outcome}_transaction")()
    table = wh.table("typed")
    publish(table)
    path = str(tmp_path / "lake" / "typed")
    st = StaticTable.from_metadata(iceberg_metadata(path))
    assert [f.name for f in st.schema().fields] == [
        "id", "name", "at", "tags", "partition", "offset", "timestamp"
    ]
    got = st.scan().to_arrow()
    assert sorted(got["name"].to_pylist()) == sorted([f"commit-{i}" for i in range(5)] * 2)
    assert sorted(got["name"].to_pylist()) == sorted(table.scan().to_arrow()["name"].to_pylist())
    assert {tuple(t) for t in got["tags"].to_pylist()} == {("commit",)}
    con = duckdb_iceberg_connection()
    rows = con.execute(f"SELECT count(*), min(id), max(id) FROM iceberg_scan('{path}')").fetchone()
    assert rows == (10, 0, 4)


def test_a_nanosecond_timestamp_column_cannot_be_mirrored(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("n", schema=pa.schema([("at", pa.timestamp("ns", tz="UTC"))]))
    with pytest.raises(MirrorUnsupportedError, match="format v3"):
        publish(table)


def test_vacuum_keeps_files_a_pinned_iceberg_reader_may_read(tmp_path: Path) -> None:
    from txntable.maintenance.vacuum import vacuum
    from txntable.storage.wrappers import ClockAheadStore

    wh = lake(tmp_path)
    table = wh.create_table(
        "t", partitions=1,
        configuration={"version.retention.ms": HOUR, "cleanup.policy": "compact,delete"},
    )
    for i in range(4):
        write_batch(table, 0, [f"v{i}".encode()])
    start = now_ms()
    # The mirror lags: its merge snapshot is an hour and a half from now.
    publisher = IcebergPublisher(wh.store, "t", clock=lambda: start + 90 * 60_000)
    first = publisher.publish()
    table.optimize()
    assert publisher.publish().removed == 4
    path = str(tmp_path / "lake" / "t")

    def later(ms: int) -> Table:
        return Warehouse(store=ClockAheadStore(wh.store, ms)).table("t")

    assert vacuum(later(2 * HOUR), HOUR, now=start + 2 * HOUR).deleted == []
    assert first.snapshot_id is not None
    pinned = read_pyiceberg_snapshot(path, first.snapshot_id)
    assert sorted(v for _, _, v in pinned) == [b"v0", b"v1", b"v2", b"v3"]
    gone = vacuum(later(4 * HOUR), HOUR, now=start + 4 * HOUR)
    assert len(gone.deleted) == 4
    assert sorted(v for _, _, v in read_pyiceberg(path)) == [b"v0", b"v1", b"v2", b"v3"]


def test_expiry_keeps_the_last_snapshots_and_those_a_pinned_reader_needs(
    tmp_path: Path,
) -> None:
    wh = lake(tmp_path)
    table = wh.create_table(
        "t", partitions=1,
        configuration={"version.retention.ms": HOUR, "cleanup.policy": "compact,delete"},
    )
    start = now_ms()
    clock = [start]
    publisher = IcebergPublisher(wh.store, "t", clock=lambda: clock[0])

    def versions() -> list[int]:
        return [int(s["summary"]["txntable.version"]) for s in snapshots(tmp_path, "t")]

    for i in range(12):
        write_batch(table, 0, [f"v{i}".encode()])
        publisher.publish()
    # Appends only: the metadata keeps the newest ten (each one's files are its successor's).
    assert versions() == list(range(3, 13))
    table.optimize()  # version 13: one merged segment replaces the twelve batches
    assert publisher.publish().removed == 12
    for i in range(10):
        write_batch(table, 0, [f"w{i}".encode()])
        publisher.publish()
    # The snapshot before the merge is the last to list the twelve batches: kept while its
    # replacement is younger than the retention (vacuum keeps its files).
    assert versions() == [12, *range(14, 24)]
    clock[0] = start + 2 * HOUR
    write_batch(table, 0, [b"last"])
    assert publisher.publish().expired == 2
    assert versions() == list(range(15, 25))
    got, want = comparable(read_pyiceberg(str(tmp_path / "lake" / "t")), committed(table, 24))
    assert got == want and sum(want.values()) == 23


def test_writers_publish_iceberg_in_the_background(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table(
        "t", partitions=1, configuration={"mirror.iceberg": "true", "mirror.interval.ms": 50}
    )
    for i in range(5):
        write_batch(table, 0, [f"v{i}".encode()])
    deadline = time.monotonic() + 30
    path = str(tmp_path / "lake" / "t")
    while time.monotonic() < deadline:
        table.wait_for_mirror(timeout=5)
        if os.path.exists(f"{path}/metadata/version-hint.text") and (
            snapshots(tmp_path, "t")[-1]["summary"]["txntable.version"] == "5"
        ):
            break
        time.sleep(0.05)
    assert snapshots(tmp_path, "t")[-1]["summary"]["txntable.version"] == "5"
    assert not (tmp_path / "lake" / "t" / "_delta_log").exists()  # only the format asked for
    got, want = comparable(read_polars_iceberg(path), committed(table, 5))
    assert got == want


def test_publish_by_default_writes_delta_and_the_enabled_iceberg(tmp_path: Path) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1, configuration={"mirror.iceberg": "true",
                                                             "mirror.interval.ms": -1})
    write_batch(table, 0, [b"a"])
    report = table.publish()
    assert report.delta_version == 0 and report.iceberg is not None
    assert report.iceberg.metadata_version == 1
    plain = wh.create_table("p", partitions=1)
    write_batch(plain, 0, [b"a"])
    assert plain.publish().iceberg is None  # Delta only, as before
    assert not (tmp_path / "lake" / "p" / "metadata").exists()


def test_cli_publish_format_iceberg(tmp_path: Path) -> None:
    from txntable.cli import main

    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    url = f"file://{tmp_path}/lake"
    assert main(["publish", url, "t", "--format", "iceberg", "--json"]) == 0
    assert not (tmp_path / "lake" / "t" / "_delta_log").exists()
    assert main(["publish", url, "t", "--format", "iceberg"]) == 0  # up to date
    assert [s["summary"]["txntable.version"] for s in snapshots(tmp_path, "t")] == ["1"]
    con = duckdb_iceberg_connection()
    assert sorted(read_duckdb_iceberg(con, str(tmp_path / "lake" / "t"))) == [(0, None, b"a")]


def test_publishing_without_pyiceberg_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    monkeypatch.setitem(sys.modules, "pyiceberg", None)  # import fails as if not installed
    with pytest.raises(MirrorDependencyError, match=r"txntable\[iceberg\]"):
        publish(table)
    assert table.publish().delta_version == 0  # Delta needs no pyiceberg


def test_a_publisher_that_lost_the_race_replans_on_the_winners_metadata(
    tmp_path: Path,
) -> None:
    wh = lake(tmp_path)
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a"])
    slow, fast = IcebergPublisher(wh.store, "t"), IcebergPublisher(wh.store, "t")
    assert slow.publish().metadata_version == 1
    fast.state()  # loads v1
    write_batch(table, 0, [b"b"])
    assert fast.publish().metadata_version == 2
    write_batch(table, 0, [b"c"])
    # slow still believes v1 is the newest: its put-if-absent of v2 loses, it reloads the
    # winner's metadata and writes v3 on top of it.
    report = slow.publish()
    assert (report.conflicts, report.metadata_version, report.added) == (1, 3, 1)
    chain = snapshots(tmp_path, "t")
    assert [s["summary"]["txntable.version"] for s in chain] == ["1", "2", "3"]
    got, want = comparable(read_pyiceberg(str(tmp_path / "lake" / "t")), committed(table, 3))
    assert got == want and sum(want.values()) == 3


def test_schema_evolution_adds_the_column_to_the_mirror(tmp_path: Path) -> None:
    from txntable import Producer

    wh = lake(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = wh.create_table("e", partitions=1, schema=schema)
    with Producer(wh) as producer:
        producer.send("e", value={"id": 1})
    publish(table)
    table.evolve_schema(
        pa.schema([pa.field("id", pa.int64(), nullable=False), ("note", pa.string())])
    )
    with Producer(wh) as producer:
        producer.send("e", value={"id": 2, "note": "new"})
    report = publish(table)
    assert report.added == 1
    st = StaticTable.from_metadata(iceberg_metadata(str(tmp_path / "lake" / "e")))
    # Iceberg appends the new column after the others (the mirror's own columns included).
    names = [f.name for f in st.schema().fields]
    assert names == ["id", "partition", "offset", "timestamp", "note"]
    got = st.scan().to_arrow()
    rows = sorted(zip(got["id"].to_pylist(), got["note"].to_pylist(), strict=True))
    assert rows == [(1, None), (2, "new")]
    # A later version that changes neither files nor columns writes nothing (the column
    # order differs between Iceberg's schema and the mirror's, not the schema).
    table.alter_configuration({"retention.ms": 7 * 24 * HOUR})
    assert publish(table).metadata_version is None


def test_any_store_publishes_the_mirror_through_the_store(tmp_path: Path) -> None:
    from txntable.storage.memory import MemoryStore

    wh = Warehouse(store=MemoryStore(f"iceberg-{tmp_path.name}"), group_commit=False)
    table = wh.create_table("t", partitions=2)
    write_batch(table, 0, [b"a"])
    write_batch(table, 1, [b"b", b"c"])
    report = publish(table)
    assert report.metadata_version == 1 and report.bytes_written > 0
    assert wh.store.exists("t/metadata/v1.metadata.json")
    cold = IcebergPublisher(wh.store, "t").state()
    assert sorted(f.records for f in cold.files.values()) == [1, 2]
    assert cold.location == "memory://iceberg-" + tmp_path.name + "/t"


def test_a_format_that_fails_does_not_keep_the_other_from_publishing(tmp_path: Path) -> None:
    from txntable import Producer

    wh = lake(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("at", pa.timestamp("us"))])
    table = wh.create_table("n", schema=schema, configuration={"mirror.iceberg": "true",
                                                                "mirror.interval.ms": -1})
    with Producer(wh) as producer:
        producer.send("n", value={"id": 7, "at": None})
    # Delta reader 1 cannot hold a timestamp without a zone; Iceberg can.
    with pytest.raises(MirrorUnsupportedError, match="timestampNtz"):
        table.publish()
    assert not (tmp_path / "lake" / "n" / "_delta_log").exists()
    st = StaticTable.from_metadata(iceberg_metadata(str(tmp_path / "lake" / "n")))
    assert st.scan().to_arrow()["id"].to_pylist() == [7]
