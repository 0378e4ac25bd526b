"""Spark's timestamp conversion rules on write, driven without Spark."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest

from txntable.errors import SerializationError
from txntable_spark.timeconv import conform_timestamps, floor_timestamps, session_time_zone

NY = "America/New_York"
US_NY = pa.timestamp("us", tz=NY)
NAIVE = pa.timestamp("us")


def _zone(name: str = NY):  # type: ignore[no-untyped-def]
    return lambda: name


def _convert(values: list, src: pa.DataType, dst: pa.DataType, zone: str = NY) -> list:
    column = pa.chunked_array([pa.array(values, src)])
    return conform_timestamps(column, dst, _zone(zone), "c").to_pylist()


def test_an_instant_into_a_naive_column_is_its_session_wall_clock() -> None:
    instant = dt.datetime(2024, 1, 1, 0, 0, tzinfo=ZoneInfo(NY))  # 05:00 UTC
    assert _convert([instant, None], US_NY, NAIVE) == [dt.datetime(2024, 1, 1, 0, 0), None]
    # The same instant from a session in Tokyo is another wall clock, as Spark's cast.
    tokyo = pa.timestamp("us", tz="Asia/Tokyo")
    assert _convert([instant], tokyo, NAIVE) == [dt.datetime(2024, 1, 1, 14, 0)]


def test_a_wall_clock_into_a_zoned_column_is_read_in_the_session_zone() -> None:
    utc = pa.timestamp("us", tz="UTC")
    wall = [
        dt.datetime(2024, 1, 1, 0, 0),
        dt.datetime(2024, 3, 10, 2, 30),  # in the spring-forward gap
        dt.datetime(2024, 11, 3, 1, 30),  # in the fall-back overlap
        None,
    ]
    got = _convert(wall, NAIVE, utc)
    # LocalDateTime.atZone: a gap moves later by its length, an overlap takes the earlier.
    assert got == [
        dt.datetime(2024, 1, 1, 5, 0, tzinfo=dt.UTC),
        dt.datetime(2024, 3, 10, 7, 30, tzinfo=dt.UTC),
        dt.datetime(2024, 11, 3, 5, 30, tzinfo=dt.UTC),
        None,
    ]
    with pytest.raises(SerializationError, match="column 'c'"):
        _convert(wall, NAIVE, utc, zone="Not/AZone")


def test_coarser_units_are_floored_as_spark_floors_micros() -> None:
    micros = pa.array([-1500, 1500, -1000, None, 0], pa.timestamp("us", tz="UTC"))
    assert floor_timestamps(micros, "ms").cast(pa.int64()).to_pylist() == [-2, 1, -1, None, 0]
    assert floor_timestamps(micros, "s").cast(pa.int64()).to_pylist() == [-1, 0, -1, None, 0]
    assert floor_timestamps(micros, "ns").cast(pa.int64()).to_pylist() == [
        -1_500_000,
        1_500_000,
        -1_000_000,
        None,
        0,
    ]
    naive_ms = pa.timestamp("ms")
    assert pa.array(_convert([-1500], NAIVE, naive_ms), naive_ms).cast(pa.int64()).to_pylist() == [
        -2
    ]


def test_nested_timestamps_follow_the_same_rules() -> None:
    instant = dt.datetime(2024, 1, 1, 0, 0, tzinfo=ZoneInfo(NY))
    wall = dt.datetime(2024, 1, 1, 0, 0)
    src = pa.struct(
        [
            ("at", US_NY),
            ("n", pa.int32()),
            ("walls", pa.list_(NAIVE)),
            ("by_name", pa.map_(pa.string(), US_NY)),
        ]
    )
    dst = pa.struct(
        [
            ("at", NAIVE),
            ("n", pa.int64()),
            ("walls", pa.list_(pa.timestamp("ms", tz="UTC"))),
            ("by_name", pa.map_(pa.string(), NAIVE)),
        ]
    )
    rows = [
        None,
        {"at": instant, "n": 1, "walls": [wall, None], "by_name": [("a", instant)]},
        {"at": None, "n": 2, "walls": None, "by_name": None},
    ]
    whole = pa.array(rows, src)
    for arr, expect_rows in ((whole, rows), (whole.slice(1), rows[1:])):
        got = conform_timestamps(pa.chunked_array([arr]), dst, _zone(), "c").to_pylist()
        expected = [
            None
            if r is None
            else {
                "at": None if r["at"] is None else wall,
                "n": r["n"],  # not a timestamp: left for the caller's cast
                "walls": None
                if r["walls"] is None
                else [dt.datetime(2024, 1, 1, 5, 0, tzinfo=dt.UTC), None],
                "by_name": None if r["by_name"] is None else [("a", wall)],
            }
            for r in expect_rows
        ]
        assert got == expected


def test_the_session_zone_comes_from_the_batch_then_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nested = pa.schema([("a", pa.int32()), ("s", pa.struct([("t", pa.timestamp("us", tz=NY))]))])
    assert session_time_zone(nested) == NY  # Spark labels zoned columns with it
    monkeypatch.setenv("TZ", ":Asia/Tokyo")
    assert session_time_zone(pa.schema([("t", NAIVE)])) == "Asia/Tokyo"  # as the JVM's
