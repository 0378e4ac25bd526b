"""Idempotent appends under ambiguous storage failures, and sequence validation on the log."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tableutil import ReadFaultStore, batches_in_log, is_log_version, read_all, write_batch

from txntable import Producer, Warehouse
from txntable.errors import OutOfOrderSequenceError, TransientStorageError

MakeProducer = Callable[..., Producer]


@pytest.mark.parametrize("transactional", [False, True])
def test_ambiguous_log_put_is_resolved_by_reading_back(
    fault_store: ReadFaultStore, make_producer: MakeProducer, transactional: bool
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, transactional_id="tx" if transactional else None)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    fault = fault_store.fail_after_write(is_log_version, ops={"put_if_absent"})
    futures = [p.send("orders", value=f"v{i}".encode(), partition=0) for i in range(3)]
    p.flush()
    assert fault.fired == 1
    assert [f.result(timeout=10).offset for f in futures] == [0, 1, 2]
    if transactional:
        p.commit_transaction()
    assert fault_store.get_faults_fired == 0
    logged = batches_in_log(wh, "orders")
    assert [(v, b.baseOffset, b.count, b.baseSequence) for v, b in logged] == [(1, 0, 3, 0)]
    level = "read_committed" if transactional else "read_uncommitted"
    assert read_all(wh, "orders", [0], level) == {0: [(0, b"v0"), (1, b"v1"), (2, b"v2")]}
    # The producer continues with the next sequence.
    if transactional:
        p.begin_transaction()
    nxt = p.send("orders", value=b"v3", partition=0)
    p.flush()
    assert nxt.result(timeout=10).offset == (4 if transactional else 3)
    logged = [b for _, b in batches_in_log(wh, "orders")]
    if transactional:
        # Every completed transaction bumps the epoch (KIP-890); sequences restart at 0.
        assert [(b.producerEpoch, b.baseSequence) for b in logged] == [
            (logged[0].producerEpoch, 0),
            (logged[0].producerEpoch + 1, 0),
        ]
    else:
        assert [b.baseSequence for b in logged] == [0, 3]


def test_ambiguous_put_without_idempotence_is_resolved_by_reading_back(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """Without sequences only the read-back of the commit id prevents a second copy."""
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, enable_idempotence=False)
    fault = fault_store.fail_after_write(is_log_version, ops={"put_if_absent"})
    future = p.send("orders", value=b"once", partition=0)
    p.flush()
    assert future.result(timeout=10).offset == 0 and fault.fired == 1
    logged = batches_in_log(wh, "orders")
    assert [(v, b.baseOffset, b.producerId, b.baseSequence) for v, b in logged] == [(1, 0, -1, -1)]
    assert read_all(wh, "orders", [0], "read_uncommitted") == {0: [(0, b"once")]}


@pytest.mark.parametrize("transactional", [False, True])
def test_ambiguous_put_and_failed_read_back_retries_as_duplicate(
    fault_store: ReadFaultStore, make_producer: MakeProducer, transactional: bool
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, transactional_id="tx" if transactional else None)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    version_keys: list[str] = []

    def ambiguous(key: str) -> TransientStorageError:
        fault_store.fail_next_get(key)  # the read-back of this very version fails too
        version_keys.append(key)
        return TransientStorageError(f"injected: outcome of writing {key} unknown")

    fault = fault_store.fail_after_write(
        is_log_version, ops={"put_if_absent"}, exc_factory=ambiguous
    )
    futures = [p.send("orders", value=f"v{i}".encode(), partition=0) for i in range(3)]
    p.flush()
    assert [f.result(timeout=10).offset for f in futures] == [0, 1, 2]
    assert fault.fired == 1 and fault_store.get_faults_fired == 1
    assert version_keys == ["orders/_log/00000000000000000001.json"]
    table = p.metadata.table("orders")  # the producer's own handle saw the conflict
    assert table.log.stats.ambiguous == 1
    assert table.log.stats.conflicts >= 1
    assert table.snapshot(refresh=False).version == 1  # the retry wrote nothing
    logged = batches_in_log(wh, "orders")
    assert [(v, b.baseOffset, b.count, b.baseSequence) for v, b in logged] == [(1, 0, 3, 0)]
    if transactional:
        p.commit_transaction()
    level = "read_committed" if transactional else "read_uncommitted"
    assert read_all(wh, "orders", [0], level) == {0: [(0, b"v0"), (1, b"v1"), (2, b"v2")]}
    assert read_all(wh, "orders", [0], "read_uncommitted")[0][:3] == [
        (0, b"v0"),
        (1, b"v1"),
        (2, b"v2"),
    ]


def test_failed_segment_put_is_retried(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh)
    fault = fault_store.fail_before_write(lambda k: k.endswith(".parquet"), times=2)
    future = p.send("orders", value=b"x", partition=0)
    p.flush()
    assert future.result(timeout=10).offset == 0
    assert fault.fired == 2
    assert read_all(wh, "orders", [0], "read_uncommitted") == {0: [(0, b"x")]}


def test_log_put_that_never_landed_is_retried(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh)
    fault = fault_store.fail_before_write(is_log_version, times=3, ops={"put_if_absent"})
    future = p.send("orders", value=b"x", partition=0)
    p.flush()
    assert future.result(timeout=10).offset == 0
    assert fault.fired == 3
    assert [v for v, _ in batches_in_log(wh, "orders")] == [1]


def test_out_of_order_sequence_is_rejected(wh: Warehouse) -> None:
    table = wh.create_table("orders", partitions=1)
    ident = {"producer_id": 7, "producer_epoch": 0}
    result, version = write_batch(table, 0, [b"a", b"b", b"c"], base_sequence=0, **ident)
    assert result.base_offsets == [0] and version == 1
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 3, got 5"):
        write_batch(table, 0, [b"x"], base_sequence=5, **ident)
    assert table.snapshot().version == 1
    assert table.snapshot().partition(0).high_watermark == 3
    # The exact retry of the first batch is a duplicate: original offsets, nothing written.
    result, version = write_batch(table, 0, [b"a", b"b", b"c"], base_sequence=0, **ident)
    assert result.base_offsets == [0] and result.duplicates == [True] and version == 1
    result, version = write_batch(table, 0, [b"d"], base_sequence=3, **ident)
    assert result.base_offsets == [3] and version == 2
    assert read_all(wh, "orders", [0], "read_uncommitted") == {
        0: [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    }


def test_stale_handle_rebases_offsets(wh: Warehouse) -> None:
    """A writer whose snapshot is behind loses the race, refreshes and gets later offsets."""
    wh.create_table("orders", partitions=1)
    a, b = wh.table("orders"), wh.table("orders")
    a.snapshot()
    b.snapshot()
    assert write_batch(b, 0, [b"b0", b"b1"])[0].base_offsets == [0]
    result, version = write_batch(a, 0, [b"a2"])
    assert result.base_offsets == [2] and version == 2
    assert a.log.stats.conflicts == 1
    assert read_all(wh, "orders", [0], "read_uncommitted") == {
        0: [(0, b"b0"), (1, b"b1"), (2, b"a2")]
    }


COORDINATOR_WRITES = [
    (1, False),
    (2, False),
    (1, True),
    (2, True),
    (3, True),
    (4, True),
]


def arm_nth(store: ReadFaultStore, prefix: str, nth: int, read_back_fails: bool):
    """Make the ``nth`` write under ``prefix`` land, then raise; optionally fail its read-back."""
    seen = 0

    def predicate(key: str) -> bool:
        nonlocal seen
        if key.startswith(prefix) and (prefix != "orders/" or is_log_version(key)):
            seen += 1
            return seen == nth
        return False

    def ambiguous(key: str) -> TransientStorageError:
        if read_back_fails:
            store.fail_next_get(key)
        return TransientStorageError(f"injected: outcome of writing {key} unknown")

    return store.fail_after_write(predicate, exc_factory=ambiguous)


@pytest.mark.parametrize("read_back_fails", [False, True], ids=["read-back-ok", "read-back-fails"])
@pytest.mark.parametrize(
    ("nth", "flush_first"),
    COORDINATOR_WRITES,
    ids=[f"{'flushed' if f else 'short-path'}-{n}" for n, f in COORDINATOR_WRITES],
)
def test_ambiguous_coordinator_write(
    fault_store: ReadFaultStore,
    make_producer: MakeProducer,
    nth: int,
    flush_first: bool,
    read_back_fails: bool,
) -> None:
    """The n-th write of the transaction's coordinator object lands but reports an error.

    Writes: 1 creates the object (init_transactions); then either 2 RegisterTable (the
    one-log commit's only coordinator write, and only for the id's first commit to the
    table), or 2 Ongoing (AddPartitions), 3 PrepareCommit, 4 CompleteCommit (data flushed
    before the commit).
    """
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    fault = arm_nth(fault_store, "_coordinator/txn/", nth, read_back_fails)
    p = make_producer(wh, transactional_id="tx")
    # A transient failure inside init_transactions is retried within delivery_timeout_ms
    # (the retry finds the object it created and bumps the epoch again).
    p.init_transactions()
    p.begin_transaction()
    future = p.send("orders", value=b"v", partition=0)
    if flush_first:
        p.flush()
    p.commit_transaction()
    assert fault.fired == 1
    assert fault_store.get_faults_fired == int(read_back_fails)
    assert future.result(timeout=10).offset == 0
    assert read_all(wh, "orders", [0], "read_committed") == {0: [(0, b"v")]}
    loaded = p.coordinator.load("tx")
    assert loaded is not None
    if flush_first:
        assert loaded[0].state.value == "CompleteCommit"
    else:  # one-log: the coordinator only lists the table, for InitProducerId's fence
        assert (loaded[0].state.value, loaded[0].tables) == ("Empty", ("orders",))
    p.begin_transaction()  # and the producer carries on
    nxt = p.send("orders", value=b"w", partition=0)
    p.commit_transaction()
    assert nxt.result(timeout=10).offset == 2
    assert read_all(wh, "orders", [0], "read_committed") == {0: [(0, b"v"), (2, b"w")]}


@pytest.mark.parametrize(
    ("flush_first", "commit"),
    [(False, True), (True, True), (True, False)],  # an unflushed abort writes no markers
    ids=["short-path-commit", "flushed-commit", "flushed-abort"],
)
def test_ambiguous_marker_version_with_failed_read_back(
    fault_store: ReadFaultStore, make_producer: MakeProducer, flush_first: bool, commit: bool
) -> None:
    """The version holding the markers lands, its write reports an error, the read-back fails."""
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    future = p.send("orders", value=b"v", partition=0)
    if flush_first:
        p.flush()
    fault = arm_nth(fault_store, "orders/", 1, read_back_fails=True)
    if commit:
        p.commit_transaction()
    else:
        p.abort_transaction()
    assert fault.fired == 1 and fault_store.get_faults_fired == 1
    assert future.result(timeout=10).offset == 0
    expected = [(0, b"v")] if commit else []
    assert read_all(wh, "orders", [0], "read_committed") == {0: expected}
    desc = wh.table("orders").describe().partitions[0]
    assert (desc.high_watermark, desc.last_stable_offset) == (2, 2)
    loaded = p.coordinator.load("tx")
    assert loaded is not None
    if flush_first:
        assert loaded[0].state.value == ("CompleteCommit" if commit else "CompleteAbort")
    else:  # a one-log commit: no decision in the coordinator
        assert loaded[0].state.value == "Empty"
    p.begin_transaction()
    nxt = p.send("orders", value=b"w", partition=0)
    p.commit_transaction()
    assert nxt.result(timeout=10).offset == 2
    assert read_all(wh, "orders", [0], "read_committed") == {0: [*expected, (2, b"w")]}
