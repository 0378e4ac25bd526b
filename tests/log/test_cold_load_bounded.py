"""A cold load on local disk costs O(live state): no listing of the whole ``_log`` directory.

A directory has no order, so a LIST "after the tip" reads every entry: the load used to grow
with the history (2.4 ms at 100 versions, 28.5 ms at 10,000 after optimize). Where the store's
listing is unordered the load probes for later versions at doubling distances instead
(``Log.probe_tip``), and lists only on evidence of a gap; a writer still lists before its
first commit, and a refreshing handle once per gap-check interval.
"""

from __future__ import annotations

import pathlib

import pytest
from tableutil import write_batch

from txntable import Consumer, TopicPartition, Warehouse
from txntable.errors import CorruptLogError
from txntable.log.log import tip_probes
from txntable.protocol.snapshot import checkpoint_actions
from txntable.storage import ClockAheadStore, CountingStore
from txntable.storage.local import LocalStore
from txntable.storage.memory import MemoryStore
from txntable.table import Table

TP = TopicPartition("t", 0)


def version_key(v: int) -> str:
    return f"t/_log/{v:020d}.json"


def build(store: CountingStore, versions: int, **config: str) -> Table:
    table = Warehouse(store=store).create_table("t", configuration=config or None)
    for i in range(versions):
        write_batch(table, 0, [f"r{i}".encode()])
    return table


def cold_requests(store: CountingStore) -> dict[str, int]:
    store.reset()
    Warehouse(store=store).table("t").snapshot()
    return store.snapshot()


def test_tip_probes_double() -> None:
    assert tip_probes(10, span=16) == [12, 13, 15, 19, 27]
    assert len(tip_probes(0)) == 41


def test_stores_say_whether_their_listing_is_ordered(tmp_path: pathlib.Path) -> None:
    assert not LocalStore(str(tmp_path)).ordered_listing
    assert MemoryStore("ordered-listing").ordered_listing
    assert not CountingStore(LocalStore(str(tmp_path))).ordered_listing
    assert CountingStore(MemoryStore("ordered-listing")).ordered_listing


def test_a_cold_load_on_local_disk_lists_nothing_and_its_requests_do_not_grow(
    tmp_path: pathlib.Path,
) -> None:
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    table = build(store, 12, **{"checkpoint.interval": "5"})
    short = cold_requests(store)
    for i in range(60):
        write_batch(table, 0, [f"more{i}".encode()])
    long = cold_requests(store)
    assert short["LIST"] == long["LIST"] == 0
    # Opening checks version 0; the load reads the hint, the checkpoint and the tail after
    # it (at most 4 versions and the miss), then probes 41 keys.
    assert long["HEAD"] == short["HEAD"] == 1 + 41
    assert long["GET"] <= 2 + 5


def test_a_deleted_version_with_later_ones_is_found_on_local_disk(tmp_path: pathlib.Path) -> None:
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 8, **{"checkpoint.interval": "3"})
    store.delete(version_key(7))
    with pytest.raises(CorruptLogError, match="version 7 is missing.*version 8 exists") as e:
        Warehouse(store=store).table("t").snapshot()
    assert e.value.path == version_key(7)
    consumer = Consumer(Warehouse(store=store), auto_offset_reset="earliest")
    with pytest.raises(CorruptLogError, match="version 7 is missing"):
        consumer.assign([TP])


@pytest.mark.parametrize("deleted", [(2,), (2, 3), (2, 3, 4, 5)])
def test_holes_as_long_as_what_follows_are_found_by_the_probe(
    tmp_path: pathlib.Path, deleted: tuple[int, ...]
) -> None:
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 2 * len(deleted) + 1, **{"checkpoint.interval": "0"})
    for v in deleted:
        store.delete(version_key(v))
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        Warehouse(store=store).table("t").snapshot()


def test_an_unusable_hint_makes_the_load_list(tmp_path: pathlib.Path) -> None:
    # Versions 7..12 deleted (a hole longer than the one version after it, which the probes
    # would miss) and the hint's checkpoint 12 damaged: the load lists to find another
    # checkpoint, and that listing shows version 13 above the hole.
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 13, **{"checkpoint.interval": "6"})
    store.put("t/_log/00000000000000000012.checkpoint.json", b"damaged")
    for v in range(7, 13):
        store.delete(version_key(v))
    with pytest.raises(CorruptLogError, match="version 7 is missing"):
        Warehouse(store=store).table("t").snapshot()


