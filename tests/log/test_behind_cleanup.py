"""A handle whose snapshot predates another client's log cleanup (issue 21.1).

Log cleanup deletes versions below a checkpoint. A handle that loaded the table before must
neither mistake the deleted versions for corruption (it reloads from the checkpoint) nor put
a version that cleanup deleted: such a version is below the checkpoint every reader loads,
so its acknowledged records would be lost. Cleanup measures a version's age on the store's
clock, so a maintainer's clock far ahead (the public ``now=``, or skew) cannot make it delete
the version a writer that listed the log a moment ago is about to put.
"""

from __future__ import annotations

import time

import pytest
from tableutil import read_all

from txntable import Producer, Warehouse
from txntable.errors import VersionNotAvailableError, VersionNotFoundError
from txntable.log import log as log_module
from txntable.read.timestamps import commit_timestamp, version_at_timestamp
from txntable.storage import ClockAheadStore, MemoryStore, Store, StoreWrapper
from txntable.table import Table

DAY = 86_400_000
#: A maintainer's clock far ahead: every version is older than version.retention.ms by it.
FAR = 10**15
NO_RETENTION = {"retention.ms": "-1"}


def send(producer: Producer, value: bytes) -> int:
    return producer.send("t", value=value, partition=0).get(timeout=10).offset


def test_a_far_clock_cannot_delete_what_a_writer_is_about_to_put(
    memory_store: MemoryStore,
) -> None:
    # The reproduction of the issue: the first handle writes v1, v2; the second three more
    # and maintains with a clock far ahead; the first sends at once (its gap check is not
    # due). It used to put version 3, which cleanup had deleted below the checkpoint at 6:
    # acknowledged, and never read again.
    wh = Warehouse(store=memory_store)
    wh.create_table("t", configuration=NO_RETENTION)
    first = Producer(Warehouse(store=memory_store), linger_ms=0)
    assert [send(first, b"a"), send(first, b"b")] == [0, 1]
    with Producer(Warehouse(store=memory_store), linger_ms=0) as second:
        assert [send(second, v) for v in (b"c", b"d", b"e")] == [2, 3, 4]
    report = Warehouse(store=memory_store).table("t").maintain(now=FAR, vacuum=False)
    assert report.errors == []
    assert send(first, b"f") == 5
    first.close()
    want = [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]
    assert read_all(Warehouse(store=memory_store), "t", [0], "read_committed") == {0: want}
    assert Warehouse(store=memory_store).table("t").verify().ok
    # The store dated every version a moment ago: nothing was old enough to delete.
    assert report.log_cleanup is not None and report.log_cleanup.versions_deleted == 0
    assert report.log_cleanup.too_young != []


@pytest.mark.parametrize("ahead", [2 * DAY, 8 * DAY])
def test_cleanup_deletes_once_the_store_dates_the_checkpoint_old(
    memory_store: MemoryStore, ahead: int
) -> None:
    wh = Warehouse(store=memory_store)
    wh.create_table("t", configuration={**NO_RETENTION, "version.retention.ms": str(3 * DAY)})
    with Producer(wh, linger_ms=0) as p:
        for v in (b"a", b"b", b"c"):
            send(p, v)
    later = Warehouse(store=ClockAheadStore(memory_store, ahead)).table("t")
    report = later.maintain(now=FAR, vacuum=False)
    assert report.log_cleanup is not None
    deleted = report.log_cleanup.versions_deleted
    assert (deleted > 0) == (ahead > 3 * DAY), report.log_cleanup


def cleaned(memory_store: MemoryStore) -> tuple[Warehouse, int]:
    """Table ``t`` with versions 1..3 (records a, b, c), then maintenance a month later on
    the store's clock: version 0 and the versions from the checkpoint on stay. Returns the
    warehouse and the earliest version after 0."""
    wh = Warehouse(store=memory_store)
    wh.create_table("t", configuration=NO_RETENTION)
    with Producer(wh, linger_ms=0) as p:
        for v in (b"a", b"b", b"c"):
            time.sleep(0.002)  # commit timestamps one apart at least
            send(p, v)
    time.sleep(0.002)
    later = Warehouse(store=ClockAheadStore(memory_store, 30 * DAY)).table("t")
    report = later.maintain(now=FAR, vacuum=False)
    assert report.errors == [] and report.log_cleanup is not None
    earliest = report.log_cleanup.earliest_version
    assert earliest is not None and report.log_cleanup.versions_deleted == earliest - 1
    return wh, earliest


