"""``Table.scan`` and the consumer's read-ahead over S3 (the moto server, over HTTP)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from s3util import RecordingStore, S3Location, drain

from txntable import Producer, Warehouse
from txntable.protocol.actions import Batch
from txntable.storage import LatencyStore, S3Store

pytestmark = [pytest.mark.s3, pytest.mark.slow]

TABLE = "events"


def _fill(wh: Warehouse, make_producer: Callable[..., Producer]) -> None:
    """Six transactions on two partitions, two of them aborted, two batches each."""
    wh.create_table(TABLE, partitions=2)
    p = make_producer(wh, transactional_id="writer", linger_ms=600_000, batch_size=1 << 30)
    p.init_transactions()
    for t in range(6):
        p.begin_transaction()
        for half in range(2):
            for i in range(5):
                p.send(TABLE, value=b"t%d-%d-%d" % (t, half, i), partition=i % 2)
            p.flush()
        if t in (1, 4):
            p.abort_transaction()
        else:
            p.commit_transaction()


def test_scan_over_s3_reads_each_visible_segment_once_and_no_aborted_one(
    s3_location: S3Location, make_producer: Callable[..., Producer]
) -> None:
    _fill(Warehouse(s3_location.url, storage_options=s3_location.options), make_producer)
    recording = RecordingStore(S3Store(s3_location.url, s3_location.options))
    wh = Warehouse(store=recording)
    table = wh.table(TABLE)
    snap = table.snapshot()
    batches = [e for part in snap.partitions for e in part.entries if isinstance(e, Batch)]
    consumed, _ = drain(wh, TABLE, 2, "read_committed")
    recording.reset()

    got = table.scan().to_arrow()

    expected = [(r.partition, r.offset, r.value) for p in (0, 1) for r in consumed[p]]
    assert (
        list(zip(*(got[c].to_pylist() for c in ("partition", "offset", "value")), strict=True))
        == expected
    )
    assert len(expected) == 4 * 10  # four committed transactions of ten records
    reads = recording.keys("GET")
    segment_reads = [k for k in reads if "/data/" in k]
    visible = {s.path for s in table.scan().slices}
    assert sorted(segment_reads) == sorted(visible)  # each once
    aborted = {b.path for b in batches} - visible
    assert len(aborted) == 2 * 2 * 2  # two aborted transactions, two batches, two partitions
    assert not aborted & set(segment_reads)
    # Besides the segments, a scan of the handle's snapshot reads only the next log version.
    assert [k for k in reads if "/data/" not in k] == [f"{TABLE}/_log/{snap.version + 1:020d}.json"]


def test_scan_and_poll_through_a_latency_wrapper_return_the_same_records(
    s3_location: S3Location, make_producer: Callable[..., Producer]
) -> None:
    _fill(Warehouse(s3_location.url, storage_options=s3_location.options), make_producer)
    plain = Warehouse(s3_location.url, storage_options=s3_location.options)
    slow = Warehouse(store=LatencyStore(S3Store(s3_location.url, s3_location.options), 5))
    for level in ("read_committed", "read_uncommitted"):
        want = plain.table(TABLE).scan(isolation_level=level).to_arrow()
        assert slow.table(TABLE).scan(isolation_level=level, max_workers=4).to_arrow() == want
        records, positions = drain(slow, TABLE, 2, level)
        got = [(r.partition, r.offset, r.value) for p in (0, 1) for r in records[p]]
        cols = ("partition", "offset", "value")
        assert got == list(zip(*(want[c].to_pylist() for c in cols), strict=True))
        assert positions == {
            p.partition: (p.last_stable_offset if level == "read_committed" else p.high_watermark)
            for p in plain.table(TABLE).snapshot().partitions
        }
