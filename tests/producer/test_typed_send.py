"""``send`` of a typed table's records: every value is checked before anything is buffered.

A value the check accepts must convert when the records are sealed (a failure there would
fail every record buffered with it and the producer for good); a value it refuses is a
``SerializationError`` naming the column, and the producer stays usable.
"""

from __future__ import annotations

import collections.abc
import datetime
import decimal
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typedutil import ALL_TYPES

from txntable import Producer, Warehouse
from txntable.errors import SerializationError
from txntable.protocol.schema import TypedLayout, check_record

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("attrs", pa.map_(pa.string(), pa.int64())),
        ("price", pa.float64()),
        ("ratio", pa.float32()),
        ("point", pa.struct([("x", pa.int32()), ("y", pa.int32())])),
    ]
)


class FrozenMapping(collections.abc.Mapping[str, Any]):
    """A mapping that is not a dict (what some libraries hand out)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@pytest.fixture
def wh(tmp_path: Any) -> Warehouse:
    wh = Warehouse(str(tmp_path))
    wh.create_table("t", 1, schema=SCHEMA)
    return wh


def read_all(wh: Warehouse) -> list[dict[str, Any]]:
    rows = wh.table("t").scan(columns=[*SCHEMA.names, "offset"]).to_arrow().to_pylist()
    return rows


def test_json_forms_of_maps_and_mappings_are_stored(wh: Warehouse) -> None:
    with Producer(wh) as p:
        p.send("t", {"id": 1, "attrs": [["a", 1], ["b", None]]})  # JSON's form of a map
        p.send("t", {"id": 2, "attrs": {"c": 3}, "point": FrozenMapping({"x": 1, "y": 2})})
        p.send("t", {"id": 3, "price": 2**70, "ratio": np.float64(0.5)})
        p.flush()
    assert read_all(wh) == [
        {"id": 1, "attrs": [("a", 1), ("b", None)], "price": None, "ratio": None,
         "point": None, "offset": 0},
        {"id": 2, "attrs": [("c", 3)], "price": None, "ratio": None,
         "point": {"x": 1, "y": 2}, "offset": 1},
        {"id": 3, "attrs": None, "price": float(2**70), "ratio": 0.5, "point": None,
         "offset": 2},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "column"),
    [
        ({"id": 1, "price": 10**400}, "price"),
        ({"id": 1, "attrs": [("a", 1, 2)]}, "attrs"),
        ({"id": 1, "attrs": ["ab"]}, "attrs"),  # a str unpacks into two characters
        ({"id": 1, "attrs": [("a", 2**63)]}, "attrs"),
        ({"id": 1, "point": {"x": 1.5}}, "point"),
        ({"id": np.uint64(2**64 - 1)}, "id"),
    ],
)
def test_bad_value_fails_its_send_and_the_producer_stays_usable(
    wh: Warehouse, record: dict[str, Any], column: str
) -> None:
    with Producer(wh) as p:
        good = p.send("t", {"id": 1})
        with pytest.raises(SerializationError, match=f"column '{column}'"):
            p.send("t", record)
        later = p.send("t", {"id": 2})
        p.flush()
        assert (good.get().offset, later.get().offset) == (0, 1)
    assert [r["id"] for r in read_all(wh)] == [1, 2]


def test_text_that_is_not_utf8_is_refused(tmp_path: Any) -> None:
    wh = Warehouse(str(tmp_path))
    wh.create_table("s", 1, schema=pa.schema([("name", pa.string())]))
    with Producer(wh) as p:
        with pytest.raises(SerializationError, match="column 'name'"):
            p.send("s", {"name": "\ud800"})
        assert p.send("s", {"name": "ok é"}).get().offset == 0


# --- the property: what the check accepts, sealing converts ----------------------------------

LAYOUT = TypedLayout(ALL_TYPES)
CONVERTERS = LAYOUT.converters()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**63, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e39, 3.5e38, float(2**128 - 2**103), 3.4028234e38]),
    st.text(max_size=4),
    st.sampled_from(["\ud800", "ok"]),
    st.binary(max_size=4),
    st.builds(bytearray, st.binary(max_size=3)),
    st.builds(memoryview, st.binary(max_size=3)),
    st.dates(),
    st.datetimes(timezones=st.sampled_from([None, datetime.UTC])),
    st.sampled_from([datetime.datetime(3000, 1, 1), datetime.datetime(1, 1, 1)]),
    st.decimals(allow_nan=True, places=4, max_value=10**12, min_value=-(10**12)),
    st.sampled_from([decimal.Decimal("NaN"), decimal.Decimal("1e40")]),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.float32, st.floats(width=32)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.lists(st.tuples(inner, inner), max_size=2),
        st.lists(st.lists(inner, min_size=2, max_size=3), max_size=2),
        st.dictionaries(st.sampled_from(["x", "y", "street", "lines", "geo", "lat", "k"]), inner,
                        max_size=3),
        st.builds(FrozenMapping, st.dictionaries(st.sampled_from(["x", "y", "lat"]), inner,
                                                 max_size=2)),
    ),  # fmt: skip
    max_leaves=6,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(column=st.sampled_from(ALL_TYPES.names), value=values)
def test_every_accepted_value_converts_when_sealed(column: str, value: Any) -> None:
    """``check_record`` refuses a value (SerializationError) or sealing stores it."""
    record = {"id": 1, column: value}
    try:
        row, _ = check_record(record, LAYOUT, CONVERTERS)
    except SerializationError:
        return
    table = LAYOUT.rows_table([row], np.array([0], dtype=np.int64))
    stored = table.column(column)[0].as_py()
    if ALL_TYPES.field(column).type == pa.float32() and isinstance(row.get(column), float):
        # float32 holds every accepted value finitely, or it was given as inf / nan
        assert math.isinf(stored) == math.isinf(row[column])


# --- float32 range (item 8 of issue 19): refused like an integer out of range -------------


def test_float32_refuses_finite_values_it_would_store_as_infinity(wh: Warehouse) -> None:
    with Producer(wh) as p:
        with pytest.raises(SerializationError, match="column 'ratio'"):
            p.send("t", {"id": 1, "ratio": 1e300})
        with pytest.raises(SerializationError, match="column 'ratio', row 1: .*out of range"):
            p.send_batch("t", pa.table({"id": [2, 3], "ratio": [1.0, -1e39]}))
        p.send("t", {"id": 4, "ratio": float("inf")})  # infinity given as such is a value
        p.send_batch("t", pa.table({"id": [5, 6], "ratio": [3.4028234e38, float("-inf")]}))
        p.flush()
    rows = [(r["id"], r["ratio"]) for r in read_all(wh)]
    assert rows == [(4, math.inf), (5, 3.4028234663852886e38), (6, -math.inf)]


def test_float32_inside_nested_columns_refuses_overflow_by_row(tmp_path: Any) -> None:
    wh = Warehouse(str(tmp_path))
    nested = pa.schema([("xs", pa.list_(pa.float32())), ("s", pa.struct([("x", pa.float32())]))])
    wh.create_table("n", 1, schema=nested)
    with Producer(wh) as p:
        with pytest.raises(SerializationError, match="column 'xs', row 2"):
            p.send_batch("n", {"xs": [[1.0], None, [2.0, 5e38]]})
        with pytest.raises(SerializationError, match="column 's', row 1"):
            p.send_batch("n", {"s": [None, {"x": -5e38}]})
        with pytest.raises(SerializationError, match="column 'xs'"):
            p.send("n", {"xs": [1e300]})
    assert wh.table("n").scan().to_arrow().num_rows == 0
