"""A handle whose snapshot predates another client's log cleanup (issue 21.1).

Log cleanup deletes versions below a checkpoint. A handle that loaded the table before must
neither mistake the deleted versions for corruption (it reloads from the checkpoint) nor put
a version that cleanup deleted: such a version is below the checkpoint every reader loads,
so its acknowledged records would be lost. Cleanup measures a version's age on the store's
clock, so a maintainer's clock far ahead (the public ``now=``, or skew) cannot make it delete
the version a writer that listed the log a moment ago is about to put.
"""

from __future__ import annotations

import pytest
from tableutil import read_all

from txntable import Producer, Warehouse
from txntable.storage import ClockAheadStore, MemoryStore

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
