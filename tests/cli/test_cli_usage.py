"""What a one-shot command line refuses and how it stops: a reader that closes the pipe, a
warehouse that does not exist, a memory:// warehouse, options that would be ignored, floats
JSON has no number for, one damaged group among good ones."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from cliutil import REPO, invoke, ok

from txntable import Consumer, OffsetAndMetadata, Producer, TopicPartition, Warehouse


@pytest.mark.parametrize("group", [[], ["--group", "g"]])
def test_consume_into_a_pipe_closed_early_stops_quietly(tmp_path: Path, group: list[str]) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("t")
    with Producer(wh) as p:
        for i in range(2000):  # 2 MiB: far more than a pipe holds
            p.send("t", value=b"%04d" % i + b"x" * 1020)
    proc = subprocess.Popen(
        [sys.executable, "-m", "txntable.cli", "consume", lake, "t", "--format", "value",
         *group],  # fmt: skip
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"0000x")
    proc.stdout.close()  # what `| head -1` does
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141  # 128 + SIGPIPE, as a shell reports `yes | head`
    assert stderr == b""
    if group:  # what the reader read is unknown: nothing was committed
        described = wh.describe_group("g")
        assert described is not None and described.offsets == ()
        assert described.members == ()  # it left the group


def test_a_warehouse_that_does_not_exist_is_reported(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    for args in (["tables", missing], ["verify", missing], ["groups", missing],
                 ["txns", missing], ["describe", missing, "t"]):  # fmt: skip
        result = invoke(*args)
        assert (result.exit_code, result.stdout) == (1, ""), args
        assert result.stderr == (
            f"txntable: no warehouse at {missing}: directory {missing} does not exist\n"
        )
    assert not Path(missing).exists()  # nothing was created by looking
    ok("create", missing, "t")  # the first table makes the warehouse
    assert ok("tables", missing) == "t\n"


def test_a_memory_warehouse_is_refused() -> None:
    result = invoke("create", "memory://scratch", "t")
    assert result.exit_code == 2
    assert "a memory:// warehouse lives inside one process" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--idle-timeout-ms", "100"], "--idle-timeout-ms applies to --follow"),
        (["--commit"], "--commit/--no-commit apply to --group"),
        (["--no-commit"], "--commit/--no-commit apply to --group"),
    ],
)
def test_consume_refuses_options_it_would_ignore(
    tmp_path: Path, args: list[str], message: str
) -> None:
    lake = str(tmp_path / "lake")
    Warehouse(lake).create_table("t")
    result = invoke("consume", lake, "t", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_non_finite_floats_print_as_json_text_and_read_back(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("f", schema=pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    values = {1: math.nan, 2: math.inf, 3: -math.inf, 4: 1.5}
    with Producer(wh) as p:
        for i, x in values.items():
            p.send("f", {"id": i, "x": x}, partition=0)
    out = ok("consume", lake, "f")

    def no_constants(name: str) -> object:
        raise AssertionError(f"not JSON: {name}")

    rows = [json.loads(line, parse_constant=no_constants) for line in out.splitlines()]
    assert [(r["id"], r["x"]) for r in rows] == [
        (1, "NaN"), (2, "Infinity"), (3, "-Infinity"), (4, 1.5),
    ]  # fmt: skip
    # What consume printed, produce reads back as the same floats.
    wh.create_table("g", schema=pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    ok("produce", lake, "g", stdin=out)
    got = {r["id"]: r["x"] for r in wh.table("g").scan().to_arrow().to_pylist()}
    assert math.isnan(got.pop(1)) and got == {2: math.inf, 3: -math.inf, 4: 1.5}


def test_a_damaged_group_is_listed_with_its_error(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    wh = Warehouse(lake)
    wh.create_table("t")
    for group in ("bad", "good"):
        c = Consumer(wh, group_id=group)
        c.assign([TopicPartition("t", 0)])
        c.commit({TopicPartition("t", 0): OffsetAndMetadata(0)})
        c.close()
    (tmp_path / "lake/_groups/bad/members.json").write_text("{")
    result = invoke("groups", lake, "--json")
    assert result.exit_code == 1
    bad, good = json.loads(result.stdout)
    assert bad["group_id"] == "bad"
    assert bad["error"].startswith("CorruptLogError: ")
    assert good["group_id"] == "good" and good["offsets"][0]["offset"] == 0
    text = invoke("groups", lake).stdout.splitlines()
    assert text[1].split()[0] == "bad" and "CorruptLogError" in text[1]
    assert text[2].split()[:4] == ["good", "t", "0", "0"]
