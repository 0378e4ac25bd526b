"""Transaction timeout (a stalled producer is aborted by recover), epoch exhaustion, and
completion racing with the producer's next transaction."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from txnutil import assert_no_open_transactions, markers_by_partition, read_all

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import PreconditionFailedError, ProducerFencedError
from txntable.storage import open_store
from txntable.storage.base import Store, StoredObject, StoreWrapper
from txntable.txn import coordinator as coordinator_module
from txntable.txn import recovery as recovery_module
from txntable.txn.coordinator import MAX_PRODUCER_EPOCH, TransactionCoordinator, TxnState
from txntable.util import now_ms

TID = "stall"


def meta_of(wh: Warehouse, tid: str = TID):  # noqa: ANN201
    loaded = TransactionCoordinator(wh.store).load(tid)
    assert loaded is not None
    return loaded


@pytest.fixture
def table(wh: Warehouse) -> Warehouse:
    wh.create_table("t", partitions=3)
    return wh


def stalled_producer(wh: Warehouse, timeout_ms: int) -> Producer:
    """A producer with a flushed, open transaction on partitions 0 and 1 of ``t``."""
    producer = Producer(wh, transactional_id=TID, transaction_timeout_ms=timeout_ms)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", value=b"committed", partition=2)
    producer.commit_transaction()
    producer.begin_transaction()
    for p in (0, 1):
        producer.send("t", value=b"stalled-%d" % p, partition=p)
    producer.flush()
    return producer


def test_timed_out_transaction_is_aborted_by_recover(table: Warehouse, wh2: Warehouse) -> None:
    a = stalled_producer(table, timeout_ms=300)
    start = meta_of(table)[0].txn_start_timestamp
    parts = table.table("t").describe().partitions
    for p in parts[:2]:
        assert p.last_stable_offset < p.high_watermark  # pinned by A
        assert len(p.open_transactions) == 1
    assert read_all(table, ["t"], "read_uncommitted").count(b"stalled-0") == 1
    assert read_all(table, ["t"]) == [b"committed"]

    # Before the timeout another client's recover leaves it alone.
    report = wh2.recover(now=start + 200)
    assert report.timed_out == [] and meta_of(table)[0].state is TxnState.ONGOING
    time.sleep(max(start + 350 - now_ms(), 0) / 1000)
    report = wh2.recover()  # the wall clock, past the timeout
    assert report.timed_out == [TID]
    meta, _ = meta_of(table)
    assert meta.state is TxnState.COMPLETE_ABORT
    # PrepareEpochFence bumps once (the fence), completing the abort once more (KIP-890).
    assert meta.producer_epoch == a.producer_epoch + 2

    t = table.table("t")
    assert_no_open_transactions(t)
    assert read_all(table, ["t"]) == [b"committed"]
    marks = markers_by_partition(t.log)
    assert [m.type for m in marks[0]] == ["ABORT"] and [m.type for m in marks[1]] == ["ABORT"]
    assert [m.type for m in marks[2]] == ["COMMIT"]

    # A wakes up: its send fails fenced, and so does its commit.
    future = a.send("t", value=b"late", partition=0)
    with pytest.raises(ProducerFencedError):
        a.commit_transaction()
    with pytest.raises(ProducerFencedError):
        future.result(timeout=10)
    with pytest.raises(ProducerFencedError):
        a.begin_transaction()
    assert read_all(table, ["t"]) == [b"committed"]
    assert_no_open_transactions(t)
    assert b"late" not in read_all(table, ["t"], "read_uncommitted")


def test_timed_out_producer_commit_without_more_sends_is_fenced(table: Warehouse) -> None:
    a = stalled_producer(table, timeout_ms=200)
    report = Warehouse(table.url).recover(now=now_ms() + 1000)
    assert report.timed_out == [TID]
    with pytest.raises(ProducerFencedError):
        a.commit_transaction()
    assert read_all(table, ["t"]) == [b"committed"]
    # A new instance of the id takes over cleanly.
    b = Producer(Warehouse(table.url), transactional_id=TID)
    b.init_transactions()
    b.begin_transaction()
    b.send("t", value=b"b", partition=0)
    b.commit_transaction()
    assert sorted(read_all(table, ["t"])) == [b"b", b"committed"]
    assert_no_open_transactions(table.table("t"))


def test_timed_out_abort_from_a_new_partition_is_fenced(table: Warehouse) -> None:
    """After the timeout abort, the stalled producer cannot register a new partition."""
    a = stalled_producer(table, timeout_ms=100)
    Warehouse(table.url).recover(now=now_ms() + 1000)
    future = a.send("t", value=b"late-2", partition=2)
    with pytest.raises(ProducerFencedError):
        a.commit_transaction()
    with pytest.raises(ProducerFencedError):
        future.result(timeout=10)
    assert read_all(table, ["t"]) == [b"committed"]
    assert_no_open_transactions(table.table("t"))


def set_epoch(wh: Warehouse, epoch: int) -> None:
    coord = TransactionCoordinator(wh.store)
    meta, etag = meta_of(wh)
    coord.cas(replace(meta, producer_epoch=epoch), etag)


def test_epoch_exhaustion_rotates_the_producer_id(table: Warehouse) -> None:
    first = Producer(table, transactional_id=TID)
    first.init_transactions()
    pid = first.producer_id
    set_epoch(table, MAX_PRODUCER_EPOCH - 2)

    p = Producer(Warehouse(table.url), transactional_id=TID)
    p.init_transactions()
    # The last usable epoch; MAX_PRODUCER_EPOCH itself is kept for a final fence (KIP-360).
    assert (p.producer_id, p.producer_epoch) == (pid, MAX_PRODUCER_EPOCH - 1)
    p.begin_transaction()
    p.send("t", value=b"before", partition=0)
    p.flush()  # registered: the coordinator completes it (a one-log commit keeps the epoch)
    p.commit_transaction()
    # Completing bumps the epoch; epoch + 1 would be the reserved one: rotate instead.
    assert p.producer_id != pid and p.producer_epoch == 0
    meta, _ = meta_of(table)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (pid, MAX_PRODUCER_EPOCH - 1)

    q = Producer(Warehouse(table.url), transactional_id=TID)
    q.init_transactions()
    assert (q.producer_id, q.producer_epoch) == (p.producer_id, 1)
    meta, _ = meta_of(table)
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (q.producer_id, 1, TxnState.EMPTY)
    q.begin_transaction()
    q.send("t", value=b"after", partition=0)
    q.commit_transaction()
    assert read_all(table, ["t"]) == [b"before", b"after"]

    # The old producer id is fenced for good.
    with pytest.raises(ProducerFencedError):
        p.begin_transaction()
        p.send("t", value=b"zombie", partition=0)
        p.commit_transaction()
    assert read_all(table, ["t"]) == [b"before", b"after"]


def test_epoch_exhaustion_with_an_open_transaction(table: Warehouse) -> None:
    """The open transaction is aborted with the last epoch, then the id rotates."""
    p = Producer(table, transactional_id=TID)
    p.init_transactions()
    pid = p.producer_id
    set_epoch(table, MAX_PRODUCER_EPOCH - 2)
    p = Producer(Warehouse(table.url), transactional_id=TID)
    p.init_transactions()
    assert p.producer_epoch == MAX_PRODUCER_EPOCH - 1
    p.begin_transaction()
    p.send("t", value=b"open", partition=1)
    p.flush()

    q = Producer(Warehouse(table.url), transactional_id=TID)
    q.init_transactions()
    # Aborted under the last epoch, completed onto a new producer id, then bumped for q.
    assert q.producer_id != pid and q.producer_epoch == 1
    t = table.table("t")
    assert_no_open_transactions(t)
    (abort,) = markers_by_partition(t.log)[1]
    assert (abort.type, abort.producerId, abort.producerEpoch) == ("ABORT", pid, MAX_PRODUCER_EPOCH)
    assert read_all(table, ["t"]) == []
    with pytest.raises(ProducerFencedError):
        p.commit_transaction()


def test_epoch_exhaustion_through_repeated_init(table: Warehouse, monkeypatch) -> None:  # noqa: ANN001
    """With a small maximum, re-initialising in a loop rotates the id, never reusing one."""
    monkeypatch.setattr(coordinator_module, "MAX_PRODUCER_EPOCH", 4)
    seen: list[tuple[int, int]] = []
    for _ in range(9):
        p = Producer(Warehouse(table.url), transactional_id=TID)
        p.init_transactions()
        seen.append((p.producer_id, p.producer_epoch))
        p.close()
    assert len(set(seen)) == len(seen)
    assert all(epoch < 4 for _, epoch in seen)
    assert len({pid for pid, _ in seen}) >= 3
    # Each rotation starts again at epoch 0 under a new id.
    for (pid_a, epoch_a), (pid_b, epoch_b) in zip(seen, seen[1:], strict=False):
        assert (pid_b == pid_a and epoch_b == epoch_a + 1) or (pid_b != pid_a and epoch_b == 0)


def test_stale_completer_does_not_commit_the_next_transaction(table: Warehouse) -> None:
    p = Producer(table, transactional_id=TID, linger_ms=3_600_000, batch_size=1 << 30)
    p.init_transactions()
    recoverer = TransactionCoordinator(Warehouse(table.url).store)
    stale: list = []  # type: ignore[type-arg]
    real = p.coordinator.write_markers

    def write_markers(meta, kind, deadline=None):  # type: ignore[no-untyped-def]
        if not stale:
            stale.append(recoverer.load(TID))  # a recover() scan sees PrepareCommit here
        return real(meta, kind, deadline)

    p.coordinator.write_markers = write_markers  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("t", value=b"t1", partition=0)
    p.flush()
    p.commit_transaction()
    assert stale[0][0].state is TxnState.PREPARE_COMMIT

    p.begin_transaction()
    p.send("t", value=b"t2-aborted", partition=0)
    p.flush()
    # The slow recoverer finally runs: its COMMIT marker of t1 (old epoch) is refused by the
    # table now that t2 wrote under the next epoch, and it reports that it lost the race.
    with pytest.raises(PreconditionFailedError):
        recoverer.complete(*stale[0])
    p.abort_transaction()
    assert read_all(table, ["t"]) == [b"t1"]


@pytest.mark.parametrize("flush_first", [False, True], ids=["short-path", "flushed"])
def test_another_producers_commit_aborts_the_timed_out_transaction(
    table: Warehouse, flush_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever writer of the table notices first aborts the stuck transaction."""
    a = stalled_producer(table, timeout_ms=300)
    # The other writer's expiry clock, moved by the test: before A's deadline however slow
    # the machine, then past it without a sleep.
    started = meta_of(table)[0].txn_start_timestamp
    clock = [started + 100]
    monkeypatch.setattr(recovery_module, "now_ms", lambda: clock[0])
    t = table.table("t")
    parts = t.describe().partitions
    assert parts[0].last_stable_offset == 0 and parts[0].high_watermark == 1  # pinned by A
    other = Producer(Warehouse(table.url), transactional_id="other", linger_ms=60_000)
    other.init_transactions()

    # Before A's timeout, B's commit leaves A alone.
    other.begin_transaction()
    other.send("t", value=b"b1", partition=0)
    other.commit_transaction()
    assert meta_of(table)[0].state is TxnState.ONGOING
    assert [o.producer_id for o in t.describe().partitions[0].open_transactions] == [a.producer_id]

    clock[0] = started + 400
    other.begin_transaction()
    other.send("t", value=b"b2", partition=1)
    if flush_first:
        other.flush()
    other.commit_transaction()
    assert meta_of(table)[0].state is TxnState.COMPLETE_ABORT
    assert_no_open_transactions(t)
    assert sorted(read_all(table, ["t"])) == [b"b1", b"b2", b"committed"]
    with pytest.raises(ProducerFencedError):
        a.commit_transaction()
    other.close()


