"""Pure tests of the Spark source's planning, options, executor scan and writer logic.

No SparkSession: tables live in memory stores and are written through the real commit path.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import AnalysisException
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from sparkutil import TableWriter, arrow_rows, rec

from txntable.errors import (
    InvalidConfigurationError,
    InvalidTableNameError,
    OffsetOutOfRangeError,
)
from txntable.protocol.actions import Batch
from txntable.warehouse import Warehouse
from txntable_spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    parse_read_options,
    parse_write_options,
    split_table_path,
)
from txntable_spark.planning import (
    OffsetRange,
    SegmentSlice,
    limit_offsets,
    limit_segments,
    pack_slices,
    plan_ranges,
    plan_scan,
    resolve_ranges,
)
from txntable_spark.scan import read_slices


def _wh() -> Warehouse:
    return Warehouse(f"memory://spark-plan-{uuid.uuid4().hex}")


def _opts(wh: Warehouse, name: str, **extra: str):  # type: ignore[no-untyped-def]
    return parse_read_options({"path": f"{wh.url}/{name}", **extra})


def _offsets(groups: list[list[SegmentSlice]]) -> list[tuple[int, int]]:
    return sorted(
        (s.partition, s.base_offset + i)
        for g in groups
        for s in g
        for i in range(s.row_start, s.row_stop)
    )


def _model_offsets(tw: TableWriter, **kw) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [(r[0], r[1]) for r in tw.expected(**kw)]


@pytest.fixture
def mixed() -> TableWriter:
    """Two partitions: plain data, a committed and an aborted txn interleaved, an open txn."""
    tw = TableWriter(_wh(), "orders", 2)
    tw.batch(0, [rec(i, b"k") for i in range(4)])  # 0-3
    tw.batch(0, [rec(10 + i) for i in range(3)], pid=1, txn=True)  # 4-6 aborted
    tw.batch(0, [rec(20 + i) for i in range(2)], pid=2, txn=True)  # 7-8 committed
    tw.batch(1, [rec(30 + i) for i in range(2)], pid=1, txn=True)  # p1 0-1 aborted
    tw.end_txn(1, commit=False)  # markers: p0 9, p1 2
    tw.batch(0, [rec(40)])  # 10
    tw.end_txn(2, commit=True)  # p0 11
    tw.batch(1, [rec(50 + i) for i in range(3)])  # p1 3-5
    tw.batch(0, [rec(60 + i) for i in range(2)], pid=3, txn=True)  # p0 12-13 open: LSO 12
    tw.batch(0, [rec(70)])  # 14 (above the LSO)
    return tw


def test_read_committed_plan_matches_model(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    groups = plan_scan(snap, _opts(mixed.warehouse, "orders"))
    assert _offsets(groups) == _model_offsets(mixed)
    assert snap.partition(0).last_stable_offset == 12
    assert max(o for p, o in _offsets(groups) if p == 0) == 10


def test_read_uncommitted_plan_includes_aborted_and_open(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    opts = _opts(mixed.warehouse, "orders", **{"isolation.level": "READ_UNCOMMITTED"})
    assert _offsets(plan_scan(snap, opts)) == _model_offsets(mixed, read_committed=False)


def test_aborted_segments_are_never_planned(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    aborted = {
        e.path for e in snap.partition(0).entries if isinstance(e, Batch) and e.producerId == 1
    }
    planned = {s.path for g in plan_scan(snap, _opts(mixed.warehouse, "orders")) for s in g}
    assert aborted and not aborted & planned


def test_offsets_slice_segments(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    opts = _opts(
        mixed.warehouse,
        "orders",
        startingOffsets='{"orders": {"0": 2, "1": -2}}',
        endingOffsets='{"orders": {"0": 8, "1": 4}}',
    )
    groups = plan_scan(snap, opts)
    assert _offsets(groups) == _model_offsets(mixed, start={0: 2}, end={0: 8, 1: 4})
    first = next(s for g in groups for s in g if s.partition == 0)
    assert (first.base_offset, first.row_start, first.row_stop) == (0, 2, 4)


def test_ending_offset_beyond_lso_is_clamped(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    opts = _opts(mixed.warehouse, "orders", endingOffsets='{"orders": {"0": 100}}')
    ranges = resolve_ranges(snap, opts.starting, opts.ending, True)
    assert ranges[0] == OffsetRange(0, 0, 12)
    ranges = resolve_ranges(snap, opts.starting, opts.ending, False)
    assert ranges[0] == OffsetRange(0, 0, 15)


def test_start_inside_open_txn_is_empty(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    opts = _opts(mixed.warehouse, "orders", startingOffsets='{"orders": {"0": 13}}')
    assert [s for g in plan_scan(snap, opts) for s in g if s.partition == 0] == []


def test_out_of_range_offsets(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    with pytest.raises(OffsetOutOfRangeError):
        plan_scan(snap, _opts(mixed.warehouse, "orders", startingOffsets='{"orders": {"0": 99}}'))
    with pytest.raises(OffsetOutOfRangeError):
        plan_scan(snap, _opts(mixed.warehouse, "orders", startingOffsets='{"orders": {"7": 0}}'))


def test_log_start_offset_and_fail_on_data_loss() -> None:
    from txntable.protocol.actions import LogStart

    tw = TableWriter(_wh(), "t", 1)
    for i in range(3):
        tw.batch(0, [rec(i)])
    snap = tw.table.snapshot()
    from txntable.protocol.snapshot import apply_action

    apply_action(snap, LogStart(0, 2))
    start = '{"t": {"0": 0}}'
    with pytest.raises(OffsetOutOfRangeError):
        plan_scan(snap, _opts(tw.warehouse, "t", startingOffsets=start))
    groups = plan_scan(
        snap, _opts(tw.warehouse, "t", startingOffsets=start, failOnDataLoss="false")
    )
    assert _offsets(groups) == [(0, 2)]
    assert _offsets(plan_scan(snap, _opts(tw.warehouse, "t"))) == [(0, 2)]


def test_time_travel_snapshot_plans_old_state(mixed: TableWriter) -> None:
    v = mixed.table.snapshot().version
    mixed.batch(1, [rec(99)])
    old = mixed.table.snapshot_at(v)
    new = mixed.table.snapshot()
    opts = _opts(mixed.warehouse, "orders")
    assert len(_offsets(plan_scan(new, opts))) == len(_offsets(plan_scan(old, opts))) + 1


def test_packing_by_bytes_and_min_partitions() -> None:
    slices = [SegmentSlice(0, f"s{i}", i * 10, 10, 0, 10, 100) for i in range(10)]
    assert [len(g) for g in pack_slices(slices, 250)] == [2, 2, 2, 2, 2]
    assert [len(g) for g in pack_slices(slices, 10_000)] == [10]
    assert [len(g) for g in pack_slices(slices, 10_000, min_partitions=4)] == [3, 3, 3, 1]
    assert len(pack_slices(slices, 10_000, min_partitions=4, min_bytes=600)) == 2
    assert len(pack_slices(slices, 1)) == 10  # a segment is never split
    half = SegmentSlice(0, "x", 0, 10, 0, 5, 100)
    assert half.est_bytes == 50
    assert pack_slices([], 10) == []


def test_limit_offsets_is_proportional() -> None:
    start = {0: 0, 1: 100, 2: 5}
    available = {0: 1000, 1: 200, 2: 5}
    out = limit_offsets(start, available, 110)
    assert out == {0: 100, 1: 110, 2: 5}
    assert limit_offsets(start, available, 10_000) == available
    # A tiny share still moves a partition forward.
    assert limit_offsets({0: 0, 1: 0}, {0: 1000, 1: 1}, 10)[1] == 1


def test_plan_ranges_for_streaming(mixed: TableWriter) -> None:
    snap = mixed.table.snapshot()
    groups = plan_ranges(snap, [OffsetRange(0, 3, 9)], True, 1 << 30)
    assert _offsets(groups) == [(0, 3), (0, 7), (0, 8)]


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/tmp/lake/orders", ("/tmp/lake", "orders")),
        ("/tmp/lake/orders/", ("/tmp/lake", "orders")),
        ("file:///tmp/lake/orders", ("file:///tmp/lake", "orders")),
        ("file:///orders", ("file:///", "orders")),
        ("s3://bucket/prefix/orders", ("s3://bucket/prefix", "orders")),
        ("s3://bucket/orders", ("s3://bucket", "orders")),
        ("memory://name/orders", ("memory://name", "orders")),
        ("lake/orders", ("lake", "orders")),
    ],
)
def test_split_table_path(path: str, expected: tuple[str, str]) -> None:
    assert split_table_path(path) == expected


@pytest.mark.parametrize("path", ["orders", "memory://orders", "s3://bucket"])
def test_split_table_path_rejects(path: str) -> None:
    with pytest.raises(InvalidConfigurationError):
        split_table_path(path)


def test_bad_table_name() -> None:
    with pytest.raises(InvalidTableNameError):
        split_table_path("/lake/_coordinator")


@pytest.mark.parametrize(
    "options",
    [
        {"isolation.level": "serializable"},
        {"startingOffsets": "yesterday"},
        {"startingOffsets": '{"other": {"0": 1}}'},
        {"startingOffsets": '{"t": {"x": 1}}'},
        {"startingOffsets": '{"t": {"0": -3}}'},
        {"startingOffsets": "latest"},
        {"startingOffsets": '{"t": {"0": -1}}'},
        {"endingOffsets": "earliest"},
        {"versionAsOf": "-1"},
        {"versionAsOf": "abc"},
        {"maxBytesPerPartition": "0"},
        {"failOnDataLoss": "maybe"},
    ],
)
def test_bad_read_options(options: dict[str, str]) -> None:
    with pytest.raises(InvalidConfigurationError):
        parse_read_options({"path": "/lake/t", **options})


def test_read_options_parsed() -> None:
    opts = parse_read_options(
        {
            "path": "s3://b/lake/t",
            "isolationlevel": "read_uncommitted",
            "startingoffsets": '{"t": {"0": 5, "2": -2}}',
            "versionasof": "3",
            "storage.s3.endpoint": "http://127.0.0.1:9000",
            "storage.s3.secret-access-key": "hunter2",
        }
    )
    assert not opts.read_committed
    assert opts.starting == OffsetSpec(EARLIEST, {0: 5, 2: EARLIEST})
    assert opts.ending == OffsetSpec(LATEST)
    assert opts.version_as_of == 3
    assert opts.location.warehouse_url == "s3://b/lake"
    assert opts.location.storage_options["s3.secret-access-key"] == "hunter2"
    assert "hunter2" not in repr(opts) and "127.0.0.1" not in repr(opts)


def test_streaming_read_options() -> None:
    opts = parse_read_options({"path": "/l/t", "maxOffsetsPerTrigger": "7"}, streaming=True)
    assert opts.starting == OffsetSpec(LATEST)
    assert opts.max_offsets_per_trigger == 7
    with pytest.raises(InvalidConfigurationError):
        parse_read_options({"path": "/l/t", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(InvalidConfigurationError):
        parse_read_options({"path": "/l/t", "versionAsOf": "1"}, streaming=True)


def test_write_options() -> None:
    loc = {"warehouse": "/l", "table": "t"}
    opts = parse_write_options({**loc, "txnAppId": "etl"}, streaming=True)
    assert (opts.location.warehouse_url, opts.location.table, opts.txn_app_id) == ("/l", "t", "etl")
    opts = parse_write_options({**loc, "txnappid": "etl", "txnversion": "7"})
    assert (opts.txn_app_id, opts.txn_version) == ("etl", 7)
    with pytest.raises(InvalidConfigurationError):
        parse_write_options({})
    with pytest.raises(InvalidConfigurationError):
        parse_write_options({"path": "/l/t", "table": "u"})
    # Delta's idempotent batch write needs both (alone, either would be ignored).
    for one in ({"txnAppId": "etl"}, {"txnVersion": "1"}):
        with pytest.raises(InvalidConfigurationError, match="both txnAppId and txnVersion"):
            parse_write_options({**loc, **one})
    with pytest.raises(InvalidConfigurationError, match="txnVersion must be >= 0"):
        parse_write_options({**loc, "txnAppId": "etl", "txnVersion": "-1"})
    with pytest.raises(InvalidConfigurationError, match="txnVersion does not apply to a stream"):
        parse_write_options({**loc, "txnVersion": "1"}, streaming=True)
    stream = {**loc, "checkpointlocation": "/ck", "queryname": "q"}
    assert parse_write_options(stream, streaming=True).txn_app_id is None
    with pytest.raises(InvalidConfigurationError, match="checkpointLocation does not apply"):
        parse_write_options({**loc, "checkpointLocation": "/ck"})


# --- unknown and unsupported options are refused, never ignored -----------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "stream"])
def test_unknown_read_options_are_refused_listing_the_accepted_ones(streaming: bool) -> None:
    what = "a streaming read" if streaming else "a batch read"
    with pytest.raises(
        InvalidConfigurationError,
        match=rf"unknown option 'kafka.bootstrap.servers' for {what}; accepted: .*"
        r"failOnDataLoss, .*startingOffsets, .*and storage.<storage option>",
    ):
        parse_read_options({"path": "/l/t", "kafka.bootstrap.servers": "b:9092"}, streaming)


@pytest.mark.parametrize("name", ["subscribe", "assign", "subscribePattern", "SUBSCRIBE"])
def test_kafka_topic_selection_options_are_refused(name: str) -> None:
    with pytest.raises(InvalidConfigurationError, match="path .* names the one table"):
        parse_read_options({"path": "/l/t", name: "t"})


def test_timestamp_options_parse() -> None:
    opts = parse_read_options(
        {
            "path": "/l/t",
            "startingOffsetsByTimestamp": '{"t": {"0": 1700000000000, "2": 5}}',
            "endingTimestamp": "1800000000000",
            "startingOffsetsByTimestampStrategy": "LATEST",
            "timestampAsOf": "2023-11-14T22:13:20Z",
        }
    )
    assert opts.starting_timestamps is not None and opts.ending_timestamps is not None
    assert opts.starting_timestamps.timestamps == {0: 1700000000000, 2: 5}
    assert opts.starting_timestamps.for_partition(1) is None
    assert opts.ending_timestamps.for_partition(7) == 1800000000000
    assert opts.starting_timestamp_strategy == "latest"
    assert opts.timestamp_as_of == 1700000000000
    # The global option wins over the per-partition one, as in Spark.
    both = parse_read_options(
        {"path": "/l/t", "startingTimestamp": "9", "startingOffsetsByTimestamp": '{"t": {"0": 1}}'}
    )
    assert both.starting_timestamps is not None and both.starting_timestamps.for_partition(0) == 9
    assert parse_read_options({"path": "/l/t", "startingTimestamp": "9"}, True).starting_timestamps


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingTimestamp": "yesterday"}, "startingTimestamp must be a timestamp"),
        ({"endingTimestamp": "-5"}, "endingTimestamp must be a timestamp"),
        ({"startingOffsetsByTimestamp": '{"other": {"0": 1}}'}, "names table"),
        ({"startingOffsetsByTimestamp": "latest"}, "must be JSON like"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "must be error or latest"),
        ({"timestampAsOf": "last tuesday"}, "timestampAsOf must be"),
        ({"timestampAsOf": "5", "versionAsOf": "1"}, "not both"),
    ],
)
def test_malformed_timestamp_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        parse_read_options({"path": "/l/t", **options})


def test_ending_and_time_travel_options_do_not_apply_to_streams() -> None:
    for name in ("endingTimestamp", "timestampAsOf"):
        with pytest.raises(InvalidConfigurationError, match="does not apply to a streaming read"):
            parse_read_options({"path": "/l/t", name: "5"}, True)


def test_options_of_the_other_mode_are_refused() -> None:
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxFilesPerTrigger"):
        with pytest.raises(InvalidConfigurationError, match=f"{name} does not apply to a batch"):
            parse_read_options({"path": "/l/t", name: "5"})
    for name in ("endingOffsets", "versionAsOf"):
        with pytest.raises(InvalidConfigurationError, match=f"{name} does not apply to a stream"):
            parse_read_options({"path": "/l/t", name: "1"}, streaming=True)
    with pytest.raises(InvalidConfigurationError, match="txnAppId does not apply to a batch read"):
        parse_read_options({"path": "/l/t", "txnAppId": "x"})


def test_storage_options_pass_to_the_storage_layer() -> None:
    opts = parse_read_options({"path": "s3://b/l/t", "storage.s3.region": "eu-west-1"})
    assert opts.location.storage_options == {"s3.region": "eu-west-1"}
    # An unknown storage option is the storage layer's to refuse, in its own words.
    with pytest.raises(InvalidConfigurationError) as info:
        parse_read_options({"path": "s3://b/l/t", "storage.s3.regoin": "eu-west-1"})
    assert "s3.regoin" in str(info.value) and "for a batch read" not in str(info.value)


def test_kafka_isolation_level_spelling_is_honoured() -> None:
    opts = parse_read_options({"path": "/l/t", "kafka.isolation.level": "read_uncommitted"})
    assert not opts.read_committed
    assert parse_read_options({"path": "/l/t", "kafka.isolation.level": "read_committed"})
    with pytest.raises(InvalidConfigurationError, match="isolation level options disagree"):
        parse_read_options(
            {
                "path": "/l/t",
                "kafka.isolation.level": "read_uncommitted",
                "isolation.level": "read_committed",
            }
        )


def test_trigger_options_parsed() -> None:
    base = {"path": "/l/t"}
    opts = parse_read_options({**base, "minOffsetsPerTrigger": "10"}, streaming=True)
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_ms) == (10, 15 * 60 * 1000)
    for text, ms in (("30s", 30_000), ("500ms", 500), ("2m", 120_000), ("1h", 3_600_000)):
        opts = parse_read_options(
            {**base, "minOffsetsPerTrigger": "10", "maxTriggerDelay": text}, streaming=True
        )
        assert opts.max_trigger_delay_ms == ms
    bad = [
        {"minOffsetsPerTrigger": "10", "maxTriggerDelay": "soon"},
        {"minOffsetsPerTrigger": "10", "maxTriggerDelay": "-5s"},
        {"maxTriggerDelay": "1m"},  # only meaningful with minOffsetsPerTrigger
        {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
        {"maxFilesPerTrigger": "0"},
    ]
    for extra in bad:
        with pytest.raises(InvalidConfigurationError):
            parse_read_options({**base, **extra}, streaming=True)
    opts = parse_read_options({**base, "maxFilesPerTrigger": "3"}, streaming=True)
    assert opts.max_files_per_trigger == 3


# --- executor scan ---------------------------------------------------------------------------


def test_read_slices_schema_and_rows(mixed: TableWriter) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from txntable_spark.schema import ARROW_SCHEMA, SPARK_SCHEMA

    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    snap = mixed.table.snapshot()
    opts = _opts(mixed.warehouse, "orders", startingOffsets='{"orders": {"0": 1}}')
    slices = [s for g in plan_scan(snap, opts) for s in g]
    batches = list(read_slices(mixed.warehouse.url, {}, "orders", slices))
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    table = pa.Table.from_batches(batches)
    got = sorted(
        (
            r["partition"],
            r["offset"],
            r["key"],
            r["value"],
            tuple((h["key"], h["value"]) for h in r["headers"]),
            int(r["timestamp"].timestamp() * 1000),
        )
        for r in table.to_pylist()
    )
    assert got == mixed.expected(start={0: 1})
    assert set(table.column("topic").to_pylist()) == {"orders"}


# --- property: planning equals the model for random histories ------------------------------

_op = st.one_of(
    st.tuples(st.just("plain"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("txn"), st.integers(0, 1), st.integers(1, 4), st.integers(1, 3)),
    st.tuples(st.just("end"), st.integers(1, 3), st.booleans()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=14), start=st.integers(0, 6), end_cut=st.integers(0, 8))
def test_plan_matches_model_randomised(ops: list[tuple], start: int, end_cut: int) -> None:
    tw = TableWriter(_wh(), "r", 2)
    n = 0
    for op in ops:
        if op[0] == "plain":
            tw.batch(op[1], [rec(n + i) for i in range(op[2])])
            n += op[2]
        elif op[0] == "txn":
            tw.batch(op[1], [rec(n + i) for i in range(op[2])], pid=op[3], txn=True)
            n += op[2]
        else:
            tw.end_txn(op[1], op[2])
    snap = tw.table.snapshot()
    for read_committed in (True, False):
        hw = snap.partition(0).high_watermark
        s0 = min(start, hw)
        e0 = max(s0, hw - end_cut)
        level = "read_committed" if read_committed else "read_uncommitted"
        opts = _opts(
            tw.warehouse,
            "r",
            **{
                "isolation.level": level,
                "startingOffsets": f'{{"r": {{"0": {s0}}}}}',
                "endingOffsets": f'{{"r": {{"0": {e0}}}}}',
            },
        )
        want = _model_offsets(tw, read_committed=read_committed, start={0: s0}, end={0: e0})
        assert _offsets(plan_scan(snap, opts)) == want


def test_streaming_start_inside_open_txn_is_not_lowered(mixed: TableWriter) -> None:
    from txntable_spark.stream import TxnTableStreamReader

    loc = {"path": f"{mixed.warehouse.url}/orders"}
    reader = TxnTableStreamReader(
        parse_read_options({**loc, "startingOffsets": '{"orders": {"0": 13}}'}, streaming=True)
    )
    start = reader.initialOffset()
    assert start["0"] == 13  # LSO is 12: the stream waits instead of re-reading 12
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["0"] == 13 and reader.partitions(start, end) == []
    mixed.end_txn(3, commit=True)  # marker at 15: LSO -> 16
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"0": 16, "1": 6}
    planned = [s for p in reader.partitions(start, end) for s in p.slices]  # type: ignore[attr-defined]
    assert [(s.partition, s.base_offset + s.row_start) for s in planned if s.partition == 0] == [
        (0, 13),
        (0, 14),
    ]


def test_stream_reader_rate_limit_and_available_now(mixed: TableWriter) -> None:
    from txntable_spark.stream import TxnTableStreamReader

    loc = {"path": f"{mixed.warehouse.url}/orders", "startingOffsets": "earliest"}
    reader = TxnTableStreamReader(parse_read_options({**loc, "maxOffsetsPerTrigger": "4"}, True))
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(4)
    start = reader.initialOffset()
    assert start == {"0": 0, "1": 0}
    reader.prepareForTriggerAvailableNow()
    table = reader._table
    snap = table.snapshot(refresh=False) if table else None
    mixed.batch(1, [rec(999)])  # after the AvailableNow target: not read by this run
    steps = []
    for _ in range(20):
        end = reader.latestOffset(start, limit)
        if end == start:
            break
        steps.append(end)
        start = end
    # 4 offsets a trigger shared in proportion to what each partition has (12 and 6, markers
    # and aborted offsets included), each share rounded down as Spark's Kafka source does.
    assert steps == [{"0": 2 * i, "1": i} for i in range(1, 7)]
    assert start == {"0": 12, "1": 6}
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    # One handle whose snapshot is refreshed in place: no reload per micro-batch.
    assert reader._table is table and table is not None
    assert table.snapshot(refresh=False) is snap and snap.version == mixed.table.snapshot().version


def test_max_files_per_trigger_admits_that_many_segments(mixed: TableWriter) -> None:
    """Visible segments below the LSO: p0 [0-3] [7-8] [10], p1 [3-5] (aborted ones are
    skipped, not counted). Two per trigger, partitions in turn."""
    from pyspark.sql.streaming.datasource import ReadMaxFiles

    from txntable_spark.stream import TxnTableStreamReader

    loc = {"path": f"{mixed.warehouse.url}/orders", "startingOffsets": "earliest"}
    reader = TxnTableStreamReader(parse_read_options({**loc, "maxFilesPerTrigger": "2"}, True))
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxFiles(2)
    start = reader.initialOffset()
    ends = []
    segments: list[int] = []
    while (end := reader.latestOffset(start, limit)) != start:
        planned = [s for p in reader.partitions(start, end) for s in p.slices]  # type: ignore[attr-defined]
        segments.append(len(planned))
        ends.append(end)
        start = end
    assert ends == [{"0": 7, "1": 6}, {"0": 12, "1": 6}]
    assert segments == [2, 2]
    # A trigger that must read everything ignores the option.
    fresh = TxnTableStreamReader(parse_read_options({**loc, "maxFilesPerTrigger": "1"}, True))
    assert fresh.latestOffset(fresh.initialOffset(), ReadAllAvailable()) == {"0": 12, "1": 6}


class _Clock:
    """A settable clock for ``maxTriggerDelay`` (no sleeping, so no flakiness under load)."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(mixed: TableWriter) -> None:
    from pyspark.sql.streaming.datasource import ReadMinRows

    from txntable_spark.stream import TxnTableStreamReader

    loc = {"path": f"{mixed.warehouse.url}/orders", "startingOffsets": "earliest"}
    options = {**loc, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "300ms"}
    clock = _Clock()
    reader = TxnTableStreamReader(parse_read_options(options, True), clock)
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(5)
    start = reader.initialOffset()
    first = reader.latestOffset(start, limit)  # data at the first trigger: not delayed
    assert first == {"0": 12, "1": 6}
    mixed.batch(1, [rec(500), rec(501)])  # 2 new offsets < 5
    clock.ms += 299
    assert reader.latestOffset(first, limit) == first  # wait for more
    clock.ms += 1
    assert reader.latestOffset(first, limit) == {"0": 12, "1": 8}  # the delay is over
    mixed.batch(1, [rec(600 + i) for i in range(5)])  # 5 new offsets: at once
    assert reader.latestOffset({"0": 12, "1": 8}, limit) == {"0": 12, "1": 13}
    # AvailableNow never waits for data that will not come.
    mixed.batch(1, [rec(700)])
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset({"0": 12, "1": 13}, limit) == {"0": 12, "1": 14}


