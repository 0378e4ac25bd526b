"""``Table.scan`` and the Arrow poll: exact records, offsets, columns and errors.

The table built by ``history`` has, on partition 0 (offsets in brackets):

* an idempotent batch ``a0 a1`` [0-1];
* a committed transaction ``c0 c1 c2`` [2-4], COMMIT [5];
* an aborted transaction ``x0 x1`` [6-7], ABORT [8];
* an idempotent batch ``b0`` [9];
* an open transaction ``o0`` [10] (the LSO is 10, the high watermark 11);

and on partition 1 one committed transaction ``p0 p1`` [0-1], COMMIT [2].
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from tableutil import SegmentLog, drain, write_batch

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    InvalidConfigurationError,
    MissingSegmentError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from txntable.protocol.records import READ_SCHEMA
from txntable.read.reader import prefetch
from txntable.storage import MemoryStore

MakeProducer = Callable[..., Producer]
T = "orders"
TP0, TP1 = TopicPartition(T, 0), TopicPartition(T, 1)


@dataclass
class History:
    wh: Warehouse
    open_txn: Producer
    aborted_paths: list[str]
    committed_paths: list[str]


def _send(p: Producer, partition: int, *values: bytes, key: bytes | None = None) -> None:
    for v in values:
        p.send(T, value=v, key=key, partition=partition, headers=[("h", v)], timestamp=7)
    p.flush()


@pytest.fixture
def history(wh: Warehouse, make_producer: MakeProducer) -> History:
    wh.create_table(T, partitions=2)
    idem = make_producer(wh)
    tx = make_producer(wh, transactional_id="tx")
    tx.init_transactions()
    _send(idem, 0, b"a0", b"a1", key=b"k")
    tx.begin_transaction()
    _send(tx, 0, b"c0", b"c1", b"c2")
    tx.commit_transaction()
    tx.begin_transaction()
    _send(tx, 0, b"x0", b"x1")
    tx.abort_transaction()
    _send(idem, 0, b"b0")
    tx.begin_transaction()
    _send(tx, 1, b"p0", b"p1")
    tx.commit_transaction()
    other = make_producer(wh, transactional_id="open")
    other.init_transactions()
    other.begin_transaction()
    _send(other, 0, b"o0")
    snap = wh.table(T).snapshot()
    part0 = snap.partition(0)
    assert (part0.last_stable_offset, part0.high_watermark) == (10, 11)
    batches = [e for e in part0.entries if hasattr(e, "path")]
    aborted = [b.path for b in batches if b.baseOffset == 6]
    committed = [b.path for b in batches if b.baseOffset != 6]
    return History(wh, other, aborted, committed)


def rows(table: pa.Table) -> list[tuple[int, int, bytes | None]]:
    return [
        (r["partition"], r["offset"], r["value"])
        for r in table.select(["partition", "offset", "value"]).to_pylist()
    ]


COMMITTED_0 = [
    (0, 0, b"a0"),
    (0, 1, b"a1"),
    (0, 2, b"c0"),
    (0, 3, b"c1"),
    (0, 4, b"c2"),
    (0, 9, b"b0"),
]
COMMITTED_1 = [(1, 0, b"p0"), (1, 1, b"p1")]


def test_read_committed_scan_returns_exactly_the_committed_records(history: History) -> None:
    table = history.wh.table(T).scan().to_arrow()
    assert table.schema == READ_SCHEMA
    assert rows(table) == COMMITTED_0 + COMMITTED_1
    first = table.slice(0, 1).to_pylist()[0]
    assert first["topic"] == T and first["key"] == b"k"
    assert first["headers"] == [{"key": "h", "value": b"a0"}]
    assert first["timestamp"].timestamp() == 0.007


def test_read_uncommitted_scan_includes_aborted_and_open_data(history: History) -> None:
    scan = history.wh.table(T).scan(isolation_level="read_uncommitted")
    expected_0 = COMMITTED_0[:5] + [(0, 6, b"x0"), (0, 7, b"x1"), (0, 9, b"b0"), (0, 10, b"o0")]
    assert rows(scan.to_arrow()) == expected_0 + COMMITTED_1
    assert scan.count() == len(expected_0) + 2


def test_partitions_and_offset_ranges_are_exact(history: History) -> None:
    table = history.wh.table(T)
    got = table.scan(starting_offsets={0: 1}, ending_offsets={0: 4}, partitions=[0])
    assert rows(got.to_arrow()) == [(0, 1, b"a1"), (0, 2, b"c0"), (0, 3, b"c1")]
    assert [(r.partition, r.start, r.end) for r in got.ranges] == [(0, 1, 4)]
    # Partitions in the order asked; an end past the LSO is lowered to it.
    got = table.scan(starting_offsets={0: 3}, ending_offsets={0: 11}, partitions=[1, 0])
    assert rows(got.to_arrow()) == COMMITTED_1 + [(0, 3, b"c1"), (0, 4, b"c2"), (0, 9, b"b0")]
    # Offsets inside skipped entries return nothing; "latest" start is empty.
    assert rows(table.scan(starting_offsets={0: 5}, ending_offsets={0: 9, 1: 0}).to_arrow()) == []
    assert table.scan(starting_offsets="latest").count() == 0
    # One offset for every partition.
    assert rows(table.scan(starting_offsets=1, partitions=[1]).to_arrow()) == COMMITTED_1[1:]


def test_time_travel_reads_the_table_as_of_a_version(history: History) -> None:
    table = history.wh.table(T)
    log_versions = table.snapshot().version
    seen = []
    for v in range(log_versions + 1):
        seen.append(rows(table.scan(version=v).to_arrow()))
    assert seen[0] == []
    assert seen[-1] == COMMITTED_0 + COMMITTED_1
    # Every version's scan is a prefix-closed view: what one version returns, later ones keep.
    for before, after in zip(seen, seen[1:], strict=False):
        assert set(before) <= set(after)
    assert table.scan(version=log_versions).snapshot.version == log_versions


def test_scan_pins_its_snapshot(history: History) -> None:
    table = history.wh.table(T)
    scan = table.scan()
    history.open_txn.commit_transaction()  # moves the LSO; the scan was planned before
    assert rows(scan.to_arrow()) == COMMITTED_0 + COMMITTED_1
    assert (0, 10, b"o0") in rows(table.scan().to_arrow())


def test_aborted_segments_are_never_fetched(history: History) -> None:
    for path in history.aborted_paths:
        history.wh.store.delete(path)
    table = history.wh.table(T)
    assert rows(table.scan().to_arrow()) == COMMITTED_0 + COMMITTED_1
    # The consumer skips them without reading them too.
    consumer = Consumer(history.wh, isolation_level="read_committed")
    consumer.assign([TP0])
    consumer.seek_to_beginning()
    got = drain(consumer, [TP0])[TP0]
    assert [(r.offset, r.value) for r in got] == [(o, v) for _, o, v in COMMITTED_0]
    # read_uncommitted needs them: the missing segment is an error there.
    with pytest.raises(MissingSegmentError):
        table.scan(isolation_level="read_uncommitted").to_arrow()


def test_missing_committed_segment_raises_and_moves_no_position(history: History) -> None:
    history.wh.store.delete(history.committed_paths[1])  # the committed transaction's batch
    table = history.wh.table(T)
    with pytest.raises(MissingSegmentError):
        table.scan().to_arrow()
    with pytest.raises(MissingSegmentError):
        list(table.scan(partitions=[0]).to_batches())
    assert rows(table.scan(partitions=[1]).to_arrow()) == COMMITTED_1
    for arrow in (False, True):
        consumer = Consumer(history.wh, isolation_level="read_committed")
        consumer.assign([TP0, TP1])
        consumer.seek_to_beginning()
        poll = consumer.poll_arrow if arrow else consumer.poll
        with pytest.raises(MissingSegmentError):
            poll(timeout_ms=0, max_records=100)
        # Nothing was returned, so no position moved (partition 1 was fine, but the error
        # came before anything was handed out).
        assert (consumer.position(TP0), consumer.position(TP1)) == (0, 0)
        consumer.close()


def test_offsets_out_of_range_and_bad_arguments(history: History) -> None:
    table = history.wh.table(T)
    with pytest.raises(OffsetOutOfRangeError):
        table.scan(starting_offsets={0: 12})  # past the high watermark
    table.delete_records({0: 2})
    with pytest.raises(OffsetOutOfRangeError):
        table.scan(starting_offsets={0: 1})  # below the log start offset
    assert rows(table.scan(partitions=[0]).to_arrow())[0] == (0, 2, b"c0")
    with pytest.raises(UnknownTopicOrPartitionError):
        table.scan(partitions=[2])
    with pytest.raises(OffsetOutOfRangeError):
        table.scan(starting_offsets={5: 0})
    for bad in (
        {"isolation_level": "committed"},
        {"starting_offsets": "first"},
        {"starting_offsets": {0: -3}},
        {"starting_offsets": {"0": 1}},
        {"ending_offsets": 1.5},
        {"partitions": ["0"]},
        {"max_workers": 0},
        {"max_bytes_in_flight": True},
    ):
        with pytest.raises(InvalidConfigurationError):
            table.scan(**bad)


def test_to_batches_streams_in_order_and_to_pandas(history: History) -> None:
    scan = history.wh.table(T).scan(max_workers=2)
    batches = list(scan.to_batches())
    assert all(b.schema == READ_SCHEMA for b in batches)
    assert rows(pa.Table.from_batches(batches)) == rows(scan.to_arrow())
    pd = pytest.importorskip("pandas")
    frame = scan.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == READ_SCHEMA.names
    assert list(frame["offset"]) == [o for _, o, _ in COMMITTED_0 + COMMITTED_1]


def test_empty_table_scans_to_an_empty_table(wh: Warehouse) -> None:
    wh.create_table("empty", partitions=3)
    table = wh.table("empty").scan().to_arrow()
    assert table.schema == READ_SCHEMA and table.num_rows == 0


@pytest.mark.parametrize("typed", [False, True])
def test_no_columns_still_counts_every_row(wh: Warehouse, typed: bool) -> None:
    # pyarrow's dataset.to_table(columns=[]) returns the row count: so does scan().
    schema = pa.schema([("a", pa.int64())]) if typed else None
    wh.create_table("n", partitions=2, schema=schema)
    with Producer(wh) as p:
        for i in range(5):
            p.send("n", {"a": i} if typed else b"v", partition=i % 2)
    wh.table("n").optimize()  # merged segments on both partitions
    with Producer(wh) as p:
        p.send("n", {"a": 9} if typed else b"v", partition=0)
    scan = wh.table("n").scan(columns=[])
    table = scan.to_arrow()
    assert (table.num_rows, table.num_columns) == (6, 0)
    assert sum(b.num_rows for b in scan.to_batches()) == 6
    assert len(scan.to_pandas()) == 6
    assert wh.table("n").scan(columns=[], partitions=[1]).to_arrow().num_rows == 2


# --- bounded read-ahead ---------------------------------------------------------------------


def test_prefetch_runs_at_most_window_ahead_and_stops_early() -> None:
    started: list[int] = []
    lock = threading.Lock()

    def fn(i: int) -> int:
        with lock:
            started.append(i)
        return i * 10

    def items() -> Iterator[int]:
        yield from range(100)

    out = prefetch(items(), fn, window=3)
    assert next(out) == 0
    time.sleep(0.05)  # let the pool run whatever was submitted
    assert len(started) <= 4  # the one returned, plus at most the window ahead
    out.close()
    time.sleep(0.05)
    assert len(started) <= 4
    assert list(prefetch(range(10), fn, window=4)) == [i * 10 for i in range(10)]


def test_prefetch_byte_budget_bounds_what_is_held() -> None:
    held = 0
    peak = 0
    lock = threading.Lock()

    def fn(i: int) -> int:
        nonlocal held, peak
        with lock:
            held += 10
            peak = max(peak, held)
        return i

    for i in prefetch(range(20), fn, window=8, size=lambda _: 10, max_bytes=30):
        with lock:
            held -= 10
        assert i >= 0
    assert peak <= 30 + 10  # the budget, plus the item being handed out
    # An item bigger than the whole budget still goes through, alone.
    assert list(prefetch(range(3), lambda i: i, window=4, size=lambda _: 99, max_bytes=10)) == [
        0,
        1,
        2,
    ]


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_poll_reads_ahead_within_fetch_max_bytes_and_fetches_each_segment_once(
    memory_store: MemoryStore,
) -> None:
    log = SegmentLog(memory_store)
    wh = Warehouse(store=log)
    table = wh.create_table(T, partitions=1)
    for i in range(8):
        write_batch(table, 0, [b"%d-%d" % (i, j) for j in range(4)])
    batches = [e for e in table.snapshot().partition(0).entries]
    paths = [b.path for b in batches]  # type: ignore[union-attr]
    size = batches[0].size  # type: ignore[union-attr]
    assert all(b.size == size for b in batches)  # type: ignore[union-attr]
    consumer = Consumer(wh, auto_offset_reset="earliest", fetch_max_bytes=3 * size)
    consumer.assign([TP0])
    got = consumer.poll(max_records=2)  # half of segment 0
    assert [r.offset for r in got[TP0]] == [0, 1]
    # Segment 0 is still held (half read), so two more fit in the budget: 1 and 2.
    _wait_for(lambda: len(log.reads) >= 3)
    time.sleep(0.05)
    assert log.reads == paths[:3]
    values = [r.value for r in got[TP0]]
    while batch := consumer.poll(max_records=3):
        values.extend(r.value for r in batch[TP0])
    assert values == [b"%d-%d" % (i, j) for i in range(8) for j in range(4)]
    assert sorted(log.reads) == sorted(paths)  # each segment fetched exactly once
    consumer.close()


def test_fetch_max_bytes_must_be_positive(wh: Warehouse) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidConfigurationError):
            Consumer(wh, fetch_max_bytes=bad)  # type: ignore[arg-type]


# --- Arrow poll ----------------------------------------------------------------------------


def _drain_arrow(consumer: Consumer, max_records: int) -> list[tuple[Any, ...]]:
    out = []
    while batch := consumer.poll_arrow(max_records=max_records):
        for tp, table in batch.items():
            assert table.schema == READ_SCHEMA
            assert set(table.column("topic").to_pylist()) == {tp.topic}
            assert set(table.column("partition").to_pylist()) == {tp.partition}
            out.extend(
                (tp.partition, r["offset"], r["key"], r["value"], r["headers"])
                for r in table.to_pylist()
            )
    return out


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
@pytest.mark.parametrize("max_records", [1, 2, 500])
def test_arrow_poll_equals_poll_and_moves_positions_alike(
    history: History, level: str, max_records: int
) -> None:
    a = Consumer(history.wh, isolation_level=level, auto_offset_reset="earliest")
    b = Consumer(history.wh, isolation_level=level, auto_offset_reset="earliest")
    for c in (a, b):
        c.assign([TP0, TP1])
    records = []
    arrow = []
    while True:
        polled = a.poll(max_records=max_records)
        polled_arrow = b.poll_arrow(max_records=max_records)
        assert list(polled) == list(polled_arrow)
        for tp, recs in polled.items():
            records.extend(
                (tp.partition, r.offset, r.key, r.value, [{"key": k, "value": v} for k, v in h])
                for r in recs
                for h in [r.headers]
            )
        for tp, table in polled_arrow.items():
            arrow.extend(
                (tp.partition, r["offset"], r["key"], r["value"], r["headers"])
                for r in table.to_pylist()
            )
        assert {tp: a.position(tp) for tp in (TP0, TP1)} == {
            tp: b.position(tp) for tp in (TP0, TP1)
        }
        if not polled:
            break
    assert records == arrow
    end = 10 if level == "read_committed" else 11
    assert (a.position(TP0), a.position(TP1)) == (end, 3)
    expected = history.wh.table(T).scan(isolation_level=level).to_arrow()
    assert sorted((p, o, v) for p, o, _, v, _ in records) == sorted(rows(expected))
    a.close()
    b.close()


def test_poll_records_carry_every_field(history: History) -> None:
    consumer = Consumer(history.wh, isolation_level="read_committed", auto_offset_reset="earliest")
    consumer.assign([TP0])
    record = consumer.poll(max_records=1)[TP0][0]
    # kafka-python's order: topic, partition, leader_epoch, offset, timestamp,
    # timestamp_type, key, value, headers, checksum, then the serialized sizes
    assert record == (T, 0, -1, 0, 7, 0, b"k", b"a0", [("h", b"a0")], None, 1, 2, 3)
    assert (record.topic, record.partition, record.offset, record.timestamp) == (T, 0, 0, 7)
    assert record.headers == [("h", b"a0")]
    consumer.close()
