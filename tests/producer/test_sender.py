"""The sender alone: rounds drained from a real accumulator, written and committed to a real
store, with a real transaction manager for ids and sequences; no ``Producer``.

Records are appended to the accumulator directly and never linger (a round is ready only
on flush or close), so a test decides which records share a round.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tableutil import batches_in_log, read_all

from txntable import Warehouse
from txntable.errors import KafkaTimeoutError, ProducerFencedError, TransientStorageError
from txntable.producer.accumulator import PY_RECORD_OVERHEAD, RecordAccumulator
from txntable.producer.futures import FutureRecordMetadata
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.producer.sender import Sender
from txntable.producer.transaction_manager import ClientTxnState, TransactionManager
from txntable.storage import MemoryStore
from txntable.storage.base import Store, StoreWrapper
from txntable.storage.wrappers import FaultInjectingStore
from txntable.structs import RECORD_OVERHEAD

Parts = tuple[RecordAccumulator, TransactionManager, Sender]


@pytest.fixture
def store(memory_store: MemoryStore) -> FaultInjectingStore:
    return FaultInjectingStore(memory_store)


@pytest.fixture
def t(store: FaultInjectingStore) -> Warehouse:
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=3)
    return wh


@pytest.fixture
def make_parts() -> Iterator[Callable[..., Parts]]:
    made: list[tuple[RecordAccumulator, Sender, ProducerMetadata]] = []

    def make(
        wh: Warehouse, transactional_id: str | None = None, delivery_timeout_ms: int = 5000
    ) -> Parts:
        retries = Retries(delivery_timeout_ms, 1000)
        metadata = ProducerMetadata(wh, retries)
        txn = TransactionManager(metadata, retries, transactional_id, True, 60_000)
        acc = RecordAccumulator(
            metadata,
            batch_size=1 << 30,
            linger_ms=600_000,
            buffer_memory=32 << 20,
            max_block_ms=1000,
            max_request_size=1 << 20,
            on_unsent_failure=lambda e: txn.batch_failed(e, sequenced=False),
        )
        sender = Sender(acc, txn, metadata, retries, maintenance=None)
        sender.start()
        made.append((acc, sender, metadata))
        return acc, txn, sender

    yield make
    for acc, sender, metadata in made:
        acc.close()
        sender.close(10)
        assert not sender.is_alive()
        metadata.close()


def put(acc: RecordAccumulator, value: bytes, partition: int) -> FutureRecordMetadata:
    size = RECORD_OVERHEAD + len(value)
    return acc.append("t", None, value, 1_000, partition, (), size, size + PY_RECORD_OVERHEAD)


def sent(acc: RecordAccumulator, value: bytes, partition: int) -> FutureRecordMetadata:
    """``put`` and flush: the record's own round."""
    future = put(acc, value, partition)
    acc.flush(10)
    return future


def spy_registrations(
    txn: TransactionManager, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, set[int]]]:
    """Every AddPartitionsToTxn the coordinator is asked for, from now on."""
    registered: list[dict[str, set[int]]] = []
    real = txn.coordinator.add_partitions

    def spy(tid: str, pid: int, epoch: int, partitions: dict[str, set[int]]) -> None:
        registered.append({k: set(v) for k, v in partitions.items()})
        real(tid, pid, epoch, partitions)

    monkeypatch.setattr(txn.coordinator, "add_partitions", spy)
    return registered


def is_segment(key: str) -> bool:
    return key.startswith("t/data/")


def test_a_round_is_one_segment_per_partition_committed_as_one_log_version(
    t: Warehouse, make_parts: Callable[..., Parts]
) -> None:
    acc, txn, _ = make_parts(t)
    futures = [put(acc, b"a", 0), put(acc, b"b", 2), put(acc, b"c", 0)]
    assert acc.flush(10)
    assert [(f.get(0).partition, f.get(0).offset) for f in futures] == [(0, 0), (2, 0), (0, 1)]
    found = batches_in_log(t, "t")
    assert {v for v, _ in found} == {1}  # version 0 created the table
    identity = [
        (b.partition, b.count, b.producerId, b.producerEpoch, b.baseSequence) for _, b in found
    ]
    assert identity == [(0, 2, txn.producer_id, 0, 0), (2, 1, txn.producer_id, 0, 0)]
    assert txn.producer_id >= 0
    # The next round continues each partition's sequences.
    assert sent(acc, b"d", 0).get(0).offset == 2
    assert batches_in_log(t, "t")[-1][1].baseSequence == 2
    assert read_all(t, "t", [0, 1, 2], "read_committed") == {
        0: [(0, b"a"), (1, b"c"), (2, b"d")],
        1: [],
        2: [(0, b"b")],
    }


