"""A missing log version is corruption: readers and writers detect it, nobody fills it.

A deleted ``_log/<N>.json`` used to roll the table back silently (readers stopped at
``N - 1``) and the next commit re-created version ``N``, so the versions after it joined the
log again behind a different version ``N``: committed records lost, offsets reused.
"""

from __future__ import annotations

import pytest
from tableutil import RecordingStore, write_batch

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import CorruptLogError, TableExistsError, VersionNotFoundError
from txntable.storage.base import Store
from txntable.table import Table

TP = TopicPartition("t", 0)


def version_key(v: int) -> str:
    return f"t/_log/{v:020d}.json"


def table_at_version(wh: Warehouse, versions: int, **config: str) -> Table:
    """Table ``t`` (one partition) with one record per version 1..``versions``."""
    table = wh.create_table("t", configuration=config or None)
    for i in range(versions):
        write_batch(table, 0, [f"r{i}".encode()])
    assert table.snapshot().version == versions
    return table


def test_cold_load_with_a_missing_version_fails_naming_it(wh: Warehouse) -> None:
    table_at_version(wh, 4)
    wh.store.delete(version_key(2))
    with pytest.raises(CorruptLogError, match=r"version 2 is missing.*version 4 exists") as e:
        Warehouse(store=wh.store).table("t").describe()
    assert e.value.path == version_key(2)
    # A consumer fails the same way, instead of reporting high watermark 1.
    consumer = Consumer(Warehouse(store=wh.store), auto_offset_reset="earliest")
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        consumer.assign([TP])


def test_writer_never_fills_a_missing_version(wh: Warehouse) -> None:
    table_at_version(wh, 4)
    wh.store.delete(version_key(2))
    before = sorted(wh.store.list("t/_log/"))
    producer = Producer(Warehouse(store=wh.store), linger_ms=0)
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        producer.send("t", value=b"new").result(timeout=10)
    producer.close()
    assert sorted(wh.store.list("t/_log/")) == before  # nothing written, version 2 still absent


def test_gap_after_the_newest_checkpoint_is_detected(wh: Warehouse) -> None:
    # Checkpoints at 3 and 6; the hint points at 6. Version 7 deleted, 8 kept: the load
    # from checkpoint 6 must not stop at 6.
    table_at_version(wh, 8, **{"checkpoint.interval": "3"})
    wh.store.delete(version_key(7))
    with pytest.raises(CorruptLogError, match="version 7 is missing.*version 8 exists"):
        Warehouse(store=wh.store).table("t").snapshot()


def test_versions_below_the_checkpoint_loaded_are_not_needed(wh: Warehouse) -> None:
    # What a checkpoint covers may be cleaned up (Delta's log cleanup): not a gap.
    table_at_version(wh, 8, **{"checkpoint.interval": "3"})
    wh.store.delete(version_key(2))
    wh.store.delete(version_key(5))
    assert Warehouse(store=wh.store).table("t").describe().partitions[0].high_watermark == 8


def test_deleted_newest_versions_behind_a_checkpoint_are_detected(wh: Warehouse) -> None:
    # Checkpoint 6 and its hint survive; versions 5 and 6 are gone: the cold load from
    # version 0 must not stop at 4 (a writer would then write 5 again).
    table_at_version(wh, 6, **{"checkpoint.interval": "3"})
    wh.store.delete("t/_log/_last_checkpoint")
    wh.store.delete("t/_log/00000000000000000006.checkpoint.json")
    wh.store.put("t/_log/00000000000000000003.checkpoint.json", b"damaged")
    wh.store.delete(version_key(5))
    wh.store.delete(version_key(6))
    wh.store.put("t/_log/00000000000000000009.checkpoint.json", b"{}\n")
    with pytest.raises(CorruptLogError, match="version 5 is missing.*checkpoint 9 exists"):
        Warehouse(store=wh.store).table("t").snapshot()


def _delete_after_reading(store: Store, handle: Table, deleted: int, newest: int) -> None:
    """Let another writer commit up to ``newest``, then delete version ``deleted``."""
    other = Warehouse(store=store).table("t")
    while other.snapshot().version < newest:
        write_batch(other, 0, [b"other"])
    store.delete(version_key(deleted))


