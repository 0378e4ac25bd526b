"""Producer processes racing for the same log versions on local disk."""

from __future__ import annotations

import pathlib
import threading
import time
import uuid
from typing import Any

import pytest
from procutil import run_workers
from tableutil import read_all, write_batch

from txntable import Producer, Warehouse
from txntable.producer.partitioner import partition_for_key
from txntable.protocol.actions import CommitInfo
from txntable.storage.base import Store, StoredObject, StoreWrapper
from txntable.storage.local import LocalStore
from txntable.storage.memory import MemoryStore
from txntable.util import now_ms

PROCESSES = 4
RECORDS = 300
PARTITIONS = 3
FLUSH_EVERY = 10


def produce(url: str, worker: int, barrier: Any, results: Any) -> None:
    """Child process: send RECORDS keyed records, report (value, partition, offset) of each."""
    try:
        wh = Warehouse(url)
        producer = Producer(wh, enable_idempotence=True, batch_size=300, linger_ms=1)
        producer.partitions_for("t")  # load the table before the race starts
        barrier.wait(timeout=60)
        futures = []
        for i in range(RECORDS):
            value = f"w{worker}-r{i}".encode()
            futures.append((value, producer.send("t", value=value, key=value)))
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                producer.flush()  # many small commits, so the processes keep colliding
        producer.flush()
        acked = [(v, f.result(timeout=60)) for v, f in futures]
        table = producer.metadata.table("t")
        producer.close()  # a committer serves the other processes until it is closed
        # Versions this process wrote (its appends, or group-commit rounds), and the races
        # it lost (a lost race, or an append handed to another writer's round).
        followed = table.group_commit.stats["followed"] if table.group_commit else 0
        stats = (table.log.stats.commits, table.log.stats.conflicts + followed)
        results.put((worker, [(v, md.partition, md.offset) for v, md in acked], stats, None))
    except BaseException as e:  # reported to the parent, which fails the test with it
        results.put((worker, [], (0, 0), repr(e)))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_processes_append_exactly_once(tmp_path: pathlib.Path) -> None:
    url = f"file://{tmp_path}/lake"
    Warehouse(url).create_table("t", partitions=PARTITIONS)
    reports = run_workers(produce, [(url, w) for w in range(PROCESSES)])
    assert [err for _, _, _, err in reports if err] == []

    acked: dict[bytes, tuple[int, int]] = {}
    commits = conflicts = 0
    for _, records, (c, x), _ in reports:
        commits += c
        conflicts += x
        for value, partition, offset in records:
            assert value not in acked
            acked[value] = (partition, offset)
            assert partition == partition_for_key(value, PARTITIONS)
    assert len(acked) == PROCESSES * RECORDS
    assert conflicts > 0  # the processes really raced for versions

    wh = Warehouse(url)
    desc = wh.table("t").describe()
    got = read_all(wh, "t", range(PARTITIONS), "read_uncommitted")
    assert got == read_all(wh, "t", range(PARTITIONS), "read_committed")
    seen: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        hw = desc.partitions[p].high_watermark
        assert desc.partitions[p].last_stable_offset == hw
        assert [offset for offset, _ in got[p]] == list(range(hw))  # dense, no markers
        for offset, value in got[p]:
            assert value is not None and value not in seen
            seen[value] = (p, offset)
    assert seen == acked  # every acknowledged record exactly once, exactly where acked
    # Many small appends (a segment per partition per flush) …
    assert sum(p.segments for p in desc.partitions) >= PROCESSES * RECORDS // FLUSH_EVERY
    # … and every version was written by one of the processes.
    assert desc.version == commits