class CoordinatorReads(StoreWrapper):
    """Records the key of every GET of a coordinator object."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads: list[str] = []

    def get(self, key: str) -> StoredObject:
        if key.startswith("_coordinator/txn/"):
            self.reads.append(key)
        return super().get(key)


def test_an_open_transaction_costs_other_writers_one_lookup_per_deadline(
    table: Warehouse,
) -> None:
    """The expiry check is off the hot path: one coordinator read, then not before the
    transaction's deadline, however many flushes the other writer makes."""
    a = stalled_producer(table, timeout_ms=60_000)
    store = CoordinatorReads(open_store(table.url))
    b = Producer(Warehouse(store=store), linger_ms=0)
    for i in range(20):
        b.send("t", value=b"b%d" % i, partition=0).result()
    assert store.reads == [TransactionCoordinator.key(TID)]
    assert meta_of(table)[0].state is TxnState.ONGOING
    b.close()
    a.abort_transaction()


def test_a_reader_reads_a_stuck_prepared_object_once_per_grace_period(table: Warehouse) -> None:
    """A producer dies right after its PrepareCommit CAS; a read_committed consumer polling
    in a loop reads the coordinator object once, completes the transaction once the grace
    period is over, and never reads the object on an idle poll."""
    stalled_producer(table, timeout_ms=60_000)
    coordinator = TransactionCoordinator(table.store)
    meta, etag = meta_of(table)
    prepared = meta.transition(TxnState.PREPARE_COMMIT)
    coordinator.cas(prepared, etag)  # ... and the producer is SIGKILLed here
    grace = 5_000
    ready = prepared.last_update_timestamp + grace
    store = CoordinatorReads(open_store(table.url))
    consumer = Consumer(
        Warehouse(store=store, stuck_transaction_grace_ms=grace),
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    tps = [TopicPartition("t", p) for p in range(3)]
    consumer.assign(tps)
    seen = [r.value for recs in consumer.poll().values() for r in recs]
    for _ in range(30):
        assert consumer.poll() == {}
    assert now_ms() < ready, "the machine stalled for the whole grace period"
    assert seen == [b"committed"]
    assert store.reads == [TransactionCoordinator.key(TID)]  # one read for 31 polls

    time.sleep(max(ready - now_ms() + 50, 0) / 1000)
    got = consumer.poll()
    assert sorted(r.value for recs in got.values() for r in recs) == [b"stalled-0", b"stalled-1"]
    assert store.reads == [TransactionCoordinator.key(TID)] * 2
    assert meta_of(table)[0].state is TxnState.COMPLETE_COMMIT
    for _ in range(10):
        assert consumer.poll() == {}
    assert len(store.reads) == 2  # nothing open any more: no reads
    consumer.close()


def test_readers_leave_an_expired_ongoing_transaction_to_writers(table: Warehouse) -> None:
    a = stalled_producer(table, timeout_ms=200)
    time.sleep(0.3)
    store = CoordinatorReads(open_store(table.url))
    reader = Warehouse(store=store, stuck_transaction_grace_ms=0)  # recheck after 1 s
    started = time.monotonic()
    for _ in range(10):
        assert read_all(reader, ["t"]) == [b"committed"]
    polled_s = time.monotonic() - started
    assert meta_of(table)[0].state is TxnState.ONGOING
    # One read, then not again before the recheck delay, however often it is polled (a
    # machine so loaded that the ten polls took over a second may read once more a second).
    assert set(store.reads) == {TransactionCoordinator.key(TID)}
    assert len(store.reads) <= 1 + int(polled_s)
    a.abort_transaction()


def test_a_timed_out_transaction_below_the_log_start_is_still_aborted(table: Warehouse) -> None:
    """Issue 21.2: at protocol >= 2, delete_records past an open transaction's first batch
    dropped that batch from the snapshot (and its checkpoints): the transaction lost its
    transactional id, no writer aborted it at its timeout, and the LSO stayed pinned."""
    a = Producer(table, transactional_id=TID, transaction_timeout_ms=300)
    a.init_transactions()
    a.begin_transaction()
    a.send("t", value=b"open", partition=0)
    a.flush()  # offset 0, open
    with Producer(table, linger_ms=0) as idem:
        assert idem.send("t", value=b"idem", partition=0).get(timeout=10).offset == 1
    t = table.table("t")
    assert t.delete_records({0: 2}) == {0: 2}
    t.expire_producers(now=now_ms() + 10**9)  # the idempotent producer: upgrades to v2
    snap = t.snapshot()
    assert snap.protocol is not None and snap.protocol.minReaderVersion == 2
    (held,) = t.describe().partitions[0].open_transactions
    assert (held.producer_id, held.first_offset, held.transactional_id) == (a.producer_id, 0, TID)
    t.checkpoint()  # a cold load from the checkpoint knows the transaction too
    (cold,) = Warehouse(store=table.store).table("t").describe().partitions[0].open_transactions
    assert cold == held
    time.sleep(0.4)
    with Producer(Warehouse(store=table.store), linger_ms=0) as other:
        assert other.send("t", value=b"later", partition=0).get(timeout=10).offset == 2
    assert meta_of(table)[0].state is TxnState.COMPLETE_ABORT
    part = t.describe().partitions[0]
    assert (part.log_start_offset, part.last_stable_offset, part.high_watermark) == (2, 4, 4)
    assert part.open_transactions == ()
    with pytest.raises(ProducerFencedError):
        a.commit_transaction()
