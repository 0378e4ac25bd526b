"""Merge, compaction, retention, producer expiry, checkpoints and log cleanup on real tables."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from maintutil import Op, comparable, open_transaction, read, read_keys, run_history
from tableutil import log_versions

from txntable import Producer, Warehouse
from txntable.errors import (
    CorruptLogError,
    PolicyViolationError,
    UnsupportedProtocolError,
    VersionNotAvailableError,
)
from txntable.log.log import Log
from txntable.maintenance.merge import plan_commit, plan_groups
from txntable.protocol.actions import ExpireProducer, Protocol, Segment
from txntable.protocol.records import MERGED_SEGMENT_SCHEMA
from txntable.protocol.snapshot import replay
from txntable.read.reader import read_segment
from txntable.storage import ClockAheadStore

DAY = 24 * 3600 * 1000
#: How far the store's clock is moved for log cleanup to find versions old (a year).
LATER = 365 * DAY

HISTORY = [
    Op("idem", ((0, 3), (1, 2))),
    Op("commit", ((0, 2), (1, 1))),
    Op("abort", ((0, 2), (1, 3))),
    Op("idem", ((0, 1),)),
    Op("commit", ((0, 1), (1, 2))),
    Op("abort", ((1, 1),)),
    Op("idem", ((1, 2),)),
]


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(f"file://{tmp_path}/wh")



def test_optimize_keeps_every_committed_record_at_its_offset(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    opener = open_transaction(wh, "t", 1, 2)  # partition 1's LSO stays below its HW
    committed = read(wh, "t", "read_committed")
    uncommitted = read(wh, "t", "read_uncommitted")
    table = wh.table("t")
    lso = {p.partition: p.last_stable_offset for p in table.snapshot().partitions}

    report = table.optimize()

    assert report.version is not None and report.segments_written == 2
    snap = wh.table("t").snapshot()
    assert snap.protocol == Protocol(2, 2)
    for part in snap.partitions:
        assert isinstance(part.entries[0], Segment)
        assert part.entries[0].endOffset == lso[part.partition]
        assert all(not isinstance(e, Segment) for e in part.entries[1:])
    assert read(wh, "t", "read_committed") == committed
    # Below the merge point read_uncommitted now returns what read_committed does (aborted
    # data and markers are gone, as after Kafka's cleaner); above it nothing changed.
    after = read(wh, "t", "read_uncommitted")
    for p in (0, 1):
        below = [r for r in uncommitted[p] if r[0] < lso[p]]
        above = [r for r in uncommitted[p] if r[0] >= lso[p]]
        assert [r for r in after[p] if r[0] < lso[p]] == committed[p]
        assert [r for r in after[p] if r[0] >= lso[p]] == above
        assert len(below) > len(committed[p])  # there was aborted data to drop
    opener.abort_transaction()
    assert read(wh, "t", "read_committed") == committed


def test_merged_segment_has_explicit_offsets(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    table = wh.table("t")
    table.optimize()
    seg = table.snapshot().partition(0).entries[0]
    assert isinstance(seg, Segment)
    data = read_segment(wh.store, seg.path, seg.count, merged=True)
    assert data.schema.equals(MERGED_SEGMENT_SCHEMA)
    offsets = data.column("offset").to_pylist()
    assert offsets == [o for o, _ in read(wh, "t", "read_committed")[0]]
    assert offsets == sorted(offsets) and seg.baseOffset <= offsets[0]


def test_positions_inside_a_merged_segment_resume_where_they_were(wh: Warehouse) -> None:
    from txntable import Consumer, TopicPartition

    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    expected = read(wh, "t", "read_committed")[0]
    wh.table("t").optimize()
    tp = TopicPartition("t", 0)
    for start in range(expected[-1][0] + 2):
        c = Consumer(wh, isolation_level="read_committed")
        c.assign([tp])
        c.seek(tp, start)
        got = []
        for _ in range(20):
            got += [(r.offset, r.value) for r in c.poll(max_records=2).get(tp, [])]
        assert got == [r for r in expected if r[0] >= start], start
        c.close()


def test_a_producer_commit_rebases_over_a_merge(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    table = wh.table("t")
    snap = table.snapshot()
    runs = plan_groups(snap.partition(0), 1 << 30)
    assert len(runs) == 1
    # Someone appends between the merge's planning and its commit: the merge still lands.
    run_history(wh, "t", [Op("idem", ((0, 2),))])
    from txntable.maintenance.maintain import rewrite

    report = rewrite(table, compact=False)
    assert report.version is not None
    assert report.runs_dropped_by_conflict == 0
    merged = wh.table("t").snapshot().partition(0)
    assert isinstance(merged.entries[0], Segment)
    assert merged.entries[-1].next_offset == merged.log_end_offset


def test_a_run_another_maintainer_rewrote_is_dropped(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1)
    run_history(wh, "t", [Op("idem", ((0, 2),)), Op("commit", ((0, 2),))])
    first, second = wh.table("t"), wh.table("t")
    stale = second.snapshot()
    runs = plan_groups(stale.partition(0), 1 << 30)
    first.optimize()
    fake = Segment(0, runs[0].base_offset, runs[0].end_offset, 0, "", 0)
    plan = plan_commit(second.snapshot(), [(runs[0], fake)])
    assert plan.actions == [] and plan.result == []


def test_compaction_keeps_the_latest_value_per_key(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact"})
    ops = [Op("idem", ((0, 5),)), Op("commit", ((0, 4),)), Op("abort", ((0, 3),))]
    run_history(wh, "t", ops + [Op("idem", ((0, 2),))], keys=3)
    before = read_keys(wh, "t")[0]
    latest = {}
    for offset, key, value in before:
        latest[key] = (offset, value)

    report = wh.table("t").compact()

    assert report.version is not None
    after = read_keys(wh, "t")[0]
    assert sorted(after) == sorted((o, k, v) for k, (o, v) in latest.items())


@pytest.mark.parametrize("policy", [None, "delete"])
def test_compaction_of_a_delete_policy_table_is_refused(wh: Warehouse, policy: str | None) -> None:
    # Kafka never key-compacts a delete-policy topic: its repeated keys are all data.
    configuration = {} if policy is None else {"cleanup.policy": policy}
    wh.create_table("t", partitions=1, configuration=configuration)
    run_history(wh, "t", [Op("idem", ((0, 4),)), Op("commit", ((0, 4),))], keys=2)
    before = read_keys(wh, "t")[0]
    version = wh.table("t").snapshot().version

    with pytest.raises(PolicyViolationError, match="cleanup.policy"):
        wh.table("t").compact()

    assert wh.table("t").snapshot().version == version
    assert read_keys(wh, "t")[0] == before and len(before) == 8
    report = wh.table("t").compact(ignore_cleanup_policy=True)  # the explicit override
    assert report.records_kept == 2 and report.records_dropped == 6


def test_compaction_runs_under_compact_and_delete(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact,delete"})
    run_history(wh, "t", [Op("idem", ((0, 4),))], keys=2)
    assert wh.table("t").compact().records_dropped == 2


def test_compaction_never_touches_records_above_the_lso(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact"})
    run_history(wh, "t", [Op("idem", ((0, 4),))], keys=2)
    opener = open_transaction(wh, "t", 0, 2)
    run_history(wh, "t", [Op("idem", ((0, 4),))], keys=2)  # above the LSO
    lso = wh.table("t").snapshot().partition(0).last_stable_offset
    before = read(wh, "t", "read_uncommitted")[0]
    wh.table("t").compact()
    after = read(wh, "t", "read_uncommitted")[0]
    assert [r for r in after if r[0] >= lso] == [r for r in before if r[0] >= lso]
    assert len([r for r in after if r[0] < lso]) == 2
    opener.commit_transaction()


def test_tombstones_go_after_delete_retention(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact"})
    run_history(wh, "t", [Op("idem", ((0, 2),)), Op("idem", ((0, 1),), tombstone=True)], keys=2)
    # k0 -> v0 then tombstone at 2; k1 -> v1.
    table = wh.table("t")
    t0 = 10 * DAY
    table.compact(now=t0)
    assert read_keys(wh, "t")[0] == [(1, b"k1", b"v1"), (2, b"k0", None)]
    table.compact(now=t0 + DAY - 1)  # the horizon has not passed: the tombstone stays
    assert read_keys(wh, "t")[0] == [(1, b"k1", b"v1"), (2, b"k0", None)]
    table.compact(now=t0 + DAY)
    assert read_keys(wh, "t")[0] == [(1, b"k1", b"v1")]


def test_retention_by_time_and_bytes(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"retention.ms": str(DAY)})
    p = Producer(wh, linger_ms=600_000, batch_size=1 << 30)
    for ts in (1_000, 2_000, 3 * DAY):
        p.send("t", value=b"x", timestamp=ts, partition=0)
        p.send("t", value=b"y", timestamp=ts, partition=0)
        p.flush()
    p.close()
    table = wh.table("t")
    report = table.apply_retention(now=2 * DAY + 2_500)
    assert report.log_start_offsets == {0: 4}
    assert read(wh, "t", "read_committed")[0] == [(4, b"x"), (5, b"y")]
    assert table.snapshot().partition(0).entries[0].baseOffset == 4
    # Size (Kafka's rule): a segment goes only if the rest is still >= retention.bytes.
    from txntable.maintenance.retention import retention_point

    part = table.snapshot().partition(0)
    assert retention_point(part, 0, -1, part.size_bytes) == 4
    assert retention_point(part, 0, -1, part.size_bytes + 1) == 4
    assert retention_point(part, 0, -1, 0) == 6


def test_retention_never_passes_an_open_transaction(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"retention.ms": "1"})
    run_history(wh, "t", [Op("idem", ((0, 2),))])
    opener = open_transaction(wh, "t", 0, 2)
    run_history(wh, "t", [Op("idem", ((0, 2),))])
    report = wh.table("t").apply_retention(now=10**15)
    assert report.log_start_offsets == {0: 2}  # the transaction starts at 2
    opener.commit_transaction()
    report = wh.table("t").apply_retention(now=10**15)
    assert report.log_start_offsets == {0: 7}


def test_idle_producers_expire_but_never_with_an_open_transaction(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    opener = open_transaction(wh, "t", 0, 1)
    table = wh.table("t")
    snap = table.snapshot()
    pids = set(snap.producer_epochs)
    report = table.expire_producers(now=10**15)
    assert opener.producer_id not in report.producer_ids
    assert set(report.producer_ids) == pids - {opener.producer_id}
    snap = wh.table("t").snapshot()
    assert set(snap.producer_epochs) == {opener.producer_id}
    assert all(set(p.producers) <= {opener.producer_id} for p in snap.partitions)
    opener.commit_transaction()


def test_expire_producer_with_an_open_transaction_is_corrupt() -> None:
    from tableutil import batch, snapshot_of

    snap = snapshot_of([batch(0, 0, pid=5, epoch=0, seq=0, txn=True)])
    with pytest.raises(CorruptLogError, match="open transaction"):
        snap.apply(2, [ExpireProducer(5)])


def test_an_expired_idempotent_producer_continues(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1)
    p = Producer(wh, linger_ms=600_000, batch_size=1 << 30)
    for i in range(3):
        p.send("t", value=f"a{i}".encode(), partition=0)
        p.flush()
    wh.table("t").expire_producers(now=10**15)
    md = p.send("t", value=b"after", partition=0)
    p.flush()
    assert md.result().offset == 3  # sequence 3 accepted from a producer without state
    p.close()


def test_checkpoint_plus_tail_equals_full_replay_after_maintenance(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2, configuration={"retention.ms": str(DAY)})
    run_history(wh, "t", HISTORY)
    table = wh.table("t")
    table.optimize()
    run_history(wh, "t", HISTORY[:3])
    table.apply_retention(now=10**15)
    run_history(wh, "t", HISTORY[3:])
    table.expire_producers(now=10**15)
    table.checkpoint()
    run_history(wh, "t", HISTORY[:2])
    full = replay(log_versions(table.log))
    loaded = Log(wh.store, "t").load()
    assert comparable(loaded) == comparable(full)
    assert comparable(wh.table("t").snapshot()) == comparable(full)


def test_checkpoint_in_parts_and_a_damaged_part_is_skipped(
    wh: Warehouse, caplog: pytest.LogCaptureFixture
) -> None:
    wh.create_table("t", partitions=2)
    run_history(wh, "t", HISTORY)
    table = wh.table("t")
    table.log.checkpoint_part_actions = 7
    assert table.log.write_checkpoint(table.snapshot())
    listing = table.log.listing()
    v = table.snapshot().version
    parts = listing.parts_of(v)
    assert parts > 2
    full = replay(log_versions(table.log))
    assert comparable(Log(wh.store, "t").load()) == comparable(full)
    # Damage part 2: the checkpoint is skipped with a warning, the log replayed instead.
    wh.store.put(table.log.checkpoint_key(v, 2, parts), b'{"batch":{"nonsense":1}}\n')
    with caplog.at_level(logging.WARNING, logger="txntable.log.log"):
        loaded = Log(wh.store, "t").load()
    assert comparable(loaded) == comparable(full)
    assert any("damaged checkpoint" in r.message for r in caplog.records)


def test_log_cleanup_keeps_time_travel_to_the_window(wh: Warehouse) -> None:
    wh.create_table("t", partitions=1, configuration={"checkpoint.interval": "0"})
    run_history(wh, "t", [Op("idem", ((0, 1),))] * 6)
    table = wh.table("t")
    table.optimize()  # upgrades to v2, checkpoints at its version
    cp_version = table.snapshot().version
    run_history(wh, "t", [Op("idem", ((0, 1),))] * 3)
    expected_at_cp = read(wh, "t", "read_committed")
    # Every version is inside the (7-day) window: nothing goes.
    assert table.clean_log().versions_deleted == 0
    assert table.snapshot_at(1).version == 1
    # A clock far ahead is not enough: the store dates the versions a moment ago.
    young = table.clean_log(now=10**15)
    assert (young.versions_deleted, young.too_young) == (0, [cp_version])
    report = Warehouse(store=ClockAheadStore(wh.store, LATER)).table("t").clean_log(now=10**15)
    assert report.earliest_version == cp_version
    assert report.versions_deleted == cp_version - 1
    assert wh.store.exists(table.log.version_key(0))
    with pytest.raises(VersionNotAvailableError) as err:
        table.snapshot_at(cp_version - 1)
    assert err.value.earliest == cp_version
    assert table.snapshot_at(cp_version).version == cp_version
    assert comparable(Log(wh.store, "t").load()) == comparable(table.snapshot())
    assert read(wh, "t", "read_committed") == expected_at_cp


def test_an_old_reader_refuses_a_maintained_table(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    import txntable.protocol.actions as actions

    wh.create_table("t", partitions=1, configuration={"checkpoint.interval": "0"})
    run_history(wh, "t", [Op("idem", ((0, 1),))] * 3)
    table = wh.table("t")
    table.optimize()
    Warehouse(store=ClockAheadStore(wh.store, LATER)).table("t").clean_log(now=10**15)
    monkeypatch.setattr(actions, "READER_VERSION", 1)
    with pytest.raises(UnsupportedProtocolError):
        Log(wh.store, "t").load()


def test_maintain_runs_every_step(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2, configuration={"retention.ms": str(DAY)})
    run_history(wh, "t", HISTORY)
    committed = read(wh, "t", "read_committed")
    report = wh.table("t").maintain()
    assert report.errors == []
    assert report.rewrite is not None and report.rewrite.segments_written == 2
    assert report.checkpoint is not None and report.checkpoint.written
    assert report.vacuum is not None and report.vacuum.deleted == []
    assert read(wh, "t", "read_committed") == committed


def test_a_producer_runs_maintenance_in_the_background(wh: Warehouse) -> None:

    conf = {"maintenance.interval.ms": "0", "maintenance.merge.min.entries": "4"}
    wh.create_table("t", partitions=1, configuration=conf)
    p = Producer(wh, linger_ms=600_000, batch_size=1 << 30)
    for i in range(6):
        p.send("t", value=f"v{i}".encode(), partition=0)
        p.flush()
    assert p.sender.maintenance is not None
    p.sender.maintenance.join(30)
    p.close()
    part = wh.table("t").snapshot().partition(0)
    assert isinstance(part.entries[0], Segment)
    assert read(wh, "t", "read_committed")[0] == [(i, f"v{i}".encode()) for i in range(6)]
    off = Producer(wh, linger_ms=600_000, batch_size=1 << 30, auto_maintenance=False)
    assert off.sender.maintenance is None
    off.close()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cleanup.policy", "forever"),
        ("retention.ms", "soon"),
        ("retention.bytes", "-2"),
        ("segment.bytes", "0"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("version.retention.ms", "1000"),
        ("producer.id.expiration.ms", "0"),
    ],
)
def test_create_table_refuses_bad_maintenance_settings(
    wh: Warehouse, key: str, value: str
) -> None:
    from txntable.errors import InvalidConfigurationError, TableNotFoundError

    with pytest.raises(InvalidConfigurationError, match=key.replace(".", r"\.")):
        wh.create_table("t", configuration={key: value})
    with pytest.raises(TableNotFoundError):
        wh.table("t")


def test_plan_groups_sizes_runs_and_skips_what_needs_no_rewrite() -> None:
    from tableutil import batch, snapshot_of

    from txntable.protocol.actions import AbortedTxn, Marker

    snap = snapshot_of(
        [batch(0, 0, count=2)],  # 100 bytes each
        [batch(0, 2, count=2)],
        [batch(0, 4, count=2)],
        [batch(0, 6, pid=3, epoch=0, seq=0, txn=True)],
        [Marker(0, 7, 3, 0, "ABORT"), AbortedTxn(0, 3, 6, 7, 8)],
        [batch(0, 8, pid=4, epoch=0, seq=0, txn=True)],  # open: the LSO is 8
        partitions=1,
    )
    part = snap.partition(0)
    assert part.last_stable_offset == 8
    runs = plan_groups(part, 200)
    assert [(r.base_offset, r.end_offset) for r in runs] == [(0, 4), (4, 8)]
    assert runs[1].visible == (True, False, False)  # the aborted batch and its marker go
    assert [(r.base_offset, r.end_offset) for r in plan_groups(part, 1)] == [(6, 8)]
    assert [(r.base_offset, r.end_offset) for r in plan_groups(part, 10_000)] == [(0, 8)]


def test_a_maintained_table_verifies_clean(wh: Warehouse) -> None:
    wh.create_table("t", partitions=2, configuration={"checkpoint.interval": "3"})
    run_history(wh, "t", HISTORY)
    table = wh.table("t")
    table.optimize()
    run_history(wh, "t", HISTORY[:3])
    table.apply_retention(now=10**15)
    table.expire_producers(now=10**15)
    table.log.checkpoint_part_actions = 5
    table.checkpoint()
    run_history(wh, "t", HISTORY[3:])
    report = table.verify()
    assert report.ok, report.errors
    assert report.checkpoints_checked >= 2
    Warehouse(store=ClockAheadStore(wh.store, LATER)).table("t").clean_log(now=10**15)
    truncated = wh.table("t").verify()
    assert truncated.ok, truncated.errors
    assert truncated.start_version > 0


def test_verify_catches_a_merged_segment_with_moved_offsets(wh: Warehouse) -> None:
    import pyarrow.compute as pc

    from txntable.protocol.records import encode_table

    wh.create_table("t", partitions=1)
    run_history(wh, "t", HISTORY_ONE)
    table = wh.table("t")
    table.optimize()
    seg = table.snapshot().partition(0).entries[0]
    assert isinstance(seg, Segment)
    data = read_segment(wh.store, seg.path, seg.count, merged=True)
    moved = data.set_column(0, "offset", pc.add(data.column("offset"), 1000))
    wh.store.put_data_file(seg.path, encode_table(moved))
    report = wh.table("t").verify()
    assert "merge.offsets" in {v.rule for v in report.errors}


HISTORY_ONE = [Op("idem", ((0, 3),)), Op("abort", ((0, 2),)), Op("commit", ((0, 2),))]
