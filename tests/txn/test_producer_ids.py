"""Producer ids: blocks reserved by CAS on one of 64 shards, never handed out twice.

Hundreds of producers starting together (a Spark job's tasks, issue 17's W=256) each reserve
a block; on one object that is one CAS per round trip for all of them, and most attempts
lose. Shard 0 is the original ``_coordinator/producer_ids.json`` (an older client's blocks
come from it, from 0 up); shard k hands out ids from k * 2**40.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from txntable import config
from txntable.errors import (
    CorruptLogError,
    InvalidTxnStateError,
    PreconditionFailedError,
    TransientStorageError,
)
from txntable.layout import (
    PRODUCER_ID_SHARD_SPAN,
    PRODUCER_ID_SHARDS,
    PRODUCER_IDS_KEY,
    producer_ids_key,
)
from txntable.storage.base import Store, StoredObject, StoreWrapper
from txntable.storage.local import LocalStore
from txntable.storage.wrappers import LatencyStore
from txntable.txn.coordinator import ProducerIdAllocator, TransactionCoordinator

BLOCK = config.PRODUCER_ID_BLOCK_SIZE_DEFAULT


@pytest.fixture
def store(tmp_path) -> Iterator[LocalStore]:
    yield LocalStore(str(tmp_path))


class _CountingConflicts(StoreWrapper):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.conflicts = 0
        self._lock = threading.Lock()

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        try:
            return super().put_if_match(key, data, etag)
        except PreconditionFailedError:
            with self._lock:
                self.conflicts += 1
            raise

    def put_if_absent(self, key: str, data: bytes) -> str:
        try:
            return super().put_if_absent(key, data)
        except Exception:
            with self._lock:
                self.conflicts += 1
            raise


def _shard_of(pid: int) -> int:
    return pid // PRODUCER_ID_SHARD_SPAN


def test_producers_starting_together_get_distinct_ids_from_many_shards(store: LocalStore) -> None:
    """32 producers (each its own allocator, as separate processes are) reserve at once:
    every id distinct, each in its shard's range, and few CAS attempts lost (on one object
    most of them would be)."""
    counting = _CountingConflicts(LatencyStore(store, 5))
    ids: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(32)

    def producer() -> None:
        allocator = ProducerIdAllocator(counting, block_size=10)
        start.wait(10)
        got = [allocator.allocate() for _ in range(3)]
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=producer) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 96 and len(set(ids)) == 96
    shards = {_shard_of(i) for i in ids}
    assert len(shards) > 8 and shards <= set(range(PRODUCER_ID_SHARDS))
    for i in ids:
        first = _shard_of(i) * PRODUCER_ID_SHARD_SPAN
        assert first <= i < first + PRODUCER_ID_SHARD_SPAN
    # All try shard 0 first (31 lose it), then spread: a few more. One shard: ~500.
    assert counting.conflicts < 100
    # Each producer's three ids came from one block of its own.
    assert all(store.get(producer_ids_key(s)).data for s in shards)


def test_shard_zero_is_the_original_block_object(store: LocalStore) -> None:
    """An older client's blocks (``producer_ids.json``, from 0 up) and a newer one's on
    shard 0 come from the same object by the same CAS: never the same id. Shard 0 is tried
    first: producers starting one at a time get small ids in order, as before shards."""
    store.put(PRODUCER_IDS_KEY, b'{"nextBlockStart":5000,"version":1,"writeId":"x"}')
    assert ProducerIdAllocator(store, block_size=100).allocate() == 5000  # shard 0 first
    assert b'"nextBlockStart":5100' in store.get(PRODUCER_IDS_KEY).data
    allocator = ProducerIdAllocator(store, block_size=100, first_shard=7)
    assert allocator.allocate() == 7 * PRODUCER_ID_SHARD_SPAN
    assert store.get(producer_ids_key(7)).data.startswith(b'{"nextBlockStart":%d,' % (
        7 * PRODUCER_ID_SHARD_SPAN + 100))


def test_a_spent_shard_is_left_for_another(store: LocalStore) -> None:
    end = 4 * PRODUCER_ID_SHARD_SPAN
    store.put(producer_ids_key(3), b'{"nextBlockStart":%d,"version":1,"writeId":"x"}' % (end - 5))
    pid = ProducerIdAllocator(store, block_size=10, first_shard=3).allocate()
    assert _shard_of(pid) != 3
    assert store.get(producer_ids_key(3)).data.startswith(b'{"nextBlockStart":%d,' % (end - 5))


@pytest.mark.parametrize(
    "body, error",
    [
        (b"not json", "invalid producer id block"),
        (b'{"nextBlockStart":5,"version":1,"writeId":"x"}', "invalid nextBlockStart 5"),
        (b'{"nextBlockStart":true,"version":1,"writeId":"x"}', "invalid nextBlockStart"),
    ],
    ids=["not-json", "below-the-shard", "not-an-int"],
)
def test_a_damaged_shard_is_a_typed_error_naming_it(
    store: LocalStore, body: bytes, error: str
) -> None:
    store.put(producer_ids_key(9), body)
    with pytest.raises(CorruptLogError, match=error) as info:
        ProducerIdAllocator(store, first_shard=9).allocate()
    assert info.value.path == producer_ids_key(9)


def test_with_every_shard_spent_no_block_is_reserved(store: LocalStore) -> None:
    for shard in range(2):
        end = (shard + 1) * PRODUCER_ID_SHARD_SPAN
        store.put(producer_ids_key(shard), b'{"nextBlockStart":%d,"version":1,"writeId":"x"}' % (
            end - 5))
    with pytest.raises(InvalidTxnStateError, match="every shard is spent"):
        ProducerIdAllocator(store, block_size=10, shards=2).allocate()


class _SlowGets(StoreWrapper):
    """Every GET takes 50 ms and is recorded (key, start, end)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> StoredObject:
        started = time.monotonic()
        try:
            time.sleep(0.05)
            return super().get(key)
        finally:
            with self._lock:
                self.gets.append((key, started, time.monotonic()))


