"""Typed-table test values shared by the core and the Spark tests (``from typedutil import
...``): a schema with every allowed type, and rows of it."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pyarrow as pa

UTC = datetime.UTC
IST = datetime.timezone(datetime.timedelta(hours=5, minutes=30))

#: One column of every type a record schema allows.
ALL_TYPES = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("flag", pa.bool_()),
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("text", pa.string()),
        ("blob", pa.binary()),
        ("day", pa.date32()),
        ("amount", pa.decimal128(12, 3)),
        ("ts_s", pa.timestamp("s")),
        ("ts_ms_utc", pa.timestamp("ms", tz="UTC")),
        ("ts_us_zone", pa.timestamp("us", tz="Asia/Kolkata")),
        ("ts_ns", pa.timestamp("ns", tz="UTC")),
        ("ints", pa.list_(pa.int32())),
        ("points", pa.list_(pa.struct([("x", pa.float64()), ("y", pa.float64())]))),
        (
            "address",
            pa.struct(
                [
                    pa.field("street", pa.string(), nullable=False),
                    ("lines", pa.list_(pa.string())),
                    ("geo", pa.struct([("lat", pa.float64()), ("lon", pa.float64())])),
                ]
            ),
        ),
        ("attrs", pa.map_(pa.string(), pa.int64())),
    ]
)


def row(i: int) -> dict[str, Any]:
    """A record with every column set (``i`` varies the values)."""
    return {
        "id": i,
        "flag": i % 2 == 0,
        "i8": -128 + i,
        "i16": 30000 + i,
        "i32": -(2**31) + i,
        "f32": 1.5 + i,
        "f64": 2.25e300 / (i + 1),
        "text": f"héllo {i}",
        "blob": bytes([i, 0, 255]),
        "day": datetime.date(2024, 2, 29) + datetime.timedelta(days=i),
        "amount": decimal.Decimal(f"{i}23456789.125"),
        "ts_s": datetime.datetime(2024, 1, 1, 12, 0, i),
        "ts_ms_utc": datetime.datetime(2024, 1, 1, 12, 0, 0, 1000 * i, tzinfo=UTC),
        "ts_us_zone": datetime.datetime(2024, 6, 1, 8, 30, 0, i, tzinfo=IST),
        "ts_ns": datetime.datetime(2024, 1, 2, 0, 0, 0, 7, tzinfo=UTC),
        "ints": [i, None, -i],
        "points": [{"x": 1.0, "y": float(i)}, None],
        "address": {"street": f"rue {i}", "lines": ["a", None], "geo": {"lat": 1.0, "lon": None}},
        "attrs": [("k", i), ("n", None)],
    }


def null_row(i: int) -> dict[str, Any]:
    """Only the not-null column set."""
    return {"id": i}


def comparable(value: dict[str, Any]) -> dict[str, Any]:
    """A record as Arrow's ``to_pylist`` returns it (timestamps as UTC-aware values of
    their column's zone, maps as lists of pairs)."""
    out = dict.fromkeys(ALL_TYPES.names)
    out.update(value)
    for name in ("ts_ms_utc", "ts_us_zone", "ts_ns"):
        if out[name] is not None:
            out[name] = out[name].astimezone(UTC)
    return out
