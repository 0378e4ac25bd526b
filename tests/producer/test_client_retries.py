"""Client state and retries under failing storage (issue 9, items 1 and 2).

An abort that waits for a failing batch ends in READY, not in ABORTABLE_ERROR; transient
storage errors of a first table load, of ``send_offsets_to_transaction`` and of
``recover()``'s listing are retried within the documented timeouts, and only then become
``KafkaTimeoutError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from tableutil import ReadFaultStore, read_all

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import KafkaTimeoutError, TransientStorageError
from txntable.producer.transaction_manager import ClientTxnState
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    StoreWrapper,
)
from txntable.structs import ConsumerGroupMetadata, OffsetAndMetadata
from txntable.txn.coordinator import TransactionCoordinator

MakeProducer = Callable[..., Producer]


class FlakyReads(StoreWrapper):
    """Fails the next ``times`` GET / HEAD / LIST requests whose key matches, then recovers.

    ``times=-1`` fails every matching request until :meth:`heal` is called.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._faults: list[list[object]] = []
        self.fired = 0
        self._lock = threading.Lock()

    def fail(self, predicate: Callable[[str], bool], times: int = 1) -> None:
        with self._lock:
            self._faults.append([predicate, times])

    def heal(self) -> None:
        with self._lock:
            self._faults.clear()

    def _check(self, op: str, key: str) -> None:
        with self._lock:
            for fault in self._faults:
                predicate, remaining = fault
                if remaining != 0 and predicate(key):  # type: ignore[operator]
                    fault[1] = remaining - 1 if remaining > 0 else -1  # type: ignore[operator]
                    self.fired += 1
                    raise TransientStorageError(f"injected {op} failure of {key!r}")

    def get(self, key: str) -> StoredObject:
        self._check("GET", key)
        return super().get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._check("HEAD", key)
        return super().head(key)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        self._check("LIST", prefix)
        return super().list(prefix, start_after)

    def get_data_file(self, key: str) -> bytes:
        self._check("GET", key)
        return super().get_data_file(key)


@pytest.fixture
def flaky(memory_store: Store) -> FlakyReads:
    return FlakyReads(memory_store)


def in_transaction(
    store: Store, make_producer: MakeProducer, **kwargs: object
) -> tuple[Warehouse, Producer]:
    """A one-partition table ``t`` and a producer ``tx`` inside a transaction."""
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=1)
    p = make_producer(wh, transactional_id="tx", **kwargs)
    p.init_transactions()
    p.begin_transaction()
    return wh, p


# --- 1. an abort that waits for a failing batch ------------------------------------------------