def test_a_new_id_reads_its_object_and_a_producer_id_block_at_once(store: LocalStore) -> None:
    """InitProducerId of a new transactional id needs a producer id: the block's object is
    read beside the id's (one round trip less to start a producer); for an existing id that
    read is spent in parallel and reserves nothing."""
    ProducerIdAllocator(store).allocate()  # the block object exists: its etag is CAS'd on
    slow = _SlowGets(store)
    coordinator = TransactionCoordinator(slow)
    meta = coordinator.init_producer_id("new", 60_000)
    assert meta.producer_epoch == 0
    (txn,) = [g for g in slow.gets if g[0].endswith("/new.json")]
    (block,) = [g for g in slow.gets if g[0] == PRODUCER_IDS_KEY]
    assert txn[1] < block[2] and block[1] < txn[2]  # they overlapped
    # Its block is reserved now: ids of this coordinator come from it.
    slow.gets.clear()
    second = coordinator.init_producer_id("other", 60_000)
    assert second.producer_id == meta.producer_id + 1
    assert [g[0] for g in slow.gets if g[0] == PRODUCER_IDS_KEY] == []
    # An existing id with a fresh coordinator: the block read is spent, nothing reserved.
    before = store.get(PRODUCER_IDS_KEY)
    again = TransactionCoordinator(slow).init_producer_id("new", 60_000)
    assert (again.producer_id, again.producer_epoch) == (meta.producer_id, 1)
    assert store.get(PRODUCER_IDS_KEY).etag == before.etag


def test_a_failed_or_stale_block_prefetch_falls_back_to_reading_and_racing(
    store: LocalStore,
) -> None:
    """The prefetched block object is a first guess: a failed read is read again, and a
    stale one loses its CAS and reserves the next block, never an id handed out before."""
    allocator = ProducerIdAllocator(store)
    first = allocator.allocate()
    stale = ProducerIdAllocator(store)
    prefetched = stale.prefetch()
    assert prefetched is not None
    prefetched.result()
    taken = ProducerIdAllocator(store).allocate()  # another client reserves a block meanwhile
    pid = stale.allocate(prefetched)
    assert pid not in (first, taken) and pid // BLOCK != taken // BLOCK
    failing: Future[StoredObject | None] = Future()
    failing.set_exception(TransientStorageError("down"))
    other = ProducerIdAllocator(store).allocate(failing)
    assert len({first, taken, pid, other}) == 4
    assert ProducerIdAllocator(store).prefetch() is not None
    assert allocator.prefetch() is None  # ids left in its block: no read needed