def test_failed_segment_puts_are_retried_within_the_delivery_timeout(
    t: Warehouse, store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    acc, _, _ = make_parts(t)
    fault = store.fail_before_write(is_segment, times=2)
    assert sent(acc, b"x", 1).get(0).offset == 0
    assert fault.fired == 2
    assert [b.count for _, b in batches_in_log(t, "t")] == [1]


def test_a_batch_not_written_in_time_fails_alone_and_the_next_round_goes_on(
    t: Warehouse, store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    acc, txn, sender = make_parts(t, delivery_timeout_ms=300)
    store.fail_before_write(is_segment, times=1000, exc=TransientStorageError("down"))
    doomed = put(acc, b"lost", 0)
    acc.flush(10)
    with pytest.raises(KafkaTimeoutError, match="not committed within delivery_timeout_ms=300"):
        doomed.get(0)
    # KIP-360: the failed batch's sequence may never reach the log: a new epoch restarts them.
    assert txn.producer_epoch == 1
    store.clear()
    assert sent(acc, b"kept", 0).get(0).offset == 0
    assert sender.is_alive()
    assert [(b.producerEpoch, b.baseSequence) for _, b in batches_in_log(t, "t")] == [(1, 0)]


def test_a_transactional_round_registers_each_new_partition_once(
    t: Warehouse, make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    acc, txn, _ = make_parts(t, transactional_id="tx")
    txn.init_transactions()
    txn.begin_transaction()
    registered = spy_registrations(txn, monkeypatch)
    put(acc, b"a", 0)
    acc.flush(10)
    put(acc, b"b", 0)
    put(acc, b"c", 1)
    acc.flush(10)
    assert registered == [{"t": {0}}, {"t": {1}}]
    assert all(b.transactional for _, b in batches_in_log(t, "t"))
    assert read_all(t, "t", [0, 1], "read_committed") == {0: [], 1: []}
    txn.begin_commit()
    txn.commit()
    assert read_all(t, "t", [0, 1], "read_committed") == {0: [(0, b"a"), (1, b"b")], 1: [(0, b"c")]}


def test_the_short_path_writes_its_segments_and_leaves_the_commit_to_the_manager(
    t: Warehouse, make_parts: Callable[..., Parts]
) -> None:
    acc, txn, sender = make_parts(t, transactional_id="tx")
    txn.init_transactions()
    txn.begin_transaction()
    future = put(acc, b"a", 2)
    whole = acc.drain_whole(txn.short_path_allowed)
    assert whole is not None
    segments_then: list[list[str]] = []

    def register() -> None:
        # Runs beside the segment's put (both before the append): the segment lands while
        # the registration is still in progress (run one after the other, it never would).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            written = [k for k in t.store.list("t/") if k.endswith(".parquet")]
            if written:
                segments_then.append(written)
                return
            time.sleep(0.005)

    written = sender.write_transaction(whole, register)
    assert len(segments_then) == 1 and len(segments_then[0]) == 1
    ((pending,),) = written.values()
    assert (pending.partition, pending.count, pending.base_sequence) == (2, 1, 0)
    assert t.store.get_data_file(pending.path)  # written
    assert acc.used_memory == 0  # the round is handed back
    assert batches_in_log(t, "t") == [] and not future.done()
    txn.begin_commit()
    txn.commit_one_log("t", whole["t"], written["t"])
    assert (future.get(0).partition, future.get(0).offset) == (2, 0)


def test_a_failed_registration_beside_the_segments_fails_the_transaction_with_its_error(
    t: Warehouse, store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    """The registration's error is the transaction's, whether the segments were written or
    failed too: a fenced producer is fatal, whatever else went wrong."""
    for segments_fail in (False, True):
        acc, txn, sender = make_parts(
            t, transactional_id=f"tx{segments_fail}", delivery_timeout_ms=200
        )
        txn.init_transactions()
        txn.begin_transaction()
        future = put(acc, b"a", 0)
        whole = acc.drain_whole(txn.short_path_allowed)
        assert whole is not None
        if segments_fail:
            store.fail_before_write(is_segment, times=1000, exc=TransientStorageError("down"))

        def register() -> None:
            raise ProducerFencedError("a newer instance")

        with pytest.raises(ProducerFencedError, match="a newer instance") as raised:
            sender.write_transaction(whole, register)
        assert isinstance(future.exception(0), ProducerFencedError)
        assert txn.state is ClientTxnState.FATAL_ERROR
        assert acc.used_memory == 0
        if segments_fail:
            assert isinstance(raised.value.__cause__, TransientStorageError)
        store.clear()


def test_a_short_path_segment_that_cannot_be_written_fails_the_transaction(
    t: Warehouse, store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    acc, txn, sender = make_parts(t, transactional_id="tx", delivery_timeout_ms=200)
    txn.init_transactions()
    txn.begin_transaction()
    future = put(acc, b"a", 0)
    whole = acc.drain_whole(txn.short_path_allowed)
    assert whole is not None
    store.fail_before_write(is_segment, times=1000, exc=TransientStorageError("down"))
    with pytest.raises(TransientStorageError, match="down"):
        sender.write_transaction(whole)
    assert isinstance(future.exception(0), TransientStorageError)
    assert txn.state is ClientTxnState.ABORTABLE_ERROR
    assert acc.used_memory == 0


def test_the_sender_drains_what_is_buffered_before_it_stops(
    t: Warehouse, make_parts: Callable[..., Parts]
) -> None:
    acc, _, sender = make_parts(t)
    future = put(acc, b"last", 1)
    assert acc.close() == 1
    sender.join(10)
    assert not sender.is_alive()
    assert future.get(0).offset == 0


def test_an_error_of_the_senders_own_machinery_is_kept_and_the_thread_goes_on(
    t: Warehouse, make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    acc, txn, sender = make_parts(t, transactional_id="tx")
    txn.init_transactions()
    txn.begin_transaction()
    boom = RuntimeError("broken")
    calls: list[Any] = []
    real = acc.seal_all

    def seal_all() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise boom
        real()

    monkeypatch.setattr(acc, "seal_all", seal_all)
    future = put(acc, b"a", 0)
    assert acc.flush(10)
    assert future.get(0).offset == 0  # the next loop sealed and sent it
    assert sender.error is boom
    assert txn.state is ClientTxnState.FATAL_ERROR
    assert sender.is_alive()


def test_the_sender_warms_arrows_python_conversion_before_the_first_commit(
    tmp_path: Any,
) -> None:
    """pyarrow imports pandas on its first conversion of Python objects (0.25-0.5 s): the
    sender does that conversion as it starts, so a producer's first commit does not."""
    pytest.importorskip("pandas")
    script = f"""
import sys, time
from txntable import Producer, Warehouse
wh = Warehouse({str(tmp_path)!r})
wh.create_table("t", partitions=1)
assert "pandas" not in sys.modules
with Producer(wh) as producer:
    deadline = time.monotonic() + 30
    while "pandas" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    print("pandas" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"


def test_a_failing_warm_up_does_not_stop_the_sender(
    monkeypatch: pytest.MonkeyPatch, t: Warehouse
) -> None:
    """A broken pandas install makes pyarrow's first conversion raise: the sender thread
    must still run rounds (the records' own conversion reports the error to their batch)."""
    import txntable.producer.sender as sender_module

    real = sender_module.pa.array
    calls = []

    def array(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            calls.append(1)
            raise ValueError("numpy.dtype size changed, may indicate binary incompatibility")
        return real(*args, **kwargs)

    monkeypatch.setattr(sender_module.pa, "array", array)
    from txntable import Producer

    with Producer(t) as producer:
        metadata = producer.send("t", value=b"v", partition=1).get(timeout=30)
    assert calls == [1]
    assert (metadata.partition, metadata.offset) == (1, 0)


class _InFlight(StoreWrapper):
    """Segment puts and log-version puts take 30 ms; the most of each in flight at once."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.most = {"segment": 0, "version": 0}
        self._now = {"segment": 0, "version": 0}
        self._lock = threading.Lock()

    def _slow(self, kind: str, call: Callable[[], Any]) -> Any:
        with self._lock:
            self._now[kind] += 1
            self.most[kind] = max(self.most[kind], self._now[kind])
        try:
            time.sleep(0.03)
            return call()
        finally:
            with self._lock:
                self._now[kind] -= 1

    def put_data_file(self, key: str, data: bytes) -> None:
        self._slow("segment", lambda: super(_InFlight, self).put_data_file(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        if "/_log/0" not in key:
            return super().put_if_absent(key, data)
        return self._slow("version", lambda: super(_InFlight, self).put_if_absent(key, data))


def test_a_transactional_round_of_two_tables_puts_and_appends_them_at_once(
    memory_store: MemoryStore, make_parts: Callable[..., Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One registration for both tables, their segments in flight together, then their
    appends together (a round trip each, not one per table); the futures complete on the
    sender's thread, in table order."""
    Warehouse(store=memory_store).create_table("t", partitions=1)
    Warehouse(store=memory_store).create_table("u", partitions=1)
    store = _InFlight(memory_store)
    wh = Warehouse(store=store)
    acc, txn, _ = make_parts(wh, transactional_id="tx")
    txn.init_transactions()
    txn.begin_transaction()
    registered = spy_registrations(txn, monkeypatch)
    completed: list[tuple[str, str]] = []
    for topic in ("t", "u"):
        size = RECORD_OVERHEAD + 1
        future = acc.append(topic, None, b"x", 1_000, 0, (), size, size + PY_RECORD_OVERHEAD)
        future.add_callback(
            lambda _md, topic=topic: completed.append((topic, threading.current_thread().name))
        )
    store.most = {"segment": 0, "version": 0}
    acc.flush(10)
    assert registered == [{"t": {0}, "u": {0}}]
    assert store.most == {"segment": 2, "version": 2}
    assert completed == [("t", "txntable-sender"), ("u", "txntable-sender")]
    txn.begin_commit()
    txn.commit()
    assert read_all(wh, "t", [0], "read_committed") == {0: [(0, b"x")]}
    assert read_all(wh, "u", [0], "read_committed") == {0: [(0, b"x")]}


def test_a_table_whose_segment_cannot_be_written_fails_alone_in_a_round_of_two(
    store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=1)
    wh.create_table("u", partitions=1)
    acc, txn, _ = make_parts(wh, transactional_id="tx", delivery_timeout_ms=300)
    txn.init_transactions()
    txn.begin_transaction()
    store.fail_before_write(lambda k: k.startswith("t/data/"), times=1000)
    size = RECORD_OVERHEAD + 1
    doomed = acc.append("t", None, b"x", 1_000, 0, (), size, size + PY_RECORD_OVERHEAD)
    kept = acc.append("u", None, b"y", 1_000, 0, (), size, size + PY_RECORD_OVERHEAD)
    acc.flush(10)
    with pytest.raises(KafkaTimeoutError, match="batch of t not committed"):
        doomed.get(0)
    assert kept.get(0).offset == 0
    assert txn.state is ClientTxnState.ABORTABLE_ERROR


def test_an_idempotent_round_of_two_tables_puts_and_appends_them_at_once(
    memory_store: MemoryStore, make_parts: Callable[..., Parts]
) -> None:
    Warehouse(store=memory_store).create_table("t", partitions=1)
    Warehouse(store=memory_store).create_table("u", partitions=1)
    store = _InFlight(memory_store)
    wh = Warehouse(store=store)
    acc, _, _ = make_parts(wh)
    size = RECORD_OVERHEAD + 1
    futures = [
        acc.append(topic, None, b"x", 1_000, 0, (), size, size + PY_RECORD_OVERHEAD)
        for topic in ("t", "u")
    ]
    acc.flush(10)
    assert [f.get(0).offset for f in futures] == [0, 0]
    assert store.most == {"segment": 2, "version": 2}
    assert read_all(wh, "u", [0], "read_committed") == {0: [(0, b"x")]}


def test_a_transactions_last_segment_is_put_on_the_committing_thread(
    t: Warehouse, store: FaultInjectingStore, make_parts: Callable[..., Parts]
) -> None:
    """The caller waits for the puts anyway: the last segment (a small transaction's only
    one) is put on its thread, the others on the put pool while it encodes; a failure of
    either fails the transaction, the first batch's error first."""
    threads: dict[str, int] = {}
    put_data_file = store.inner.put_data_file

    def recording(key: str, data: bytes) -> None:
        threads[key] = threading.get_ident()
        put_data_file(key, data)

    store.inner.put_data_file = recording  # type: ignore[method-assign]
    acc, txn, sender = make_parts(t, transactional_id="tx", delivery_timeout_ms=200)
    txn.init_transactions()
    txn.begin_transaction()
    for p in (0, 1, 2):
        put(acc, b"v%d" % p, p)
    whole = acc.drain_whole(txn.short_path_allowed)
    assert whole is not None
    written = sender.write_transaction(whole)
    paths = [b.path for b in written["t"]]
    assert len(paths) == 3 and set(threads) == set(paths)
    assert threads[paths[-1]] == threading.get_ident()
    assert all(threads[p] != threading.get_ident() for p in paths[:-1])
    txn.begin_commit()
    txn.commit_one_log("t", whole["t"], written["t"])

    txn.begin_transaction()
    futures = [put(acc, b"w%d" % p, p) for p in (0, 1, 2)]
    whole = acc.drain_whole(txn.short_path_allowed)
    assert whole is not None
    first, last = (str(b.partition) for b in (whole["t"][0], whole["t"][-1]))
    store.fail_before_write(
        lambda key: f"partition={first}/" in key, times=1000, exc=TransientStorageError("one")
    )
    store.fail_before_write(
        lambda key: f"partition={last}/" in key, times=1000, exc=TransientStorageError("two")
    )
    with pytest.raises(TransientStorageError, match="one"):
        sender.write_transaction(whole)
    assert all(isinstance(f.exception(0), TransientStorageError) for f in futures)
    assert acc.used_memory == 0