def test_abort_waiting_for_a_failing_batch_ends_ready(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """Storage fails longer than delivery_timeout_ms while abort waits for the batch."""
    wh, p = in_transaction(fault_store, make_producer, linger_ms=0, delivery_timeout_ms=300)
    fault = fault_store.fail_before_write(lambda k: k.endswith(".parquet"), times=10_000)
    lost = p.send("t", value=b"lost", partition=0)
    deadline = time.monotonic() + 10
    while fault.fired == 0:  # the batch is in flight: the sender is retrying its segment
        assert time.monotonic() < deadline, "the sender never picked the batch up"
        time.sleep(0.005)
    p.abort_transaction()  # waits for the batch, which fails after delivery_timeout_ms
    assert p.txn is not None and p.txn.state is ClientTxnState.READY
    with pytest.raises(KafkaTimeoutError, match="delivery_timeout_ms=300") as info:
        lost.result(timeout=0)  # Kafka's batch expiry: a timeout, the outcome unknown
    assert isinstance(info.value.__cause__, TransientStorageError)
    fault_store.clear()
    p.begin_transaction()
    p.send("t", value=b"kept", partition=0)
    p.commit_transaction()
    assert read_all(wh, "t", [0], "read_committed") == {0: [(0, b"kept")]}


def test_abort_whose_end_txn_fails_can_be_called_again(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """A failing EndTxn leaves the abort resumable: the same call finishes it."""
    wh, p = in_transaction(fault_store, make_producer, delivery_timeout_ms=200)
    p.send("t", value=b"aborted", partition=0)
    p.flush()
    fault_store.fail_before_write(lambda k: k.startswith("_coordinator/txn/"), times=10_000)
    with pytest.raises(KafkaTimeoutError):
        p.abort_transaction()
    fault_store.clear()
    p.abort_transaction()
    assert p.txn is not None and p.txn.state is ClientTxnState.READY
    p.begin_transaction()
    p.send("t", value=b"kept", partition=0)
    p.commit_transaction()
    assert read_all(wh, "t", [0], "read_committed") == {0: [(2, b"kept")]}


# --- 2. transient errors are retried within the documented timeouts ----------------------------


def test_send_retries_the_first_table_load(flaky: FlakyReads, make_producer: MakeProducer) -> None:
    wh = Warehouse(store=flaky)
    wh.create_table("t", partitions=1)
    p = make_producer(wh, max_block_ms=10_000)
    flaky.fail(lambda k: k == "t/_log/00000000000000000000.json", times=2)  # HEAD, then GET
    flaky.fail(lambda k: k == "t/_log/_last_checkpoint", times=1)
    future = p.send("t", value=b"v", partition=0)
    p.flush()
    assert future.result(timeout=10).offset == 0
    assert flaky.fired == 3


def test_send_gives_up_after_max_block_ms(flaky: FlakyReads, make_producer: MakeProducer) -> None:
    wh = Warehouse(store=flaky)
    wh.create_table("t", partitions=1)
    p = make_producer(wh, max_block_ms=200)
    flaky.fail(lambda k: k.startswith("t/_log/"), times=-1)
    start = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="max_block_ms=200"):
        p.send("t", value=b"v", partition=0)
    assert 0.15 < time.monotonic() - start < 5
    flaky.heal()
    future = p.send("t", value=b"v", partition=0)  # the producer is still usable
    p.flush()
    assert future.result(timeout=10).offset == 0


@pytest.mark.parametrize(
    "failing",
    [
        "coordinator CAS",  # AddPartitionsToTxn of the group log
        "coordinator GET",
        "group log read",
        "group log commit",
    ],
)
def test_send_offsets_to_transaction_retries(
    fault_store: ReadFaultStore, make_producer: MakeProducer, failing: str
) -> None:
    wh, p = in_transaction(fault_store, make_producer, max_block_ms=10_000)
    p.send("t", value=b"v", partition=0)
    p.flush()
    group_v0 = "_groups/g/_log/00000000000000000000.json"
    if failing == "coordinator CAS":
        fault = fault_store.fail_before_write(
            lambda k: k == "_coordinator/txn/tx.json", times=2, ops={"put_if_match"}
        )
    elif failing == "coordinator GET":
        # Another client changed the object: the producer's copy is stale, so it reads it.
        other = TransactionCoordinator(fault_store.inner)
        loaded = other.load("tx")
        assert loaded is not None
        meta, etag = loaded
        other.cas(replace(meta, last_update_timestamp=meta.last_update_timestamp + 1), etag)
        fault_store.fail_next_get("_coordinator/txn/tx.json", times=2)
    elif failing == "group log read":
        Consumer(wh, group_id="g").commit({TopicPartition("t", 0): OffsetAndMetadata(0)})
        fault_store.fail_next_get(group_v0, times=2)
    else:
        fault = fault_store.fail_before_write(
            lambda k: k.startswith("_groups/g/_log/000"), times=2, ops={"put_if_absent"}
        )
    tp = TopicPartition("t", 0)
    p.send_offsets_to_transaction({tp: OffsetAndMetadata(1)}, ConsumerGroupMetadata("g"))
    p.commit_transaction()
    if failing in ("coordinator CAS", "group log commit"):
        assert fault.fired == 2
    else:
        assert fault_store.get_faults_fired == 2
    committed = Consumer(wh, group_id="g").committed(tp)
    assert committed is not None and committed.offset == 1


def test_send_offsets_to_transaction_times_out(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    wh, p = in_transaction(fault_store, make_producer, max_block_ms=200)
    fault_store.fail_before_write(lambda k: k.startswith("_groups/"), times=10_000)
    tp = TopicPartition("t", 0)
    with pytest.raises(KafkaTimeoutError, match="max_block_ms=200"):
        p.send_offsets_to_transaction({tp: OffsetAndMetadata(1)}, ConsumerGroupMetadata("g"))
    # The offsets may or may not be pending: the transaction can only be aborted.
    assert p.txn is not None and p.txn.state is ClientTxnState.ABORTABLE_ERROR
    fault_store.clear()
    p.abort_transaction()
    assert Consumer(wh, group_id="g").committed(tp) is None


def _stuck_transaction(wh: Warehouse) -> Producer:
    wh.create_table("t", partitions=1)
    p = Producer(wh, transactional_id="stuck", linger_ms=0, transaction_timeout_ms=1)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"v", partition=0).result(timeout=10)
    return p


def test_recover_retries_its_listing(flaky: FlakyReads) -> None:
    wh = Warehouse(store=flaky)
    p = _stuck_transaction(wh)
    flaky.fail(lambda k: k == "_coordinator/txn/", times=2)
    flaky.fail(lambda k: k == "_coordinator/txn/stuck.json", times=2)
    report = wh.recover(now=int(time.time() * 1000) + 60_000)
    assert report.timed_out == ["stuck"] and report.failed == {}
    assert flaky.fired == 4
    assert wh.table("t").describe().partitions[0].last_stable_offset == 2
    p.close()


def test_recover_listing_times_out(flaky: FlakyReads) -> None:
    wh = Warehouse(store=flaky)
    p = _stuck_transaction(wh)
    flaky.fail(lambda k: k == "_coordinator/txn/", times=-1)
    with pytest.raises(KafkaTimeoutError, match="_coordinator/txn/"):
        wh.recover(timeout_ms=200)
    flaky.heal()
    p.close()


def test_recover_reports_an_id_that_keeps_failing(flaky: FlakyReads) -> None:
    wh = Warehouse(store=flaky)
    p = _stuck_transaction(wh)
    flaky.fail(lambda k: k == "_coordinator/txn/stuck.json", times=-1)
    report = wh.recover(now=int(time.time() * 1000) + 60_000, timeout_ms=200)
    assert list(report.failed) == ["stuck"]
    assert report.failed["stuck"].startswith("TransientStorageError: ")
    flaky.heal()
    p.close()


# --- 3. readers and sends retry within their timeouts (issue 19.13) -----------------------------


def _three_records(store: Store) -> Warehouse:
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=1)
    with Producer(wh) as p:
        for v in (b"a", b"b", b"c"):
            p.send("t", value=v, partition=0)
    return wh