def test_min_offsets_per_trigger_applies_to_the_first_data_of_an_idle_query() -> None:
    """A query that starts with nothing to read waits for its first data like any other
    (Spark's Kafka source starts the delay at the first trigger; issue 26 item 5)."""
    from txntable_spark.stream import TxnTableStreamReader

    tw = TableWriter(_wh(), "orders", 1)
    loc = {"path": f"{tw.warehouse.url}/orders", "startingOffsets": "earliest"}
    options = {**loc, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "1m"}
    clock = _Clock()
    reader = TxnTableStreamReader(parse_read_options(options, True), clock)
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    assert reader.latestOffset(start, limit) == start == {"0": 0}  # nothing yet
    tw.batch(0, [rec(i) for i in range(2)])
    clock.ms += 30_000
    assert reader.latestOffset(start, limit) == start  # 2 < 5, 30 s < 1 min: wait
    clock.ms += 30_000
    assert reader.latestOffset(start, limit) == {"0": 2}  # the delay ran out


def test_include_headers_false_drops_the_column(mixed: TableWriter) -> None:
    from txntable_spark.schema import ARROW_SCHEMA_NO_HEADERS, spark_schema
    from txntable_spark.source import TxnTableDataSource, TxnTableReader

    path = f"{mixed.warehouse.url}/orders"
    source = TxnTableDataSource({"path": path, "includeheaders": "false"})
    names = ["key", "value", "topic", "partition", "offset", "timestamp"]
    assert source.schema().fieldNames() == names
    assert source.schema() == spark_schema(False)
    reader = source.reader(source.schema())
    assert isinstance(reader, TxnTableReader) and not reader.opts.include_headers
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert batches and all(b.schema.equals(ARROW_SCHEMA_NO_HEADERS) for b in batches)
    assert sum(b.num_rows for b in batches) == len(mixed.expected())
    with pytest.raises(InvalidConfigurationError, match="fixed schema"):
        source.reader(spark_schema(True))


