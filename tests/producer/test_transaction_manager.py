"""The transaction manager alone: its state machine, producer id, epoch and sequences, and
its coordinator calls against a real coordinator and real tables (memory store); no
accumulator, no sender, no ``Producer``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tableutil import log_versions, read_all, write_batch

from txntable import Warehouse
from txntable.errors import (
    InvalidTxnStateError,
    KafkaTimeoutError,
    ProducerFencedError,
    StorageError,
    TransientStorageError,
    UnknownTopicOrPartitionError,
)
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.producer.transaction_manager import ClientTxnState, TransactionManager
from txntable.protocol.actions import NO_PRODUCER_ID, NO_SEQUENCE, Marker
from txntable.structs import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from txntable.txn.coordinator import MAX_PRODUCER_EPOCH

S = ClientTxnState
MakeManager = Callable[..., TransactionManager]


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=2)
    return wh


@pytest.fixture
def make_manager() -> Iterator[MakeManager]:
    made: list[tuple[TransactionManager, ProducerMetadata]] = []

    def make(
        wh: Warehouse,
        transactional_id: str | None = "tx",
        idempotent: bool = True,
        delivery_timeout_ms: int = 5000,
    ) -> TransactionManager:
        retries = Retries(delivery_timeout_ms, 1000)
        metadata = ProducerMetadata(wh, retries)
        manager = TransactionManager(metadata, retries, transactional_id, idempotent, 60_000)
        made.append((manager, metadata))
        return manager

    yield make
    for manager, metadata in made:
        manager.close()
        metadata.close()


def soon() -> float:
    """A deadline 10 s away."""
    return time.monotonic() + 10


def markers(wh: Warehouse) -> list[tuple[int, str, int]]:
    """``(partition, type, epoch)`` of every marker in table ``t``'s log."""
    return [
        (a.partition, a.type, a.producerEpoch)
        for _, actions in log_versions(wh.table("t").log)
        for a in actions
        if isinstance(a, Marker)
    ]


def transactional_batch(wh: Warehouse, m: TransactionManager) -> None:
    """Append the transaction's batch ``[b"a"]`` to partition 0, as the sender would."""
    write_batch(
        wh.table("t"),
        0,
        [b"a"],
        producer_id=m.producer_id,
        producer_epoch=m.producer_epoch,
        base_sequence=0,
        transactional=True,
        transactional_id=m.transactional_id,
    )


def in_transaction(make_manager: MakeManager, wh: Warehouse, tid: str = "tx") -> TransactionManager:
    manager = make_manager(wh, tid)
    manager.init_transactions()
    manager.begin_transaction()
    return manager


def test_the_state_machine_follows_kafkas_rules(t: Warehouse, make_manager: MakeManager) -> None:
    m = make_manager(t)
    with pytest.raises(InvalidTxnStateError, match="cannot begin a transaction in state UNINIT"):
        m.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="from state UNINITIALIZED to state READY"):
        m.transition(S.READY)
    m.init_transactions()
    assert m.state is S.READY
    m.begin_transaction()
    error = StorageError("a batch failed")
    m.fail(error, fatal=False)
    assert m.state is S.ABORTABLE_ERROR
    with pytest.raises(StorageError, match="a batch failed"):
        m.begin_commit()  # an abortable error can only be aborted
    m.begin_abort()
    m.fail(StorageError("late"), fatal=False)  # the abort is what it calls for already
    assert (m.state, m.last_error) == (S.ABORTING_TRANSACTION, error)
    fenced = ProducerFencedError("fenced")
    m.fail(fenced, fatal=True)
    with pytest.raises(ProducerFencedError):
        m.transition(S.READY)  # fatal sticks: every move raises its error
    m.fail(StorageError("later"), fatal=False)
    assert (m.state, m.last_error) == (S.FATAL_ERROR, fenced)


