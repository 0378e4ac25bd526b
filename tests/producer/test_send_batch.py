"""Producer.send_batch and the columnar send path: same records, same log, typed errors."""

from __future__ import annotations

import random
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tableutil import ReadFaultStore, batches_in_log, drain, is_log_version, log_versions, read_all

from txntable import (
    Consumer,
    Producer,
    RecordMetadata,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    BufferExhaustedError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    RecordTooLargeError,
    SerializationError,
    TxnTableError,
    UnknownTopicOrPartitionError,
)
from txntable.producer.futures import SegmentOffsets, SendBatchResult
from txntable.protocol.actions import Batch, Marker
from txntable.protocol.records import HEADERS_TYPE, TIMESTAMP_TYPE, to_record_table
from txntable.storage import MemoryStore
from txntable.storage.base import StoreWrapper

MakeProducer = Callable[..., Producer]
Row = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


def make_records(n: int = 400, seed: int = 11) -> dict[str, list]:  # type: ignore[type-arg]
    rng = random.Random(seed)
    return {
        "key": [rng.randbytes(rng.randrange(0, 40)) for _ in range(n)],
        "value": [rng.randbytes(rng.randrange(0, 200)) if i % 7 else None for i in range(n)],
        "headers": [[("h", rng.randbytes(3)), ("n", None)] if i % 5 == 0 else [] for i in range(n)],
        "timestamp": [1_700_000_000_000 + i for i in range(n)],
    }


def as_table(records: dict[str, list]) -> pa.Table:  # type: ignore[type-arg]
    return pa.table(
        {
            "key": pa.array(records["key"], pa.binary()),
            "value": pa.array(records["value"], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in hs] for hs in records["headers"]],
                HEADERS_TYPE,
            ),
            "timestamp": pa.array(records["timestamp"], TIMESTAMP_TYPE),
        }
    )


