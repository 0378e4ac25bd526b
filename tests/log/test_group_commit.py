"""Group commit on a real store: many writers, a committer, followers that help.

Writers are threads with their own Warehouse on one local directory (a real backend),
behind a small latency so that they really race. What a user relies on: every acknowledged
record is in the table exactly once, at the offset its future reported; a refused operation
raises its error in its own writer; a dead committer costs latency, never progress; a
maintenance commit is never starved by busy producers.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tableutil import write_batch

from txntable import Producer, Warehouse
from txntable.errors import InvalidProducerEpochError, KafkaTimeoutError
from txntable.layout import intent_key, intents_prefix, outcomes_key
from txntable.log import group_commit
from txntable.log.group_commit import (
    OUTCOME_RECORD_VERSIONS,
    GroupCommitConfig,
    Lease,
    LeaseState,
)
from txntable.protocol.append import PendingBatch, plan_append
from txntable.protocol.records import encode_segment
from txntable.protocol.sequencing import AppendOp, Intent, RoundItem, RoundPlan
from txntable.storage.base import StoredObject, StoreWrapper
from txntable.storage.local import LocalStore
from txntable.storage.wrappers import CountingStore, LatencyStore
from txntable.structs import ProducerRecord
from txntable.table import Table
from txntable.util import now_ms

PARTITIONS = 4
FAST = GroupCommitConfig(help_ms=150, idle_ms=300, lease_ms=1000, timeout_ms=60_000)


def warehouse(root: Path, latency_ms: float = 2, cfg: GroupCommitConfig = FAST) -> Warehouse:
    return Warehouse(store=LatencyStore(LocalStore(str(root)), latency_ms), group_commit=cfg)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    Warehouse(store=LocalStore(str(tmp_path))).create_table("t", partitions=PARTITIONS)
    yield tmp_path


def read_committed(root: Path) -> dict[int, list[tuple[int, bytes]]]:
    scan = Warehouse(store=LocalStore(str(root))).table("t").scan().to_arrow()
    out: dict[int, list[tuple[int, bytes]]] = {}
    for p, o, v in zip(
        scan.column("partition").to_pylist(),
        scan.column("offset").to_pylist(),
        scan.column("value").to_pylist(),
        strict=True,
    ):
        out.setdefault(p, []).append((o, v))
    return out


def run_writers(root: Path, writers: int, records: int, transactional: bool) -> dict:
    """Each writer sends ``records`` records one commit at a time; returns what was acked
    ({(partition, offset): value}) and the writers' group-commit counters."""
    acked: dict[tuple[int, int], bytes] = {}
    stats: list[dict[str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        try:
            tid = f"w{i}" if transactional else None
            producer = Producer(warehouse(root), transactional_id=tid, linger_ms=0,
                                auto_maintenance=False)
            if transactional:
                producer.init_transactions()
            rng = random.Random(i)
            for n in range(records):
                value = f"{i}-{n}".encode()
                if transactional:
                    producer.begin_transaction()
                future = producer.send("t", value=value, partition=rng.randrange(PARTITIONS))
                if transactional:
                    producer.commit_transaction()
                meta = future.get(timeout=60)
                with lock:
                    acked[(meta.partition, meta.offset)] = value
            gc = producer.metadata.table("t").group_commit
            assert gc is not None
            with lock:
                stats.append(dict(gc.stats))
            producer.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert errors == []
    totals: dict[str, int] = {}
    for s in stats:
        for k, v in s.items():
            totals[k] = totals.get(k, 0) + v
    return {"acked": acked, "stats": totals}


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_many_writers_land_every_acknowledged_record_once(root: Path, transactional: bool) -> None:
    out = run_writers(root, writers=8, records=15, transactional=transactional)
    acked = out["acked"]
    assert len(acked) == 8 * 15
    got = read_committed(root)
    seen = {(p, o): v for p, rows in got.items() for o, v in rows}
    assert seen == acked  # exactly the acknowledged records, at their offsets
    for rows in got.values():
        offsets = [o for o, _ in rows]
        if transactional:  # a COMMIT marker after each record
            assert offsets == list(range(0, 2 * len(rows), 2))
        else:
            assert offsets == list(range(len(rows)))
    assert out["stats"]["followed"] + out["stats"]["rounds"] > 0, "no round ran: no contention"


def test_a_follower_helps_when_the_committer_is_gone(root: Path) -> None:
    """A live lease whose owner died: writers that follow it commit rounds themselves."""
    wh = warehouse(root)
    table = wh.table("t")
    dead = Lease(table, "dead" * 8, 60_000).take(None)
    assert dead is not None
    gc = table.group_commit
    assert gc is not None
    gc._seen = dead  # follow the dead committer
    started = time.monotonic()
    result, version = table.submit(AppendOp((_segment(wh, table, 0),)))
    assert result.base_offsets == [0]
    assert gc.stats["helps"] >= 1 and gc.stats["followed"] == 1
    assert time.monotonic() - started < 10
    assert wh.table("t").snapshot().partition(0).high_watermark == 1
    # The intent was decided by the version and then deleted.
    assert list(wh.store.list(intents_prefix("t"))) == [] or _eventually_empty(wh)


def test_a_solo_writer_that_keeps_winning_joins_a_live_committer(root: Path) -> None:
    """A writer that never loses a race never escalates; once per lease_ms / 20 it reads the
    lease in the background, and once it saw a live committer's its next commit is an
    intent (it would otherwise race the committer's rounds and starve their followers:
    issue 17's bench at W=64, and the first commits of a W=16 run). Without a committer it
    stays solo."""
    wh = warehouse(root, cfg=replace(FAST, lease_ms=2_000))  # a look per 100 ms at most
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    table.submit(AppendOp((_segment(wh, table, 0),)))  # looks (in the background): no lease
    time.sleep(0.15)
    table.submit(AppendOp((_segment(wh, table, 0),)))  # looks again: still none
    assert (gc.stats["direct"], gc.stats["followed"]) == (2, 0)
    # Another writer becomes the committer (dead here: the follower helps).
    lease = Lease(table, "other" * 6, 60_000)
    held = lease.take(lease.read())
    assert held is not None
    table.submit(AppendOp((_segment(wh, table, 0),)))  # looked 100 ms ago: no look, solo
    assert (gc.stats["direct"], gc.stats["followed"]) == (3, 0)
    time.sleep(0.15)
    table.submit(AppendOp((_segment(wh, table, 0),)))  # solo; its look finds the lease
    assert _eventually(lambda: gc._seen is not None)
    assert gc._seen is not None and gc._seen.owner == held.owner
    result, _ = table.submit(AppendOp((_segment(wh, table, 0),)))
    assert result.base_offsets == [4]
    assert (gc.stats["direct"], gc.stats["followed"]) == (4, 1)


def test_a_solo_writers_look_for_a_committer_is_off_its_commit_path(root: Path) -> None:
    """The look is a GET in the background: a writer alone commits without waiting for it
    (one writer is no slower with group commit than without)."""
    reading = threading.Event()
    release = threading.Event()

    class SlowLease(LocalStore):
        def get(self, key: str) -> StoredObject:
            if key.endswith("lease.json"):
                reading.set()
                release.wait(10)
            return super().get(key)

    wh = Warehouse(store=SlowLease(str(root)), group_commit=FAST)
    table = wh.table("t")
    try:
        started = time.monotonic()
        result, _ = table.submit(AppendOp((_segment(wh, table, 0),)))
        assert reading.wait(5)  # the look is running (and blocked) ...
        result2, _ = table.submit(AppendOp((_segment(wh, table, 1),)))
        # ... and both commits returned without it.
        assert time.monotonic() - started < 5
        assert (result.base_offsets, result2.base_offsets) == ([0], [0])
    finally:
        release.set()


def test_a_producer_that_opens_a_busy_table_follows_its_committer_from_its_first_commit(
    root: Path,
) -> None:
    """Opening a table to write it looks for a committer (in the background): the first
    commit is an intent, not a direct attempt that would race the committer's rounds (lose,
    read the versions it missed, read the lease; or win and make the round lose)."""
    wh = warehouse(root)
    held = Lease(wh.table("t"), "dead" * 8, 60_000).take(None)  # live, commits nothing
    assert held is not None
    producer = Producer(wh, linger_ms=0, auto_maintenance=False)
    try:
        table = producer.metadata.table("t")
        gc = table.group_commit
        assert gc is not None
        assert _eventually(lambda: gc._seen is not None)
        assert gc._seen is not None and gc._seen.owner == held.owner
        meta = producer.send("t", value=b"v", partition=0).get(timeout=30)
        assert (meta.partition, meta.offset) == (0, 0)
        # It followed the lease (and helped: its owner commits nothing); no direct attempt.
        assert (gc.stats["direct"], gc.stats["followed"]) == (0, 1)
        assert table.log.stats.conflicts == 0
    finally:
        producer.close()


def test_an_operation_only_this_writer_can_plan_does_not_look_for_a_committer(
    root: Path,
) -> None:
    """The look is for declarative operations: a solo writer's own build function (as
    maintenance commits) still races alone first, and takes no live lease over."""
    wh = warehouse(root, cfg=replace(FAST, lease_ms=400))
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    lease = Lease(table, "other" * 6, 60_000)
    held = lease.take(lease.read())
    assert held is not None
    time.sleep(0.15)
    pending = _segment(wh, table, 0)
    gc.commit(lambda s: plan_append(s, [pending], [], None, now_ms()))
    assert (gc.stats["direct"], gc.stats["followed"]) == (1, 0)
    current = lease.read()
    assert current is not None and current.owner == held.owner


def test_a_lapsed_lease_is_taken_over_by_a_waiting_writer(root: Path) -> None:
    wh = warehouse(root)
    table = wh.table("t")
    lapsed = Lease(table, "gone" * 8, 1).take(None)  # expires at once
    assert lapsed is not None
    gc = table.group_commit
    assert gc is not None
    segment = _segment(wh, table, 1)  # first: cold, it can outlast the hint set next
    gc._seen = LeaseState(lapsed.owner, lapsed.epoch, now_ms() + 200, lapsed.etag)
    result, _ = table.submit(AppendOp((segment,)))
    assert (gc.stats["followed"], gc.stats["direct"]) == (1, 0)
    assert result.base_offsets == [0]
    lease = Lease(table, "someone", 1000).read()
    assert lease is not None and lease.owner == gc.id and lease.epoch == lapsed.epoch + 1
    gc.close()
    released = Lease(table, "someone", 1000).read()
    assert released is not None and not released.live(now_ms())


def test_a_refused_intent_raises_its_error_in_its_own_writer(root: Path) -> None:
    wh = warehouse(root)
    table = wh.table("t")
    table.submit(AppendOp((_segment(wh, table, 0, pid=5, epoch=3, seq=0),)))
    gc = table.group_commit
    assert gc is not None
    gc._seen = Lease(table, "dead" * 8, 60_000).take(None)
    with pytest.raises(InvalidProducerEpochError, match="epoch 2"):
        table.submit(AppendOp((_segment(wh, table, 0, pid=5, epoch=2, seq=1),)))
    snap = wh.table("t").snapshot()
    assert snap.partition(0).high_watermark == 1
    (outcome,) = [o for o in snap.intents.values() if o.error is not None]
    assert outcome.error == "InvalidProducerEpochError"


def test_two_committers_racing_decide_each_intent_once(root: Path) -> None:
    """A committer that lost the race sequences again: what the winner decided is no longer
    eligible, so nothing is committed twice (plain batches: no sequence to catch it)."""
    wh = warehouse(root)
    a, b = wh.table("t"), wh.table("t")
    b.snapshot()  # b's snapshot stays at the version before a's round
    for i in range(4):
        it = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, a, i % PARTITIONS),)), None,
                    now_ms())
        wh.store.put(intent_key("t", it.created_ms, it.id), it.to_json())
    ga, gb = a.group_commit, b.group_commit
    assert ga is not None and gb is not None
    decided, _ = ga._round([], None)
    assert decided == 4
    again, _ = gb._round([], None)  # stale: its put loses, it refreshes, nothing is left
    assert again == 0
    snap = wh.table("t").snapshot()
    assert sum(p.high_watermark for p in snap.partitions) == 4
    assert snap.version == 1


