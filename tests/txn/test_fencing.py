"""Producer fencing by transactional id, and the client transaction state machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tableutil import ReadFaultStore, read_all

from txntable import Producer, Warehouse
from txntable.errors import (
    InvalidConfigurationError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
    StorageError,
)
from txntable.producer.transaction_manager import ClientTxnState
from txntable.protocol.actions import AbortedTxn, Marker

MakeProducer = Callable[..., Producer]


@pytest.fixture
def orders(wh: Warehouse) -> Warehouse:
    wh.create_table("orders", partitions=2)
    return wh


def flushed(p: Producer, value: bytes, partition: int = 0) -> int:
    f = p.send("orders", value=value, partition=partition)
    p.flush()
    return f.result(timeout=10).offset


def assert_fatal(p: Producer) -> None:
    """Every further transactional call of a fenced producer raises ProducerFencedError."""
    assert p.txn is not None and p.txn.state is ClientTxnState.FATAL_ERROR
    for call in (
        lambda: p.send("orders", value=b"late", partition=0),
        p.begin_transaction,
        p.commit_transaction,
        p.abort_transaction,
        p.init_transactions,
    ):
        with pytest.raises(ProducerFencedError):
            call()
        assert p.txn.state is ClientTxnState.FATAL_ERROR


def fence_scenario(orders: Warehouse, make_producer: MakeProducer) -> tuple[Producer, Producer]:
    old = make_producer(orders, transactional_id="etl")
    old.init_transactions()
    old.begin_transaction()
    assert flushed(old, b"old-0", 0) == 0
    assert flushed(old, b"old-1", 1) == 0
    old_epoch = old.producer_epoch
    new = make_producer(orders, transactional_id="etl")
    new.init_transactions()
    assert new.producer_id == old.producer_id
    assert new.producer_epoch > old_epoch
    # The old instance's open transaction was aborted with a bumped epoch, on both partitions.
    snap = orders.table("orders").snapshot()
    for p in (0, 1):
        part = snap.partition(p)
        assert part.ongoing == {}
        assert part.last_stable_offset == part.high_watermark == 2
        marker = part.entries[-1]
        assert isinstance(marker, Marker)
        assert (marker.offset, marker.type, marker.producerId) == (1, "ABORT", old.producer_id)
        assert marker.producerEpoch == old_epoch + 1
        assert part.aborted == [AbortedTxn(p, old.producer_id, 0, 1, 2)]
    assert snap.producer_epochs[old.producer_id] == old_epoch + 1
    return old, new


def test_new_instance_fences_old_send(orders: Warehouse, make_producer: MakeProducer) -> None:
    old, new = fence_scenario(orders, make_producer)
    future = old.send("orders", value=b"zombie", partition=0)
    old.flush()
    with pytest.raises(InvalidProducerEpochError) as info:
        future.result(timeout=10)
    assert isinstance(info.value, ProducerFencedError)
    assert_fatal(old)

    new.begin_transaction()
    assert flushed(new, b"new-0", 0) == 2
    new.commit_transaction()
    assert read_all(orders, "orders", [0, 1], "read_committed") == {0: [(2, b"new-0")], 1: []}
    assert read_all(orders, "orders", [0, 1], "read_uncommitted") == {
        0: [(0, b"old-0"), (2, b"new-0")],
        1: [(0, b"old-1")],
    }


def test_new_instance_fences_old_commit(orders: Warehouse, make_producer: MakeProducer) -> None:
    old, new = fence_scenario(orders, make_producer)
    version = orders.table("orders").snapshot().version
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    assert orders.table("orders").snapshot().version == version  # no COMMIT marker
    assert_fatal(old)
    assert read_all(orders, "orders", [0, 1], "read_committed") == {0: [], 1: []}
    new.begin_transaction()
    assert flushed(new, b"new-1", 1) == 2
    new.commit_transaction()
    assert read_all(orders, "orders", [0, 1], "read_committed") == {0: [], 1: [(2, b"new-1")]}


def test_fenced_producer_cannot_register_new_partition(
    orders: Warehouse, make_producer: MakeProducer
) -> None:
    old = make_producer(orders, transactional_id="etl")
    old.init_transactions()
    old.begin_transaction()
    assert flushed(old, b"old-0", 0) == 0
    new = make_producer(orders, transactional_id="etl")
    new.init_transactions()
    future = old.send("orders", value=b"zombie", partition=1)  # needs AddPartitionsToTxn
    old.flush()
    with pytest.raises(ProducerFencedError):
        future.result(timeout=10)
    assert_fatal(old)
    assert orders.table("orders").describe().partitions[1].high_watermark == 0


def test_old_abort_after_fencing(orders: Warehouse, make_producer: MakeProducer) -> None:
    old, _ = fence_scenario(orders, make_producer)
    with pytest.raises(ProducerFencedError):
        old.abort_transaction()
    assert_fatal(old)


def test_fencing_an_idle_instance(orders: Warehouse, make_producer: MakeProducer) -> None:
    old = make_producer(orders, transactional_id="etl")
    old.init_transactions()
    new = make_producer(orders, transactional_id="etl")
    new.init_transactions()
    old.begin_transaction()  # the client cannot know yet
    future = old.send("orders", value=b"zombie", partition=0)
    old.flush()
    with pytest.raises(ProducerFencedError):
        future.result(timeout=10)
    assert_fatal(old)
    assert orders.table("orders").describe().partitions[0].high_watermark == 0


def test_illegal_transaction_calls(orders: Warehouse, make_producer: MakeProducer) -> None:
    p = make_producer(orders, transactional_id="etl")
    with pytest.raises(InvalidTxnStateError, match="UNINITIALIZED"):
        p.send("orders", value=b"x")
    with pytest.raises(InvalidTxnStateError, match="UNINITIALIZED"):
        p.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="UNINITIALIZED"):
        p.commit_transaction()
    p.init_transactions()
    with pytest.raises(InvalidTxnStateError, match="in state READY"):
        p.commit_transaction()
    with pytest.raises(InvalidTxnStateError, match="in state READY"):
        p.abort_transaction()
    with pytest.raises(InvalidTxnStateError, match="in state READY"):
        p.send("orders", value=b"x")
    p.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="in state IN_TRANSACTION"):
        p.begin_transaction()
    with pytest.raises(InvalidTxnStateError, match="IN_TRANSACTION"):
        p.init_transactions()
    assert p.txn is not None and p.txn.state is ClientTxnState.IN_TRANSACTION
    p.commit_transaction()  # an empty transaction commits without writing anything
    assert p.txn.state is ClientTxnState.READY
    assert orders.table("orders").snapshot().version == 0
    idem = make_producer(orders)
    with pytest.raises(InvalidTxnStateError, match="no transactional_id"):
        idem.begin_transaction()
    with pytest.raises(InvalidConfigurationError, match="need enable_idempotence=True"):
        Producer(orders, transactional_id="x", enable_idempotence=False)


def test_abortable_error_then_abort_and_continue(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """A failed send makes the transaction abortable; after abort the producer goes on."""
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=2)
    p = make_producer(wh, transactional_id="etl")
    p.init_transactions()
    p.begin_transaction()
    assert flushed(p, b"kept-then-aborted", 0) == 0
    epoch = p.producer_epoch
    boom = StorageError("injected permanent failure")
    fault_store.fail_before_write(lambda k: k.endswith(".parquet"), exc=boom)
    failed = p.send("orders", value=b"lost", partition=1)
    p.flush()
    assert failed.exception(timeout=10) is boom
    assert p.txn is not None and p.txn.state is ClientTxnState.ABORTABLE_ERROR
    # The abortable error itself, until the transaction is aborted (Kafka's rule).
    with pytest.raises(StorageError) as commit_error:
        p.commit_transaction()
    assert commit_error.value is boom
    with pytest.raises(StorageError) as send_error:
        p.send("orders", value=b"x", partition=0)
    assert send_error.value is boom
    p.abort_transaction()
    assert p.txn.state is ClientTxnState.READY
    assert p.producer_epoch > epoch  # burnt sequences: a fresh epoch
    p.begin_transaction()
    assert flushed(p, b"after", 1) == 0
    p.commit_transaction()
    assert read_all(wh, "orders", [0, 1], "read_committed") == {0: [], 1: [(0, b"after")]}
    part0 = wh.table("orders").snapshot().partition(0)
    assert [type(e).__name__ for e in part0.entries] == ["Batch", "Marker"]
    assert part0.aborted == [AbortedTxn(0, p.producer_id, 0, 1, 2)]