def test_refreshing_reader_detects_a_gap_at_its_next_check(wh: Warehouse) -> None:
    table_at_version(wh, 4)
    reader = Warehouse(store=wh.store).table("t")
    reader.snapshot()
    _delete_after_reading(wh.store, reader, deleted=5, newest=7)
    # Between checks a refresh only probes the next version (one GET): it sees nothing new.
    assert reader.snapshot().version == 4
    reader.log.gap_check_interval_ms = 0
    with pytest.raises(CorruptLogError, match="version 5 is missing.*version 7 exists"):
        reader.snapshot()


def test_writer_on_a_warm_handle_checks_before_writing(wh: Warehouse) -> None:
    writer = table_at_version(wh, 4)
    _delete_after_reading(wh.store, writer, deleted=5, newest=6)
    writer.log.gap_check_interval_ms = 0
    with pytest.raises(CorruptLogError, match="version 5 is missing"):
        write_batch(writer, 0, [b"lost?"])
    assert wh.store.head(version_key(5)) is None


def test_versions_that_arrive_during_the_check_are_read_not_reported(wh: Warehouse) -> None:
    reader = table_at_version(wh, 2)
    other = Warehouse(store=wh.store).table("t")
    write_batch(other, 0, [b"x"])
    write_batch(other, 0, [b"y"])
    reader.log.gap_check_interval_ms = 0
    assert reader.snapshot().version == 4


def test_idle_refresh_costs_one_get_and_no_list(recording_store: RecordingStore) -> None:
    wh = Warehouse(store=recording_store)
    table_at_version(wh, 3)
    reader = Warehouse(store=recording_store).table("t")
    reader.snapshot()
    recording_store.reset()
    for _ in range(5):
        reader.snapshot()
    assert recording_store.log_gets("t") == [version_key(4)] * 5
    assert recording_store.counts["LIST"] == 0


def test_version_as_of_beyond_the_newest_is_version_not_found(wh: Warehouse) -> None:
    table = table_at_version(wh, 4)
    with pytest.raises(VersionNotFoundError, match=r"version 9.*available versions: 0\.\.4$"):
        table.snapshot_at(9)
    with pytest.raises(VersionNotFoundError, match=r"version -1.*available versions: 0\.\.4$"):
        table.snapshot_at(-1)
    assert table.snapshot_at(4).version == 4


def test_version_as_of_across_a_gap_is_corruption(wh: Warehouse) -> None:
    table = table_at_version(wh, 4)
    wh.store.delete(version_key(2))
    assert Warehouse(store=wh.store).table("t").snapshot_at(1).version == 1
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        Warehouse(store=wh.store).table("t").snapshot_at(3)
    assert table.snapshot(refresh=False).version == 4


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_table_is_never_created_over_an_orphaned_log(
    kind: str, wh: Warehouse, local_wh: Warehouse
) -> None:
    # Issue 19.1: with version 0 deleted, create_table used to succeed and the new table
    # adopted the old versions 1..3 (HW 3, the old records scanned as its own).
    wh = wh if kind == "memory" else local_wh
    table_at_version(wh, 3)
    wh.store.delete(version_key(0))
    assert wh.list_tables() == []
    before = sorted(wh.store.list("t/_log/"))
    with pytest.raises(CorruptLogError, match="no version 0") as e:
        wh.create_table("t", partitions=2)
    assert e.value.path == version_key(0)
    assert sorted(wh.store.list("t/_log/")) == before  # nothing written
    assert wh.orphaned_logs() == ["t"]
    report = wh.verify_table("t")
    assert [(v.rule, v.version) for v in report.errors] == [
        ("log.missing-version", 0),
        ("log.missing-version", 1),
    ]
    # An existing table is still TableExistsError, an empty name still creatable.
    wh.create_table("u")
    with pytest.raises(TableExistsError):
        wh.create_table("u")
    assert wh.orphaned_logs() == ["t"]