def read_back(wh: Warehouse, table: str, level: str = "read_uncommitted") -> list[Row]:
    n = wh.table(table).num_partitions
    tps = [TopicPartition(table, p) for p in range(n)]
    consumer = Consumer(wh, isolation_level=level)
    consumer.assign(tps)
    consumer.seek_to_beginning()
    got = drain(consumer, tps)
    consumer.close()
    return [
        (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
        for tp in tps
        for r in got[tp]
    ]


def logged(wh: Warehouse, table: str) -> list[tuple[object, ...]]:
    """Batches and markers of the log, without paths and producer ids."""
    out: list[tuple[object, ...]] = []
    for _, actions in log_versions(wh.table(table).log):
        for a in actions:
            if isinstance(a, Batch):
                out.append(("batch", a.partition, a.baseOffset, a.count, a.baseSequence))
            elif isinstance(a, Marker):
                out.append(("marker", a.partition, a.offset, a.type))
    return out


def no_data_written(wh: Warehouse, table: str) -> bool:
    return wh.table(table).snapshot().version == 0 and not [
        k for k in wh.store.list(f"{table}/") if "/data/" in k
    ]


@pytest.mark.parametrize("max_request_size", [1024 * 1024, 2000])
@pytest.mark.parametrize("transactional", [False, True])
def test_send_batch_is_send_for_the_same_records(
    wh: Warehouse, make_producer: MakeProducer, transactional: bool, max_request_size: int
) -> None:
    records = make_records()
    for name in ("by_send", "by_batch"):
        wh.create_table(name, partitions=4)
    kw = {"max_request_size": max_request_size}
    one = make_producer(wh, transactional_id="one" if transactional else None, **kw)
    two = make_producer(wh, transactional_id="two" if transactional else None, **kw)
    if transactional:
        for p in (one, two):
            p.init_transactions()
            p.begin_transaction()
    futures = [
        one.send("by_send", value=v, key=k, headers=h or None, timestamp=t)
        for k, v, h, t in zip(*records.values(), strict=True)
    ]
    batch = two.send_batch("by_batch", as_table(records))
    for p in (one, two):
        p.commit_transaction() if transactional else p.flush()
    result = batch.result(timeout=10)
    metas = [f.result(timeout=10) for f in futures]
    assert [(m.partition, m.offset, m.timestamp) for m in metas] == list(
        zip(result.partitions.tolist(), result.offsets.tolist(), records["timestamp"], strict=True)
    )
    assert all(m.topic == "by_send" for m in metas)
    assert result.counts == dict(Counter(m.partition for m in metas))
    assert logged(wh, "by_send") == logged(wh, "by_batch")
    if max_request_size == 2000:  # segments split by size: several batches per partition
        assert len([e for e in logged(wh, "by_batch") if e[0] == "batch"]) > 8
    level = "read_committed" if transactional else "read_uncommitted"
    rows = read_back(wh, "by_send", level)
    assert rows == read_back(wh, "by_batch", level) and len(rows) == 400
    # Every record is where Kafka's partitioner puts it, in send order within a partition.
    by_key = {(p, o): (k, v) for p, o, k, v, _, _ in rows}
    for i, m in enumerate(metas):
        assert by_key[(m.partition, m.offset)] == (records["key"][i], records["value"][i])


def test_send_batch_result_reports_segments(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("t", partitions=2)
    p = make_producer(wh, max_request_size=1000)
    p.send("t", value=b"first", partition=1)
    p.flush()
    # 30 records of 21 + 100 record bytes: 8 fit one segment of 1000 bytes.
    future = p.send_batch("t", {"value": [b"v" * 100] * 30}, partition=1)
    p.flush()
    result = future.result(timeout=10)
    assert isinstance(result, SendBatchResult) and result.topic == "t"
    assert result.segments == (
        SegmentOffsets(1, 1, 8), SegmentOffsets(1, 9, 8), SegmentOffsets(1, 17, 8),
        SegmentOffsets(1, 25, 6),
    )  # fmt: skip
    assert result.base_offsets == {1: 1} and result.counts == {1: 30}
    assert result.offsets.tolist() == list(range(1, 31))
    assert result.partitions.tolist() == [1] * 30
    assert [(b.baseOffset, b.count, b.baseSequence) for _, b in batches_in_log(wh, "t")] == [
        (0, 1, 0), (1, 8, 1), (9, 8, 9), (17, 8, 17), (25, 6, 25),
    ]  # fmt: skip


def test_null_keys_follow_the_sticky_partitioner(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    wh.create_table("t", partitions=4)
    p = make_producer(wh)
    small = p.send_batch("t", {"value": [b"x"] * 50})
    p.flush()
    assert len(small.result(timeout=10).counts) == 1  # one sticky partition for one batch
    q = make_producer(wh, max_request_size=1000)
    # 24 records of 121 bytes: runs of 8 (one segment each), each run on another partition.
    future = q.send_batch("t", {"value": [b"y" * 100] * 24})
    q.flush()
    parts = future.result(timeout=10).partitions.tolist()
    runs = [parts[i : i + 8] for i in range(0, 24, 8)]
    assert all(len(set(run)) == 1 for run in runs)
    assert runs[0][0] != runs[1][0] and runs[1][0] != runs[2][0]


def test_aborted_send_batch_is_invisible_read_committed(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    wh.create_table("t", partitions=3)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    aborted = p.send_batch("t", {"key": [b"a%d" % i for i in range(60)], "value": [b"x"] * 60})
    p.flush()  # in the log, inside the open transaction
    assert aborted.result(timeout=10).counts
    assert read_back(wh, "t", "read_committed") == []
    p.abort_transaction()
    assert read_back(wh, "t", "read_committed") == []
    keys = sorted(r[2] for r in read_back(wh, "t", "read_uncommitted"))
    assert keys == sorted(b"a%d" % i for i in range(60))
    p.begin_transaction()
    dropped = p.send_batch("t", {"value": [b"never"] * 5}, partition=0)
    p.abort_transaction()  # still buffered: dropped, never written
    with pytest.raises(InvalidTxnStateError, match="transaction aborted before send"):
        dropped.result(timeout=10)
    p.begin_transaction()
    p.send_batch("t", {"value": [b"kept"]}, partition=0)
    p.commit_transaction()
    assert [r[3] for r in read_back(wh, "t", "read_committed")] == [b"kept"]


@pytest.mark.parametrize("transactional", [False, True])
def test_send_batch_retried_after_an_ambiguous_log_put_is_not_duplicated(
    fault_store: ReadFaultStore, make_producer: MakeProducer, transactional: bool
) -> None:
    wh = Warehouse(store=fault_store)
    wh.create_table("orders", partitions=2)
    p = make_producer(wh, transactional_id="tx" if transactional else None)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
        p.send("orders", value=b"registers the partitions", partition=0)
        p.send("orders", value=b"registers the partitions", partition=1)
        p.flush()  # so the batch below takes the ordinary path, not the short path
    fault = fault_store.fail_after_write(is_log_version, ops={"put_if_absent"})
    values = [b"v%d" % i for i in range(10)]
    future = p.send_batch("orders", {"value": values}, partition=1)
    p.flush()
    assert fault.fired == 1
    result = future.result(timeout=10)
    first = 1 if transactional else 0
    assert result.offsets.tolist() == list(range(first, first + 10))
    if transactional:
        p.commit_transaction()
    mine = [b for _, b in batches_in_log(wh, "orders") if b.partition == 1 and b.count == 10]
    assert len(mine) == 1 and mine[0].baseOffset == first
    level = "read_committed" if transactional else "read_uncommitted"
    assert [v for _, v in read_all(wh, "orders", [1], level)[1]][-10:] == values
    assert len(read_all(wh, "orders", [1], "read_uncommitted")[1]) == first + 10  # no copy


def test_record_too_large_writes_nothing(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, max_request_size=1000)
    with pytest.raises(RecordTooLargeError, match="row 2"):
        p.send_batch("orders", {"value": [b"a", b"b", b"x" * 1000]})
    p.flush()
    assert no_data_written(wh, "orders")
    ok = p.send_batch("orders", {"value": [b"a", b"b"]})
    p.flush()
    assert ok.result(timeout=10).offsets.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("data", "column"),
    [
        ({"key": [b"k"]}, "'value'"),
        ({"value": ["text"]}, "'value'"),
        ({"value": [1]}, "'value'"),
        ({"value": [b"v"], "key": [1]}, "'key'"),
        ({"value": [b"v"], "Key": [b"k"]}, "'Key'"),
        ({"value": [b"v"], "timestamp": ["noon"]}, "'timestamp'"),
        ({"value": [b"v"], "timestamp": [-5]}, "'timestamp'"),
        ({"value": [b"v"], "headers": [[1, 2]]}, "'headers'"),
        ({"value": [b"v"], "headers": [[{"key": None, "value": b"x"}]]}, "'headers'"),
    ],
)
def test_bad_columns_name_the_column_and_write_nothing(
    wh: Warehouse, make_producer: MakeProducer, data: dict, column: str  # type: ignore[type-arg]
) -> None:
    wh.create_table("orders", partitions=1)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    with pytest.raises(SerializationError, match=column):
        p.send_batch("orders", data)
    with pytest.raises(SerializationError):
        p.send_batch("orders", 42)
    p.commit_transaction()  # the transaction is unharmed: nothing was buffered
    assert no_data_written(wh, "orders")


def test_accepted_inputs(wh: Warehouse, make_producer: MakeProducer) -> None:
    pd = pytest.importorskip("pandas")
    wh.create_table("t", partitions=1)
    p = make_producer(wh)
    stamps = pa.array([1_700_000_000_123_456, None], pa.timestamp("us"))
    inputs = [
        pd.DataFrame({"key": [b"k0", None], "value": [b"v0", b"v1"]}),
        pa.record_batch({"value": pa.array([b"v2", None], pa.large_binary())}),
        {"value": [b"v4", b"v5"], "timestamp": [5, None]},
        pa.table({"value": pa.array([b"v6", b"v7"]), "timestamp": stamps}),
        pa.table({"value": pa.array([b"ab", b"cd"], pa.binary(2))}),
    ]
    before = int(time.time() * 1000)
    for data in inputs:
        p.send_batch("t", data, partition=0)
    with pytest.raises(UnknownTopicOrPartitionError):
        p.send_batch("t", {"value": [b"x"]}, partition=1)
    empty = p.send_batch("t", {"value": pa.array([], pa.binary())})
    assert empty.done() and empty.result().segments == ()
    p.flush()
    rows = read_back(wh, "t")
    assert [(r[2], r[3]) for r in rows] == [
        (b"k0", b"v0"), (None, b"v1"), (None, b"v2"), (None, None), (None, b"v4"),
        (None, b"v5"), (None, b"v6"), (None, b"v7"), (None, b"ab"), (None, b"cd"),
    ]  # fmt: skip
    stamps_read = [r[5] for r in rows]
    assert stamps_read[4] == 5 and stamps_read[6] == 1_700_000_000_123
    assert all(before <= stamps_read[i] for i in (0, 1, 2, 3, 5, 7, 8, 9))
    assert all(r[4] == [] for r in rows)


@pytest.mark.parametrize("typed", [False, True])
def test_a_filtered_dataframe_is_sent_without_its_index(
    wh: Warehouse, make_producer: MakeProducer, typed: bool
) -> None:
    # A filtered frame has a non-default index: it must not become a column.
    pd = pytest.importorskip("pandas")
    schema = pa.schema([("n", pa.int64()), ("value", pa.binary())]) if typed else None
    wh.create_table("t", partitions=1, schema=schema)
    frame = pd.DataFrame({"n": [1, 2, 3, 4], "value": [b"a", b"b", b"c", b"d"]})
    kept = frame[frame.n % 2 == 0]
    p = make_producer(wh)
    p.send_batch("t", kept if typed else kept[["value"]], partition=0)
    p.flush()
    table = wh.table("t").scan(columns=["value", "offset"]).to_arrow()
    assert table.to_pylist() == [{"value": b"b", "offset": 0}, {"value": b"d", "offset": 1}]


def test_send_batch_data_is_converted_while_another_thread_imports_pandas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyarrow imports pandas the first time it converts a Python list (the sender does,
    sealing send()'s records); until that import ends, sys.modules holds a pandas without
    its names. A send_batch of a dict in that window failed with AttributeError
    ("partially initialized module 'pandas' has no attribute 'DataFrame'": bench/memory.py
    hit it on every run)."""
    pd = pytest.importorskip("pandas")
    pa.table(pd.DataFrame({"n": [1]}))  # pyarrow holds the real module from now on
    monkeypatch.setitem(sys.modules, "pandas", types.ModuleType("pandas"))  # being imported
    table = to_record_table({"key": [b"k"], "value": [b"v"]}, now=1_700_000_000_000)
    assert table.column("value").to_pylist() == [b"v"]
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_000]


class GatedStore(StoreWrapper):
    """Segment puts wait until the gate opens (a slow or unreachable object store)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def put_data_file(self, key: str, data: bytes) -> None:
        self.waiting.set()
        self.gate.wait(30)
        self.inner.put_data_file(key, data)


def test_buffer_exhausted_after_max_block_ms(
    memory_store: MemoryStore, make_producer: MakeProducer
) -> None:
    store = GatedStore(memory_store)
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=1)
    p = make_producer(wh, linger_ms=0, batch_size=1, buffer_memory=100_000, max_block_ms=200)
    first = p.send("t", value=b"first", partition=0)
    assert store.waiting.wait(10)  # the sender is stuck writing the first segment
    sent = []
    with pytest.raises(BufferExhaustedError, match="max_block_ms=200"):
        while True:
            start = time.monotonic()
            sent.append(p.send("t", value=b"x" * 200, partition=0))
            assert len(sent) < 1000, "send never blocked"
    assert time.monotonic() - start >= 0.19
    with pytest.raises(BufferExhaustedError):
        p.send_batch("t", {"value": [b"y" * 200] * 50}, partition=0)
    store.gate.set()
    p.flush()
    assert first.result(timeout=10).offset == 0
    assert [f.result(timeout=10).offset for f in sent] == list(range(1, len(sent) + 1))


def test_transaction_larger_than_the_buffer_streams(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    wh.create_table("t", partitions=2)
    p = make_producer(wh, transactional_id="big", buffer_memory=40_000, linger_ms=0, batch_size=1)
    p.init_transactions()
    p.begin_transaction()
    futures = [p.send("t", value=b"%05d" % i + b"." * 200, key=b"k%d" % i) for i in range(600)]
    p.send_batch("t", {"value": [b"b" * 200] * 600, "key": [b"k%d" % i for i in range(600)]})
    p.commit_transaction()
    rows = read_back(wh, "t", "read_committed")
    at = {(part, off): value for part, off, _, value, _, _ in rows}
    for i, f in enumerate(futures):  # each acknowledged where it is read
        md = f.result(timeout=10)
        assert at[(md.partition, md.offset)] == b"%05d" % i + b"." * 200
    assert sorted(at.values()) == sorted(
        [b"%05d" % i + b"." * 200 for i in range(600)] + [b"b" * 200] * 600
    )
    acts = logged(wh, "t")
    assert len([a for a in acts if a[0] == "batch"]) > 4  # streamed: several versions
    assert [a[0] for a in acts if a[0] == "marker"] == ["marker", "marker"]


def test_record_futures(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("t", partitions=1)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    f = p.send("t", value=b"v", partition=0, timestamp=7)
    assert not f.done() and f.running() and not f.cancel()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    with pytest.raises(KafkaTimeoutError):
        f.get(timeout=0.01)
    seen: list[object] = []
    f.add_done_callback(lambda h: seen.append(("done", h is f)))
    f.add_callback(lambda tag, md: seen.append((tag, md)), "ok")
    f.add_errback(lambda e: seen.append(("err", e)))
    p.commit_transaction()
    md = RecordMetadata("t", 0, 0, 7)
    assert f.get(timeout=10) == md and f.exception() is None and f.succeeded()
    assert seen == [("done", True), ("ok", md)]
    f.add_callback(lambda m: seen.append(("late", m)))  # already done: called at once
    assert seen[-1] == ("late", md)
    p.begin_transaction()
    lost = p.send("t", value=b"lost", partition=0)
    errors: list[BaseException] = []
    lost.add_errback(errors.append)
    p.abort_transaction()
    assert lost.failed() and isinstance(lost.exception(), TxnTableError)
    assert errors == [lost.exception()]


def run_in_threads(work: Callable[[int], None], threads: int) -> None:
    """Run ``work(t)`` for t in range(threads), each on its own thread, and wait for all."""
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_sends_from_many_threads_while_the_sender_seals(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    """send() takes no lock: rows appended while a seal closes the lists are never lost."""
    wh.create_table("t", partitions=3)
    p = make_producer(wh, linger_ms=0, batch_size=1)  # the sender seals all the time
    per_thread, threads = 1500, 4
    handles: dict[bytes, object] = {}

    def work(t: int) -> None:
        for i in range(per_thread):
            key = b"t%d-%d" % (t, i)
            handles[key] = p.send("t", value=key[::-1], key=key)

    run_in_threads(work, threads)
    p.flush()
    rows = read_back(wh, "t")
    assert len(rows) == per_thread * threads
    where = {(part, off): (k, v) for part, off, k, v, _, _ in rows}
    for key, handle in handles.items():
        md = handle.result(timeout=10)  # type: ignore[attr-defined]
        assert where[(md.partition, md.offset)] == (key, key[::-1])
    # Each thread's records keep their send order within a partition (rows are in offset
    # order per partition).
    for t in range(threads):
        by_partition: dict[int, list[int]] = {}
        for part, _, k, _, _, _ in rows:
            if k.startswith(b"t%d-" % t):
                by_partition.setdefault(part, []).append(int(k.split(b"-")[1]))
        for sent_order in by_partition.values():
            assert sent_order == sorted(sent_order)


def test_sparse_partitions_timestamps_and_headers_stay_with_their_rows_across_threads(
    wh: Warehouse, make_producer: MakeProducer
) -> None:
    """Explicit partitions, timestamps and headers are kept only for the records that have
    them (not as a column per record): each stays with its own row, whichever thread sent
    it and however the seals cut the threads' lists; the others get the clock at send()."""
    wh.create_table("t", partitions=3)
    p = make_producer(wh, linger_ms=0, batch_size=1)  # the sender seals all the time
    per_thread, threads = 800, 3
    expected: dict[bytes, tuple[int | None, int | None, list[tuple[str, bytes]]]] = {}
    handles: dict[bytes, object] = {}
    before = int(time.time() * 1000)

    def work(t: int) -> None:
        for i in range(per_thread):
            key = b"t%d-%d" % (t, i)
            partition = (t + i) % 3 if i % 3 == 0 else None
            stamp = 1_000_000 + t * 10_000 + i if i % 5 == 0 else None
            headers = [("h", key)] if i % 7 == 0 else []
            expected[key] = (partition, stamp, headers)
            handles[key] = p.send(
                "t", value=key, key=key, partition=partition, headers=headers, timestamp=stamp
            )

    run_in_threads(work, threads)
    p.flush()
    after = int(time.time() * 1000)
    rows = {k: (part, ts, list(h)) for part, _, k, _, h, ts in read_back(wh, "t")}
    assert len(rows) == per_thread * threads
    for key, (partition, stamp, headers) in expected.items():
        got_partition, got_stamp, got_headers = rows[key]
        md = handles[key].result(timeout=10)  # type: ignore[attr-defined]
        assert (md.partition, md.timestamp) == (got_partition, got_stamp)
        if partition is not None:
            assert got_partition == partition
        if stamp is not None:
            assert got_stamp == stamp
        else:
            assert before <= got_stamp <= after
        assert got_headers == headers


def test_one_send_batch_call_samples_key_and_value_once_for_all_its_segments(
    wh: Warehouse, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txntable.protocol import records

    sampled: list[int] = []
    codec = records._ZSTD

    class CountingCodec:
        def compress(self, data: object) -> pa.Buffer:
            sampled.append(len(data))  # type: ignore[arg-type]
            return codec.compress(data)

    monkeypatch.setattr(records, "_ZSTD", CountingCodec())
    wh.create_table("t", partitions=8)
    rng = random.Random(5)
    n = 8 * 1200  # ~1,200 rows per partition: each segment's key and value can be sampled
    keys = [rng.randbytes(16) for _ in range(n)]
    values = [rng.randbytes(100) for _ in range(n)]
    p = make_producer(wh)
    future = p.send_batch("t", {"key": keys, "value": values})
    p.flush()
    assert len(future.result(timeout=10).segments) == 8
    assert sampled == [records.COMPRESSION_SAMPLE_BYTES] * 2  # the first segment's, not 16
    paths = [b.path for _, b in batches_in_log(wh, "t")]
    meta = [pq.ParquetFile(pa.BufferReader(wh.store.get(p).data)).metadata for p in paths]
    codecs = {m.row_group(0).column(m.schema.names.index("value")).compression for m in meta}
    assert codecs == {"UNCOMPRESSED"}
    assert sorted(r[3] for r in read_back(wh, "t")) == sorted(values)
