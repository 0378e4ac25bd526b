"""The table commands users expect besides create and describe: config (show and alter),
evolve, drop, delete-records; describe shows the configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from cliutil import invoke, ok

from txntable import Producer, Warehouse
from txntable.config import TABLE_CONFIG


@pytest.fixture
def lake(tmp_path: Path) -> str:
    url = str(tmp_path / "lake")
    wh = Warehouse(url)
    wh.create_table("t", partitions=2, configuration={"retention.ms": "3600000"})
    with Producer(wh) as p:
        for i in range(6):
            p.send("t", value=b"v%d" % i, partition=i % 2)
    return url


def test_config_shows_every_key_and_alters_them(lake: str) -> None:
    shown = json.loads(ok("config", lake, "t", "--json"))
    rows = {r["name"]: r for r in shown["configuration"]}
    assert set(rows) == set(TABLE_CONFIG)
    assert rows["retention.ms"] == {
        "name": "retention.ms", "value": "3600000", "default": "604800000", "is_set": True,
        "doc": TABLE_CONFIG["retention.ms"].doc,
    }  # fmt: skip
    assert rows["cleanup.policy"]["value"] == "delete" and not rows["cleanup.policy"]["is_set"]
    text = ok("config", lake, "t").splitlines()
    assert text[1].split() == ["KEY", "VALUE", "SOURCE", "DEFAULT", "MEANING"]
    assert [line.split()[:3] for line in text if line.startswith("retention.ms")] == [
        ["retention.ms", "3600000", "table"]
    ]
    altered = json.loads(ok("config", lake, "t", "--set", "cleanup.policy=compact",
                            "--unset", "retention.ms", "--json"))  # fmt: skip
    rows = {r["name"]: r for r in altered["configuration"]}
    assert (rows["cleanup.policy"]["value"], rows["cleanup.policy"]["is_set"]) == ("compact", True)
    assert (rows["retention.ms"]["value"], rows["retention.ms"]["is_set"]) == ("604800000", False)
    assert Warehouse(lake).table("t").configuration == {"cleanup.policy": "compact"}
    bad = invoke("config", lake, "t", "--set", "cleanup.policy=sometimes")
    assert bad.exit_code == 1
    assert bad.stderr.startswith("txntable: InvalidConfigurationError: cleanup.policy must be")


def test_describe_shows_the_configuration(lake: str) -> None:
    assert json.loads(ok("describe", lake, "t", "--json"))["configuration"] == {
        "retention.ms": "3600000"
    }
    text = ok("describe", lake, "t").splitlines()
    at = text.index("Configuration")
    assert text[at + 1].split() == ["KEY", "VALUE"]
    assert text[at + 2].split() == ["retention.ms", "3600000"]
    ok("config", lake, "t", "--unset", "retention.ms")
    assert ok("describe", lake, "t").splitlines()[-1] == "Configuration: every key at its default"


def test_evolve_adds_a_column(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("o", schema=pa.schema([("id", pa.int32())]), key="id")
    with Producer(wh) as p:
        p.send("o", {"id": 1})
    new = [{"name": "id", "type": "int64"}, {"name": "note", "type": "string"}]
    evolved = json.loads(ok("evolve", lake, "o", "--schema", json.dumps(new), "--json"))
    assert evolved == {
        "table": "o",
        "schema": [{"name": "id", "type": "int64", "nullable": True},
                   {"name": "note", "type": "string", "nullable": True}],
        "key_columns": ["id"],
    }  # fmt: skip
    assert wh.table("o").scan().to_arrow().select(["id", "note"]).to_pylist() == [
        {"id": 1, "note": None}
    ]
    narrowing = [{"name": "id", "type": "int8"}]
    refused = invoke("evolve", lake, "o", "--schema", json.dumps(narrowing))
    assert refused.exit_code == 1 and "SchemaMismatchError" in refused.stderr
    assert "--schema" in invoke("evolve", lake, "o").stderr  # required


def test_drop_asks_first_and_deletes_everything(lake: str, tmp_path: Path) -> None:
    declined = invoke("drop", lake, "t", stdin="n\n")
    assert declined.exit_code == 1
    assert Warehouse(lake).list_tables() == ["t"]
    assert ok("drop", lake, "t", stdin="y\n").endswith("object(s) deleted)\n")
    assert Warehouse(lake).list_tables() == []
    assert not (tmp_path / "lake/t").exists()
    missing = invoke("drop", lake, "t", "--yes")
    assert missing.exit_code == 1
    assert missing.stderr == f"txntable: TableNotFoundError: no table 't' in {lake}\n"
    assert json.loads(ok("drop", lake, "t", "--yes", "--if-exists", "--json")) == {
        "table": "t", "dropped": False, "objects_deleted": 0,
    }  # fmt: skip


def test_delete_records_moves_log_start_offsets(lake: str) -> None:
    out = json.loads(ok("delete-records", lake, "t", "--before", "2", "-p", "0", "--json"))
    assert out == {"table": "t", "log_start_offsets": {"0": 2}}
    values = ok("consume", lake, "t", "--format", "value").splitlines()
    assert sorted(values) == ["v1", "v3", "v4", "v5"]  # v0 and v2 were partition 0's first two
    everything = json.loads(ok("delete-records", lake, "t", "--before", "latest", "--json"))
    assert everything["log_start_offsets"] == {"0": 3, "1": 3}
    assert ok("consume", lake, "t") == ""
    past = invoke("delete-records", lake, "t", "--before", "9")
    assert past.exit_code == 1
    assert past.stderr == (
        "txntable: OffsetOutOfRangeError: t-0: cannot delete records below 9: high watermark "
        "is 3\n"
    )
    assert invoke("delete-records", lake, "t", "--before", "soon").exit_code == 2