def test_version_as_of_beyond_the_newest_names_the_range(mixed: TableWriter) -> None:
    from txntable.errors import VersionNotFoundError
    from txntable_spark.source import load_snapshot

    newest = mixed.table.snapshot().version
    opts = _opts(mixed.warehouse, "orders", versionAsOf=str(newest + 5))
    with pytest.raises(
        VersionNotFoundError,
        match=rf"cannot time travel to version {newest + 5}; available versions: 0\.\.{newest}$",
    ):
        load_snapshot(opts)


@pytest.mark.parametrize("read_committed", [True, False])
def test_table_scan_matches_the_model(read_committed: bool) -> None:
    """``Table.scan`` (the core read path Spark executors use) against the writer's model."""
    wh = _wh()
    tw = TableWriter(wh, "orders", 2)
    tw.batch(0, [rec(i) for i in range(3)])
    tw.batch(0, [rec(10 + i, b"t") for i in range(2)], pid=1, txn=True)
    tw.batch(1, [rec(20 + i, headers=2) for i in range(4)], pid=2, txn=True)
    tw.end_txn(1, commit=False)
    tw.batch(0, [rec(30 + i, b"t") for i in range(2)], pid=2, txn=True)
    tw.end_txn(2, commit=True)
    tw.batch(1, [rec(40)], pid=3, txn=True)  # open
    tw.batch(1, [rec(50 + i) for i in range(2)])  # above the LSO
    level = "read_committed" if read_committed else "read_uncommitted"
    assert arrow_rows(tw.table.scan(isolation_level=level).to_arrow()) == tw.expected(
        read_committed
    )
    ranged = tw.table.scan(
        isolation_level=level, starting_offsets={0: 1, 1: 2}, ending_offsets={0: 7}
    )
    assert arrow_rows(ranged.to_arrow()) == tw.expected(read_committed, {0: 1, 1: 2}, {0: 7})