class _InFlightGets(StoreWrapper):
    """Counts reads of log versions, and the most in flight at once (each takes 30 ms)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.versions: list[int] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> StoredObject:
        if "/_log/0" not in key:
            return super().get(key)
        with self._lock:
            self.versions.append(int(key.rsplit("/", 1)[1].split(".")[0]))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(0.03)
            return super().get(key)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_a_lost_race_reads_the_versions_it_missed_two_at_a_time(tmp_path: pathlib.Path) -> None:
    """The version a writer lost exists, and under contention more were won since: its
    refresh reads two at a time, then four after two rounds that found both."""
    store = _InFlightGets(LocalStore(str(tmp_path)))
    Warehouse(store=LocalStore(str(tmp_path))).create_table("t", partitions=1)
    behind = Warehouse(store=store, group_commit=False).table("t")
    snap = behind.snapshot()
    assert behind.log.try_put(snap, [CommitInfo(now_ms(), "TEST", uuid.uuid4().hex)])
    other = Warehouse(store=LocalStore(str(tmp_path)), group_commit=False).table("t")
    for i in range(5):
        write_batch(other, 0, [f"r{i}".encode()])  # versions 2..6
    store.versions.clear()
    assert not behind.log.try_put(snap, [CommitInfo(now_ms(), "TEST", uuid.uuid4().hex)])
    assert snap.version == 6 and snap.partition(0).high_watermark == 5
    # [2, 3], [4, 5], [6, 7, 8, 9]: each once, three round trips; 7 does not exist.
    assert sorted(store.versions) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert store.most_in_flight == 4


def _table_with_tail(store: Store, tail: int) -> None:
    """A table whose newest checkpoint is at version 100, then ``tail`` versions."""
    wh = Warehouse(store=store, group_commit=False)
    wh.create_table("t", partitions=1)
    with Producer(wh, linger_ms=0) as producer:
        for i in range(100 + tail):  # version 1 + i
            producer.send("t", value=b"%d" % i, partition=0).result()


def test_a_load_reads_the_tail_after_its_checkpoint_at_once(memory_store: MemoryStore) -> None:
    """On a store that lists in order (S3) a load lists what follows the checkpoint while it
    reads it, then reads the listed versions concurrently: a table 40 versions after its
    checkpoint opened in ~1 s at 20 ms a request when it read them one after another."""
    _table_with_tail(memory_store, 40)  # the checkpoint at 100, versions 101..140
    store = _InFlightGets(memory_store)
    snap = Warehouse(store=store, group_commit=False).table("t").snapshot()
    assert snap.version == 140 and snap.partition(0).high_watermark == 140
    # The checkpoint (100), then each version once; no probe of 141.
    assert sorted(store.versions) == list(range(100, 141))
    assert store.most_in_flight >= 16


def test_a_young_table_is_loaded_with_version_0_beside_the_others(
    memory_store: MemoryStore,
) -> None:
    """Without a checkpoint a load lists the log, then reads version 0 together with the
    versions after it: one round trip, not one for version 0 and one for the rest."""
    wh = Warehouse(store=memory_store, group_commit=False)
    wh.create_table("t", partitions=1)
    writer = wh.table("t")
    for i in range(5):
        write_batch(writer, 0, [b"%d" % i])  # versions 1..5
    store = _InFlightGets(memory_store)
    snap = Warehouse(store=store, group_commit=False).table("t").snapshot()
    assert snap.version == 5 and snap.partition(0).high_watermark == 5
    assert sorted(store.versions) == [0, 1, 2, 3, 4, 5]
    assert store.most_in_flight == 6


class _SlowHeadAndHint(StoreWrapper):
    """Holds HEADs and reads of ``_last_checkpoint``, recording when each ran."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def _held(self, what: str, call: Any) -> Any:
        started = time.monotonic()
        try:
            time.sleep(0.05)
            return call()
        finally:
            with self._lock:
                self.calls.append((what, started, time.monotonic()))

    def head(self, key: str) -> Any:
        return self._held("head", lambda: super(_SlowHeadAndHint, self).head(key))

    def get(self, key: str) -> StoredObject:
        if key.endswith("_last_checkpoint"):
            return self._held("hint", lambda: super(_SlowHeadAndHint, self).get(key))  # type: ignore[no-any-return]
        return super().get(key)


def test_opening_a_table_reads_its_checkpoint_hint_beside_the_existence_check(
    memory_store: MemoryStore,
) -> None:
    """``Warehouse.table`` checks version 0 and reads ``_last_checkpoint`` at once, and the
    first load uses that read (one round trip less to open and load a table)."""
    _table_with_tail(memory_store, 3)  # the checkpoint at 100, versions 101..103
    store = _SlowHeadAndHint(memory_store)
    handle = Warehouse(store=store, group_commit=False).table("t")
    snap = handle.snapshot()
    assert snap.version == 103 and snap.partition(0).high_watermark == 103
    assert [c[0] for c in sorted(store.calls, key=lambda c: c[1])] in (
        ["head", "hint"],
        ["hint", "head"],
    )
    (head,) = [c for c in store.calls if c[0] == "head"]
    (hint,) = [c for c in store.calls if c[0] == "hint"]
    assert hint[1] < head[2] and head[1] < hint[2]  # they overlapped