def _is_segment(key: str) -> bool:
    return key.endswith(".parquet")


def _is_version(key: str) -> bool:
    return "/_log/" in key and key.endswith(".json")


TP0 = TopicPartition("t", 0)


def test_poll_retries_failing_reads(flaky: FlakyReads) -> None:
    wh = _three_records(flaky)
    c = Consumer(wh, auto_offset_reset="earliest")
    c.assign([TP0])
    flaky.fail(_is_version, times=2)
    flaky.fail(_is_segment, times=2)
    got = c.poll(timeout_ms=0)
    assert [(r.offset, r.value) for r in got[TP0]] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert flaky.fired == 4


def test_poll_times_out_after_request_timeout_and_loses_nothing(flaky: FlakyReads) -> None:
    wh = _three_records(flaky)
    c = Consumer(wh, auto_offset_reset="earliest", request_timeout_ms=200)
    c.assign([TP0])
    c.seek(TP0, 1)
    flaky.fail(_is_segment, times=-1)
    start = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="request_timeout_ms=200") as info:
        c.poll(timeout_ms=0)
    assert isinstance(info.value.__cause__, TransientStorageError)
    assert 0.15 < time.monotonic() - start < 5
    assert c.position(TP0) == 1  # nothing was consumed
    flaky.heal()
    assert [r.value for r in c.poll(timeout_ms=0)[TP0]] == [b"b", b"c"]


def test_committed_retries_and_times_out(flaky: FlakyReads) -> None:
    wh = _three_records(flaky)
    Consumer(wh, group_id="g").commit({TP0: OffsetAndMetadata(2)})
    c = Consumer(wh, group_id="g", request_timeout_ms=200)
    flaky.fail(lambda k: k.startswith("_groups/g/_log/"), times=2)
    assert c.committed(TP0) == OffsetAndMetadata(2)
    flaky.fail(lambda k: k.startswith("_groups/g/_log/"), times=-1)
    with pytest.raises(KafkaTimeoutError):
        Consumer(wh, group_id="g", request_timeout_ms=200).committed(TP0)


def test_scan_retries_failing_reads_then_times_out(flaky: FlakyReads) -> None:
    wh = _three_records(flaky)
    table = wh.table("t")
    flaky.fail(_is_version, times=2)
    flaky.fail(_is_segment, times=2)
    assert table.scan().to_arrow()["value"].to_pylist() == [b"a", b"b", b"c"]
    assert flaky.fired == 4
    flaky.fail(_is_segment, times=-1)
    with pytest.raises(KafkaTimeoutError, match="request_timeout_ms=200"):
        table.scan(request_timeout_ms=200).to_arrow()
    flaky.fail(_is_version, times=-1)
    with pytest.raises(KafkaTimeoutError, match="loading table t"):
        table.scan(request_timeout_ms=200)


def test_a_batch_that_outlives_delivery_timeout_fails_with_a_timeout(
    fault_store: ReadFaultStore, make_producer: MakeProducer
) -> None:
    """Kafka's batch expiry: the future fails with a timeout, not a storage error."""
    wh = Warehouse(store=fault_store)
    wh.create_table("t", partitions=1)
    p = make_producer(wh, linger_ms=0, delivery_timeout_ms=200)
    fault_store.fail_before_write(_is_segment, times=10_000)
    future = p.send("t", value=b"lost", partition=0)
    with pytest.raises(KafkaTimeoutError, match="delivery_timeout_ms=200"):
        future.result(timeout=10)
