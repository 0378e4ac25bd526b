"""Transactional consumer offsets: zombies, aborts, KIP-447 unstable offsets, group commits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from txnutil import all_tps, group_log, markers_by_partition, read_all

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import (
    IllegalGenerationError,
    InvalidConfigurationError,
    OffsetMetadataTooLargeError,
    ProducerFencedError,
    UnstableOffsetCommitError,
)
from txntable.structs import OffsetAndMetadata

TID = "ctp"
GROUP = "g"


@pytest.fixture
def tables(wh: Warehouse) -> Warehouse:
    wh.create_table("in", partitions=2)
    wh.create_table("out", partitions=2)
    feeder = Producer(wh)
    for i in range(20):
        feeder.send("in", value=b"in-%d" % i, partition=i % 2)
    feeder.close()
    return wh


def consume_and_send(
    producer: Producer, consumer: Consumer, n: int, tag: bytes
) -> dict[TopicPartition, OffsetAndMetadata]:
    """Poll up to ``n`` records, write them transformed, send their offsets (no commit)."""
    got = consumer.poll(max_records=n)
    offsets = {}
    for tp, records in got.items():
        for r in records:
            producer.send("out", value=tag + b":" + (r.value or b""), partition=tp.partition)
        offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, tag.decode())
    producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
    return offsets


def group_consumer(wh: Warehouse, **kw: object) -> Consumer:
    c = Consumer(
        wh,
        isolation_level="read_committed",
        group_id=GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=False,  # its offsets commit with the transactions
        **kw,  # type: ignore[arg-type]
    )
    c.assign(all_tps(wh, ["in"]))
    return c


def test_fenced_zombie_offsets_never_become_visible(tables: Warehouse) -> None:
    wh = tables
    zombie = Producer(wh, transactional_id=TID)
    zombie.init_transactions()
    zc = group_consumer(wh)
    zombie.begin_transaction()
    zombie_offsets = consume_and_send(zombie, zc, 6, b"zombie")
    zombie.flush()
    assert zombie_offsets == {TopicPartition("in", 0): OffsetAndMetadata(6, "zombie")}

    # The new instance fences the zombie before it commits.
    new = Producer(Warehouse(wh.url), transactional_id=TID)
    new.init_transactions()
    checker = Consumer(wh, group_id=GROUP)
    for tp in all_tps(wh, ["in"]):
        assert checker.committed(tp) is None  # aborted, not pending, not committed
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    # A fenced zombie cannot sneak offsets in afterwards either.
    with pytest.raises(ProducerFencedError):
        zombie.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(9)}, GROUP)
    for tp in all_tps(wh, ["in"]):
        assert checker.committed(tp) is None

    # The new instance starts from the (absent) committed offsets and commits its own.
    nc = group_consumer(wh)
    assert {nc.position(tp) for tp in all_tps(wh, ["in"])} == {0}
    new.begin_transaction()
    new_offsets = consume_and_send(new, nc, 4, b"new")
    new.commit_transaction()
    assert new_offsets == {TopicPartition("in", 0): OffsetAndMetadata(4, "new")}
    assert checker.committed(TopicPartition("in", 0)) == OffsetAndMetadata(4, "new")
    assert checker.committed(TopicPartition("in", 1)) is None
    out = read_all(wh, ["out"])
    assert sorted(out) == [b"new:in-%d" % i for i in (0, 2, 4, 6)]


def test_zombie_fenced_between_registering_the_group_and_writing_offsets(
    tables: Warehouse,
) -> None:
    """The fence lands after the zombie's AddOffsets (group registered) and before its
    offset commit reaches the group log: the commit must be refused, not left pending."""
    wh = tables
    zombie = Producer(wh, transactional_id=TID)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", value=b"zombie", partition=0)
    zombie.flush()
    real_add = zombie.coordinator.add_partitions
    fenced: list[Producer] = []

    def add_then_get_fenced(tid: str, pid: int, epoch: int, partitions: dict) -> None:  # type: ignore[type-arg]
        real_add(tid, pid, epoch, partitions)
        if any(t.startswith("_groups/") for t in partitions) and not fenced:
            new = Producer(Warehouse(wh.url), transactional_id=TID)
            new.init_transactions()
            fenced.append(new)

    zombie.coordinator.add_partitions = add_then_get_fenced  # type: ignore[method-assign]
    with pytest.raises(ProducerFencedError):
        zombie.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(9)}, GROUP)
    checker = Consumer(wh, group_id=GROUP)
    assert checker.committed(TopicPartition("in", 0)) is None  # not unstable: nothing pending

    # The new instance commits offsets for another partition only; the zombie's offset
    # for in-0 must not ride along on its COMMIT marker.
    new = fenced[0]
    new.begin_transaction()
    new.send("out", value=b"new", partition=1)
    new.send_offsets_to_transaction({TopicPartition("in", 1): OffsetAndMetadata(4)}, GROUP)
    new.commit_transaction()
    assert checker.committed(TopicPartition("in", 0)) is None
    assert checker.committed(TopicPartition("in", 1)) == OffsetAndMetadata(4)
    assert read_all(wh, ["out"]) == [b"new"]


def test_zombie_fenced_between_registering_a_partition_and_writing_its_data(
    tables: Warehouse,
) -> None:
    """Same race on a data partition: the zombie's batch must be refused, not left open."""
    wh = tables
    zombie = Producer(wh, transactional_id=TID, linger_ms=3_600_000, batch_size=1 << 30)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(1)}, GROUP)
    real_add = zombie.coordinator.add_partitions
    fenced: list[Producer] = []

    def add_then_get_fenced(tid: str, pid: int, epoch: int, partitions: dict) -> None:  # type: ignore[type-arg]
        real_add(tid, pid, epoch, partitions)
        if "out" in partitions and not fenced:
            new = Producer(Warehouse(wh.url), transactional_id=TID)
            new.init_transactions()
            fenced.append(new)

    zombie.coordinator.add_partitions = add_then_get_fenced  # type: ignore[method-assign]
    future = zombie.send("out", value=b"zombie", partition=0)
    zombie.flush()
    with pytest.raises(ProducerFencedError):
        future.result()
    for p in wh.table("out").describe().partitions:
        assert p.open_transactions == ()
        assert p.last_stable_offset == p.high_watermark
    # The new instance's commit on the same partition does not carry the zombie's data.
    new = fenced[0]
    new.begin_transaction()
    new.send("out", value=b"new", partition=0)
    new.commit_transaction()
    assert read_all(wh, ["out"]) == [b"new"]