def test_a_long_hole_at_the_end_is_found_before_any_write(tmp_path: pathlib.Path) -> None:
    # The documented limit of the probe: the hint names checkpoint 1, versions 2..10 are
    # deleted and only 11 follows (the probes look at 3, 4, 6, 10, 18, …). The cold load
    # stops at 1; a writer lists before its first commit and never re-creates version 2,
    # and a reader's next full check (every interval) finds the hole.
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    table = build(store, 1, **{"checkpoint.interval": "0"})
    table.checkpoint()
    for i in range(10):
        write_batch(table, 0, [f"r{i}".encode()])
    for v in range(2, 11):
        store.delete(version_key(v))
    writer = Warehouse(store=store).table("t")
    assert writer.snapshot().version == 1
    with pytest.raises(CorruptLogError, match="version 2 is missing.*version 11 exists"):
        write_batch(writer, 0, [b"lost?"])
    assert not store.exists(version_key(2))
    reader = Warehouse(store=store).table("t")
    reader.snapshot()
    reader.log.gap_check_interval_ms = 0
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        reader.snapshot()


def test_versions_committed_during_the_probe_are_read(tmp_path: pathlib.Path) -> None:
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 3).checkpoint()

    class Late(CountingStore):
        """Commits two versions the moment the probe first looks above the tip."""

        fired = False

        def head(self, key: str):  # type: ignore[no-untyped-def]
            if not self.fired and key == version_key(5):
                self.fired = True
                other = Warehouse(store=store).table("t")
                write_batch(other, 0, [b"x"])
                write_batch(other, 0, [b"y"])
            return super().head(key)

    assert Warehouse(store=Late(store.inner)).table("t").snapshot().version == 5


def test_maintenance_keeps_the_log_directory_bounded(tmp_path: pathlib.Path) -> None:
    # Each round commits 30 versions, then runs maintain() with the clock a retention window
    # (plus a day) further on: log cleanup leaves version 0, the latest version and its
    # checkpoint, whatever the history; every record stays readable.
    import os

    from txntable.config import VERSION_RETENTION_MS_DEFAULT
    from txntable.util import now_ms

    wh = Warehouse(f"file://{tmp_path}/lake")
    table = wh.create_table("t", configuration={"retention.ms": "-1"})
    log_dir = tmp_path / "lake" / "t" / "_log"
    written = []
    for round_ in range(1, 4):
        for i in range(30):
            value = f"{round_}-{i}".encode()
            write_batch(table, 0, [value])
            written.append(value)
        later = now_ms() + round_ * (VERSION_RETENTION_MS_DEFAULT + DAY)
        # The store's clock moves on too: cleanup measures versions' ages on it.
        ahead = round_ * (VERSION_RETENTION_MS_DEFAULT + DAY)
        report = Warehouse(store=ClockAheadStore(wh.store, ahead)).table("t").maintain(now=later)
        assert report.errors == []
        assert report.log_cleanup is not None and report.log_cleanup.versions_deleted >= 29
        latest = wh.table("t").snapshot().version
        assert sorted(os.listdir(log_dir)) == sorted(
            [f"{0:020d}.json", f"{latest:020d}.json", f"{latest:020d}.checkpoint.json",
             "_last_checkpoint"]
        )
    c = Consumer(Warehouse(f"file://{tmp_path}/lake"), auto_offset_reset="earliest")
    c.assign([TP])
    got = [r.value for r in c.poll(max_records=1000)[TP]]
    c.close()
    assert got == written


DAY = 86_400_000


def test_a_handle_far_behind_comes_back_from_the_newest_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    """A group-commit follower learns its outcomes from the outcome record, not the log, so
    its handle falls behind by every version since. Brought to a known version it reads the
    newest checkpoint and the versions after it, not every version it missed."""
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 0, **{"checkpoint.interval": "20"})
    stale = Warehouse(store=store).table("t")
    stale.snapshot()
    writer = Warehouse(store=store).table("t")
    for i in range(130):
        write_batch(writer, 0, [f"r{i}".encode()])
    tip = writer.snapshot().version
    store.reset()
    snap = stale.caught_up(tip)
    requests = store.snapshot()
    assert snap.version == tip == 130
    assert stale.snapshot(refresh=False) is snap
    assert snap.partition(0).high_watermark == 130
    # The hint, the checkpoint at 120, versions 121-130 and the refresh's probe past them.
    assert requests["GET"] <= 14, requests
    fresh = Warehouse(store=store).table("t").snapshot()
    assert checkpoint_actions(snap) == checkpoint_actions(fresh)


def test_a_handle_a_little_behind_reads_its_missing_versions(tmp_path: pathlib.Path) -> None:
    store = CountingStore(LocalStore(str(tmp_path / "lake")))
    build(store, 0, **{"checkpoint.interval": "20"})
    stale = Warehouse(store=store).table("t")
    before = stale.snapshot()
    writer = Warehouse(store=store).table("t")
    for i in range(5):
        write_batch(writer, 0, [f"r{i}".encode()])
    assert stale.caught_up(5) is before  # the same snapshot, moved on in place
    assert before.version == 5