# --- merged segments (maintenance) ---------------------------------------------------------


@pytest.mark.parametrize(("start", "end"), [(0, 13), (5, 11), (6, 10), (6, 12), (11, 13)])
def test_executor_scan_cuts_a_sparse_merged_segment_by_offset(start: int, end: int) -> None:
    """Spark's plan and executor read of a key-compacted segment (offsets 4, 5, 10, 11 of
    ``[0, 13)``) equal ``Table.scan``, for ranges starting and ending inside its gaps."""
    from maintutil import SPARSE, compacted_table

    wh = _wh()
    compacted_table(wh, "orders", partitions=2)
    snap = wh.table("orders").snapshot()
    opts = _opts(
        wh,
        "orders",
        startingOffsets=json.dumps({"orders": {"0": start, "1": start}}),
        endingOffsets=json.dumps({"orders": {"0": end, "1": end}}),
        maxBytesPerPartition="1",  # one input partition per slice
    )
    groups = plan_scan(snap, opts)
    slices = [s for g in groups for s in g]
    assert len(groups) == len(slices) == 2 and all(s.merged for s in slices)
    batches = list(read_slices(wh.url, {}, "orders", slices))
    got = sorted(arrow_rows(pa.Table.from_batches(batches))) if batches else []
    scan = wh.table("orders").scan(starting_offsets=start, ending_offsets={0: end, 1: end})
    assert got == arrow_rows(scan.to_arrow())
    assert [o for p, o, *_ in got if p == 0] == [o for o in SPARSE if start <= o < end]


