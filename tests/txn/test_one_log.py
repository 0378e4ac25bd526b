"""CommitOneLog (issue 17): a transaction whose data all goes to one table commits as one
append of its batches and COMMIT markers, with no coordinator write but the table's
registration (once per id and table). Fencing then rests on InitProducerId's fence in every
registered table; sequences continue within the epoch; a refused append is abortable (out of
sequence: under a new epoch) or fatal (fenced)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from tableutil import MANUAL_FLUSH
from txnutil import assert_no_open_transactions, committed_values, log_versions, read_all

from txntable import Producer, Warehouse
from txntable.errors import (
    CorruptLogError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransientStorageError,
    UnsupportedProtocolError,
)
from txntable.protocol.actions import Batch, Marker
from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.records import encode_segment
from txntable.protocol.sequencing import AppendOp
from txntable.storage.wrappers import FaultInjectingStore
from txntable.structs import ProducerRecord, TopicPartition
from txntable.table import Table
from txntable.txn import coordinator as coordinator_module
from txntable.txn.coordinator import TransactionCoordinator, TxnMetadata, TxnState

MakeProducer = Callable[..., Producer]


def meta(wh: Warehouse, tid: str = "tx") -> tuple[TxnMetadata, str]:
    loaded = TransactionCoordinator(wh.store).load(tid)
    assert loaded is not None
    return loaded


def batches(table: Table) -> list[Batch]:
    return [a for _, actions in log_versions(table.log) for a in actions if isinstance(a, Batch)]


def markers(table: Table) -> list[Marker]:
    return [a for _, actions in log_versions(table.log) for a in actions if isinstance(a, Marker)]


def one_log(p: Producer, table: str, *values: bytes, partition: int = 0) -> None:
    p.begin_transaction()
    for v in values:
        p.send(table, value=v, partition=partition)
    p.commit_transaction()


def segment(table: Table, partition: int, values: list[bytes], **fields: object) -> PendingBatch:
    """A real segment of ``values`` written to ``table`` (not committed)."""
    data = encode_segment([ProducerRecord(None, v, (), 1_000) for v in values])
    path = table.segment_key(partition, f"{uuid.uuid4().hex}.parquet")
    table.store.put(path, data)
    return PendingBatch(
        partition=partition,
        path=path,
        count=len(values),
        size=len(data),
        min_timestamp=1_000,
        max_timestamp=1_000,
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def two_tables(wh: Warehouse) -> Warehouse:
    wh.create_table("a", partitions=2)
    wh.create_table("b", partitions=1)
    return wh


@pytest.fixture
def p(two_tables: Warehouse, make_producer: MakeProducer) -> Producer:
    """The transactional producer ``tx`` of ``two_tables``, initialised."""
    producer = make_producer(two_tables, transactional_id="tx")
    producer.init_transactions()
    return producer


def test_one_coordinator_write_per_table_then_one_log_version_per_transaction(
    two_tables: Warehouse, p: Producer
) -> None:
    wh = two_tables
    _, etag = meta(wh)
    one_log(p, "a", b"a1")  # registers a
    registered, etag_after = meta(wh)
    assert etag_after != etag and registered.tables == ("a",)
    assert registered.state is TxnState.EMPTY
    versions = len(list(log_versions(wh.table("a").log)))
    one_log(p, "a", b"a2", b"a3")
    assert meta(wh)[1] == etag_after  # no coordinator write at all
    assert len(list(log_versions(wh.table("a").log))) == versions + 1  # data and marker together
    one_log(p, "b", b"b1")
    assert meta(wh)[0].tables == ("a", "b")
    assert committed_values(wh, "a") == [b"a1", b"a2", b"a3"]
    assert committed_values(wh, "b") == [b"b1"]
    assert_no_open_transactions(wh.table("a"))


def test_sequences_continue_across_one_log_transactions_under_one_epoch(
    two_tables: Warehouse, p: Producer
) -> None:
    wh = two_tables
    epoch = p.producer_epoch
    one_log(p, "a", b"x", b"y")
    one_log(p, "a", b"z")
    p.begin_transaction()
    p.abort_transaction()  # an empty transaction keeps the epoch and the sequences
    one_log(p, "a", b"w")
    one_log(p, "a", b"v", partition=1)  # a partition new to the producer starts at 0
    got = [(b.partition, b.producerEpoch, b.baseSequence, b.count) for b in batches(wh.table("a"))]
    assert got == [(0, epoch, 0, 2), (0, epoch, 2, 1), (0, epoch, 3, 1), (1, epoch, 0, 1)]
    assert p.producer_epoch == epoch and meta(wh)[0].producer_epoch == epoch
    # A two-phase transaction at the same epoch continues them too, and then bumps.
    p.begin_transaction()
    p.send("a", value=b"u", partition=0)
    p.flush()
    p.commit_transaction()
    assert batches(wh.table("a"))[-1].baseSequence == 4
    assert p.producer_epoch == epoch + 1
    one_log(p, "a", b"t")
    assert (batches(wh.table("a"))[-1].producerEpoch, batches(wh.table("a"))[-1].baseSequence) == (
        epoch + 1,
        0,
    )
    assert committed_values(wh, "a") == [b"x", b"y", b"z", b"w", b"u", b"t"]


def test_init_transactions_fences_every_registered_table(
    two_tables: Warehouse, make_producer: MakeProducer
) -> None:
    """The old instance's next one-log append is refused in every table it registered,
    whether it commits directly or as a group-commit intent decided by a round."""
    wh = two_tables
    old = make_producer(wh, transactional_id="tx")
    old.init_transactions()
    one_log(old, "a", b"a-old")
    one_log(old, "b", b"b-old")
    pid, epoch = old.producer_id, old.producer_epoch
    old.begin_transaction()
    old.send("a", value=b"a-zombie", partition=1)

    new = make_producer(Warehouse(wh.url), transactional_id="tx")
    new.init_transactions()
    assert (new.producer_id, new.producer_epoch) == (pid, epoch + 1)
    for name in ("a", "b"):
        fence = markers(wh.table(name))[-1]
        assert (fence.partition, fence.type, fence.producerId, fence.producerEpoch) == (
            0,
            "ABORT",
            pid,
            epoch + 1,
        )
        assert wh.table(name).snapshot().producer_epochs[pid] == epoch + 1

    # Directly: the append is refused by the table (its registration is cached).
    with pytest.raises(ProducerFencedError) as refused:
        old.commit_transaction()
    assert type(refused.value) is ProducerFencedError
    with pytest.raises(ProducerFencedError):
        old.begin_transaction()  # fatal
    # As an intent: a round decides it and records the refusal.
    b = Warehouse(wh.url).table("b")
    assert b.group_commit is not None
    zombie = segment(
        b, 0, [b"b-zombie"], producer_id=pid, producer_epoch=epoch, base_sequence=1,
        transactional=True, transactional_id="tx",
    )  # fmt: skip
    op = AppendOp((zombie,), (PendingMarker(0, pid, epoch, "COMMIT"),))
    with pytest.raises(InvalidProducerEpochError):
        b.group_commit._follow(op, "tx", time.monotonic() + 30)
    b.close()
    assert committed_values(wh, "b") == [b"b-old"]
    assert read_all(wh, ["a"], "read_uncommitted") == [b"a-old"]
    one_log(new, "a", b"a-new")
    assert read_all(wh, ["a"]) == [b"a-old", b"a-new"]


def test_a_one_log_commit_that_beat_the_new_instance_is_kept(
    two_tables: Warehouse, make_producer: MakeProducer
) -> None:
    """As in Kafka when EndTxn beats InitProducerId: the commit happened before the new
    instance existed, and the fence follows it."""
    wh = two_tables
    old = make_producer(wh, transactional_id="tx")
    old.init_transactions()
    one_log(old, "a", b"first")
    new = make_producer(Warehouse(wh.url), transactional_id="tx")
    new.init_transactions()
    assert committed_values(wh, "a") == [b"first"]
    assert [m.type for m in markers(wh.table("a"))] == ["COMMIT", "ABORT"]  # the fence last


def at_last_epoch_but_one(
    wh: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch, **state: Any
) -> Producer:
    """Producer "tx" after a one-log commit to table a, its coordinator object moved to
    epoch 2 (with ``state``) where 3 is the last: the next InitProducerId rotates the id."""
    monkeypatch.setattr(coordinator_module, "MAX_PRODUCER_EPOCH", 3)
    old = make_producer(wh, transactional_id="tx")
    old.init_transactions()
    one_log(old, "a", b"a0")
    current, etag = meta(wh)
    TransactionCoordinator(wh.store).cas(
        coordinator_module.replace(current, producer_epoch=2, **state), etag
    )
    return old


def test_a_rotated_producer_id_fences_the_old_one_at_the_last_epoch(
    two_tables: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = two_tables
    old = at_last_epoch_but_one(wh, make_producer, monkeypatch)
    new = make_producer(Warehouse(wh.url), transactional_id="tx")
    new.init_transactions()  # epoch 3 is the reserved one: a new producer id
    assert new.producer_id != old.producer_id and new.producer_epoch == 0
    fence = markers(wh.table("a"))[-1]
    assert (fence.type, fence.producerId, fence.producerEpoch) == ("ABORT", old.producer_id, 3)


def test_a_rotation_while_completing_the_old_transaction_fences_the_old_id(
    two_tables: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous instance left a prepared transaction at its last epoch: completing it
    rotates the producer id before InitProducerId bumps, and the fence must still name the
    id the zombie holds (not the new one)."""
    wh = two_tables
    old = at_last_epoch_but_one(
        wh, make_producer, monkeypatch, state=TxnState.PREPARE_COMMIT, partitions={"b": (0,)}
    )
    new = make_producer(Warehouse(wh.url), transactional_id="tx")
    new.init_transactions()
    assert new.producer_id != old.producer_id and new.producer_epoch == 1
    fence = markers(wh.table("a"))[-1]
    assert (fence.type, fence.producerId, fence.producerEpoch) == ("ABORT", old.producer_id, 3)
    assert wh.table("a").snapshot().producer_epochs[old.producer_id] == 3


