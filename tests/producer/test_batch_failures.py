"""A batch that fails fails its own records, with a typed error, and nothing else.

Issue 21 item 4 (mixed explicit/keyless partitioning in one batch killed the sender with a
numpy ValueError) and the rule behind it: no exception outside the ``TxnTableError`` tree
reaches a caller, and the sender thread never dies of one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from tableutil import ReadFaultStore, is_log_version, read_all

from txntable import Producer, Warehouse
from txntable.errors import InternalError, KafkaTimeoutError, StorageError, TxnTableError
from txntable.producer import accumulator, partitioner, sender

MakeProducer = Callable[..., Producer]


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=3)
    return wh


def test_explicit_and_keyless_records_in_one_batch(
    t: Warehouse, make_producer: MakeProducer
) -> None:
    p = make_producer(t)
    explicit = p.send("t", value=b"a", partition=2)
    keyless = p.send("t", value=b"b")
    p.flush()
    assert (explicit.get(5).partition, explicit.get(5).offset) == (2, 0)
    chosen = keyless.get(5).partition
    assert 0 <= chosen < 3
    # The sender lives on.
    again = p.send("t", value=b"c", partition=1)
    p.flush()
    assert (again.get(5).partition, again.get(5).offset) == (1, 0 if chosen != 1 else 1)


def test_all_null_keys_hash_to_no_partition() -> None:
    keys = pa.array([None, None], pa.binary())
    assert partitioner.murmur2_array(keys).tolist() == [0, 0]
    assert partitioner.partitions_for_keys(keys, 4).tolist() == [-1, -1]


class Boom(RuntimeError):
    """A bug-like failure injected into the producer."""


def _fail_once(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Make ``module.name`` raise :class:`Boom` on its first call only."""
    real = getattr(module, name)
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Boom("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky)
    return calls


@pytest.mark.parametrize("where", ["sealing", "sending"])
def test_a_bug_in_one_batch_fails_that_batch_only(
    t: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == "sealing":
        _fail_once(monkeypatch, accumulator, "choose_partitions")
    else:
        _fail_once(monkeypatch, sender, "encode_table")
    p = make_producer(t)
    doomed = [p.send("t", value=b"x", partition=0) for _ in range(3)]
    p.flush()
    for future in doomed:
        with pytest.raises(InternalError, match="Boom: injected") as info:
            future.get(5)
        assert isinstance(info.value.__cause__, Boom)
    healthy = p.send("t", value=b"y", partition=0)
    p.flush()
    assert (healthy.get(5).partition, healthy.get(5).offset) == (0, 0)
    assert read_all(t, "t", [0], "read_committed") == {0: [(0, b"y")]}


def test_a_bug_while_sealing_in_the_callers_thread_is_typed(
    t: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send`` seals in the caller's thread once enough is buffered: the bug reaches the
    batch's futures, never the caller as a ValueError."""
    _fail_once(monkeypatch, accumulator, "greedy_cuts")
    p = make_producer(t, batch_size=64, max_request_size=200, buffer_memory=100_000)
    futures = [p.send("t", value=b"v" * 40) for _ in range(30)]
    p.flush()
    errors = [f.exception(5) for f in futures]
    assert any(isinstance(e, InternalError) for e in errors)
    assert all(e is None or isinstance(e, InternalError) for e in errors)
    ok = p.send("t", value=b"after")
    p.flush()
    assert ok.get(5).offset >= 0


def test_send_batch_bug_is_typed(
    t: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_once(monkeypatch, accumulator, "seal")
    p = make_producer(t)
    with pytest.raises(InternalError) as info:
        p.send_batch("t", {"value": [b"a", b"b"]}, partition=0)
    assert isinstance(info.value.__cause__, Boom)
    result = p.send_batch("t", {"value": [b"c"]}, partition=0)
    p.flush()
    assert result.get(5).offsets.tolist() == [0]


def test_transaction_with_a_failed_batch_must_abort_then_works(
    t: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_once(monkeypatch, accumulator, "choose_partitions")
    p = make_producer(t, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"lost", partition=0)
    with pytest.raises(InternalError):
        p.commit_transaction()  # the short path must not commit a transaction missing a batch
    p.abort_transaction()
    p.begin_transaction()
    p.send("t", value=b"kept", partition=0)
    p.commit_transaction()
    # Offset 0 is the aborted transaction's ABORT marker (nothing of it was written).
    assert read_all(t, "t", [0], "read_committed") == {0: [(0, b"kept")]}


def test_wrap_keeps_typed_errors() -> None:
    typed = TxnTableError("x")
    assert InternalError.wrap(typed) is typed
    wrapped = InternalError.wrap(ValueError("zero-size array"))
    assert isinstance(wrapped, InternalError) and isinstance(wrapped.__cause__, ValueError)


# --- KIP-360: a failed idempotent batch does not fail the next healthy one (issue 25.4) ------


@pytest.mark.parametrize("failure", ["refused", "timed out"])
def test_the_next_healthy_batch_after_a_failed_one_succeeds(
    fault_store: ReadFaultStore, make_producer: MakeProducer, failure: str
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("t", partitions=2)
    p = make_producer(wh, linger_ms=0, delivery_timeout_ms=200)
    first = [p.send("t", value=b"a%d" % i, partition=i) for i in (0, 1)]
    assert [f.get(10).offset for f in first] == [0, 0]
    if failure == "refused":  # nothing written: the log put is refused
        fault_store.fail_before_write(
            is_log_version, times=1, exc=StorageError("refused"), ops={"put_if_absent"}
        )
        expected: type[Exception] = StorageError
    else:  # storage down longer than delivery_timeout_ms: the batch expires
        fault_store.fail_before_write(lambda k: k.endswith(".parquet"), times=10_000)
        expected = KafkaTimeoutError
    lost = [p.send("t", value=b"b%d" % i, partition=i) for i in (0, 1)]
    for f in lost:
        with pytest.raises(expected):
            f.get(10)
    fault_store.clear()
    later = [p.send("t", value=b"c%d" % i, partition=i) for i in (0, 1)]
    assert [f.get(10).offset for f in later] == [1, 1]
    got = read_all(wh, "t", [0, 1], "read_committed")
    assert got == {0: [(0, b"a0"), (1, b"c0")], 1: [(0, b"a1"), (1, b"c1")]}
    # The producer continued under a new epoch, sequences from 0 (KIP-360).
    snap = wh.table("t").snapshot()
    entry = snap.partition(0).producers[p.producer_id]
    assert entry.epoch == 1 and entry.last_seq == 0