class _RecordedGets(StoreWrapper):
    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.gets: list[str] = []

    def get(self, key: str) -> StoredObject:
        self.gets.append(key)
        return self.inner.get(key)


def test_a_committer_takes_intents_from_their_keys(root: Path) -> None:
    """An intent whose key carries its body is decided without a read; one whose key
    payload is damaged, or whose key is plain (too large an intent, an older writer), is
    read: its object decides."""
    store = _RecordedGets(LocalStore(str(root)))
    wh = Warehouse(store=store, group_commit=FAST)
    table = wh.table("t")
    intents = [
        Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, i),)), None, now_ms())
        for i in range(4)
    ]
    keys = [intent_key("t", it.created_ms, it.id, it.key_payload()) for it in intents[:2]]
    keys.append(intent_key("t", intents[2].created_ms, intents[2].id, "AAAA"))
    keys.append(intent_key("t", intents[3].created_ms, intents[3].id))
    assert all(it.key_payload() in key for it, key in zip(intents[:2], keys, strict=False))
    for key, it in zip(keys, intents, strict=True):
        wh.store.put(key, it.to_json())
    store.gets.clear()
    gc = table.group_commit
    assert gc is not None
    decided, _ = gc._round([], None)
    assert decided == 4
    assert sorted(k for k in store.gets if "/_commit/intents/" in k) == sorted(keys[2:])
    snap = wh.table("t").snapshot()
    assert [p.high_watermark for p in snap.partitions] == [1, 1, 1, 1]
    assert all(snap.intents[it.id].error is None for it in intents)
    gc._flush_deletes(force=True)
    assert _eventually(lambda: not list(wh.store.list(intents_prefix("t"))))