def test_aborted_transaction_offsets_are_not_visible(tables: Warehouse) -> None:
    wh = tables
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    c = group_consumer(wh)
    producer.begin_transaction()
    first = consume_and_send(producer, c, 4, b"t1")
    producer.commit_transaction()
    producer.begin_transaction()
    consume_and_send(producer, c, 4, b"t2")
    producer.abort_transaction()
    checker = Consumer(wh, group_id=GROUP)
    for tp, om in first.items():
        assert checker.committed(tp) == om
    # The group log holds one COMMIT and one ABORT marker, and no open transaction.
    assert [m.type for m in markers_by_partition(group_log(wh, GROUP))[0]] == ["COMMIT", "ABORT"]
    # A restarted consumer resumes after the committed (not the aborted) offsets.
    again = group_consumer(wh)
    assert {tp: again.position(tp) for tp in first} == {tp: om.offset for tp, om in first.items()}


def test_pending_transactional_offset_is_unstable(tables: Warehouse) -> None:
    wh = tables
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    tp = TopicPartition("in", 0)
    producer.begin_transaction()
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(5, "pending")}, GROUP)
    checker = Consumer(wh, group_id=GROUP)
    with pytest.raises(UnstableOffsetCommitError):
        checker.committed(tp)
    # Only the partition with the pending commit is unstable.
    assert checker.committed(TopicPartition("in", 1)) is None
    # The initial position of a group member is unstable too.
    member = Consumer(wh, group_id=GROUP, auto_offset_reset="earliest")
    member.assign([tp])
    with pytest.raises(UnstableOffsetCommitError):
        member.position(tp)

    waiting = Consumer(wh, group_id=GROUP, unstable_offset_timeout_ms=10_000)

    def commit_soon() -> None:
        time.sleep(0.3)
        producer.commit_transaction()

    t = threading.Thread(target=commit_soon)
    t.start()
    started = time.monotonic()
    assert waiting.committed(tp) == OffsetAndMetadata(5, "pending")
    assert time.monotonic() - started >= 0.2
    t.join(30)
    assert not t.is_alive()
    assert checker.committed(tp) == OffsetAndMetadata(5, "pending")

    # A wait that runs out still raises.
    producer.begin_transaction()
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(6)}, GROUP)
    short = Consumer(wh, group_id=GROUP, unstable_offset_timeout_ms=100)
    with pytest.raises(UnstableOffsetCommitError):
        short.committed(tp)
    producer.abort_transaction()
    assert short.committed(tp) == OffsetAndMetadata(5, "pending")