def test_out_of_order_sequence_is_abortable_and_the_abort_moves_to_a_new_epoch(
    two_tables: Warehouse, p: Producer
) -> None:
    wh = two_tables
    epoch = p.producer_epoch
    one_log(p, "a", b"a0")
    p.begin_transaction()
    future = p.send("a", value=b"gap", partition=0)
    txn = p.transaction_manager
    txn.next_sequence(TopicPartition("a", 0), 5)  # as if five records were lost in between
    with pytest.raises(OutOfOrderSequenceError):
        p.commit_transaction()
    assert isinstance(future.exception(5), OutOfOrderSequenceError)
    p.abort_transaction()  # BumpEpoch: the next transaction starts at sequence 0
    assert p.producer_epoch == epoch + 1
    current, _ = meta(wh)
    assert (current.state, current.producer_epoch, current.last_producer_epoch) == (
        TxnState.EMPTY,
        epoch + 1,
        epoch,
    )
    one_log(p, "a", b"a1")
    last = batches(wh.table("a"))[-1]
    assert (last.producerEpoch, last.baseSequence) == (epoch + 1, 0)
    assert committed_values(wh, "a") == [b"a0", b"a1"]


def test_a_segment_that_cannot_be_written_is_abortable_and_the_next_commit_works(
    memory_store: object, make_producer: MakeProducer
) -> None:
    store = FaultInjectingStore(memory_store)  # type: ignore[arg-type]
    wh = Warehouse(store=store)
    wh.create_table("a", partitions=1)
    p = make_producer(wh, transactional_id="tx", delivery_timeout_ms=200)
    p.init_transactions()
    one_log(p, "a", b"a0")
    epoch = p.producer_epoch
    p.begin_transaction()
    p.send("a", value=b"lost", partition=0)
    store.fail_before_write(
        lambda k: "/data/" in k, times=1000, exc=TransientStorageError("down"), ops={"put"}
    )
    with pytest.raises(TransientStorageError):
        p.commit_transaction()
    store.clear()
    p.abort_transaction()  # its sequence was taken: a new epoch, so no gap follows
    assert p.producer_epoch == epoch + 1
    one_log(p, "a", b"a1")
    assert committed_values(wh, "a") == [b"a0", b"a1"]


