"""Randomized histories: maintenance never changes what read_committed returns at or above
the log start (merge, retention, vacuum), compaction keeps every key's latest value, and
every reader (poll, poll_arrow, Table.scan) returns the same over merged segments."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from maintutil import Op, comparable, op_lists, open_transaction, read_keys, run_history
from tableutil import log_versions

from txntable import Consumer, TopicPartition, Warehouse
from txntable.log.log import Log
from txntable.protocol.snapshot import replay

_names = itertools.count()

ops = op_lists(8)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("optimize"), st.sampled_from([1, 2_000, 5_000, 1 << 30])),
        st.tuples(st.just("retention"), st.integers(0, 6_000)),
        st.tuples(st.just("vacuum"), st.just(0)),
        st.tuples(st.just("more"), st.just(0)),
    ),
    min_size=1,
    max_size=5,
)


def _visible(wh: Warehouse) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    return read_keys(wh, "t")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=ops, plan=steps, pinned=st.booleans())
def test_merge_retention_vacuum_keep_read_committed(
    history: list[Op], plan: list[tuple[str, int]], pinned: bool
) -> None:
    wh = Warehouse(f"memory://maint-prop-{next(_names)}")
    wh.create_table("t", partitions=2, configuration={"retention.ms": "-1"})
    run_history(wh, "t", history, keys=3)
    opener = open_transaction(wh, "t", 1, 1) if pinned else None
    table = wh.table("t")
    expected = _visible(wh)
    for step, arg in plan:
        if step == "optimize":
            table.optimize(target_bytes=arg)
        elif step == "retention":
            from txntable.maintenance.retention import plan_retention

            table.commit(lambda s, b=arg: plan_retention(s, 0, -1, b))
        elif step == "vacuum":
            table.vacuum(retention_ms=3600 * 1000, dry_run=False)
            # Nothing the latest snapshot needs may be gone (vacuum now - 1 h is "now").
        else:
            hw = {p.partition: p.high_watermark for p in wh.table("t").snapshot().partitions}
            run_history(wh, "t", [Op("commit", ((0, 1), (1, 1)))], keys=3)
            new = _visible(wh)
            for p in (0, 1):
                expected[p] = expected[p] + [r for r in new[p] if r[0] >= hw[p]]
        snap = wh.table("t").snapshot()
        got = _visible(wh)
        for p in (0, 1):
            start = snap.partition(p).log_start_offset
            assert got[p] == [r for r in expected[p] if r[0] >= start], (step, p)
    # Checkpoint + tail == full replay, whatever maintenance did.
    table.checkpoint()
    full = replay(log_versions(table.log))
    assert comparable(Log(wh.store, "t").load()) == comparable(full)
    if opener is not None:
        opener.abort_transaction()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=ops, target=st.sampled_from([1, 3_000, 1 << 30]), twice=st.booleans())
def test_compaction_keeps_the_latest_committed_value_of_every_key(
    history: list[Op], target: int, twice: bool
) -> None:
    wh = Warehouse(f"memory://maint-compact-{next(_names)}")
    wh.create_table(
        "t",
        partitions=2,
        configuration={"cleanup.policy": "compact", "segment.bytes": str(target)},
    )
    run_history(wh, "t", history, keys=3)
    before = _visible(wh)
    table = wh.table("t")
    lso = {p.partition: p.last_stable_offset for p in table.snapshot().partitions}
    table.compact(now=0)  # tombstone horizons lie in the future: tombstones stay
    if twice:
        run_history(wh, "t", [Op("idem", ((0, 2), (1, 1)))], keys=3)
        before = _visible(wh)
        lso = {p.partition: p.last_stable_offset for p in wh.table("t").snapshot().partitions}
        wh.table("t").compact(now=0)
    after = _visible(wh)
    for p in (0, 1):
        latest_before: dict[bytes | None, tuple[int, bytes | None]] = {}
        for offset, key, value in before[p]:
            latest_before[key] = (offset, value)
        latest_after = {key: (offset, value) for offset, key, value in after[p]}
        assert latest_after == latest_before
        assert set(after[p]) <= set(before[p])
        # Nothing at or above the compaction point changes.
        assert [r for r in after[p] if r[0] >= lso[p]] == [r for r in before[p] if r[0] >= lso[p]]


Row = tuple[int, int, Any, Any, Any]


def _drain(c: Consumer, cap: int, arrow: bool) -> tuple[list[Row], list[dict[int, int]]]:
    """Everything ``c`` returns up to the end offsets, and its positions after each poll.

    Checks every poll returns at most ``cap`` records, and nothing only once nothing is left
    (a poll may just move past markers at the end).
    """
    tps = c.assignment()
    ends = c.end_offsets(tps)
    rows: list[Row] = []
    positions = []
    empty_after = []
    while any(c.position(tp) < ends[tp] for tp in tps):
        before = len(rows)
        if arrow:
            tables = c.poll_arrow(max_records=cap)
            assert sum(t.num_rows for t in tables.values()) <= cap
            rows += [
                (r["partition"], r["offset"], r["key"], r["value"], r["headers"])
                for t in tables.values()
                for r in t.to_pylist()
            ]
        else:
            records = c.poll(max_records=cap)
            assert sum(len(v) for v in records.values()) <= cap
            rows += [
                (tp.partition, r.offset, r.key, r.value, [{"key": k, "value": v} for k, v in h])
                for tp, recs in records.items()
                for r in recs
                for h in [r.headers]
            ]
        positions.append({tp.partition: c.position(tp) for tp in tps})
        if len(rows) == before:
            empty_after.append(before)
    assert all(n == len(rows) for n in empty_after), "an empty poll while records remained"
    return sorted(rows), positions


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=ops,
    target=st.sampled_from([1, 2_000, 1 << 30]),
    compact=st.booleans(),
    pinned=st.booleans(),
    cap=st.sampled_from([1, 2, 3, 7, 10_000]),
    level=st.sampled_from(["read_committed", "read_uncommitted"]),
    data=st.data(),
)
def test_scan_poll_arrow_and_poll_agree_over_merged_segments(
    history: list[Op],
    target: int,
    compact: bool,
    pinned: bool,
    cap: int,
    level: str,
    data: st.DataObject,
) -> None:
    wh = Warehouse(f"memory://maint-readers-{next(_names)}")
    wh.create_table("t", partitions=2, configuration={"cleanup.policy": "compact"})
    run_history(wh, "t", history, keys=3)
    opener = open_transaction(wh, "t", 1, 1) if pinned else None
    table = wh.table("t")
    table.optimize(target_bytes=target)
    if compact:
        table.compact(now=0)
    snap = wh.table("t").snapshot()
    # Start anywhere in the log, inside merged segments included.
    starts = {
        p.partition: data.draw(st.integers(p.log_start_offset, p.high_watermark), f"start{p}")
        for p in snap.partitions
    }
    tps = [TopicPartition("t", p) for p in starts]
    drained = []
    for arrow in (False, True):
        c = Consumer(wh, isolation_level=level)
        c.assign(tps)
        for tp in tps:
            c.seek(tp, starts[tp.partition])
        drained.append(_drain(c, cap, arrow))
        c.close()
    (polled, positions), (arrowed, arrow_positions) = drained
    assert arrowed == polled
    assert arrow_positions == positions  # poll_arrow moves positions exactly as poll
    scan = wh.table("t").scan(isolation_level=level, starting_offsets=starts)
    scanned = [
        (r["partition"], r["offset"], r["key"], r["value"], r["headers"])
        for r in scan.to_arrow().to_pylist()
    ]
    assert scanned == polled
    assert scan.count() == len(scanned)
    if opener is not None:
        opener.abort_transaction()