def test_time_travel_after_cleanup(memory_store: MemoryStore) -> None:
    # Issues 21.11 and 21.15: version 0 is never deleted, so it stays loadable (the empty
    # table); versions between it and the oldest kept checkpoint are not available, and
    # neither is a timestamp that falls among them.
    wh, earliest = cleaned(memory_store)
    table = wh.table("t")
    assert table.snapshot_at(0).version == 0
    assert table.snapshot_at(0).partition(0).high_watermark == 0
    with pytest.raises(VersionNotAvailableError) as e:
        table.snapshot_at(earliest - 1)
    assert e.value.earliest == earliest
    assert table.snapshot_at(earliest).version == earliest
    first = commit_timestamp(table, 0)
    kept = commit_timestamp(table, earliest)
    assert first is not None and kept is not None and first < kept
    assert version_at_timestamp(table, kept) == earliest
    for ts in (first, kept - 1):
        with pytest.raises(VersionNotAvailableError):
            version_at_timestamp(table, ts)
    with pytest.raises(VersionNotFoundError):
        version_at_timestamp(table, first - 1)


class SteppedClock:
    """The log module's ``time``, with a monotonic clock a test can move on."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead_s

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SteppedClock:
    stepped = SteppedClock()
    monkeypatch.setattr(log_module, "time", stepped)
    return stepped


def behind_cleanup(store: Store) -> tuple[Producer, Table]:
    """The reproduction of the issue: a producer writes a, b (versions 1, 2) and a reader
    loads the table; another producer writes c, d, e; maintenance a month later on the
    store's clock deletes the versions below its checkpoint."""
    Warehouse(store=store).create_table("t", configuration=NO_RETENTION)
    first = Producer(Warehouse(store=store), linger_ms=0)
    assert [send(first, b"a"), send(first, b"b")] == [0, 1]
    reader = Warehouse(store=store).table("t")
    assert reader.snapshot().version == 2
    with Producer(Warehouse(store=store), linger_ms=0) as second:
        assert [send(second, v) for v in (b"c", b"d", b"e")] == [2, 3, 4]
    later = Warehouse(store=ClockAheadStore(store, 30 * DAY)).table("t")
    report = later.maintain(now=FAR, vacuum=False)
    assert report.errors == [] and report.log_cleanup is not None
    assert report.log_cleanup.versions_deleted >= 4
    return first, reader


ALL = [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]


def test_a_handle_behind_cleanup_reloads_from_the_checkpoint(
    memory_store: MemoryStore, clock: SteppedClock
) -> None:
    # Once its gap check was due, the first producer found version 3 missing below the
    # checkpoint and raised CorruptLogError on every send ("restore it from a backup"),
    # although a fresh handle loads the table fine.
    first, reader = behind_cleanup(memory_store)
    clock.ahead_s += 62  # a minute later: both handles list the log again
    assert send(first, b"f") == 5
    first.close()
    snap = reader.snapshot()
    assert snap.partition(0).high_watermark == 6
    assert read_all(Warehouse(store=memory_store), "t", [0], "read_committed") == {0: ALL}
    assert Warehouse(store=memory_store).table("t").verify().ok


class PausedPut(StoreWrapper):
    """Moves ``clock`` two hours on during the next put of a log version, once armed: the
    writer was paused (or its request hung) between its gap check and its put."""

    def __init__(self, inner: Store, clock: SteppedClock) -> None:
        super().__init__(inner)
        self.clock = clock
        self.armed = False

    def put_if_absent(self, key: str, data: bytes) -> str:
        if self.armed and "/_log/" in key:
            self.armed = False
            self.clock.ahead_s += 2 * 3600
        return super().put_if_absent(key, data)


def test_a_put_that_outlives_its_listing_is_checked_before_it_counts(
    memory_store: MemoryStore, clock: SteppedClock
) -> None:
    # The first producer's gap check is not due: it puts version 3, which cleanup deleted.
    # The put completes two hours after its last listing (a pause), so before counting it
    # the producer lists once more, finds the checkpoint above it and commits again.
    paused = PausedPut(memory_store, clock)
    first, _ = behind_cleanup(paused)
    paused.armed = True
    assert send(first, b"f") == 5
    first.close()
    assert not paused.armed
    assert memory_store.exists("t/_log/00000000000000000003.json")  # below the checkpoint
    assert read_all(Warehouse(store=memory_store), "t", [0], "read_committed") == {0: ALL}
