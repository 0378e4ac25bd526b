"""Messages a user acts on: an unknown schema type names the allowed ones, a bad decimal
says so, and a line the library refuses is named with what was written before it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from cliutil import invoke

from txntable import Warehouse
from txntable.protocol.schema import TYPE_NAMES


def test_a_schema_type_that_does_not_exist_lists_the_allowed_ones(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    unknown = invoke("create", lake, "t", "--schema", '[{"name": "a", "type": "uint8"}]')
    assert unknown.exit_code == 1
    assert unknown.stderr == (
        "txntable: SchemaMismatchError: column 'a': unknown type 'uint8'; allowed: boolean, "
        "int8, int16, int32, int64, float32, float64, string, binary, date32, decimal(P,S), "
        "timestamp(UNIT), timestamp(UNIT,TZ), list, map, struct\n"
    )
    assert "uint8" not in TYPE_NAMES
    bare_list = invoke("create", lake, "t", "--schema", '[{"name": "a", "type": "list"}]')
    assert bare_list.exit_code == 1
    assert bare_list.stderr == (
        "txntable: SchemaMismatchError: column 'a': a list takes one child (its element); got 0\n"
    )
    nested = '[{"name": "a", "type": "int32", "children": [{"name": "b", "type": "int8"}]}]'
    assert invoke("create", lake, "t", "--schema", nested).stderr == (
        "txntable: SchemaMismatchError: column 'a': 'int32' takes no children; got 1\n"
    )
    assert Warehouse(lake).list_tables() == []


def test_a_bad_decimal_says_what_it_is(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    Warehouse(lake).create_table("t", schema=pa.schema([("price", pa.decimal128(10, 2))]))
    result = invoke("produce", lake, "t", stdin='{"price": "1.50"}\n{"price": "1,50"}\n')
    assert result.exit_code == 1
    assert result.stderr == (
        "txntable: line 2: column 'price': '1,50' is not a decimal number; the 1 record(s) "
        "before it were written\n"
    )


def test_a_line_the_library_refuses_is_named(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("t", partitions=2)
    lines = [{"value": "ok", "partition": 1}, {"value": "lost", "partition": 5}]
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    result = invoke("produce", lake, "t", "--format", "json", stdin=stdin)
    assert result.exit_code == 1
    assert result.stderr.startswith("txntable: line 2: UnknownTopicOrPartitionError: ")
    assert result.stderr.endswith("; the 1 record(s) before it were written\n")
    assert wh.table("t").scan().to_arrow().column("value").to_pylist() == [b"ok"]
    in_txn = invoke("produce", lake, "t", "--format", "json", "-t", "load", stdin=stdin)
    assert in_txn.exit_code == 1
    assert in_txn.stderr.startswith("txntable: line 2: UnknownTopicOrPartitionError: ")
    assert in_txn.stderr.endswith("; transaction load aborted, nothing was written\n")
    assert wh.table("t").scan().to_arrow().num_rows == 1
