"""The record accumulator alone: buffers, rounds, readiness and memory, with no sender.

The test plays the sender: it waits for readiness, drains a round, settles its batches
(``resolve`` with an offset as a commit would, or ``fail``) and hands the round back.
Tables and partition counts come from a real warehouse (memory store).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from txntable import Warehouse
from txntable.errors import BufferExhaustedError, InternalError, TxnTableError
from txntable.producer import accumulator as accumulator_module
from txntable.producer.accumulator import ProducerBatch, RecordAccumulator, Round, timestamp_range
from txntable.producer.futures import FutureRecordMetadata, FutureSendBatch, ProduceResult
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.partitioner import partition_for_key
from txntable.producer.retries import Retries
from txntable.protocol.records import record_sizes, to_record_table
from txntable.structs import RECORD_OVERHEAD

#: Nothing is ready before a flush, a close or a waiter for memory.
LINGER_FOREVER = {"linger_ms": 600_000, "batch_size": 1 << 30}


@pytest.fixture
def t(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=3)
    wh.create_table("u", partitions=1)
    return wh


def make(
    wh: Warehouse, failures: list[TxnTableError] | None = None, **options: Any
) -> RecordAccumulator:
    settings: dict[str, Any] = {
        **LINGER_FOREVER,
        "buffer_memory": 32 << 20,
        "max_block_ms": 1000,
        "max_request_size": 1 << 20,
        **options,
    }
    sink = failures if failures is not None else []
    return RecordAccumulator(
        ProducerMetadata(wh, Retries(1000, 1000)), on_unsent_failure=sink.append, **settings
    )


def put(
    acc: RecordAccumulator, value: bytes, key: bytes | None = None, partition: int = -1,
    topic: str = "t",
) -> FutureRecordMetadata:  # fmt: skip
    size = RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0)
    row_memory = size + accumulator_module.PY_RECORD_OVERHEAD
    return acc.append(topic, key, value, 1_700_000_000_000, partition, (), size, row_memory)


def put_rows(
    acc: RecordAccumulator, values: list[bytes], keys: list[bytes] | None = None,
    partition: int | None = None, topic: str = "t",
) -> ProduceResult:  # fmt: skip
    table = to_record_table({"value": values, **({"key": keys} if keys else {})}, 0)
    result = ProduceResult(topic)
    result.start(table.num_rows, table.column("timestamp").cast(pa.int64()).to_numpy())
    acc.append_rows(topic, table, record_sizes(table), partition, result)
    return result


def batches(round_: Round) -> list[ProducerBatch]:
    return [b for items in round_.values() for b in items]


def commit(acc: RecordAccumulator, round_: Round, base: int = 0) -> None:
    """Settle a round as a commit at ``base`` on every partition would, and hand it back."""
    for b in batches(round_):
        b.resolve(base)
    acc.round_done(batches(round_))


def values(batch: ProducerBatch) -> list[bytes]:
    return batch.table().column("value").to_pylist()  # type: ignore[no-any-return]


def test_a_round_is_one_batch_per_partition_in_send_order_and_settles_the_futures(
    t: Warehouse,
) -> None:
    acc = make(t)
    a, b, c = put(acc, b"a", partition=0), put(acc, b"b", partition=2), put(acc, b"c", partition=0)
    acc.seal_all()
    round_ = acc.drain()
    assert [(x.partition, x.count, values(x)) for x in round_["t"]] == [
        (0, 2, [b"a", b"c"]),
        (2, 1, [b"b"]),
    ]
    assert acc.used_memory > 0
    round_["t"][0].resolve(10)
    round_["t"][1].resolve(0)
    acc.round_done(batches(round_))
    assert [(f.get(1).partition, f.get(1).offset) for f in (a, b, c)] == [(0, 10), (2, 0), (0, 11)]
    assert acc.used_memory == 0
    assert acc.drain() == {}


def test_rows_are_partitioned_by_key_as_kafka_and_keep_their_order(t: Warehouse) -> None:
    acc = make(t)
    keys = [f"k{i % 7}".encode() for i in range(40)]
    vals = [f"v{i}".encode() for i in range(40)]
    result = put_rows(acc, vals, keys)
    round_ = acc.drain()
    for b in round_["t"]:
        pairs = zip(keys, vals, strict=True)
        expected = [v for k, v in pairs if partition_for_key(k, 3) == b.partition]
        assert values(b) == expected
    commit(acc, round_)
    assert result.partitions.tolist() == [partition_for_key(k, 3) for k in keys]


def test_a_partition_holding_more_than_max_request_size_drains_over_rounds(t: Warehouse) -> None:
    acc = make(t, max_request_size=300)
    vals = [bytes([i]) * 80 for i in range(10)]  # 101 record bytes each: two per batch
    put_rows(acc, vals, partition=1)
    drained: list[bytes] = []
    rounds = 0
    while round_ := acc.drain():
        (b,) = round_["t"]
        assert b.count == 2
        drained += values(b)
        commit(acc, round_)
        rounds += 1
    assert (rounds, drained) == (5, vals)


def test_closed_and_empty_is_not_ready_but_closed_with_records_is(t: Warehouse) -> None:
    acc = make(t)
    put(acc, b"x")
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(acc.await_ready()), daemon=True)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # lingering: no round yet
    assert acc.close() == 1  # one record not drained
    waiter.join(5)
    assert not waiter.is_alive() and waiter_result == [True]
    acc.seal_all()
    commit(acc, acc.drain())
    assert acc.await_ready() is False  # the sender stops
    assert acc.close() is None  # closed already


@pytest.mark.parametrize("trigger", ["batch_size", "linger_ms"])
def test_a_full_batch_or_an_elapsed_linger_makes_a_round_ready(t: Warehouse, trigger: str) -> None:
    options = {"batch_size": 50} if trigger == "batch_size" else {"linger_ms": 0}
    acc = make(t, **options)
    put(acc, b"v" * 60)
    assert acc.await_ready() is True


def test_a_caller_waiting_for_memory_makes_a_round_ready_and_gets_it_back(t: Warehouse) -> None:
    """Kafka's accumulator counts an exhausted buffer as ready: else lingering records
    would hold the memory the waiting caller needs."""
    acc = make(t, buffer_memory=4000, max_block_ms=10_000)
    peak: list[int] = []

    def sender() -> None:  # never ready by linger or size: only by the blocked caller
        base = 0
        while acc.await_ready():
            acc.seal_all()
            round_ = acc.drain()
            peak.append(acc.used_memory)
            for b in batches(round_):
                b.resolve(base)
                base += b.count
            acc.round_done(batches(round_))

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        futures = [put(acc, b"v" * 400, partition=0) for _ in range(20)]  # far over 4000 B
    finally:
        acc.close()
    thread.join(10)
    assert not thread.is_alive()
    assert [f.get(0).offset for f in futures] == list(range(20))
    assert len(peak) > 1 and max(peak) <= 4000


def test_a_buffer_full_for_max_block_ms_raises_buffer_exhausted(t: Warehouse) -> None:
    acc = make(t, buffer_memory=4000, max_block_ms=50)
    with pytest.raises(BufferExhaustedError, match="within max_block_ms=50"):
        for _ in range(20):
            put(acc, b"v" * 400)
    assert 0 < acc.used_memory <= 4000


def test_drain_whole_takes_one_tables_transaction_or_nothing(t: Warehouse) -> None:
    acc = make(t, max_request_size=300)
    put(acc, b"a", partition=0)
    put(acc, b"b", partition=2)
    assert acc.drain_whole(lambda: False) is None  # the transaction manager says no
    whole = acc.drain_whole(lambda: True)
    assert whole is not None and [(b.partition, values(b)) for b in whole["t"]] == [
        (0, [b"a"]),
        (2, [b"b"]),
    ]
    put(acc, b"c", partition=1)
    assert acc.drain_whole(lambda: True) is None  # a round is in flight
    commit(acc, whole)
    put(acc, b"d", topic="u", partition=0)
    assert acc.drain_whole(lambda: True) is None  # two tables: two log versions
    commit(acc, acc.drain())
    put_rows(acc, [b"v" * 200, b"w" * 200], partition=0)
    assert acc.drain_whole(lambda: True) is None  # more than one batch for partition 0
    commit(acc, acc.drain())
    commit(acc, acc.drain())
    assert acc.drain() == {} and acc.used_memory == 0


def test_abort_undrained_fails_buffered_records_but_not_the_round_in_flight(
    t: Warehouse,
) -> None:
    acc = make(t)
    in_flight = put(acc, b"sent", partition=0)
    acc.seal_all()
    round_ = acc.drain()
    queued = put_rows(acc, [b"q1", b"q2"], partition=1)
    opened = put(acc, b"open", partition=2)
    error = TxnTableError("aborted")
    acc.abort_undrained(error)
    assert opened.exception(1) is error
    assert FutureSendBatch(queued).exception(1) is error
    assert not in_flight.done()
    assert acc.flush(0.05) is False  # the round in flight is still pending
    commit(acc, round_, base=7)
    assert in_flight.get(1).offset == 7
    assert acc.used_memory == 0 and acc.drain() == {}


def test_flush_makes_lingering_records_ready_and_waits_for_them(t: Warehouse) -> None:
    acc = make(t)
    future = put(acc, b"x", partition=0)

    def sender() -> None:
        assert acc.await_ready()
        acc.seal_all()
        commit(acc, acc.drain(), base=3)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    start = time.monotonic()
    assert acc.flush(10) is True
    assert time.monotonic() - start < 10
    thread.join(5)
    assert not thread.is_alive()
    assert future.get(0).offset == 3


def test_a_failure_while_sealing_fails_that_batch_and_reports_it(
    t: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = accumulator_module.choose_partitions
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(accumulator_module, "choose_partitions", flaky)
    failures: list[TxnTableError] = []
    acc = make(t, failures)
    doomed = put(acc, b"x")
    acc.seal_all()
    error = doomed.exception(1)
    assert isinstance(error, InternalError) and failures == [error]
    assert acc.used_memory == 0
    healthy = put(acc, b"y", partition=1)
    acc.seal_all()
    commit(acc, acc.drain())
    assert healthy.get(1).offset == 0


def test_send_batch_queued_in_part_reports_the_rest_as_failed(t: Warehouse) -> None:
    """Rows queued in pieces: when the buffer stays full after the first piece, the rest
    fail and the failure is reported (a transaction must not commit half a call)."""
    failures: list[TxnTableError] = []
    acc = make(t, failures, buffer_memory=8000, max_request_size=1000, max_block_ms=0)
    with pytest.raises(BufferExhaustedError):
        put_rows(acc, [b"v" * 100] * 60, partition=0)
    assert len(failures) == 1 and isinstance(failures[0], BufferExhaustedError)
    queued = sum(b.count for b in batches(acc.drain()))
    assert 0 < queued < 60

    failures.clear()
    acc = make(t, failures, buffer_memory=8000, max_request_size=1000, max_block_ms=0)
    put(acc, b"o" * 7000)  # buffered already: the first piece does not fit either
    with pytest.raises(BufferExhaustedError):
        put_rows(acc, [b"v" * 100] * 60, partition=0)
    assert failures == []  # nothing of the call was queued


def test_freed_memory_is_handed_back_once_per_release_every_bytes_per_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Releasing after every batch made the next batch fault its pages in again; releasing
    # never let each thread keep what it freed. A thread releases once Arrow allocated
    # RELEASE_EVERY_BYTES since it last did (another thread's release does not count).
    real = pa.default_memory_pool()
    releases: list[str] = []

    class CountingPool:
        def total_bytes_allocated(self) -> int:
            return real.total_bytes_allocated()

        def release_unused(self) -> None:
            releases.append(threading.current_thread().name)

    monkeypatch.setattr(pa, "default_memory_pool", CountingPool)
    monkeypatch.setattr(accumulator_module, "_last_release", threading.local())
    step = accumulator_module.RELEASE_EVERY_BYTES
    held = [pa.allocate_buffer(step)]
    accumulator_module.return_freed_memory()
    assert releases == ["MainThread"]
    held.append(pa.allocate_buffer(step // 2))
    accumulator_module.return_freed_memory()
    assert releases == ["MainThread"]  # half the step since: this thread keeps it
    other = threading.Thread(target=accumulator_module.return_freed_memory, name="other")
    other.start()
    other.join()
    assert releases == ["MainThread", "other"]
    held.append(pa.allocate_buffer(step // 2))
    accumulator_module.return_freed_memory()
    assert releases == ["MainThread", "other", "MainThread"]


def test_each_thread_keeps_one_segment_scratch_buffer_up_to_scratch_max() -> None:
    def scratches() -> list[pa.Buffer | None]:
        small = accumulator_module.segment_scratch(1000)
        again = accumulator_module.segment_scratch(500)
        grown = accumulator_module.segment_scratch(5000)
        too_big = accumulator_module.segment_scratch(accumulator_module.SCRATCH_MAX + 1)
        return [small, again, grown, too_big, accumulator_module.segment_scratch(10)]

    out: list[list[pa.Buffer | None]] = []
    thread = threading.Thread(target=lambda: out.append(scratches()))
    thread.start()
    thread.join()
    small, again, grown, too_big, last = out[0]
    assert small is not None and small.size >= 1000
    assert again is small  # kept, not allocated again
    assert grown is not None and grown.size >= 5000 and grown is not small
    assert too_big is None  # a thread keeps at most SCRATCH_MAX bytes
    assert last is grown
    mine = accumulator_module.segment_scratch(1000)
    assert mine is not small and mine is not grown  # one buffer per thread


def test_a_segments_timestamp_range_covers_every_chunk_and_only_its_rows() -> None:
    # A segment's rows are chunks of the runs it was cut from: slices that start inside a
    # run, and empty ones; minTimestamp / maxTimestamp must bound exactly those rows.
    rows = to_record_table(
        {"key": [b"k"] * 6, "value": [b"v"] * 6, "timestamp": [50, 30, 90, 10, 70, 20]},
        now=1_000,
    )
    assert timestamp_range(rows) == (10, 90)
    cut = pa.concat_tables([rows.slice(1, 2), rows.slice(0, 0), rows.slice(4, 1)])
    assert cut.column("timestamp").num_chunks == 3
    assert timestamp_range(cut) == (30, 90)
    assert timestamp_range(rows.slice(4, 2)) == (20, 70)
