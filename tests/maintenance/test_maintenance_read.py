"""Every reader over merged and key-compacted segments (explicit, sparse offsets).

``Table.scan``, ``Consumer.poll_arrow`` and ``Consumer.poll`` plan with one algorithm and read
with one reader; these tests pin what that path does with merged segments: rows found by
offset (never by row index), capped fetches that end inside a merged segment, positions
past trailing gaps, read-ahead, and a merged file whose offsets contradict its action.

Most tests read :func:`maintutil.compacted_table`: one merged, key-compacted segment
``[0, 13)`` per partition holding offsets 4, 5, 10 and 11 only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from maintutil import MANUAL, SPARSE, compacted_table, read, sparse_history
from tableutil import SegmentLog

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import SchemaMismatchError
from txntable.protocol.actions import Segment
from txntable.protocol.records import encode_table
from txntable.read.planning import plan_fetch
from txntable.read.reader import read_segment
from txntable.storage import MemoryStore

T = "t"
TP0, TP1 = TopicPartition(T, 0), TopicPartition(T, 1)


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(f"file://{tmp_path}/wh")


def _poll_offsets(c: Consumer, tp: TopicPartition, n: int) -> tuple[list[int], int]:
    got = c.poll(max_records=n).get(tp, [])
    return [r.offset for r in got], c.position(tp)


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_capped_polls_inside_a_sparse_merged_segment(wh: Warehouse, level: str) -> None:
    compacted_table(wh, T)
    c = Consumer(wh, isolation_level=level, auto_offset_reset="earliest")
    c.assign([TP0])
    # A limit ending inside the segment: just past the last record returned, not at a row
    # index turned into an offset (that would be 1, then 2, ...).
    assert _poll_offsets(c, TP0, 1) == ([4], 5)
    assert _poll_offsets(c, TP0, 1) == ([5], 6)
    assert _poll_offsets(c, TP0, 1) == ([10], 11)
    # The last record of the segment: the position moves past the trailing gap (marker 12).
    assert _poll_offsets(c, TP0, 1) == ([11], 13)
    assert _poll_offsets(c, TP0, 1) == ([], 13)
    c.seek(TP0, 0)
    assert _poll_offsets(c, TP0, 2) == ([4, 5], 6)
    assert _poll_offsets(c, TP0, 2) == ([10, 11], 13)
    for start, first in ((6, 10), (7, 10), (11, 11), (12, None)):
        c.seek(TP0, start)
        got, pos = _poll_offsets(c, TP0, 1)
        assert got == ([first] if first is not None else []), start
        assert pos == (first + 1 if first is not None and first < 11 else 13), start
    c.close()


def test_a_limit_spanning_a_merged_segment_and_the_batches_after_it(wh: Warehouse) -> None:
    compacted_table(wh, T)
    p = Producer(wh, **MANUAL)
    for i in range(3):
        p.send(T, key=b"n", value=b"n%d" % i, partition=0)
    p.flush()
    p.close()
    c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TP0])
    assert _poll_offsets(c, TP0, 3) == ([4, 5, 10], 11)
    assert _poll_offsets(c, TP0, 3) == ([11, 13, 14], 15)
    assert _poll_offsets(c, TP0, 3) == ([15], 16)
    c.close()


def test_plan_bounds_the_rows_of_part_of_a_merged_segment(wh: Warehouse) -> None:
    compacted_table(wh, T)
    part = wh.table(T).snapshot().partition(0)
    whole = plan_fetch(part, 0, 13, True).slices
    assert [(s.merged, s.rows, s.min_rows) for s in whole] == [(True, 4, 4)]
    # From offset 6: 7 of the 13 offsets, so at most 4 records and at least none.
    tail = plan_fetch(part, 6, 13, True, max_records=1)
    assert [(s.first_offset, s.next_offset, s.rows, s.min_rows) for s in tail.slices] == [
        (6, 13, 4, 0)
    ]
    assert tail.position == 13  # if every row of the slice is returned


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0, 13, SPARSE), (5, 11, [5, 10]), (6, 10, []), (6, 12, [10, 11]), (11, 13, [11])],
)
def test_scan_ranges_cut_a_merged_segment_by_offset(
    wh: Warehouse, start: int, end: int, expected: list[int]
) -> None:
    compacted_table(wh, T)
    scan = wh.table(T).scan(starting_offsets=start, ending_offsets={0: end})
    got = scan.to_arrow()
    assert got.column("offset").to_pylist() == expected
    assert scan.count() == len(expected)
    values = got.column("value").to_pylist()
    assert got.column("headers").to_pylist() == [[{"key": "h", "value": v}] for v in values]


def _rows_poll(c: Consumer, cap: int) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    ends = c.end_offsets(c.assignment())
    while any(c.position(tp) < ends[tp] for tp in ends):
        got = c.poll(max_records=cap)
        assert got, "a poll returned nothing while records remained"
        assert sum(len(v) for v in got.values()) <= cap
        for tp, recs in got.items():
            out.extend(
                (tp.partition, r.offset, r.key, r.value, [{"key": k, "value": v} for k, v in h])
                for r in recs
                for h in [r.headers]
            )
    return out


def _rows_arrow(c: Consumer, cap: int, twin: Consumer) -> list[tuple[Any, ...]]:
    """Drain ``c`` with ``poll_arrow``, checking positions against ``twin`` polled alike."""
    out: list[tuple[Any, ...]] = []
    ends = c.end_offsets(c.assignment())
    while any(c.position(tp) < ends[tp] for tp in ends):
        got = c.poll_arrow(max_records=cap)
        twin.poll(max_records=cap)
        assert {tp: c.position(tp) for tp in ends} == {tp: twin.position(tp) for tp in ends}
        assert got and sum(t.num_rows for t in got.values()) <= cap
        for tp, table in got.items():
            out.extend(
                (tp.partition, r["offset"], r["key"], r["value"], r["headers"])
                for r in table.to_pylist()
            )
    return out


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
@pytest.mark.parametrize("cap", [1, 2, 3, 5, 10_000])
@pytest.mark.parametrize("compact", [False, True])
def test_scan_poll_arrow_and_poll_agree_over_maintained_segments(
    wh: Warehouse, level: str, cap: int, compact: bool
) -> None:
    sparse_history(wh, T, partitions=2)
    table = wh.table(T)
    table.optimize(target_bytes=1_500)  # several merged segments per partition
    if compact:
        table.compact(now=0)
    snap = wh.table(T).snapshot()
    merged = [e for p in snap.partitions for e in p.entries if isinstance(e, Segment)]
    assert merged and any(s.count < s.endOffset - s.baseOffset for s in merged)

    def consumer() -> Consumer:
        c = Consumer(wh, isolation_level=level, auto_offset_reset="earliest")
        c.assign([TP0, TP1])
        return c

    consumers = [consumer() for _ in range(3)]
    polled = _rows_poll(consumers[0], cap)
    arrow = _rows_arrow(consumers[1], cap, consumers[2])
    for c in consumers:
        c.close()
    scanned = [
        (r["partition"], r["offset"], r["key"], r["value"], r["headers"])
        for r in table.scan(isolation_level=level).to_arrow().to_pylist()
    ]
    assert sorted(polled) == sorted(arrow) == scanned
    if compact:
        assert [o for p, o, *_ in scanned if p == 0] == SPARSE


def test_read_ahead_keeps_a_merged_segment_until_the_position_passes_its_end(
    memory_store: MemoryStore,
) -> None:
    log = SegmentLog(memory_store)
    wh = Warehouse(store=log)
    seg = compacted_table(wh, T)
    c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TP0])
    got = []
    while batch := c.poll(max_records=1):
        got += [r.offset for r in batch[TP0]]
    assert got == SPARSE
    # Held until the position passed offset 13, not baseOffset + count (4): read once.
    assert log.reads.count(seg.path) == 1
    c.close()


def test_a_merged_segment_whose_offsets_contradict_its_action_is_refused(
    wh: Warehouse,
) -> None:
    seg = compacted_table(wh, T)
    data = read_segment(wh.store, seg.path, seg.count, merged=True)
    moved = data.set_column(0, "offset", pc.add(data.column("offset"), 1000))
    wh.store.put_data_file(seg.path, encode_table(moved))
    with pytest.raises(SchemaMismatchError, match="offsets are not strictly increasing"):
        wh.table(T).scan().to_arrow()
    c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TP0])
    for poll in (c.poll, c.poll_arrow):
        with pytest.raises(SchemaMismatchError):
            poll(max_records=1)
        assert c.position(TP0) == 0  # nothing moved
    c.close()


@pytest.mark.parametrize(
    ("start0", "cap", "expected", "positions"),
    [
        # Partition 0's range holds no record (only the gap before 13): partition 1 still
        # gets the whole limit, so the poll is not empty.
        (12, 1, {TP1: [4]}, (13, 5)),
        # Partition 0 returns more than the plan could promise (2 of at most 4): partition
        # 1 gets what is left of the limit, no more.
        (6, 3, {TP0: [10, 11], TP1: [4]}, (13, 5)),
        # ... or nothing at all, and its position stays.
        (6, 2, {TP0: [10, 11]}, (13, 0)),
    ],
)
def test_one_limit_across_partitions_with_sparse_merged_segments(
    wh: Warehouse,
    start0: int,
    cap: int,
    expected: dict[TopicPartition, list[int]],
    positions: tuple[int, int],
) -> None:
    compacted_table(wh, T, partitions=2)
    c = Consumer(wh, isolation_level="read_committed")
    c.assign([TP0, TP1])  # the first poll reads partition 0 first
    c.seek(TP0, start0)
    c.seek(TP1, 0)
    got = c.poll(max_records=cap)
    assert {tp: [r.offset for r in recs] for tp, recs in got.items()} == expected
    assert (c.position(TP0), c.position(TP1)) == positions
    c.close()


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_committed_transaction_after_an_abort_whose_marker_was_merged(
    wh: Warehouse, level: str
) -> None:
    """An aborted transaction that starts below a merged range keeps its index entry while its
    ABORT marker is merged away; the producer's later, committed transaction stays visible.

    Found by the exactly-once harness (a lost committed write): the filter waited for the
    ABORT marker to clear the producer, so every later transaction of it was hidden, and the
    next optimize dropped those records for every reader.
    """
    wh.create_table(T, partitions=1)
    txn = Producer(wh, transactional_id="p", **MANUAL)
    idem = Producer(wh, **MANUAL)
    txn.init_transactions()
    txn.begin_transaction()
    txn.send(T, value=b"a0", partition=0)
    txn.flush()  # offset 0
    idem.send(T, value=b"i1", partition=0)
    idem.flush()  # offset 1
    txn.send(T, value=b"a2", partition=0)
    txn.flush()  # offset 2
    txn.abort_transaction()  # ABORT marker 3, abortedTxn (first 0, last 3)
    idem.send(T, value=b"i4", partition=0)
    idem.flush()  # offset 4
    table = wh.table(T)
    # The log start passes the aborted transaction's first batch, not its marker: the index
    # entry stays, and the merge rewrites [1, 5), the marker included.
    table.delete_records({0: 1})
    assert table.optimize().segments_written == 1
    part = wh.table(T).snapshot().partition(0)
    assert isinstance(part.entries[0], Segment)
    assert (part.entries[0].baseOffset, part.entries[0].endOffset) == (1, 5)
    assert [(a.firstOffset, a.lastOffset) for a in part.aborted] == [(0, 3)]
    txn.begin_transaction()
    txn.send(T, value=b"c5", partition=0)
    txn.commit_transaction()  # offset 5, COMMIT marker 6
    want = [(1, b"i1"), (4, b"i4"), (5, b"c5")]
    assert read(wh, T, level)[0] == want
    got = wh.table(T).scan(isolation_level=level).to_arrow()
    assert list(zip(got["offset"].to_pylist(), got["value"].to_pylist(), strict=True)) == want
    # The next merge keeps the committed record (it classifies with the same filter).
    wh.table(T).optimize(target_bytes=1 << 30)
    assert read(wh, T, level)[0] == want
    idem.close()
    txn.close()


def test_optimize_after_delete_records_on_a_v1_table_keeps_the_table_readable(
    wh: Warehouse,
) -> None:
    """A v1 table keeps entries below its log start; the merge's own commit upgrades it to v2,
    which drops them. A run planned from those entries made a version no reader could replay
    (``CorruptLogError``: segment does not start at a retained entry), bricking the table.
    """
    wh.create_table(T, partitions=1)
    idem = Producer(wh, **MANUAL)
    for i in range(4):
        idem.send(T, value=f"v{i}".encode(), partition=0)
        idem.flush()
    idem.close()
    table = wh.table(T)
    table.delete_records({0: 2})
    assert table.snapshot().protocol.minReaderVersion == 1  # type: ignore[union-attr]
    report = table.optimize()
    assert report.segments_written == 1
    fresh = Warehouse(wh.url).table(T).snapshot()  # a cold replay of the log
    seg = fresh.partition(0).entries[0]
    assert isinstance(seg, Segment) and (seg.baseOffset, seg.endOffset) == (2, 4)
    assert read(wh, T, "read_committed")[0] == [(2, b"v2"), (3, b"v3")]


def test_a_merge_planned_before_a_concurrent_delete_records_drops_the_runs_it_passed(
    wh: Warehouse,
) -> None:
    """The rebase check of a merge refuses runs starting wholly below a log start moved
    between planning and commit (the v2 upgrade would drop their entries)."""
    from txntable.maintenance.merge import plan_commit, plan_groups

    wh.create_table(T, partitions=1)
    idem = Producer(wh, **MANUAL)
    for i in range(4):
        idem.send(T, value=f"v{i}".encode(), partition=0)
        idem.flush()
    idem.close()
    table = wh.table(T)
    runs = plan_groups(table.snapshot().partition(0), 1 << 30)
    assert [(r.base_offset, r.end_offset) for r in runs] == [(0, 4)]
    table.delete_records({0: 2})
    seg = Segment(0, 0, 4, 4, "t/data/0/x.parquet", 1)
    assert plan_commit(table.snapshot(), [(runs[0], seg)]).actions == []