def test_assign_mode_consumer_waits_out_a_dead_producers_offset_commit(
    tables: Warehouse,
) -> None:
    """Issue 25.5: an assigned partition whose committed offset a dead producer left pending
    is skipped by poll() (no UnstableOffsetCommitError) until the producer's transaction
    times out and the consumer aborts it, as the subscribe path does."""
    wh = tables
    tp, other = TopicPartition("in", 0), TopicPartition("in", 1)
    dead = Producer(wh, transactional_id="dead", transaction_timeout_ms=500)
    dead.init_transactions()
    dead.begin_transaction()
    dead.send_offsets_to_transaction({tp: OffsetAndMetadata(5)}, GROUP)
    dead._stop_at_exit()  # it dies here: nothing more comes from it
    c = Consumer(wh, group_id=GROUP, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([tp, other])
    first = c.poll(timeout_ms=0)
    assert list(first) == [other]  # the stable partition is read meanwhile
    assert [r.offset for r in first[other]] == list(range(10))
    got: dict[TopicPartition, list[int]] = {}
    deadline = time.monotonic() + 20
    while tp not in got and time.monotonic() < deadline:
        for part, records in c.poll(timeout_ms=100).items():
            got.setdefault(part, []).extend(r.offset for r in records)
    # Aborted: the pending offset never became the group's, so it starts at the earliest.
    assert got == {tp: list(range(10))}
    assert Consumer(wh, group_id=GROUP).committed(tp) is None
    c.close()


def test_offset_metadata_too_large(tables: Warehouse) -> None:
    wh = tables
    tp = TopicPartition("in", 0)
    c = Consumer(wh, group_id=GROUP)
    c.commit({tp: OffsetAndMetadata(1, "x" * 4096)})  # exactly the limit is fine
    with pytest.raises(OffsetMetadataTooLargeError):
        c.commit({tp: OffsetAndMetadata(2, "x" * 4097)})
    with pytest.raises(OffsetMetadataTooLargeError):
        c.commit({tp: OffsetAndMetadata(2, "é" * 2049)})  # bytes, not characters
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(OffsetMetadataTooLargeError):
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(3, "y" * 5000)}, GROUP)
    producer.abort_transaction()
    assert c.committed(tp) == OffsetAndMetadata(1, "x" * 4096)


def test_stale_generation_is_refused(tables: Warehouse) -> None:
    wh = tables
    tp = TopicPartition("in", 0)
    newer = Consumer(wh, group_id=GROUP, group_generation=5)
    newer.commit({tp: OffsetAndMetadata(3)})
    older = Consumer(wh, group_id=GROUP, group_generation=4, enable_auto_commit=False)
    with pytest.raises(IllegalGenerationError):
        older.commit({tp: OffsetAndMetadata(7)})
    same = Consumer(wh, group_id=GROUP, group_generation=5)
    same.commit({tp: OffsetAndMetadata(4)})
    assert older.committed(tp) == OffsetAndMetadata(4)
    # The transactional path carries the consumer's generation too.
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(IllegalGenerationError):
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(9)}, older.group_metadata())
    producer.abort_transaction()
    assert same.committed(tp) == OffsetAndMetadata(4)


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_fresh_group_starts_at_auto_offset_reset(tables: Warehouse, reset: str) -> None:
    wh = tables
    tps = all_tps(wh, ["in"])
    first = Consumer(
        wh, isolation_level="read_committed", group_id="fresh", auto_offset_reset=reset
    )
    first.assign(tps)
    expected = 0 if reset == "earliest" else 10
    assert {tp: first.position(tp) for tp in tps} == {tp: expected for tp in tps}
    first.seek(tps[0], 4)
    first.seek(tps[1], 7)
    first.commit()
    second = Consumer(
        wh, isolation_level="read_committed", group_id="fresh", auto_offset_reset="latest"
    )
    second.assign(tps)
    assert second.position(tps[0]) == 4 and second.position(tps[1]) == 7
    assert [r.offset for r in second.poll(max_records=100).get(tps[0], [])] == list(range(4, 10))


