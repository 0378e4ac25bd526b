"""The command line on typed tables: create --schema, describe shows the schema, produce
reads JSON lines of the columns (nothing written from a bad line in a transaction),
consume prints them back as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from cliutil import invoke, ok

from txntable import Producer, Warehouse

SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "decimal(10,2)"},
    {"name": "day", "type": "date32"},
    {"name": "at", "type": "timestamp(us,UTC)"},
    {"name": "tags", "type": "list", "children": [{"name": "element", "type": "string"}]},
    {"name": "blob", "type": "binary"},
]



def test_create_describe_produce_consume(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    ok("create", lake, "orders", "-p", "2", "--schema", f"@{schema_file}", "--key", "id")
    table = Warehouse(lake).table("orders")
    assert table.schema == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("name", pa.string()),
            ("price", pa.decimal128(10, 2)),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("tags", pa.list_(pa.string())),
            ("blob", pa.binary()),
        ]
    )
    described = json.loads(ok("describe", lake, "orders", "--json"))
    assert described["schema"] == [
        {**f, "nullable": f.get("nullable", True)}
        if "children" not in f
        else {**f, "nullable": True, "children": [{**f["children"][0], "nullable": True}]}
        for f in SCHEMA
    ]
    assert described["key_columns"] == ["id"]
    text = ok("describe", lake, "orders")
    assert "list<string>" in text and "decimal(10,2)" in text

    lines = [
        {"id": 1, "name": "a", "price": "1.25", "day": "2024-02-29",
         "at": "2024-01-01T12:00:00Z", "tags": ["x", "y"], "blob": "aGk=", "timestamp": 5},
        {"id": 2},
    ]  # fmt: skip
    stdin = "\n".join(json.dumps(x) for x in lines) + "\n"
    out = json.loads(ok("produce", lake, "orders", "--encoding", "base64", "--json", stdin=stdin))
    assert out["records"] == 2
    consumed = ok("consume", lake, "orders", "--encoding", "base64")
    printed = [json.loads(x) for x in consumed.splitlines()]
    by_id = {r["id"]: r for r in printed}
    assert by_id[1] == {
        "id": 1, "name": "a", "price": "1.25", "day": "2024-02-29",
        "at": "2024-01-01T12:00:00+00:00", "tags": ["x", "y"], "blob": "aGk=",
        "partition": by_id[1]["partition"], "offset": 0, "timestamp": 5,
    }  # fmt: skip
    assert by_id[2]["name"] is None and by_id[2]["offset"] == 0


def test_a_bad_line_aborts_the_transaction(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    ok("create", lake, "t", "--schema", json.dumps(SCHEMA[:2]))
    stdin = '{"id": 1}\n{"id": "x"}\n'
    result = invoke("produce", lake, "t", "-t", "tx", stdin=stdin)
    assert result.exit_code != 0
    assert "line 2" in result.stderr and "column 'id'" in result.stderr
    assert Warehouse(lake).table("t").scan().to_arrow().num_rows == 0
    bad = invoke("create", lake, "u", "--schema", '[{"name": "a", "type": "uint8"}]')
    assert bad.exit_code != 0 and "unknown type 'uint8'; allowed: " in bad.stderr


def test_maps_with_integer_keys_are_produced_from_json(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    schema = [
        {"name": "id", "type": "int64", "nullable": False},
        {"name": "counts", "type": "map", "children": [
            {"name": "key", "type": "int32", "nullable": False},
            {"name": "value", "type": "string"},
        ]},
    ]  # fmt: skip
    ok("create", lake, "m", "--schema", json.dumps(schema))
    lines = [
        {"id": 1, "counts": {"7": "seven", "-1": None}},  # a JSON object's keys are text
        {"id": 2, "counts": [[8, "eight"]]},  # or [key, value] pairs
    ]
    ok("produce", lake, "m", stdin="\n".join(json.dumps(x) for x in lines) + "\n")
    rows = Warehouse(lake).table("m").scan(columns=["id", "counts"]).to_arrow().to_pylist()
    assert rows == [
        {"id": 1, "counts": [(7, "seven"), (-1, None)]},
        {"id": 2, "counts": [(8, "eight")]},
    ]
    bad = invoke("produce", lake, "m", stdin='{"id": 3, "counts": {"x": "?"}}\n')
    assert bad.exit_code == 1 and "line 1" in bad.stderr and "column 'counts'" in bad.stderr
    ok("create", lake, "copy", "--schema", json.dumps(schema))
    ok("produce", lake, "copy", stdin=ok("consume", lake, "m"))  # keys printed as text
    copied = Warehouse(lake).table("copy").scan(columns=["id", "counts"]).to_arrow().to_pylist()
    assert copied == rows


ROUND_TRIP = pa.schema(
    [
        ("id", pa.int64()),
        ("blob", pa.binary()),
        ("by_number", pa.map_(pa.int32(), pa.string())),
        ("by_bytes", pa.map_(pa.binary(), pa.float32())),
        ("nested", pa.struct([("raw", pa.list_(pa.binary())), ("x", pa.float64())])),
    ]
)


@pytest.mark.parametrize(
    ("encoding", "blob"), [("utf-8", "é and ☃".encode()), ("base64", b"\x00\xff"), ("hex", b"\x80")]
)
def test_consume_then_produce_copies_a_typed_table_exactly(
    tmp_path: Path, encoding: str, blob: bytes
) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    for name in ("src", "dst"):
        wh.create_table(name, partitions=2, schema=ROUND_TRIP)
    rows = [
        {"id": 1, "blob": blob, "by_number": [(7, "seven"), (-1, None)],
         "by_bytes": [(blob, 0.5)], "nested": {"raw": [blob, None], "x": float("inf")}},
        {"id": 2, "blob": b"hi", "by_number": [], "by_bytes": None, "nested": None},
        {"id": 3},
    ]  # fmt: skip
    with Producer(wh) as p:
        for row in rows:
            p.send("src", row, partition=row["id"] % 2)
    printed = ok("consume", lake, "src", "--encoding", encoding)
    ok("produce", lake, "dst", "--encoding", encoding, stdin=printed)
    assert ok("consume", lake, "dst", "--encoding", encoding) == printed

    def table(name: str) -> list[dict[str, object]]:
        return wh.table(name).scan().to_arrow().drop_columns(["timestamp"]).to_pylist()

    assert table("dst") == table("src")
    assert len(table("src")) == 3


def test_consume_of_a_typed_table_honours_encoding_and_refuses_other_formats(
    tmp_path: Path,
) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("t", schema=ROUND_TRIP.remove(4).remove(3).remove(2))
    with Producer(wh) as p:
        p.send("t", {"id": 1, "blob": b"\xff"})
    (line,) = ok("consume", lake, "t", "--encoding", "hex").splitlines()
    assert json.loads(line)["blob"] == "ff"
    not_utf8 = invoke("consume", lake, "t")
    assert not_utf8.exit_code == 1
    assert not_utf8.stderr == (
        "txntable: column 'blob' of t-0@0 is not UTF-8; use --encoding base64 or hex\n"
    )
    for fmt in ("text", "value"):
        refused = invoke("consume", lake, "t", "--format", fmt)
        assert refused.exit_code == 2
        assert f"a typed table prints JSON lines of its columns: --format {fmt} does not " \
            "apply" in refused.stderr
    assert invoke("consume", lake, "t", "--format", "json", "--encoding", "hex").exit_code == 0
    lines = invoke("produce", lake, "t", "--format", "lines", stdin='{"id": 2}\n')
    assert lines.exit_code == 2 and "--format lines" in lines.stderr
