"""What the application is told must be what happened (issue 25 items 1 and 3, issue 21
item 5).

Kafka's rule: once a commit is decided (PrepareCommit), ``commit_transaction()`` either
finishes it or raises a timeout whose only legal follow-up is calling it again;
``abort_transaction()`` is refused; ``close()`` always closes. A one-log commit (one append
of data and markers, no coordinator decision) follows the same rule once its append's outcome
is unknown. Each test drives the storage fault wrappers at the step named, with group commit
on (the default) and off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from tableutil import ReadFaultStore, is_log_version
from txnutil import committed_values, one_partition_tables

from txntable import Producer, Warehouse
from txntable.errors import (
    CommitConflictError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    StorageError,
)
from txntable.producer.transaction_manager import ClientTxnState
from txntable.txn.coordinator import TransactionCoordinator, TxnState

MakeProducer = Callable[..., Producer]
GROUP_COMMIT = pytest.mark.parametrize("group_commit", [True, False], ids=["gc", "no-gc"])
#: How the one log put after the decision fails: refused for good (what the bench saw as
#: "gave up after 50 attempts"), a non-retriable storage error, or an outage longer than
#: the producer's delivery timeout.
FAILURES = pytest.mark.parametrize("failure", ["conflict", "storage", "outage"])


def _fail_log_puts(store: ReadFaultStore, failure: str) -> None:
    if failure == "outage":
        store.fail_before_write(is_log_version, times=10**6, ops={"put_if_absent"})
        return
    exc = CommitConflictError("injected") if failure == "conflict" else StorageError("injected")
    store.fail_before_write(is_log_version, times=1, exc=exc, ops={"put_if_absent"})


def _state(wh: Warehouse) -> TxnState:
    loaded = TransactionCoordinator(wh.store).load("tx")
    assert loaded is not None
    return loaded[0].state


# --- 25.1: a decided commit is never reported as failed ----------------------------------


def _only_commit_again_finishes(
    p: Producer, wh: Warehouse, fault_store: ReadFaultStore, state_after: TxnState
) -> None:
    """After a commit whose outcome is not known: abort and begin are refused (an abort
    would be a lie), committing again once storage is back commits once (the coordinator
    object then in ``state_after``), and the producer goes on (no "cannot move from
    PrepareCommit to PrepareCommit")."""
    with pytest.raises(InvalidTxnStateError, match="commit_transaction"):
        p.abort_transaction()
    with pytest.raises(InvalidTxnStateError):
        p.begin_transaction()
    fault_store.clear()
    p.commit_transaction()
    assert _state(wh) is state_after
    assert committed_values(wh) == [b"a"]
    p.begin_transaction()
    p.send("t0", value=b"b", partition=0)
    p.commit_transaction()
    assert committed_values(wh) == [b"a", b"b"]


@GROUP_COMMIT
@FAILURES
def test_a_decided_commit_is_finished_by_committing_again(
    fault_store: ReadFaultStore,
    make_producer: MakeProducer,
    group_commit: bool,
    failure: str,
) -> None:
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    p.flush()  # the data is in the log; the commit writes the markers
    _fail_log_puts(fault_store, failure)
    with pytest.raises(KafkaTimeoutError, match="decided to commit"):
        p.commit_transaction()
    assert _state(wh) is TxnState.PREPARE_COMMIT
    _only_commit_again_finishes(p, wh, fault_store, TxnState.COMPLETE_COMMIT)


@GROUP_COMMIT
@FAILURES
def test_a_one_log_commit_of_unknown_outcome_is_finished_by_committing_again(
    fault_store: ReadFaultStore,
    make_producer: MakeProducer,
    group_commit: bool,
    failure: str,
) -> None:
    """The one-log path has no decision object: a failed append is an unknown outcome (it
    may still land), so the rule is the same as after a decision: commit again, never
    abort; and the producer keeps its epoch throughout."""
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    epoch = p.producer_epoch
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    _fail_log_puts(fault_store, failure)
    with pytest.raises(KafkaTimeoutError, match="outcome unknown"):
        p.commit_transaction()
    assert _state(wh) is TxnState.EMPTY  # the coordinator never hears of it
    _only_commit_again_finishes(p, wh, fault_store, TxnState.EMPTY)
    assert (_state(wh), p.producer_epoch) == (TxnState.EMPTY, epoch)  # one epoch throughout


@GROUP_COMMIT
def test_a_one_log_retry_that_cannot_read_the_log_is_still_an_unknown_outcome(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    """Committing again first looks for the earlier attempt in the log: a read that keeps
    failing is a timeout (commit again), not a raw storage error."""
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    _fail_log_puts(fault_store, "outage")
    with pytest.raises(KafkaTimeoutError, match="outcome unknown"):
        p.commit_transaction()
    fault_store.clear()
    fault_store.fail_next_get("t0/_log/00000000000000000001.json", times=10**6)
    with pytest.raises(KafkaTimeoutError, match="outcome unknown"):
        p.commit_transaction()
    fault_store.get_faults.clear()
    p.commit_transaction()
    assert committed_values(wh) == [b"a"]


@GROUP_COMMIT
def test_the_bench_repro_never_shows_an_aborted_transaction(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    """/work/benchw-out/repro_abort_after_prepare.py: the application that follows the
    contract (abort after a failed commit) is refused, commits again, and every record it
    was told committed is visible exactly once — nothing it was told aborted is."""
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    _fail_log_puts(fault_store, "conflict")
    told: dict[bytes, str] = {}
    try:
        p.commit_transaction()
        told[b"a"] = "committed"
    except KafkaTimeoutError:
        try:
            p.abort_transaction()
            told[b"a"] = "aborted"
        except InvalidTxnStateError:
            p.commit_transaction()
            told[b"a"] = "committed"
    assert told == {b"a": "committed"}
    assert wh.recover().committed == []  # nothing left for recovery to roll forward
    assert committed_values(wh) == [b"a"]


# --- 25.3: close() always closes -----------------------------------------------------------


@GROUP_COMMIT
@pytest.mark.parametrize("path", ["short", "normal"])
def test_close_after_a_commit_that_cannot_finish_still_closes(
    fault_store: ReadFaultStore,
    make_producer: MakeProducer,
    group_commit: bool,
    path: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    if path == "normal":
        p.flush()
    _fail_log_puts(fault_store, "outage")
    with pytest.raises(KafkaTimeoutError):
        p.commit_transaction()
    with caplog.at_level(logging.WARNING):
        with p:  # __exit__ closes: it must not raise
            pass
    assert not p.sender.is_alive()
    fault_store.clear()
    if path == "normal":
        assert "decided to commit" in caplog.text
        assert wh.recover().committed == ["tx"]  # the decision is finished, not lost
        assert committed_values(wh) == [b"a"]
    else:
        # One-log: nothing was decided and the append never landed: nothing to finish.
        assert "commit outcome unknown" in caplog.text
        assert wh.recover().committed == []
        assert committed_values(wh) == []


@GROUP_COMMIT
def test_close_finishes_a_decided_commit_when_storage_is_back(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool
) -> None:
    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    _fail_log_puts(fault_store, "storage")
    with pytest.raises(KafkaTimeoutError):
        p.commit_transaction()
    p.close()
    assert _state(wh) is TxnState.EMPTY  # one-log: the close made the same append again
    assert committed_values(wh) == [b"a"]


def test_close_after_an_abort_that_found_the_commit_closes(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """The wedge of issue 25.3: every call raised once an abort found the transaction
    committed. Now the abort says so and the producer goes on."""
    wh, p = one_partition_tables(fault_store, make_producer, True, delivery_timeout_ms=300)
    p.begin_transaction()
    p.send("t0", value=b"a", partition=0)
    p.flush()
    # Someone else (recover(), a reader) decided and completed it meanwhile, as if this
    # producer's PrepareCommit CAS had landed without it seeing so.
    coordinator = TransactionCoordinator(wh.store)
    loaded = coordinator.load("tx")
    assert loaded is not None
    meta, etag = loaded
    prepared = meta.transition(TxnState.PREPARE_COMMIT)
    coordinator.complete(prepared, coordinator.cas(prepared, etag))
    p.txn.fail(StorageError("injected"), fatal=False)  # type: ignore[union-attr]
    with pytest.raises(InvalidTxnStateError, match="committed"):
        p.abort_transaction()
    assert p.txn is not None and p.txn.state is ClientTxnState.READY
    p.begin_transaction()
    p.send("t0", value=b"b", partition=0)
    p.commit_transaction()
    p.close()
    assert committed_values(wh) == [b"a", b"b"]


# --- 21.5: the offsets of a one-log commit whose first attempt landed ---------------------


@GROUP_COMMIT
@pytest.mark.parametrize("maintained", ["fresh", "expired"])
def test_a_one_log_commit_that_landed_is_recognised_when_committed_again(
    fault_store: ReadFaultStore, make_producer: MakeProducer, group_commit: bool, maintained: str
) -> None:
    """The version lands and the producer is told it failed: committing again gets the
    original offsets, by the batch's sequences, or by its segment when maintenance expired
    the producer's state meanwhile (it is not appended twice)."""
    from txntable.maintenance.maintain import expire_producers
    from txntable.util import now_ms

    wh, p = one_partition_tables(fault_store, make_producer, group_commit, delivery_timeout_ms=300)
    p.begin_transaction()
    future = p.send("t0", value=b"a", partition=0)
    fault_store.fail_after_write(
        is_log_version, times=1, exc_factory=StorageError("injected"), ops={"put_if_absent"}
    )
    with pytest.raises(KafkaTimeoutError, match="outcome unknown"):
        p.commit_transaction()
    fault_store.clear()
    assert committed_values(wh) == [b"a"]  # it did land
    if maintained == "expired":
        assert expire_producers(wh.table("t0"), now=now_ms() + 10**10).producer_ids
    p.commit_transaction()
    assert future.get(5).offset == 0
    assert committed_values(wh) == [b"a"]
    p.begin_transaction()
    p.send("t0", value=b"b", partition=0)
    p.commit_transaction()
    assert committed_values(wh) == [b"a", b"b"]