def test_a_stale_copy_of_a_one_log_append_closes_nothing(wh: Warehouse) -> None:
    """Writer requirement 8: an append landing again (an intent decided late, a retry)
    finds its batches duplicates and skips their markers, even where a later transaction of
    the same producer and epoch is open (which its COMMIT marker would close early)."""
    t = wh.create_table("t", partitions=1)
    fields = {"producer_id": 7, "producer_epoch": 0, "transactional": True}
    first = segment(t, 0, [b"one"], base_sequence=0, **fields)
    commit = [PendingMarker(0, 7, 0, "COMMIT")]
    t.append([first], commit)
    t.append([segment(t, 0, [b"open"], base_sequence=1, **fields)])  # two-phase, open
    stale, _ = t.append([first], commit)
    assert stale.duplicates == [True] and stale.base_offsets == [0]
    assert stale.marker_offsets == {}
    part = t.snapshot().partition(0)
    assert part.ongoing == {7: 2}  # still open: its data stays invisible
    assert read_all(wh, ["t"]) == [b"one"]


def test_the_coordinator_object_lists_tables_in_format_2(wh: Warehouse) -> None:
    plain = TxnMetadata("tx", 1, 0, TxnState.EMPTY, 60_000)
    listed = coordinator_module.replace(plain, tables=("a", "b"))
    assert b'"version":1' in plain.to_json() and b"tables" not in plain.to_json()
    assert b'"tables":["a","b"]' in listed.to_json() and b'"version":2' in listed.to_json()
    assert TxnMetadata.from_json(listed.to_json(), "k").tables == ("a", "b")
    with pytest.raises(CorruptLogError, match="tables"):
        TxnMetadata.from_json(listed.to_json().replace(b'["a","b"]', b'"a"'), "k")
    with pytest.raises(UnsupportedProtocolError):
        TxnMetadata.from_json(listed.to_json().replace(b'"version":2', b'"version":3'), "k")


def test_a_fenced_registration_is_refused(
    two_tables: Warehouse, make_producer: MakeProducer
) -> None:
    """A zombie committing to a table it never registered is stopped at RegisterTable."""
    wh = two_tables
    old = make_producer(wh, transactional_id="tx", **MANUAL_FLUSH)
    old.init_transactions()
    new = make_producer(Warehouse(wh.url), transactional_id="tx")
    new.init_transactions()
    old.begin_transaction()
    future = old.send("a", value=b"zombie", partition=0)
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    assert isinstance(future.exception(5), ProducerFencedError)
    assert meta(wh)[0].tables == ()
    assert read_all(wh, ["a"], "read_uncommitted") == []  # not even a segment committed