def test_a_writer_back_from_following_commits_without_reading_every_version(
    root: Path,
) -> None:
    """A follower learns outcomes from the outcome record and its handle falls behind the
    log; back to committing (alone, or as the committer) it starts from the newest
    checkpoint, not with a lost race and a refresh of every version it missed."""
    store = CountingStore(LocalStore(str(root)))
    wh = Warehouse(store=store, group_commit=FAST)
    table = wh.table("t")
    table.snapshot()
    other = Warehouse(store=LocalStore(str(root)), group_commit=False).table("t")
    for i in range(250):
        write_batch(other, i % PARTITIONS, [b"x"])
    gc = table.group_commit
    assert gc is not None
    gc._tip_hint = 250  # as the outcome record told it while it followed
    batch = _segment(wh, table, 0)
    store.reset()
    _, version = table.submit(AppendOp((batch,)))
    assert version == 251
    gets = store.snapshot()["GET"]
    # The checkpoint's hint and the checkpoint at 200, versions 201-250, a probe, a look at
    # the lease: not 250 versions.
    assert gets <= 60, store.snapshot()
    assert table.snapshot().partition(0).high_watermark == 63 + 1


def test_a_wrong_tip_hint_does_not_fail_a_commit(root: Path) -> None:
    """The hint comes from an outcome record (a hint; an earlier table of the same name may
    have left one): a version it names that does not exist is not corruption."""
    wh = warehouse(root)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    gc._tip_hint = 500
    _, version = table.submit(AppendOp((_segment(wh, table, 1),)))
    assert version == 1
    assert wh.table("t").snapshot().partition(1).high_watermark == 1


class _HeldCheckpoints(StoreWrapper):
    """Checkpoint puts wait until ``release`` is set."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.release = threading.Event()

    def put(self, key: str, data: bytes) -> str:
        if "checkpoint" in key.rsplit("/", 1)[-1]:
            assert self.release.wait(30)
        return self.inner.put(key, data)


def test_a_round_does_not_wait_for_its_checkpoint(tmp_path: Path) -> None:
    """Every follower in a round waits for it: the checkpoint its version is due for (~80 ms
    of encoding and two round trips at 4,000 entries) is written after, in the background."""
    Warehouse(store=LocalStore(str(tmp_path))).create_table(
        "c", partitions=1, configuration={"checkpoint.interval": "2"}
    )
    store = _HeldCheckpoints(LocalStore(str(tmp_path)))
    wh = Warehouse(store=store, group_commit=FAST)
    table = wh.table("c")
    gc = table.group_commit
    assert gc is not None
    for _ in range(2):
        base = table.snapshot(refresh=False).version
        it = Intent(uuid.uuid4().hex, base, AppendOp((_segment(wh, table, 0),)), None, now_ms())
        wh.store.put(intent_key("c", it.created_ms, it.id, it.key_payload()), it.to_json())
        decided, _ = gc._round([], None)
        assert decided == 1
    assert table.snapshot(refresh=False).version == 2  # due for a checkpoint, not waiting
    assert table.log._checkpoint_hint() is None
    store.release.set()
    assert _eventually(lambda: table.log._checkpoint_hint() == (2, 1))
    reader = Warehouse(store=LocalStore(str(tmp_path))).table("c")
    assert reader.log.read_checkpoint(2) is not None
    assert reader.snapshot().partition(0).high_watermark == 2


def test_of_many_waiting_writers_only_a_few_help_a_live_committer(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting writers that see nothing move for help_ms all see it at about the same time;
    a round decides every listed intent, so each helps a live committer only with
    probability HELPERS_AT_ONCE / the intents listed (at W=256 all of them helped, and their
    rounds raced for every version)."""
    wh = warehouse(root)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    intents = [
        Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, i % PARTITIONS),)), None,
               now_ms())
        for i in range(10)
    ]
    for it in intents:
        wh.store.put(intent_key("t", it.created_ms, it.id, it.key_payload()), it.to_json())
    Lease(table, "dead" * 8, 60_000).take(None)  # a live committer that does not commit
    decoded: list[str] = []
    decode = Intent.from_key_payload

    def counting(*args: Any) -> Intent:
        decoded.append(args[1])
        return decode(*args)

    monkeypatch.setattr(Intent, "from_key_payload", staticmethod(counting))
    monkeypatch.setattr(group_commit.random, "random", lambda: 0.5)  # 0.5 * 10 >= 4
    assert gc._volunteer() is None
    assert (gc.stats["helps_skipped"], gc.stats["helps"]) == (1, 0)
    assert wh.table("t").snapshot().version == 0
    assert decoded == []  # a writer that does not help does not read what it listed
    monkeypatch.setattr(group_commit.random, "random", lambda: 0.3)  # 0.3 * 10 < 4
    keys = gc._volunteer()
    assert keys is not None and len(keys) == 10
    gc._help(intents[0], keys)
    assert gc.stats["helps"] == 1
    assert sorted(decoded) == sorted(it.id for it in intents)
    snap = wh.table("t").snapshot()
    assert snap.version == 1
    assert all(snap.intents[it.id].error is None for it in intents)


