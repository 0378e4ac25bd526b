"""Every ``txntable`` command end to end, each in its own subprocess, as a user runs them.

JSON output is parsed and compared exactly; exit codes are checked; ``verify`` is shown a
deleted segment and a hand-written log version that leaves a gap in the offsets.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
from cliutil import ok_json, run_cli

from txntable import Producer, Warehouse
from txntable.errors import ProducerFencedError
from txntable.protocol.actions import Batch, CommitInfo, encode_actions
from txntable.txn.coordinator import TransactionCoordinator
from txntable.util import now_ms


def _txn_json(wh: Warehouse, tid: str, state: str) -> dict[str, object]:
    loaded = TransactionCoordinator(wh.store).load(tid)
    assert loaded is not None
    m = loaded[0]
    assert m.state.value == state
    return {
        "transactional_id": tid,
        "state": state,
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "last_producer_id": m.last_producer_id,
        "last_producer_epoch": m.last_producer_epoch,
        "timeout_ms": m.timeout_ms,
        "partitions": {t: list(ps) for t, ps in m.partitions.items()},
        "txn_start_timestamp": m.txn_start_timestamp,
        "last_update_timestamp": m.last_update_timestamp,
        "intent_segments": {},
        "error": None,
    }


@pytest.mark.slow
def test_a_session_with_every_command(tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    wh = Warehouse(url)

    # create, tables
    created = ok_json("create", url, "orders", "--partitions", "2", "--json")
    table_id = wh.table("orders").snapshot().metadata.tableId  # type: ignore[union-attr]
    assert created == {"name": "orders", "table_id": table_id, "partitions": 2, "created": True}
    again = run_cli("create", url, "orders")
    assert again.returncode == 1
    assert again.stderr.decode() == "txntable: TableExistsError: table 'orders' already exists\n"
    assert ok_json("tables", url, "--json") == ["orders"]

    # produce: idempotent lines with keys, then one transaction from JSON lines
    summary = ok_json("produce", url, "orders", "-k", ":", "-p", "0", "--json",
                      stdin=b"a:1\nb:2\n")
    assert summary == {
        "table": "orders",
        "transactional_id": None,
        "records": 2,
        "partitions": [{"partition": 0, "records": 2, "first_offset": 0, "last_offset": 1}],
    }
    records = (
        b'{"key": "k", "value": "v", "partition": 0}\n'
        b'{"value": {"n": 1}, "partition": 1, "headers": {"h": "x"}}\n'
    )
    summary = ok_json("produce", url, "orders", "--format", "json", "-t", "etl", "--json",
                      stdin=records)
    assert summary == {
        "table": "orders",
        "transactional_id": "etl",
        "records": 2,
        "partitions": [
            {"partition": 0, "records": 1, "first_offset": 2, "last_offset": 2},
            {"partition": 1, "records": 1, "first_offset": 0, "last_offset": 0},
        ],
    }
    # A bad line aborts the whole transaction: nothing of it is written.
    bad = run_cli("produce", url, "orders", "-k", ":", "-t", "etl", stdin=b"c:3\nno separator\n")
    assert bad.returncode == 1
    assert bad.stderr.decode() == (
        "txntable: line 2: no key separator ':'; transaction etl aborted, nothing was written\n"
    )
    # (Its init_transactions fenced orders, which etl's one-log commit registered: an ABORT
    # marker at partition 0 offset 4.)
    assert [p.high_watermark for p in wh.table("orders").describe().partitions] == [5, 2]

    # consume in a group (joins it: generation 1; commits its position; leaves: generation
    # 2), then the group's offsets and lag
    proc = run_cli("consume", url, "orders", "--json", "--group", "g1")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    stamps = [line.pop("timestamp") for line in lines]
    assert all(isinstance(s, int) and s > 0 for s in stamps)
    assert lines == [
        {"table": "orders", "partition": 0, "offset": 0, "key": "a", "value": "1", "headers": []},
        {"table": "orders", "partition": 0, "offset": 1, "key": "b", "value": "2", "headers": []},
        {"table": "orders", "partition": 0, "offset": 2, "key": "k", "value": "v", "headers": []},
        {
            "table": "orders",
            "partition": 1,
            "offset": 0,
            "key": None,
            "value": '{"n":1}',
            "headers": [["h", "x"]],
        },
    ]
    assert proc.stderr.decode() == "Processed 4 record(s)\n"
    described_group = wh.describe_group("g1")
    assert described_group is not None
    commit_ts = described_group.offsets[0].commit_timestamp
    position = {"metadata": "", "generation": 1, "commit_timestamp": commit_ts,
                "pending_producer_id": None, "log_start_offset": 0, "lag": 0}
    assert ok_json("groups", url, "--json") == [
        {
            "group_id": "g1",
            "version": 2,  # the fence of generation 1, then the commit
            "offsets": [
                {"table": "orders", "partition": 0, "offset": 5, **position,
                 "high_watermark": 5, "last_stable_offset": 5},
                {"table": "orders", "partition": 1, "offset": 2, **position,
                 "high_watermark": 2, "last_stable_offset": 2},
            ],
            "generation": 2,
            "assignor": None,
            "members": [],
        }
    ]

    # a producer dies inside a transaction: describe and txns show it open
    stuck = Producer(wh, transactional_id="stuck", transaction_timeout_ms=1)
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send("orders", value=b"late", partition=1).result()
    stuck_pid = stuck.producer_id
    (opened,) = wh.table("orders").describe().partitions[1].open_transactions
    start, began = opened.start_timestamp, opened.txn_start_timestamp
    assert began == TransactionCoordinator(wh.store).load("stuck")[0].txn_start_timestamp  # type: ignore[index]
    d = ok_json("describe", url, "orders", "--json")
    etl_pid = TransactionCoordinator(wh.store).load("etl")[0].producer_id  # type: ignore[index]
    # Record timestamps and segment sizes are the writer's; everything else is exact.
    p0, p1 = d["partitions"]
    idem_pid = p0["producers"][0]["producer_id"]
    stamp = {(p["partition"], pr["producer_id"]): pr["last_timestamp"]
             for p in d["partitions"] for pr in p["producers"]}
    assert d == {
        "name": "orders",
        "table_id": table_id,
        "version": 4,  # the third is the fence of etl's second init_transactions
        "partitions": [
            {
                "partition": 0,
                "log_start_offset": 0,
                "high_watermark": 5,
                "last_stable_offset": 5,
                "open_transactions": [],
                "producers": [
                    {"producer_id": idem_pid, "producer_epoch": 0, "last_sequence": 1,
                     "last_timestamp": stamp[0, idem_pid], "current_txn_first_offset": None},
                    # The fence: etl's epoch 1, no batch of it yet.
                    {"producer_id": etl_pid, "producer_epoch": 1, "last_sequence": -1,
                     "last_timestamp": stamp[0, etl_pid], "current_txn_first_offset": None},
                ],
                "segments": 2,
                "segment_bytes": p0["segment_bytes"],
            },
            {
                "partition": 1,
                "log_start_offset": 0,
                "high_watermark": 3,
                "last_stable_offset": 2,
                "open_transactions": [
                    {"producer_id": stuck_pid, "first_offset": 2, "transactional_id": "stuck",
                     "start_timestamp": start, "txn_start_timestamp": began}
                ],
                "producers": [
                    {"producer_id": etl_pid, "producer_epoch": 0, "last_sequence": 0,
                     "last_timestamp": stamp[1, etl_pid], "current_txn_first_offset": None},
                    {"producer_id": stuck_pid, "producer_epoch": 0, "last_sequence": 0,
                     "last_timestamp": start, "current_txn_first_offset": 2},
                ],
                "segments": 2,
                "segment_bytes": p1["segment_bytes"],
            },
        ],
        "configuration": {},
    }
    assert idem_pid != etl_pid != stuck_pid
    assert p0["segment_bytes"] > 0 and p1["segment_bytes"] > 0
    assert start <= now_ms()
    assert ok_json("txns", url, "--json") == [
        _txn_json(wh, "etl", "Empty"),
        _txn_json(wh, "stuck", "Ongoing"),
    ]

    # recover aborts it (its 1 ms timeout has passed); the LSO moves on
    time.sleep(0.01)
    assert ok_json("recover", url, "--json") == {
        "committed": [],
        "aborted": [],
        "timed_out": ["stuck"],
        "lost_race": [],
        "failed": {},
    }
    assert ok_json("txns", url, "--json", "--state", "Ongoing") == []
    p1 = wh.table("orders").describe().partitions[1]
    assert (p1.last_stable_offset, p1.high_watermark) == (4, 4)
    with pytest.raises(ProducerFencedError):
        stuck.abort_transaction()  # the dead producer's successor finds it fenced
    stuck.close()

    # checkpoint, vacuum --dry-run, verify
    assert ok_json("checkpoint", url, "orders", "--json") == {"table": "orders", "version": 5}
    assert (tmp_path / "lake/orders/_log/00000000000000000005.checkpoint.json").exists()
    old = f"orders/data/partition=0/{now_ms() - 3 * 3_600_000:013d}-{uuid.uuid4().hex}.parquet"
    (tmp_path / "lake" / old).write_bytes(b"left by a crashed writer")
    assert ok_json("vacuum", url, "orders", "--dry-run", "--retention-hours", "2", "--json") == {
        "deleted": [old],
        "undated": [],
        "referenced": 4,
        "dry_run": True,
    }
    assert (tmp_path / "lake" / old).exists()
    assert ok_json("verify", url, "--groups", "--json") == {
        "ok": True,
        "tables": [
            {"name": "orders", "version": 5, "start_version": 0, "versions_checked": 6,
             "checkpoints_checked": 1, "segments_checked": 4, "ok": True, "errors": [],
             "warnings": []},
            {"name": "_groups/g1", "version": 2, "start_version": 0, "versions_checked": 3,
             "checkpoints_checked": 0, "segments_checked": 0, "ok": True, "errors": [],
             "warnings": []},
        ],
    }


def test_verify_catches_a_deleted_segment_and_a_gap_in_offsets(tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    wh = Warehouse(url)
    wh.create_table("t", partitions=1)
    with Producer(wh, linger_ms=0) as p:
        for v in (b"1", b"2"):
            p.send("t", value=v).result()
    table = wh.table("t")
    first, second = table.snapshot().partitions[0].entries
    assert isinstance(first, Batch) and isinstance(second, Batch)
    (tmp_path / "lake" / first.path).unlink()
    # Version 3, written by hand: a batch at offset 5 where the log ends at 2.
    forged = Batch(0, 5, 1, second.path.replace(".parquet", "-x.parquet"), second.size)
    (tmp_path / "lake/t/_log/00000000000000000003.json").write_bytes(
        encode_actions([forged, CommitInfo(now_ms(), "WRITE", uuid.uuid4().hex)])
    )
    proc = run_cli("verify", url, "--json")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    (t,) = report["tables"]
    assert t["errors"] == [
        {
            "rule": "offsets.gap",
            "message": "batch at offset 5, log end offset is 2: offsets 2..4 are missing",
            "version": 3,
            "partition": 0,
            "offset": 5,
            "path": None,
            "severity": "error",
            "requirement": "offsets are dense: an entry starts at the log end offset",
        },
        {
            "rule": "segment.missing",
            "message": f"segment {first.path} is missing",
            "version": None,
            "partition": 0,
            "offset": 0,
            "path": first.path,
            "severity": "error",
            "requirement": "every referenced segment exists",
        },
        {
            "rule": "segment.missing",
            "message": f"segment {forged.path} is missing",
            "version": None,
            "partition": 0,
            "offset": 5,
            "path": forged.path,
            "severity": "error",
            "requirement": "every referenced segment exists",
        },
    ]
    # The readable form lists the same violations, one a line.
    text = run_cli("verify", url, "t")
    assert text.returncode == 3
    out = text.stdout.decode()
    assert "\x1b[" not in out  # piped: no colour
    assert out.splitlines() == [
        "t: version 3; 4 version(s), 0 checkpoint(s), 3 segment(s) checked: 3 error(s)",
        "  ERROR   offsets.gap  version 3 partition 0 offset 5: batch at offset 5, log end "
        "offset is 2: offsets 2..4 are missing",
        f"  ERROR   segment.missing  partition 0 offset 0: segment {first.path} is missing",
        f"  ERROR   segment.missing  partition 0 offset 5: segment {forged.path} is missing",
        "1 of 1 log(s) have violations",
    ]


def test_exit_codes_and_storage_options_reach_the_library(tmp_path: Path) -> None:
    missing = run_cli("describe", str(tmp_path), "nope")
    assert missing.returncode == 1
    assert missing.stderr.decode() == (
        f"txntable: TableNotFoundError: no table 'nope' in {tmp_path}\n"
    )
    usage = run_cli("describe", str(tmp_path), "t", "-o", "no-equals-sign")
    assert usage.returncode == 2
    assert "expected KEY=VALUE, got 'no-equals-sign'" in usage.stderr.decode()
    # -o goes to the store's own validation, before the command or after it.
    for args in (("-o", "s3.allow-http=maybe", "tables", "s3://bucket/wh"),
                 ("tables", "s3://bucket/wh", "-o", "s3.allow-http=maybe")):
        bad = run_cli(*args)
        assert bad.returncode == 1
        assert bad.stderr.decode() == (
            "txntable: InvalidConfigurationError: storage option s3.allow-http must be true "
            "or false\n"
        )


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "txntable"
    if not script.exists():
        pytest.skip("no console script next to this interpreter (not a venv install)")
    import subprocess

    proc = subprocess.run([str(script), "--version"], capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.decode() == "txntable, version 0.1.0\n"


def test_colour_only_on_a_terminal(tmp_path: Path) -> None:
    """The same command on a pseudo-terminal gets colour and boxes; piped it gets neither."""
    import os
    import pty
    import subprocess

    url = str(tmp_path / "lake")
    Warehouse(url).create_table("t")
    main, replica = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "txntable.cli", "describe", url, "t"],
        stdout=replica, stderr=replica, env=env,
    )
    os.close(replica)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=60) == 0
    os.close(main)
    on_tty = b"".join(chunks).decode()
    assert "\x1b[" in on_tty and "─" in on_tty
    piped = run_cli("describe", url, "t").stdout.decode()
    assert "\x1b[" not in piped and "─" not in piped
    assert piped.splitlines()[1].split()[:2] == ["PARTITION", "LOG"]