def test_commit_async_calls_back_and_resolves(tables: Warehouse) -> None:
    wh = tables
    tp = TopicPartition("in", 1)
    c = Consumer(wh, group_id=GROUP, auto_offset_reset="earliest")
    c.assign([tp])
    c.poll(max_records=3)
    calls: list[tuple[dict[TopicPartition, OffsetAndMetadata], Exception | None]] = []
    done = threading.Event()

    def cb(offsets: dict[TopicPartition, OffsetAndMetadata], error: Exception | None) -> None:
        calls.append((offsets, error))
        done.set()

    future: Future[None] = c.commit_async(callback=cb)
    assert future.result(timeout=10) is None
    assert done.wait(10)
    assert calls == [({tp: OffsetAndMetadata(3)}, None)]
    assert c.committed(tp) == OffsetAndMetadata(3)

    # Errors reach both the callback and the future.
    calls.clear()
    done.clear()
    bad = c.commit_async({tp: OffsetAndMetadata(4, "z" * 5000)}, cb)
    with pytest.raises(OffsetMetadataTooLargeError):
        bad.result(timeout=10)
    assert done.wait(10)
    assert isinstance(calls[0][1], OffsetMetadataTooLargeError)
    assert c.committed(tp) == OffsetAndMetadata(3)


def test_auto_commit_commits_positions_on_poll_and_close(tables: Warehouse) -> None:
    wh = tables
    tp = TopicPartition("in", 0)
    c = Consumer(
        wh,
        group_id="auto",
        enable_auto_commit=True,
        auto_commit_interval_ms=50,
        auto_offset_reset="earliest",
    )
    c.assign([tp])
    assert [r.offset for r in c.poll(max_records=4)[tp]] == [0, 1, 2, 3]
    assert c.committed(tp) is None  # the interval has not elapsed yet
    time.sleep(0.06)
    # Kafka's order: the poll first commits the positions reached so far, then fetches.
    assert [r.offset for r in c.poll(max_records=2)[tp]] == [4, 5]
    assert c.committed(tp) == OffsetAndMetadata(4)
    c.close()  # commits the final position
    again = Consumer(wh, group_id="auto")
    again.assign([tp])
    assert again.committed(tp) == OffsetAndMetadata(6)
    assert again.position(tp) == 6
    assert [r.offset for r in again.poll(max_records=100)[tp]] == [6, 7, 8, 9]


def test_a_group_consumer_auto_commits_by_default_as_kafkas(tables: Warehouse) -> None:
    wh = tables
    tp = TopicPartition("in", 0)
    assert Consumer(wh).enable_auto_commit is False  # no group: nowhere to commit
    c = Consumer(wh, group_id="ported", auto_offset_reset="earliest")
    assert c.enable_auto_commit is True
    c.assign([tp])
    assert [r.offset for r in c.poll(max_records=3)[tp]] == [0, 1, 2]
    c.close()  # a ported kafka-python consumer's progress is committed
    assert Consumer(wh, group_id="ported").committed(tp) == OffsetAndMetadata(3)


def test_transactions_refuse_the_offsets_of_an_auto_committing_consumer(
    tables: Warehouse,
) -> None:
    wh = tables
    tp = TopicPartition("in", 0)
    auto = Consumer(wh, group_id=GROUP, auto_offset_reset="earliest")
    auto.assign([tp])
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(InvalidConfigurationError, match="enable_auto_commit=False"):
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(2)}, auto.group_metadata())
    manual = Consumer(wh, group_id=GROUP, enable_auto_commit=False)
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(2)}, manual.group_metadata())
    producer.commit_transaction()  # the refusal left the transaction usable
    assert manual.committed(tp) == OffsetAndMetadata(2)
    producer.close()
