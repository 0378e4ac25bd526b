"""The short path is for one log, and a decided short-path commit is bounded (issue 25.2).

A transaction over several logs takes the normal path, whose open batches hold every LSO
until the markers (so no table is ever left half visible); a one-table transaction commits
as one append (CommitOneLog). An earlier client's short path decided before anything was in
the table (the coordinator object's intent); if its producer died right after the decision,
maintenance finds it through the coordinator objects and finishes it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tableutil import ReadFaultStore, is_log_version
from txnutil import HELPERS, committed_values, one_partition_tables, run_python

from txntable import Producer, Warehouse
from txntable.txn.coordinator import TransactionCoordinator, TxnState

MakeProducer = Callable[..., Producer]
GROUP_COMMIT = pytest.mark.parametrize("group_commit", [True, False], ids=["gc", "no-gc"])


# --- 25.2: a multi-log transaction takes the normal path ---------------------------------


@GROUP_COMMIT
def test_a_buffered_multi_table_transaction_holds_every_lso_until_its_markers(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, tables=3)
    seen: list[tuple[str, dict[str, object], list[tuple[int, int]]]] = []
    real = p.coordinator.cas  # the producer's own (it keeps the copy it wrote)

    def cas(meta, etag):  # type: ignore[no-untyped-def]
        if meta.state is TxnState.PREPARE_COMMIT:
            # Just before the decision: every table holds the data as an open transaction.
            lsos = [
                (d.last_stable_offset, d.high_watermark)
                for name in ("t0", "t1", "t2")
                for d in wh.table(name).describe().partitions
            ]
            seen.append((meta.state.value, dict(meta.intent), lsos))
        return real(meta, etag)

    p.coordinator.cas = cas  # type: ignore[method-assign]
    p.begin_transaction()
    for name in ("t0", "t1", "t2"):
        p.send(name, value=name.encode(), partition=0)
    p.commit_transaction()  # everything still buffered: the short path used to take it
    assert seen == [("PrepareCommit", {}, [(0, 1), (0, 1), (0, 1)])]
    for name in ("t0", "t1", "t2"):
        assert committed_values(wh, name) == [name.encode()]


@GROUP_COMMIT
def test_a_single_table_transaction_still_takes_the_short_path(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    wh, p = one_partition_tables(fault_store, make_producer, group_commit)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    p.commit_transaction()
    versions = [k for k in wh.store.list("t0/_log/") if is_log_version(k)]
    assert len(versions) == 2  # creation, then data and markers in one version
    assert committed_values(wh, "t0") == [b"a"]


# --- 25.2: a decided short-path commit of a dead producer is bounded --------------------


@pytest.fixture
def killed_after_the_cas(tmp_path: Path) -> Warehouse:
    """A warehouse whose producer (an earlier client's short path) was SIGKILLed right
    after its PrepareCommit with the intent."""
    wh = Warehouse((tmp_path / "wh").as_uri())
    wh.create_table("t", partitions=1, configuration={"maintenance.interval.ms": "200"})
    proc = run_python([str(HELPERS / "crash_short_path.py"), wh.url])
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    loaded = TransactionCoordinator(wh.store).load("short-crash")
    assert loaded is not None and loaded[0].state is TxnState.PREPARE_COMMIT
    assert committed_values(wh, "t") == []  # decided, and invisible everywhere
    return wh


DECIDED = [b"decided-0", b"decided-1", b"decided-2"]


@pytest.mark.slow
def test_maintain_finishes_a_decided_commit_nothing_in_the_table_shows(
    killed_after_the_cas: Warehouse,
) -> None:
    wh = killed_after_the_cas
    read_only = Warehouse(wh.url, finish_stuck_transactions=False, stuck_transaction_grace_ms=0)
    assert read_only.table("t").maintain(vacuum=False).decided == []
    patient = Warehouse(wh.url, stuck_transaction_grace_ms=3_600_000)
    assert patient.table("t").maintain(vacuum=False).decided == []  # its producer may be back
    assert committed_values(wh, "t") == []
    report = Warehouse(wh.url, stuck_transaction_grace_ms=0).table("t").maintain(vacuum=False)
    assert report.decided == ["short-crash"] and report.errors == []
    assert committed_values(wh, "t") == DECIDED


@pytest.mark.slow
def test_another_writers_auto_maintenance_finishes_it_within_its_interval(
    killed_after_the_cas: Warehouse,
) -> None:
    """The bound without anyone calling maintain() or recover(): the table's next writer
    with auto maintenance sweeps once per ``maintenance.interval.ms``."""
    wh = Warehouse(killed_after_the_cas.url, stuck_transaction_grace_ms=0)
    deadline = time.monotonic() + 30
    with Producer(wh, linger_ms=0) as other:
        while not set(DECIDED) <= set(committed_values(wh, "t")):
            assert time.monotonic() < deadline, "the decided commit stayed invisible"
            other.send("t", value=b"other", partition=0).get(10)
            time.sleep(0.1)
    loaded = TransactionCoordinator(wh.store).load("short-crash")
    assert loaded is not None and loaded[0].state is TxnState.COMPLETE_COMMIT
    values = committed_values(wh, "t")
    assert [v for v in values if v != b"other"] == DECIDED  # once, in order, together