def test_max_files_per_trigger_counts_a_merged_segment_once() -> None:
    from maintutil import compacted_table

    wh = _wh()
    compacted_table(wh, "orders", partitions=2)
    snap = wh.table("orders").snapshot()
    ends = limit_segments(snap, {0: 6, 1: 6}, {0: 13, 1: 13}, 1, read_committed=True)
    assert ends == {0: 13, 1: 6}  # partition 1 waits at its range start, inside the segment


def test_pushed_partition_and_offset_filters_prune_slices() -> None:
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
        StringContains,
    )

    from txntable_spark.planning import Pruning

    # Two partitions, segments of 10 offsets each: [0, 10), [10, 20), [20, 30).
    groups = [
        [SegmentSlice(p, f"p{p}s{i}", i * 10, 10, 0, 10, 100) for i in range(3)] for p in (0, 1)
    ]

    def kept(*filters: object) -> list[str]:
        pruning = Pruning()
        for f in filters:
            pruning = pruning.narrowed(f)
        return [s.path for g in pruning.prune(groups) for s in g]

    assert kept(EqualTo(("partition",), 1)) == ["p1s0", "p1s1", "p1s2"]
    assert kept(In(("partition",), (0, 5)), In(("partition",), (0,))) == ["p0s0", "p0s1", "p0s2"]
    assert kept(EqualTo(("partition",), 0), EqualTo(("partition",), 1)) == []
    assert kept(GreaterThanOrEqual(("offset",), 10), LessThan(("offset",), 20)) == [
        "p0s1",
        "p1s1",
    ]
    assert kept(GreaterThan(("offset",), 19), LessThanOrEqual(("offset",), 20)) == [
        "p0s2",
        "p1s2",
    ]
    assert kept(EqualTo(("offset",), 9), EqualTo(("partition",), 0)) == ["p0s0"]
    # Filters on other columns, other kinds or other value types prune nothing.
    assert len(kept(StringContains(("topic",), "x"), EqualTo(("partition",), "1"))) == 6
    assert len(kept(EqualTo(("value",), 3), GreaterThan(("offset",), True))) == 6


