"""The CLI's behaviour in detail, in-process through click's runner (fast): input formats and
encodings, ranges, isolation levels, groups, filters, plain versus terminal output."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cliutil import invoke, ok

from txntable import (
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.structs import ConsumerGroupMetadata


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[str]:
    url = str(tmp_path / "lake")
    Warehouse(url).create_table("t", partitions=2)
    yield url


@pytest.fixture
def left_open() -> Iterator[list[Producer]]:
    """Producers a test leaves inside a transaction; closed (aborting it) afterwards."""
    producers: list[Producer] = []
    yield producers
    for p in producers:
        p.close(timeout=10)


def records(url: str, *args: str) -> list[dict[str, object]]:
    out = ok("consume", url, "t", "--json", *args)
    lines = [json.loads(line) for line in out.splitlines()]
    for line in lines:
        del line["timestamp"], line["table"]
    return lines


# --- produce ----------------------------------------------------------------------------------


def test_produce_lines_keys_headers_and_partitions(lake: str) -> None:
    ok("produce", lake, "t", "-k", "=", "-H", "src=cli", "-p", "1", stdin="a=1\nb=x=y\n")
    assert records(lake) == [
        {"partition": 1, "offset": 0, "key": "a", "value": "1", "headers": [["src", "cli"]]},
        {"partition": 1, "offset": 1, "key": "b", "value": "x=y", "headers": [["src", "cli"]]},
    ]
    # With a key separator a blank line is no record: refused, never dropped silently.
    blank = invoke("produce", lake, "t", "-k", "=", stdin="c=3\n\n")
    assert blank.exit_code == 1
    assert blank.stderr == (
        "txntable: line 2: no key separator '='; the 1 record(s) before it were written\n"
    )
    # Without one, it is an empty value.
    ok("produce", lake, "t", "-p", "0", stdin="\nlast\r\n")  # CRLF ends a line too
    assert records(lake, "-p", "0") == [
        {"partition": 0, "offset": 0, "key": "c", "value": "3", "headers": []},
        {"partition": 0, "offset": 1, "key": None, "value": "", "headers": []},
        {"partition": 0, "offset": 2, "key": None, "value": "last", "headers": []},
    ]


def test_keys_go_to_the_partition_of_kafkas_partitioner(lake: str) -> None:
    ok("produce", lake, "t", "-k", ":", stdin="k1:a\nk2:b\nk1:c\n")
    got = records(lake)
    by_key: dict[object, set[object]] = {}
    for r in got:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(ps) == 1 for ps in by_key.values())
    assert [r["value"] for r in got if r["key"] == "k1"] == ["a", "c"]


def test_produce_and_consume_binary_in_base64_and_hex(lake: str) -> None:
    raw = bytes(range(256))
    line = {"key": base64.b64encode(b"\xff").decode(), "value": base64.b64encode(raw).decode(),
            "partition": 0}
    ok("produce", lake, "t", "--format", "json", "--encoding", "base64", stdin=json.dumps(line))
    ok("produce", lake, "t", "-p", "0", "-k", ":", "--encoding", "hex", stdin="00ff:c3a9\n")
    assert records(lake, "--encoding", "hex") == [
        {"partition": 0, "offset": 0, "key": "ff", "value": raw.hex(), "headers": []},
        {"partition": 0, "offset": 1, "key": "00ff", "value": "c3a9", "headers": []},
    ]
    # UTF-8 JSON output refuses bytes that are not UTF-8 instead of mangling them.
    result = invoke("consume", lake, "t", "--json")
    assert result.exit_code == 1
    assert "key of t-0@0 is not UTF-8; use --encoding base64 or hex" in result.stderr
    # Text output shows them escaped, one a line.
    assert ok("consume", lake, "t", "--format", "value", "--from", "1").splitlines() == ["é"]
    ok("produce", lake, "t", "-p", "1", "--encoding", "hex", stdin="ff61\n")
    assert ok("consume", lake, "t", "-p", "1", "--format", "value") == "\\xffa\n"


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ('{"value": "v", "partiton": 0}\n', "unknown field(s) ['partiton']"),
        ("[1, 2]\n", "a JSON record must be an object"),
        ('{"value": "v", "timestamp": -1}\n', "timestamp must be a non-negative integer"),
        ("{not json\n", "not valid JSON: Expecting property name enclosed in double quotes at "
         "column 2"),
        ('{"headers": [["k"]]}\n', "headers must be an object or a list of [key, value] pairs"),
    ],
)
def test_bad_json_input_is_refused_with_its_line(lake: str, stdin: str, message: str) -> None:
    result = invoke("produce", lake, "t", "--format", "json", stdin='{"value": "ok"}\n' + stdin)
    assert result.exit_code == 1
    assert message in result.stderr
    assert result.stderr.startswith("txntable: line 2: ")
    assert "the 1 record(s) before it were written" in result.stderr
    assert len(records(lake)) == 1


def test_produce_usage_errors(lake: str) -> None:
    result = invoke("produce", lake, "t", "--format", "json", "-k", ":")
    assert result.exit_code == 2
    assert "--key-separator applies to --format lines" in result.stderr
    result = invoke("produce", lake, "nope", stdin="x\n")
    assert result.exit_code == 1
    assert result.stderr.startswith("txntable: TableNotFoundError: no table 'nope'")


def test_produce_from_a_file_in_one_transaction(lake: str, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"value": "1", "partition": 0}\n{"value": "2", "partition": 1}\n')
    summary = json.loads(
        ok("produce", lake, "t", str(path), "--format", "json", "-t", "loader", "--json")
    )
    assert summary["records"] == 2 and summary["transactional_id"] == "loader"
    txns = json.loads(ok("txns", lake, "--json"))
    # One table: a one-log commit, which leaves the coordinator object Empty.
    assert [(t["transactional_id"], t["state"]) for t in txns] == [("loader", "Empty")]


# --- consume ----------------------------------------------------------------------------------


@pytest.fixture
def history(lake: str, left_open: list[Producer]) -> str:
    """Partition 0: 0-2 idempotent, 3 aborted txn, 4 its marker, 5-6 idempotent, 7 open txn."""
    wh = Warehouse(lake)
    with Producer(wh, linger_ms=0) as p:
        for v in (b"a", b"b", b"c"):
            p.send("t", value=v, partition=0).result()
    aborted = Producer(wh, transactional_id="x")
    aborted.init_transactions()
    aborted.begin_transaction()
    aborted.send("t", value=b"aborted", partition=0).result()
    aborted.abort_transaction()
    aborted.close()
    with Producer(wh, linger_ms=0) as p:
        for v in (b"d", b"e"):
            p.send("t", value=v, partition=0).result()
    opened = Producer(wh, transactional_id="open")
    left_open.append(opened)
    opened.init_transactions()
    opened.begin_transaction()
    opened.send("t", value=b"pending", partition=0).result()
    return lake


def values(url: str, *args: str) -> list[str]:
    return ok("consume", url, "t", "-p", "0", "--format", "value", *args).splitlines()


def test_consume_isolation_levels(history: str) -> None:
    assert values(history) == ["a", "b", "c", "d", "e"]  # read_committed: up to the LSO 7
    assert values(history, "--isolation-level", "read_uncommitted") == [
        "a", "b", "c", "aborted", "d", "e", "pending",
    ]


def test_consume_ranges(history: str) -> None:
    assert values(history, "--from", "1", "--until", "3") == ["b", "c"]
    assert values(history, "--from", "2", "-n", "2") == ["c", "d"]
    assert values(history, "--from", "latest") == []
    assert values(history, "--until", "6", "--isolation-level", "read_uncommitted") == [
        "a", "b", "c", "aborted", "d",
    ]
    text = ok("consume", history, "t", "-p", "0", "--from", "5", "-n", "1")
    assert text == "0\t5\tnull\td\n"
    bad = invoke("consume", history, "t", "--from", "soon")
    assert bad.exit_code == 2
    assert "expected earliest, latest or an offset, got 'soon'" in bad.stderr


def group_values(url: str, *args: str) -> list[str]:
    return ok("consume", url, "t", "-g", "g", "--format", "value", *args).splitlines()


def test_consume_in_a_group_resumes_where_it_stopped(history: str) -> None:
    assert group_values(history, "-n", "2") == ["a", "b"]
    assert group_values(history, "--no-commit") == ["c", "d", "e"]
    assert group_values(history) == ["c", "d", "e"]
    assert group_values(history) == []
    groups = json.loads(ok("groups", history, "--json"))
    (p0,) = [o for o in groups[0]["offsets"] if o["partition"] == 0]
    # Committed at the LSO: past the aborted batch and its marker; the open txn is lag.
    assert (p0["offset"], p0["last_stable_offset"], p0["high_watermark"], p0["lag"]) == (
        7, 7, 8, 1,
    )


def test_follow_stops_after_the_idle_timeout(history: str) -> None:
    result = invoke("consume", history, "t", "-p", "0", "--from", "5", "--format", "value",
                    "--follow", "--idle-timeout-ms", "300")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["d", "e"]
    assert result.stderr == "Processed 2 record(s)\n"


# --- inspection -------------------------------------------------------------------------------


def test_describe_ages_an_open_transaction_by_its_coordinator(
    lake: str, left_open: list[Producer]
) -> None:
    p = Producer(Warehouse(lake), transactional_id="stamps", linger_ms=0)
    left_open.append(p)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"v", partition=0, timestamp=5).result(timeout=10)  # a 1970 stamp
    (row,) = [line for line in ok("describe", lake, "t").splitlines() if "stamps" in line]
    age = row.split()[-1]
    assert age.endswith("ms") or (age.endswith("s") and age[:-1].isdigit()), row


def test_groups_show_a_pending_transactional_commit(
    lake: str, left_open: list[Producer]
) -> None:
    wh = Warehouse(lake)
    p = Producer(wh, transactional_id="ctp")
    left_open.append(p)
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction(
        {TopicPartition("t", 1): OffsetAndMetadata(0)}, ConsumerGroupMetadata("g")
    )
    (group,) = json.loads(ok("groups", lake, "g", "--json"))
    (offset,) = group["offsets"]
    assert offset == {
        "table": "t", "partition": 1, "offset": None, "metadata": "", "generation": -1,
        "commit_timestamp": 0, "pending_producer_id": p.producer_id, "log_start_offset": 0,
        "high_watermark": 0, "last_stable_offset": 0, "lag": None,
    }
    text = ok("groups", lake)
    assert text.splitlines() == [
        "GROUP  TABLE  PARTITION  OFFSET  LSO  HW  LAG  PENDING",
        f"g      t      1          -       0    0   -    producer {p.producer_id}",
    ]
    missing = invoke("groups", lake, "nope")
    assert missing.exit_code == 1
    assert missing.stderr == f"txntable: no consumer group 'nope' in {lake}\n"


def test_txns_filters_by_state(history: str) -> None:
    everything = json.loads(ok("txns", history, "--json"))
    assert [(t["transactional_id"], t["state"]) for t in everything] == [
        ("open", "Ongoing"), ("x", "CompleteAbort"),
    ]
    assert json.loads(ok("txns", history, "--json", "--state", "CompleteAbort"))[0][
        "transactional_id"
    ] == "x"
    plain = ok("txns", history, "--state", "Ongoing").splitlines()
    assert plain[0].split() == [
        "TRANSACTIONAL", "ID", "STATE", "PRODUCER", "EPOCH", "TIMEOUT", "OPEN", "FOR",
        "PARTICIPANTS", "UPDATED",
    ]
    assert plain[1].split()[:2] == ["open", "Ongoing"] and "t[0]" in plain[1]


def test_a_damaged_coordinator_object_is_listed_with_its_error(lake: str) -> None:
    path = Path(lake) / "_coordinator/txn/broken.json"
    path.parent.mkdir(parents=True)
    path.write_text("{")
    (row,) = json.loads(ok("txns", lake, "--json"))
    assert row["transactional_id"] == "broken" and row["state"] is None
    assert row["error"].startswith("CorruptLogError: coordinator object is not valid JSON")


def test_describe_plain_when_piped_coloured_on_a_terminal(history: str) -> None:
    plain = ok("describe", history, "t").splitlines()
    assert plain[1].split() == ["PARTITION", "LOG", "START", "LSO", "HW", "OPEN", "TXNS",
                                "PRODUCERS", "SEGMENTS", "BYTES"]
    assert plain[2].split()[:7] == ["0", "0", "7", "8", "1", "4", "7"]
    assert plain[4] == "Open transactions"
    assert all(line == line.rstrip() and "\x1b[" not in line for line in plain)
    coloured = ok("--color", "always", "describe", history, "t", "--producers")
    assert "\x1b[" in coloured and "─" in coloured and "Producers" in coloured


def test_create_options(tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    out = ok("create", url, "t", "-p", "3", "-c", "checkpoint.interval=10")
    assert out.startswith("Created table t with 3 partition(s) (id ")
    assert Warehouse(url).table("t").snapshot().metadata.configuration == {  # type: ignore[union-attr]
        "checkpoint.interval": "10"
    }
    again = json.loads(ok("create", url, "t", "--if-not-exists", "--json"))
    assert again["created"] is False and again["partitions"] == 3
    bad = invoke("create", url, "u", "-c", "checkpoint.interval=often")
    assert bad.exit_code == 1
    assert bad.stderr.startswith("txntable: InvalidConfigurationError: checkpoint.interval")
    assert invoke("create", url, "v", "-p", "0").exit_code == 2


def test_maintenance_commands_in_text(history: str) -> None:
    assert ok("checkpoint", history, "t") == "Checkpoint of t written at version 8\n"
    assert ok("vacuum", history, "t", "--dry-run") == (
        "Would delete 0 unreferenced file(s) of t; 7 referenced, 0 undated (kept)\n"
    )
    assert ok("recover", history) == "Nothing to recover.\n"
    out = ok("verify", history)
    assert out.splitlines() == [
        "t: version 8; 9 version(s), 1 checkpoint(s), 7 segment(s) checked: OK",
        "1 log(s) verified: no violation",
    ]
    assert ok("tables", history) == "t\n"


def test_verify_skips_segments_on_request_and_reports_a_damaged_version(lake: str) -> None:
    ok("produce", lake, "t", "-p", "0", stdin="x\n")
    log = Path(lake) / "t/_log/00000000000000000001.json"
    log.write_bytes(log.read_bytes()[:-1])  # truncated: no final newline
    result = invoke("verify", lake, "--no-segments", "--json")
    assert result.exit_code == 3
    (t,) = json.loads(result.stdout)["tables"]
    assert t["segments_checked"] == 0
    assert [(e["rule"], e["version"]) for e in t["errors"]] == [("log.corrupt-version", 1)]
    assert "truncated" in t["errors"][0]["message"]


def test_verify_of_the_warehouse_reports_a_log_without_version_0(lake: str) -> None:
    # Issue 19.1: "0 logs verified: no violation" for a table whose version 0 was deleted.
    ok("produce", lake, "t", "-p", "0", stdin="x\ny\n")
    (Path(lake) / "t/_log/00000000000000000000.json").unlink()
    assert ok("tables", lake) == ""
    result = invoke("verify", lake, "--json")
    assert result.exit_code == 3
    (t,) = json.loads(result.stdout)["tables"]
    assert t["name"] == "t"
    assert [(e["rule"], e["version"]) for e in t["errors"]][0] == ("log.missing-version", 0)
    refused = invoke("create", lake, "t")
    assert refused.exit_code == 1
    assert refused.stderr.startswith("txntable: CorruptLogError: cannot create table 't'")


def test_global_options_before_the_command(lake: str) -> None:
    # -o before the command reaches the store's validation too.
    refused = invoke("-o", "anything=1", "tables", lake)
    assert refused.exit_code == 1
    assert refused.stderr == (
        "txntable: InvalidConfigurationError: unknown storage option 'anything' for local "
        "disk; accepted: none\n"
    )
    assert ok("--version") == "txntable, version 0.1.0\n"
    assert "verify" in ok("--help")
