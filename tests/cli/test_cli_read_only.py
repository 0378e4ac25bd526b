"""``txntable --read-only``: reading commands never complete a dead producer's transaction."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from txntable import Producer, Warehouse
from txntable.cli import cli
from txntable.txn.coordinator import TransactionCoordinator, TxnState
from txntable.util import now_ms


def stuck_prepared(url: str) -> None:
    """A transaction flushed to ``t``, then PrepareCommit a minute ago, then the producer
    died (its markers never written)."""
    wh = Warehouse(url)
    wh.create_table("t")
    producer = Producer(wh, transactional_id="dead", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", value=b"v").result()
    coordinator = TransactionCoordinator(wh.store)
    loaded = coordinator.load("dead")
    assert loaded is not None
    meta, etag = loaded
    prepared = replace(
        meta.transition(TxnState.PREPARE_COMMIT), last_update_timestamp=now_ms() - 60_000
    )
    coordinator.cas(prepared, etag)


def describe(*args: str) -> dict:
    result = CliRunner().invoke(cli, [*args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def state(url: str) -> TxnState:
    loaded = TransactionCoordinator(Warehouse(url).store).load("dead")
    assert loaded is not None
    return loaded[0].state


def test_read_only_describe_leaves_a_stuck_transaction_alone(tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    stuck_prepared(url)
    before = sorted(Warehouse(url).store.list(""))
    part = describe("--read-only", "describe", url, "t", "--json")["partitions"][0]
    assert (part["last_stable_offset"], part["high_watermark"]) == (0, 1)
    assert state(url) is TxnState.PREPARE_COMMIT
    assert sorted(Warehouse(url).store.list("")) == before  # nothing written
    # Without the flag, describe completes it (a minute is past the grace period).
    part = describe("describe", url, "t", "--json")["partitions"][0]
    assert (part["last_stable_offset"], part["high_watermark"]) == (2, 2)  # record + marker
    assert state(url) is TxnState.COMPLETE_COMMIT