def test_maintenance_completes_next_to_busy_producers(root: Path) -> None:
    stop = threading.Event()
    failures: list[BaseException] = []
    sent = [0]

    def produce(i: int) -> None:
        try:
            with Producer(warehouse(root), linger_ms=0, auto_maintenance=False) as producer:
                while not stop.is_set():
                    producer.send("t", value=b"v", partition=i % PARTITIONS).get(timeout=60)
                    sent[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        table = warehouse(root).table("t")
        reports = []
        for _ in range(3):
            started = time.monotonic()
            reports.append(table.optimize(target_bytes=1 << 20))
            assert time.monotonic() - started < 30
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert failures == []
    assert sum(r.segments_written for r in reports) >= 1
    got = read_committed(root)
    assert sum(len(rows) for rows in got.values()) == sent[0]


def _segment(
    wh: Warehouse, table: Table, partition: int, pid: int = -1, epoch: int = -1, seq: int = -1
) -> PendingBatch:
    data = encode_segment([ProducerRecord(None, b"x", timestamp=1)])
    path = table.segment_key(partition, f"{now_ms():013d}-{uuid.uuid4().hex}.parquet")
    wh.store.put_data_file(path, data)
    return PendingBatch(partition, path, 1, len(data), pid, epoch, seq, False, 1, 1)


def _behind_a_silent_committer(wh: Warehouse) -> tuple[group_commit.GroupCommit, Intent]:
    """A handle of ``t`` that follows a live lease whose holder decides nothing, and an
    intent of its own written and waiting."""
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    Lease(table, "dead" * 8, 60_000).take(None)
    gc._seen = gc.lease.read()
    mine = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, 0),)), None, now_ms())
    wh.store.put(intent_key("t", mine.created_ms, mine.id, mine.key_payload()), mine.to_json())
    return gc, mine


