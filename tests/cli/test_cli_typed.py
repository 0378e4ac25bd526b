"""The command line on typed tables: create --schema, describe shows the schema, produce
reads JSON lines of the columns (nothing written from a bad line in a transaction),
consume prints them back as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner, Result

from txntable import Warehouse
from txntable.cli import cli

SCHEMA = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "decimal(10,2)"},
    {"name": "day", "type": "date32"},
    {"name": "at", "type": "timestamp(us,UTC)"},
    {"name": "tags", "type": "list", "children": [{"name": "element", "type": "string"}]},
    {"name": "blob", "type": "binary"},
]


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def ok(*args: str, stdin: str | None = None) -> str:
    result = invoke(*args, stdin=stdin)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


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
    printed = [json.loads(x) for x in ok("consume", lake, "orders").splitlines()]
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
    assert bad.exit_code != 0 and "not allowed" in bad.stderr