def test_without_a_transactional_id_only_ids_and_sequences_are_kept(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = make_manager(t, transactional_id=None)
    assert not m.transactional
    for call in (m.init_transactions, m.begin_transaction, m.require_transactional):
        with pytest.raises(InvalidTxnStateError, match="no transactional_id"):
            call()
    m.require_sendable()  # an idempotent producer sends at any time
    m.add_partitions("t", {0}, deadline=0)  # nothing to register
    assert m.producer_id == NO_PRODUCER_ID
    m.ensure_producer_id()
    assert m.producer_id >= 0 and m.producer_epoch == 0
    plain = make_manager(t, transactional_id=None, idempotent=False)
    plain.ensure_producer_id()
    assert plain.producer_id == NO_PRODUCER_ID
    assert plain.next_sequence(TopicPartition("t", 0), 5) == NO_SEQUENCE


def test_sequences_follow_each_partition_and_wrap_at_2_31(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = make_manager(t, transactional_id=None)
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    assert [m.next_sequence(p0, 5), m.next_sequence(p0, 3), m.next_sequence(p1, 1)] == [0, 5, 0]
    assert m.next_sequence(p1, 2**31 - 3) == 1
    assert [m.next_sequence(p1, 4), m.next_sequence(p1, 1)] == [2**31 - 2, 2]


def test_a_failed_batch_of_an_idempotent_producer_restarts_its_sequences_under_a_new_epoch(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = make_manager(t, transactional_id=None)
    m.ensure_producer_id()
    pid = m.producer_id
    tp = TopicPartition("t", 0)
    m.next_sequence(tp, 10)
    m.batch_failed(StorageError("unsealable"), sequenced=False)  # took no sequences
    assert (m.producer_id, m.producer_epoch, m.next_sequence(tp, 1)) == (pid, 0, 10)
    m.batch_failed(StorageError("refused"))
    assert (m.producer_id, m.producer_epoch, m.next_sequence(tp, 1)) == (pid, 1, 0)
    m.producer_epoch = MAX_PRODUCER_EPOCH - 1
    m.batch_failed(StorageError("refused"))
    assert m.producer_id == NO_PRODUCER_ID  # epochs exhausted: a new id at the next batch
    m.ensure_producer_id()
    assert m.producer_id not in (NO_PRODUCER_ID, pid) and m.producer_epoch == 0


def test_init_transactions_fences_the_previous_instance(
    t: Warehouse, make_manager: MakeManager
) -> None:
    old = in_transaction(make_manager, t)
    new = make_manager(t)
    new.init_transactions()
    assert (new.producer_id, new.producer_epoch) == (old.producer_id, old.producer_epoch + 1)
    with pytest.raises(ProducerFencedError):
        old.add_partitions("t", {0}, deadline=soon())


def test_a_failed_batch_of_a_transaction_must_be_aborted(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = in_transaction(make_manager, t)
    assert m.short_path_allowed()
    error = StorageError("refused")
    m.batch_failed(error)
    assert m.state is S.ABORTABLE_ERROR and not m.short_path_allowed()
    with pytest.raises(StorageError, match="refused"):
        m.begin_commit()
    m.begin_abort()
    m.end_transaction(commit=False)
    m.begin_transaction()
    assert m.state is S.IN_TRANSACTION and m.short_path_allowed()


def test_ending_with_nothing_registered_asks_no_coordinator(
    t: Warehouse, make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = in_transaction(make_manager, t)
    epoch = m.producer_epoch

    def unexpected(*args: Any) -> Any:
        raise AssertionError("EndTxn without registered partitions")

    monkeypatch.setattr(m.coordinator, "end_transaction", unexpected)
    m.begin_commit()
    m.commit()
    assert (m.state, m.producer_epoch) == (S.READY, epoch)


def test_commit_writes_the_markers_of_the_registered_partitions_with_data(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = in_transaction(make_manager, t)
    epoch = m.producer_epoch
    m.add_partitions("t", {0, 1}, deadline=soon())
    m.add_partitions("t", {1}, deadline=soon())  # registered already
    transactional_batch(t, m)
    m.begin_commit()
    m.commit()
    assert m.state is S.READY
    assert markers(t) == [(0, "COMMIT", epoch)]  # partition 1 got no data: no marker
    assert read_all(t, "t", [0, 1], "read_committed") == {0: [(0, b"a")], 1: []}
    assert m.producer_epoch == epoch + 1  # KIP-890: the next transaction under a new epoch


def test_a_commit_whose_outcome_is_unknown_can_only_be_retried(
    t: Warehouse, make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = make_manager(t, delivery_timeout_ms=100)
    m.init_transactions()
    m.begin_transaction()
    m.add_partitions("t", {0}, deadline=soon())
    transactional_batch(t, m)
    real = m.coordinator.end_transaction
    down = [True]

    def end_transaction(*args: Any) -> Any:
        if down[0]:
            raise TransientStorageError("unreachable")
        return real(*args)

    monkeypatch.setattr(m.coordinator, "end_transaction", end_transaction)
    m.begin_commit()
    with pytest.raises(KafkaTimeoutError, match="commit outcome unknown"):
        m.commit()
    assert m.end_unfinished and m.state is S.COMMITTING_TRANSACTION
    with pytest.raises(InvalidTxnStateError, match="cannot abort: commit_transaction"):
        m.retry_unfinished_abort()
    down[0] = False
    assert m.retry_unfinished_commit() is True
    assert m.state is S.READY and not m.end_unfinished
    assert markers(t) == [(0, "COMMIT", m.producer_epoch - 1)]


def test_offsets_for_a_table_that_does_not_exist_are_refused_and_the_transaction_goes_on(
    t: Warehouse, make_manager: MakeManager
) -> None:
    m = in_transaction(make_manager, t)
    meta = ConsumerGroupMetadata("g")
    with pytest.raises(UnknownTopicOrPartitionError):
        m.send_offsets({TopicPartition("nope", 0): OffsetAndMetadata(1)}, meta)
    with pytest.raises(UnknownTopicOrPartitionError):
        m.send_offsets({TopicPartition("t", 5): OffsetAndMetadata(1)}, meta)
    assert m.state is S.IN_TRANSACTION
    m.send_offsets({TopicPartition("t", 1): OffsetAndMetadata(3)}, meta)
    assert not m.short_path_allowed()  # the group's offset log is registered