def _eventually(condition: Callable[[], bool], seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _eventually_empty(wh: Warehouse) -> bool:
    for _ in range(100):
        if not list(wh.store.list(intents_prefix("t"))):
            return True
        time.sleep(0.05)
    return False


def test_a_single_writer_commits_directly(root: Path) -> None:
    """A single writer commits directly: one conditional put per record, no intent."""
    store = CountingStore(LocalStore(str(root)))
    with Producer(Warehouse(store=store), linger_ms=0, auto_maintenance=False) as producer:
        producer.send("t", value=b"warm", partition=0).get()
        store.reset()
        for _ in range(5):
            producer.send("t", value=b"x", partition=0).get()
        counts = store.snapshot()
    assert counts["CONDITIONAL_PUT"] == 5 and counts["LIST"] == 0
    assert not list(store.list(intents_prefix("t")))


def test_the_outcome_record_keeps_the_newest_versions_and_names_its_tip(root: Path) -> None:
    """Every waiting writer reads the record each time it changes: it holds the rounds of
    the newest OUTCOME_RECORD_VERSIONS versions and says its newest one in ``tip`` (issue
    17: at W=64 a record of 64 versions cost every follower ~2 ms of CPU per look and the
    rounds slowed down as it filled)."""
    wh = warehouse(root)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    for version in range(1, 41):
        gc._write_record({version: {f"i{version}": [None, "", None]}})
    data = wh.store.get(outcomes_key("t")).data
    body = json.loads(data)
    assert [r["version"] for r in body["rounds"]] == list(range(41 - OUTCOME_RECORD_VERSIONS, 41))
    assert body["tip"] == 40
    assert OUTCOME_RECORD_VERSIONS <= 16
    # Canonical (sorted keys, no whitespace, ASCII: what a waiting writer's byte search
    # relies on), also after merging rounds another committer wrote and a non-ASCII message.
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert data == canonical
    other = warehouse(root).table("t").group_commit
    assert other is not None
    other._write_record({41: {"x" * 32: ["KafkaError", "übel \"quoted\"", None]}})
    gc._write_record({42: {"y" * 32: [None, "", {"baseOffsets": [3], "duplicates": [False]}]}})
    data = wh.store.get(outcomes_key("t")).data
    body = json.loads(data)
    assert data == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert [r["version"] for r in body["rounds"]][-3:] == [40, 41, 42]
    assert body["rounds"][-2]["intents"] == {"x" * 32: ["KafkaError", 'übel "quoted"', None]}
    assert body["tip"] == 42


class _HeldRecordWrites(StoreWrapper):
    """Holds every write of the outcome record until ``release`` is set; keeps what each wrote."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self.holding = threading.Event()
        self.written: list[list[int]] = []

    def _hold(self, key: str, data: bytes) -> None:
        if key == outcomes_key("t"):
            self.holding.set()
            assert self.release.wait(10)
            self.written.append([r["version"] for r in json.loads(data)["rounds"]])

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._hold(key, data)
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        self._hold(key, data)
        return self.inner.put_if_match(key, data, etag)


def test_rounds_decided_during_a_slow_record_write_are_recorded_by_one_write(root: Path) -> None:
    """The record is written by one thread, one write at a time: rounds that land while a
    write is slow are all in the next write, not one write each (issue 17: at W=16 the
    slowest records landed ~116 ms after their version, queued behind each other)."""
    store = _HeldRecordWrites(LocalStore(str(root)))
    wh = Warehouse(store=store, group_commit=FAST)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    snap = table.snapshot()

    def decide(version: int) -> None:
        intent = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, 0),)), None, now_ms())
        refused = InvalidProducerEpochError(f"refused in {version}")
        plan = RoundPlan([], [], [refused], "WRITE", None, snap)
        gc._publish([RoundItem.of_intent(intent, now_ms())], plan, version)

    decide(1)
    assert store.holding.wait(10)
    for version in (2, 3, 4):
        decide(version)
    store.release.set()
    assert gc._recorder is not None
    gc._recorder.submit(lambda: None).result(10)  # one thread: the tasks before it are done
    assert store.written == [[1], [1, 2, 3, 4]]
    assert json.loads(store.get(outcomes_key("t")).data)["tip"] == 4


def _record_writer_and_follower(
    root: Path,
) -> tuple[Warehouse, group_commit.GroupCommit, group_commit.GroupCommit, Intent]:
    """Two handles of ``t`` (one writes the outcome record, one reads it) and an intent of
    the reader's on version 6, its segment written."""
    wh = warehouse(root)
    table = wh.table("t")
    writer = table.group_commit
    follower = warehouse(root).table("t").group_commit
    assert writer is not None and follower is not None
    mine = Intent("b" * 32, 6, AppendOp((_segment(wh, table, 0),)), None, now_ms())
    return wh, writer, follower, mine


def test_a_waiting_writer_decodes_only_its_own_entry_of_the_record(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look at a record that does not name the intent costs a byte search; one that names
    it decodes that entry and its round's version only — never the whole record, which
    holds every writer's outcomes of 16 rounds (issue 17: at W=64 parsing it was ~0.35 ms a
    look, and every waiting writer looks). The tip is learned either way; a record written
    without a tip (an older client) is parsed whole, as before."""
    wh, writer, follower, mine = _record_writer_and_follower(root)
    writer._write_record({7: {"a" * 32: [None, "", None]}})
    parsed: list[bytes] = []
    real_parse = group_commit._parse_record

    def counting_parse(data: bytes) -> dict[int, dict[str, list[Any]]]:
        parsed.append(data)
        return real_parse(data)

    monkeypatch.setattr(group_commit, "_parse_record", counting_parse)
    assert follower._from_record(mine) == (None, 7)
    assert parsed == [] and follower._tip_hint == 7
    # Decided in round 8 (refused), with other writers' outcomes around it in rounds 8 and 9.
    writer._write_record(
        {
            8: {
                "c" * 32: [None, "", None],
                mine.id: ["InvalidProducerEpochError", 'epoch 2 "fenced": by 3', None],
                "d" * 32: [None, "", None],
            }
        }
    )
    writer._write_record({9: {"e" * 32: [None, "", None]}})
    found, tip = follower._from_record(mine)
    assert found == ("InvalidProducerEpochError", 'epoch 2 "fenced": by 3', None, 8)
    assert tip == 9 and parsed == []
    # A record without a tip (written by an older client) is parsed to learn it.
    old = {"version": 1, "rounds": [{"version": 10, "intents": {}}], "writeId": "w"}
    wh.store.put(outcomes_key("t"), json.dumps(old).encode())
    assert follower._from_record(mine) == (None, 10)
    assert len(parsed) == 1


def test_a_waiting_writer_looks_again_when_the_records_next_write_is_due(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record says when it was written (``writtenMs``): a waiting writer learns the usual
    gap between writes and does not look again before the next one is due, as a look before
    it finds the record unchanged (issue 17: at W=256 rounds came ~0.45 s apart and waiting
    writers read the record ~5 times per transaction). Never longer than 1.5 gaps (a
    committer's clock ahead of the writer's) nor than the limit it is given; the usual poll
    once the write is overdue, or where the record does not say when it was written; a stall
    raises the gap by a bounded step."""
    clock = [1_000_000]
    monkeypatch.setattr(group_commit, "now_ms", lambda: clock[0])
    wh, writer, follower, mine = _record_writer_and_follower(root)
    writer._write_record({7: {"a" * 32: [None, "", None]}})
    assert json.loads(wh.store.get(outcomes_key("t")).data)["writtenMs"] == 1_000_000
    assert follower._from_record(mine) == (None, 7)
    assert follower._next_look(0.01, 10) == 0.01  # one write seen: no gap known yet
    clock[0] += 800
    writer._write_record({8: {"c" * 32: [None, "", None]}, 9: {"d" * 32: [None, "", None]}})
    assert follower._from_record(mine) == (None, 9)  # 400 ms per version
    # The same gap sets the patience before helping: three gaps (help_ms 150 ms is shorter).
    follower.cfg = replace(follower.cfg, lease_ms=10_000)
    assert follower._patience() == pytest.approx(1.2)
    clock[0] += 50
    assert follower._next_look(0.01, 10) == pytest.approx(0.35)
    assert follower._next_look(0.5, 10) == 0.5  # never sooner than the poll
    assert follower._next_look(0.01, 0.2) == 0.2
    clock[0] -= 750  # the committer's clock ahead of this writer's by 750 ms
    assert follower._next_look(0.01, 10) == pytest.approx(0.6)
    clock[0] += 750 + 400  # overdue
    assert follower._next_look(0.01, 10) == 0.01
    # A record after a stall (or an idle table) counts as twice the usual gap at most.
    clock[0] += 10_000
    writer._write_record({10: {"e" * 32: [None, "", None]}})
    assert follower._from_record(mine) == (None, 10)
    assert follower._gap_ms == pytest.approx(0.7 * 400 + 0.3 * 800)
    assert follower._patience() == pytest.approx(3 * 0.52)  # not 3 x the 10 s stall's share
    # The same bytes again teach nothing. An older client's records (no writtenMs): the
    # time of the look that saw each stands in, on this writer's clock — the first one
    # (after a record on the committer's clock) teaches nothing, the next a gap.
    assert follower._from_record(mine) == (None, 10)
    assert follower._gap_ms == pytest.approx(520)
    for tip in (11, 13):
        rounds = [{"version": tip, "intents": {}}]
        old = {"version": 1, "rounds": rounds, "tip": tip, "writeId": "w"}
        wh.store.put(outcomes_key("t"), json.dumps(old).encode())
        assert follower._from_record(mine) == (None, tip)
        assert follower._gap_ms == pytest.approx(520 if tip == 11 else 0.7 * 520 + 0.3 * 150)
        assert follower._next_look(0.01, 10) == pytest.approx(follower._gap_ms / 1000)
        clock[0] += 300


def test_a_waiting_writer_learns_the_record_gap_within_its_own_wait(root: Path) -> None:
    """The record a writer read during its last wait (seconds ago, on an idle table) is no
    sample of how often rounds come: a new wait starts without it, so a first look that
    finds the outcome teaches no gap."""
    wh, writer, follower, mine = _record_writer_and_follower(root)
    follower._record_written = (3, now_ms() - 10_000, True)  # what its last wait saw
    writer._write_record({7: {mine.id: ["InvalidProducerEpochError", "fenced", None]}})
    decided = follower._await(mine, time.monotonic() + 10)
    assert decided == ("InvalidProducerEpochError", "fenced", None, 7)
    assert follower._gap_ms == 0
    assert follower._record_written is not None and follower._record_written[0] == 7


def test_a_follower_learns_its_committers_renewals_from_the_record(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer's records say until when its lease runs: a follower whose copy of the
    lease expired by its first reading follows on without reading the lease again (issue
    17: at W=256 those reads were ~0.23 requests per transaction). A record without the
    lease (a helper's), or of another epoch, extends nothing; once the record's expiry
    passes too, the follower reads the lease as before."""
    clock = [1_000_000]
    monkeypatch.setattr(group_commit, "now_ms", lambda: clock[0])
    wh, writer, follower, mine = _record_writer_and_follower(root)
    held = writer.lease.take(None)  # expires at 1_001_000 (FAST: lease_ms 1000)
    assert held is not None
    writer._held = held
    follower._seen = follower.lease.read()
    assert follower._seen == held
    clock[0] += 800
    renewed = writer.lease.renew(held)
    assert renewed is not None and renewed.expires_ms == 1_001_800
    writer._held = renewed
    writer._write_record({7: {"a" * 32: [None, "", None]}})
    data = wh.store.get(outcomes_key("t")).data
    body = json.loads(data)
    assert body["lease"] == {"epoch": 0, "expiresMs": 1_001_800, "owner": writer.id}
    assert data == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert follower._from_record(mine) == (None, 7)
    assert follower._seen is not None and follower._seen.expires_ms == 1_001_800
    clock[0] += 500  # past the lease as the follower read it
    with monkeypatch.context() as m:
        m.setattr(follower.lease, "read", lambda: pytest.fail("the lease was read"))
        assert follower._mode() == "follower"
        # A helper's record (no lease) and one naming the next epoch extend nothing.
        writer._held = None
        writer._write_record({8: {"c" * 32: [None, "", None]}})
        assert "lease" not in json.loads(wh.store.get(outcomes_key("t")).data)
        assert follower._from_record(mine) == (None, 8)
        writer._held = replace(renewed, epoch=1, expires_ms=1_009_000)
        writer._write_record({9: {"d" * 32: [None, "", None]}})
        assert follower._from_record(mine) == (None, 9)
        assert follower._seen.expires_ms == 1_001_800
    clock[0] += 600  # past the record's expiry too: the lease is read (renewed meanwhile)
    again = writer.lease.renew(renewed)
    assert again is not None
    assert follower._mode() == "follower"
    assert follower._seen == again


def test_solo_writers_of_many_tables_share_the_threads_that_look_for_committers(
    tmp_path: Path,
) -> None:
    """A writer of 12 tables, each committed alone: the background looks at the leases run
    on one small pool of the process, no thread per table."""
    wh = Warehouse(store=LocalStore(str(tmp_path)), group_commit=FAST)
    before = {t.ident for t in threading.enumerate()}
    for i in range(12):
        wh.create_table(f"t{i}", partitions=1)
        table = wh.table(f"t{i}")
        table.submit(AppendOp((_segment(wh, table, 0),)))
    names = [t.name for t in threading.enumerate()]
    assert sum(n.startswith("txntable-lease-look") for n in names) <= 2
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not any(n.startswith("txntable-commit") for n in started), started


@pytest.mark.parametrize(
    "entry", ['[null,"",{"baseOffsets":[0],"baseOffsets":[5]}]', '[null,"",NaN]']
)
def test_an_outcome_entry_that_is_not_strict_json_is_not_trusted(root: Path, entry: str) -> None:
    """The one entry a waiting writer decodes is held to the log's JSON rules (no key twice,
    no NaN): a damaged hint teaches nothing, and the log decides instead."""
    wh = warehouse(root)
    table = wh.table("t")
    follower = table.group_commit
    assert follower is not None
    mine = Intent("b" * 32, 6, AppendOp((_segment(wh, table, 0),)), None, now_ms())
    body = f'{{"rounds":[{{"intents":{{"{mine.id}":{entry}}},"version":8}}],"tip":8,"version":1}}'
    wh.store.put(outcomes_key("t"), body.encode())
    assert follower._from_record(mine) == (None, -1)


def test_a_closing_committer_decides_the_intents_written_since_its_last_listing(
    root: Path,
) -> None:
    """close() ends with a round on a fresh listing: an intent written while the committer
    waited between listings is decided, not left until its writer helps (help_ms)."""
    cfg = replace(FAST, idle_ms=60_000, poll_ms=10_000)
    wh = warehouse(root, cfg=cfg)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    held = gc.lease.take(gc.lease.read())
    assert held is not None
    gc._start_committer(held)
    time.sleep(1.0)  # idle: its listings are now ~0.5 s apart and more
    intent = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, 2),)), None, now_ms())
    wh.store.put(intent_key("t", intent.created_ms, intent.id, intent.key_payload()),
                 intent.to_json())
    gc.close()
    snap = wh.table("t").snapshot()
    assert snap.intents[intent.id].error is None
    assert snap.partition(2).high_watermark == 1
    released = gc.lease.read()
    assert released is not None and not released.live(now_ms())


def test_a_waiting_writer_replaces_a_committer_that_stepped_down_before_help_ms(
    root: Path,
) -> None:
    """A follower whose committer released its lease (closed) learns it when the outcome
    record stands still for a few of its usual waits, reading the lease once, and takes
    over then, not after help_ms."""
    cfg = replace(FAST, help_ms=4_000)  # the lease look comes after 1 s (help_ms / 4)
    wh = warehouse(root, cfg=cfg)
    table = wh.table("t")
    gc = table.group_commit
    assert gc is not None
    other = Lease(table, "other" * 6, 60_000)
    held = other.take(None)
    assert held is not None
    gc._seen = held  # following a live committer ...
    other.release(held)  # ... that stepped down before deciding the intent
    started = time.monotonic()
    result, _ = table.submit(AppendOp((_segment(wh, table, 1),)))
    assert result.base_offsets == [0]
    assert time.monotonic() - started < 3  # not help_ms (4-6 s)
    assert gc.stats["followed"] == 1 and gc.stats["stall_looks"] == 1
    assert gc.stats["helps"] == 1
    current = gc.lease.read()
    assert current is not None and current.owner == gc.id and current.epoch == held.epoch + 1
    gc.close()


def test_a_writer_that_loses_a_race_to_a_live_committers_round_follows_it(root: Path) -> None:
    """One lost race is enough to join a live committer (racing its rounds again delays
    every follower in them); without a committer a lost race is a handle merely behind,
    and the writer retries alone (no lease taken, no committer started)."""
    wh = warehouse(root)
    table = wh.table("t")
    table.snapshot()
    gc = table.group_commit
    assert gc is not None
    gc._lease_looked = time.monotonic() + 60  # no background look: the race decides
    other = warehouse(root).table("t")
    other.submit(AppendOp((_segment(wh, other, 0),)))  # `table` is now one version behind
    result, _ = table.submit(AppendOp((_segment(wh, table, 0),)))
    assert result.base_offsets == [1]
    assert (gc.stats["direct"], gc.stats["followed"], table.log.stats.conflicts) == (1, 0, 1)
    assert gc.lease.read() is None

    other.submit(AppendOp((_segment(wh, other, 0),)))  # behind again, and now a committer:
    held = Lease(table, "dead" * 8, 60_000).take(None)  # live, but commits nothing
    assert held is not None
    result, _ = table.submit(AppendOp((_segment(wh, table, 0),)))
    assert result.base_offsets == [3]
    assert (gc.stats["direct"], gc.stats["followed"], table.log.stats.conflicts) == (1, 1, 2)
    assert gc.stats["helps"] >= 1  # the committer never decided it: the follower helped


def test_a_helper_whose_intent_the_winning_round_decided_stops(root: Path) -> None:
    """A helper's round that loses the race to a version deciding its intent ends there: a
    second round of its own would only decide other writers' intents, racing the
    committer's rounds (issue 17: at W=256 helpers lost ~50 races in 30 s to each other and
    the committer, each re-sequencing every pending intent)."""
    wh = warehouse(root)
    table = wh.table("t")
    table.snapshot()  # the helper's handle stays at version 0
    gc = table.group_commit
    assert gc is not None
    Lease(table, "dead" * 8, 60_000).take(None)  # a live committer that does not commit
    mine = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, 0),)), None, now_ms())
    wh.store.put(intent_key("t", mine.created_ms, mine.id, mine.key_payload()), mine.to_json())
    winner = warehouse(root).table("t").group_commit
    assert winner is not None
    winner._round([], None)  # version 1 decides it; the helper has not seen it
    later = Intent(uuid.uuid4().hex, 1, AppendOp((_segment(wh, table, 1),)), None, now_ms())
    wh.store.put(
        intent_key("t", later.created_ms, later.id, later.key_payload()), later.to_json()
    )
    gc._help(mine)
    assert gc.stats["helps"] == 1 and table.log.stats.conflicts == 1  # lost to version 1
    snap = wh.table("t").snapshot()
    assert snap.version == 1 and mine.id in snap.intents
    assert later.id not in snap.intents  # left to its own writer (or the committer)


def test_a_waiting_writer_gives_a_slow_committer_a_few_of_its_usual_gaps(root: Path) -> None:
    """Nothing moving for help_ms means a dead committer only when rounds come faster than
    that: with versions seconds apart (W=256 on two cores), every waiting writer read the
    log and listed the intents each help_ms. A writer waits help_ms or three of the usual
    gaps between versions, whichever is longer (at most half a lease), then helps."""
    cfg = replace(FAST, lease_ms=10_000)  # help_ms 150
    gc, mine = _behind_a_silent_committer(warehouse(root, cfg=cfg))
    gc._gap_ms = 400  # versions came 400 ms apart: patience 1.2 s
    with pytest.raises(KafkaTimeoutError):
        gc._await(mine, time.monotonic() + 0.8)
    assert gc.stats["helps"] == 0
    gc._gap_ms = 20  # versions 20 ms apart (W=16): help_ms, as before
    started = time.monotonic()
    error, _, result, version = gc._await(mine, time.monotonic() + 10)
    assert (error, version, result.base_offsets) == (None, 1, [0])
    assert gc.stats["helps"] == 1 and time.monotonic() - started < 1.1
    gc._gap_ms = 100_000  # never more than half a lease
    assert gc._patience() == 5.0


def test_where_rounds_come_seconds_apart_a_waiting_writer_reads_no_lease_between_them(
    root: Path,
) -> None:
    """At W=256 rounds came ~0.6 s apart and a waiting writer read the lease whenever the
    outcome record stood still for 0.9 help_ms (0.45 s): at almost every gap, ~1.3 lease
    reads per transaction. The record standing still is a stall only past a few of the usual
    waits for a decision, capped at 0.9 of the patience (a few of the usual gaps), not of
    help_ms."""
    cfg = replace(FAST, lease_ms=10_000)  # help_ms 150: the old cap was 0.135 s
    wh = warehouse(root, cfg=cfg)
    gc, mine = _behind_a_silent_committer(wh)
    owh = Warehouse(store=LocalStore(str(root)), group_commit=False)
    other = owh.table("t")
    stop = threading.Event()

    def rounds() -> None:  # another committer's rounds, 0.4 s apart, without the intent
        while not stop.wait(0.4):
            other.append([_segment(owh, other, 1)])
            v = other.snapshot(refresh=False).version
            record = {"rounds": [{"intents": {}, "version": v}], "tip": v, "version": 1}
            owh.store.put(outcomes_key("t"), json.dumps(record, sort_keys=True).encode())

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    gc._gap_ms, gc._decide_s = 400, 1.5  # as learned: a patience of 1.2 s
    started = time.monotonic()
    try:
        error, _, result, version = gc._await(mine, started + 10)
    finally:
        stop.set()
        thread.join()
    # The record moved on without the intent three times: it committed a round itself.
    assert error is None and result.base_offsets == [0] and gc.stats["helps"] == 1
    assert version >= 4 and time.monotonic() - started > 1.2
    assert gc.stats["stall_looks"] == 0
    # Where rounds come often the stall look is where it was: 0.9 help_ms at most.
    gc._gap_ms = 20
    assert gc._stall_s() == pytest.approx(0.135)


def test_a_waiting_writer_that_leaves_the_round_to_others_reads_the_log_every_few_stalls(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At W=256 every waiting writer that saw nothing move read the log versions its handle
    missed before drawing whether to help; most then did not help, and those catch-ups were
    a fifth of all the log reads. The helpers read the log; the others only every
    LOOK_EVERY_SKIPS stalls, which still finds an outcome whose record was lost."""
    store = LatencyStore(LocalStore(str(root)), 2)
    wh = Warehouse(store=store, group_commit=FAST)
    owh = Warehouse(store=LocalStore(str(root)), group_commit=FAST)
    other = owh.table("t")
    for i in range(3):  # versions the waiting handle has not read
        other.append([_segment(owh, other, i % PARTITIONS)])
    gc, mine = _behind_a_silent_committer(wh)  # its intent on partition 0, after 1 record
    table = wh.table("t")

    def put_intents(n: int) -> None:  # other writers' intents, waiting
        for i in range(n):
            it = Intent(uuid.uuid4().hex, 0, AppendOp((_segment(wh, table, i % PARTITIONS),)),
                        None, now_ms())
            wh.store.put(intent_key("t", it.created_ms, it.id, it.key_payload()), it.to_json())

    put_intents(9)
    log_reads: list[str] = []
    get = store.get

    def get_logging(key: str) -> StoredObject:
        if "/_log/" in key and key.rsplit("/", 1)[-1][0].isdigit():
            log_reads.append(key)
        return get(key)

    monkeypatch.setattr(store, "get", get_logging)
    monkeypatch.setattr(group_commit.random, "random", lambda: 0.5)  # 0.5 * 10 >= 4: skip
    monkeypatch.setattr(group_commit, "LOOK_EVERY_SKIPS", 1000)
    with pytest.raises(KafkaTimeoutError):
        gc._await(mine, time.monotonic() + 1.0)
    assert gc.stats["helps_skipped"] >= 2 and gc.stats["helps"] == 0
    assert log_reads == [] and gc.stats["log_reads"] == gc.stats["overlooked"] == 0
    # Another writer decides every intent at version 4, and its outcome record is lost.
    ogc = other.group_commit
    assert ogc is not None
    ogc._help(mine, ogc._list_keys())
    assert _eventually(lambda: wh.store.exists(outcomes_key("t")))  # written in the background
    wh.store.delete(outcomes_key("t"))
    put_intents(10)  # others wait: still more listed than help at once
    monkeypatch.setattr(group_commit, "LOOK_EVERY_SKIPS", 3)
    skipped = gc.stats["helps_skipped"]
    error, _, result, version = gc._await(mine, time.monotonic() + 10)
    assert (error, version, result.base_offsets) == (None, 4, [1])
    assert gc.stats["helps"] == 0 and gc.stats["helps_skipped"] == skipped + 3
    assert log_reads != [] and gc.stats["log_reads"] == 1 and gc.stats["overlooked"] == 0


def test_where_rounds_come_seconds_apart_a_waiting_writer_looks_less_often(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At W=256 a decision took seconds and a waiting writer looked at the outcome record
    every help_ms / 2 from the start: ten reads per transaction. Its looks now come up to
    half a patience apart (a few of the usual gaps between versions), and the first about
    when a decision is due (0.7 of the usual wait), up to a patience after the intent: at
    half a patience it came before most decisions and the writer read the record of each
    round before its own (~3 looks per transaction)."""
    cfg = replace(FAST, lease_ms=10_000)  # help_ms 150
    store = LatencyStore(LocalStore(str(root)), 2)
    gc, mine = _behind_a_silent_committer(Warehouse(store=store, group_commit=cfg))
    looks: list[float] = []
    get = store.get

    def get_timed(key: str) -> StoredObject:
        if key == outcomes_key("t"):
            looks.append(time.monotonic())
        return get(key)

    monkeypatch.setattr(store, "get", get_timed)

    def looks_within(seconds: float) -> list[float]:
        looks.clear()
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError):
            gc._await(mine, started + seconds)
        return [t - started for t in looks]

    gc._gap_ms, gc._decide_s = 800, 2.7  # rounds 0.8 s apart: patience 2.4 s
    seen = looks_within(2.2)  # within the patience: it does not help
    assert 1.8 < seen[0] < 2.1  # 0.7 decide_s: not half a patience (1.2 s), nor help_ms / 2
    assert len(seen) <= 5  # then every decide_s / 8 (0.34 s), not every 0.075 s
    # Rounds 20 ms apart (W=16): the patience is help_ms, and the looks are as before.
    gc.cfg = replace(cfg, help_ms=1000)  # a patience of 1 s, past the 0.5 s watched
    gc._gap_ms, gc._decide_s = 20, 0.1
    seen = looks_within(0.5)
    assert seen[0] < 0.3 and len(seen) >= 8  # from 0.7 decide_s, then every 12.5 ms


def test_a_writer_that_takes_over_a_lapsed_lease_decides_its_intent_its_handle_is_behind(
    root: Path,
) -> None:
    """A follower's handle stops at the version it last read, and its intent is written on
    the newest version it heard of (the outcome record's). Taking over a lapsed lease, its
    committer saw that intent as from the future: it decided nothing, idled out and released
    the lease before the writer's patience ran out, and the writer took the lease again, and
    so on to its deadline (W=256: a transaction failed after 120 s). The committer now
    catches up to the version it heard of first."""
    cfg = replace(FAST, help_ms=300, idle_ms=50)  # the committer idles out within a patience
    wh = warehouse(root, cfg=cfg)
    table = wh.table("t")
    table.snapshot()  # the waiting writer's handle stays at version 0
    gc = table.group_commit
    assert gc is not None
    gc._lease_looked = time.monotonic() + 60  # no background look
    other = warehouse(root).table("t")
    for _ in range(3):  # versions 1-3, which the waiting handle does not read
        other.submit(AppendOp((_segment(wh, other, 1),)))
    gc._tip_hint = 3  # as the outcome record told it while it followed
    gc._seen = Lease(table, "dead" * 8, 200).take(None)  # lapses, never renewed
    started = time.monotonic()
    result, version = gc._follow(AppendOp((_segment(wh, table, 1),)), None, started + 5)
    assert (result.base_offsets, version) == ([3], 4)
    assert time.monotonic() - started < 3
    assert gc.stats["helps"] >= 1 and gc.stats["rounds"] == 1
    gc.close()
