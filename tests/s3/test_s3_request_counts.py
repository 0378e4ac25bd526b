"""Request counts against S3: an idle poll and a short-path transaction cost a fixed budget."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from s3util import MANUAL_FLUSH, RecordingStore, S3Location

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.layout import lease_key
from txntable.storage import open_store
from txntable.txn.coordinator import TransactionCoordinator

pytestmark = [pytest.mark.s3, pytest.mark.slow]

PARTITIONS = 3


@pytest.fixture
def counted_wh(s3_location: S3Location) -> tuple[Warehouse, RecordingStore]:
    store = RecordingStore(open_store(s3_location.url, s3_location.options))
    return Warehouse(store=store), store


def test_idle_poll_reads_only_the_next_log_version(
    counted_wh: tuple[Warehouse, RecordingStore], make_producer: Callable[..., Producer]
) -> None:
    wh, store = counted_wh
    wh.create_table("events", partitions=PARTITIONS)
    producer = make_producer(wh)
    for i in range(30):
        producer.send("events", value=b"%d" % i, partition=i % PARTITIONS)
    producer.flush()
    version = wh.table("events").describe().version

    consumer = Consumer(wh, isolation_level="read_committed", fetch_backoff_ms=20)
    tps = [TopicPartition("events", p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    while consumer.poll(timeout_ms=0, max_records=1000):
        pass
    next_key = f"events/_log/{version + 1:020d}.json"

    # One poll with nothing new: exactly one GET (of the next version, a 404), whatever
    # the number of assigned partitions or the length of the history.
    store.reset()
    assert consumer.poll(timeout_ms=0) == {}
    assert store.snapshot() == {
        "GET": 1,
        "HEAD": 0,
        "LIST": 0,
        "PUT": 0,
        "CONDITIONAL_PUT": 0,
        "DELETE": 0,
    }
    assert store.keys("GET") == [next_key]

    # Waiting 200 ms re-probes only that key, at most once per fetch backoff (+1).
    store.reset()
    assert consumer.poll(timeout_ms=200) == {}
    counts = store.snapshot()
    assert 1 <= counts["GET"] <= 200 // 20 + 2
    assert set(store.keys("GET")) == {next_key}
    assert counts["GET"] == sum(counts.values())  # no LIST, HEAD or writes
    print(f"\nidle poll: 1 GET; idle poll(timeout_ms=200): {counts['GET']} GETs")
    consumer.close()


def short_path_cost(
    wh: Warehouse, store: RecordingStore, producer: Producer, records: int, registers: bool
) -> tuple[dict[str, int], list[str]]:
    """Commit one transaction of ``records`` records over every partition, all still
    buffered at ``commit_transaction`` (a one-log commit; ``registers``: the id's first to
    the table); return its request counts and GET keys (and check its offsets)."""
    before = [p.high_watermark for p in wh.table("events").describe().partitions]
    producer.begin_transaction()
    futures = [
        producer.send("events", value=b"r%d" % i, partition=i % PARTITIONS) for i in range(records)
    ]
    assert not any(f.done() for f in futures)  # nothing sent before the commit
    store.reset()
    producer.commit_transaction()
    counts = store.snapshot()
    # A writer committing alone reads the group-commit lease now and then in the background
    # (looking for a committer to follow): not on the commit path, and timed by the clock.
    looks = [k for k in store.keys("GET") if k == lease_key("events")]
    gets = [k for k in store.keys("GET") if k != lease_key("events")]
    assert len(looks) <= 1
    counts["GET"] -= len(looks)
    puts = store.keys("PUT")
    assert all(k.startswith("events/data/") and k.endswith(".parquet") for k in puts), puts
    assert sorted(k.split("/")[2] for k in puts) == [f"partition={p}" for p in range(PARTITIONS)]
    conditional = store.keys("CONDITIONAL_PUT")
    version = wh.table("events").describe().version
    # RegisterTable (the id's first one-log commit to the table), then one log version.
    registration = [TransactionCoordinator.key(producer.transaction_manager.transactional_id)]
    assert conditional == (registration if registers else []) + [
        f"events/_log/{version:020d}.json"
    ]
    # Offsets: each partition's records, then its COMMIT marker, all in one log version.
    for i, f in enumerate(futures):
        p = i % PARTITIONS
        assert f.result().partition == p
        assert f.result().offset == before[p] + i // PARTITIONS
    return counts, gets


@pytest.mark.parametrize("warm", [False, True], ids=["first-txn", "later-txn"])
def test_short_path_transaction_cost_is_independent_of_record_count(
    counted_wh: tuple[Warehouse, RecordingStore],
    make_producer: Callable[..., Producer],
    warm: bool,
) -> None:
    wh, store = counted_wh
    wh.create_table("events", partitions=PARTITIONS)
    measured = {}
    for records in (10, 1000):
        tid = f"tx-{records}"
        producer = make_producer(wh, transactional_id=tid, **MANUAL_FLUSH)
        producer.init_transactions()
        if warm:  # a transaction before: the table is registered
            producer.begin_transaction()
            producer.send("events", value=b"warm-up", partition=0)
            producer.commit_transaction()
        counts, gets = short_path_cost(wh, store, producer, records, registers=not warm)
        assert counts["PUT"] == PARTITIONS
        assert counts["CONDITIONAL_PUT"] == (1 if warm else 2)
        assert counts["LIST"] == counts["HEAD"] == counts["DELETE"] == 0
        # Uncontended, no log version is read, and the registration of the id's first
        # transaction to the table puts on the copy of the coordinator object that
        # init_transactions wrote (no read); later ones make no coordinator request at all.
        assert gets == []
        measured[records] = counts
        producer.close()
    assert measured[10] == measured[1000]
    print(
        f"\nshort-path transaction over {PARTITIONS} partitions ({'later' if warm else 'first'}"
        f" txn of the producer): {measured[10]}"
    )