def test_opening_a_group_log_reads_its_checkpoint_hint_beside_the_existence_check(
    memory_store: MemoryStore,
) -> None:
    """A consumer group's offset log is opened like a table: the hint is read beside the
    check for version 0, and the first load uses it."""
    from txntable import Consumer, OffsetAndMetadata, TopicPartition
    from txntable.groups.offsets import open_group_table

    Warehouse(store=memory_store).create_table("t", partitions=1)
    consumer = Consumer(Warehouse(store=memory_store), group_id="g")
    consumer.assign([TopicPartition("t", 0)])
    consumer.commit({TopicPartition("t", 0): OffsetAndMetadata(0)})
    consumer.close()
    store = _SlowHeadAndHint(memory_store)
    group_log = open_group_table(store, "g", create=False)
    assert group_log is not None and group_log.snapshot().version >= 1
    (head,) = [c for c in store.calls if c[0] == "head"]
    (hint,) = [c for c in store.calls if c[0] == "hint"]
    assert hint[1] < head[2] and head[1] < hint[2]  # they overlapped


def test_a_stale_prefetched_hint_still_loads_the_newest_version(
    memory_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hint read when the handle was opened may be older than the log when the handle is
    first loaded (a checkpoint written since): the load still ends at the newest version;
    and a prefetch older than HINT_PREFETCH_S is not used (the hint is read again)."""
    _table_with_tail(memory_store, 0)  # the checkpoint at 100
    store = _SlowHeadAndHint(memory_store)
    handle = Warehouse(store=store, group_commit=False).table("t")
    with Producer(Warehouse(store=memory_store, group_commit=False), linger_ms=0) as producer:
        for i in range(105):  # versions 101..205, a checkpoint at 200
            producer.send("t", value=b"x%d" % i, partition=0).result()
    snap = handle.snapshot()
    assert snap.version == 205 and snap.partition(0).high_watermark == 205
    assert [c[0] for c in store.calls].count("hint") == 1

    import txntable.log.log as log_module

    monkeypatch.setattr(log_module, "HINT_PREFETCH_S", 0.0)
    store.calls.clear()
    later = Warehouse(store=store, group_commit=False).table("t")
    assert later.snapshot().version == 205
    assert [c[0] for c in store.calls].count("hint") == 2  # the prefetch, then a read


def test_a_load_at_a_version_reads_only_up_to_it(memory_store: MemoryStore) -> None:
    _table_with_tail(memory_store, 40)
    store = _InFlightGets(memory_store)
    snap = Warehouse(store=store, group_commit=False).table("t").log.load(120)
    assert snap.version == 120 and snap.partition(0).high_watermark == 120
    assert sorted(store.versions) == list(range(100, 121))


def test_a_refresh_far_behind_reads_more_versions_at_once(memory_store: MemoryStore) -> None:
    """A consumer of a busy table (or a writer back from a pause) that is 100 versions
    behind reads them in 13 round trips, 16 at most in flight, each version once; one that
    is up to date reads one version, one a version behind two (as one at a time did)."""
    _table_with_tail(memory_store, 0)  # version 100, its checkpoint
    store = _InFlightGets(memory_store)
    handle = Warehouse(store=store, group_commit=False).table("t")
    assert handle.snapshot().version == 100
    writer = Warehouse(store=memory_store, group_commit=False).table("t")
    write_batch(writer, 0, [b"one"])
    store.versions.clear()
    assert handle.snapshot().version == 101 and sorted(store.versions) == [101, 102]
    store.versions.clear()
    assert handle.snapshot().version == 101 and store.versions == [102]
    for i in range(100):
        write_batch(writer, 0, [f"r{i}".encode()])  # versions 102..201
    store.versions.clear()
    store.most_in_flight = 0
    snap = handle.snapshot()
    assert snap.version == 201 and snap.partition(0).high_watermark == 201
    # Rounds of 1, 1, 2, 2, 4, 4, 8, 8, then 16 × 5 (102..211): each version once, the
    # last round's reads past 201 the only ones wasted.
    assert sorted(store.versions) == list(range(102, 212))
    assert store.most_in_flight == 16