@pytest.mark.slow
@pytest.mark.spark
def test_filters_pushed_to_the_source_give_the_same_rows(spark: Any, lake: str) -> None:
    wh = Warehouse(lake)
    wh.create_table("t", 2)
    from txntable import Producer

    with Producer(wh) as producer:
        for i in range(30):
            producer.send("t", b"v%d" % i, partition=i % 2)
            if i % 5 == 4:
                producer.flush()  # several segments per partition
    where = "partition = 1 AND offset >= 5 AND offset < 9"
    plain = spark.read.format("txntable").load(f"{lake}/t").where(where)
    assert sorted((r.offset, bytes(r.value)) for r in plain.collect()) == [
        (o, b"v%d" % (2 * o + 1)) for o in range(5, 9)
    ]
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = spark.read.format("txntable").option("pushFilters", "true").load(f"{lake}/t")
        pushed = sorted((r.offset, bytes(r.value)) for r in df.where(where).collect())
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    assert pushed == [(o, b"v%d" % (2 * o + 1)) for o in range(5, 9)]
    # Without the Spark setting, Spark refuses a reader that pushes filters: say so.
    with pytest.raises(AnalysisException, match="filterPushdown"):
        spark.read.format("txntable").option("pushFilters", "true").load(f"{lake}/t").collect()
