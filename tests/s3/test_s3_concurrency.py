"""Several producer processes appending to one S3 table: every acknowledgement is exact."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import s3_workers
from procutil import run_workers
from s3util import S3Location, drain

from txntable import Warehouse

pytestmark = [pytest.mark.s3, pytest.mark.slow]

PROCESSES = 4
RECORDS_PER_PROCESS = 100
PARTITIONS = 3
#: Small batches and a short linger: many commits, so the processes lose many races.
PRODUCER_OPTIONS = {"batch_size": 64, "linger_ms": 1}
#: Each process waits for an acknowledgement every this many records.
SYNC_EVERY = 4


@pytest.mark.timeout(120)
def test_producer_processes_get_exact_dense_offsets(s3_location: S3Location) -> None:
    wh = Warehouse(s3_location.url, storage_options=s3_location.options)
    wh.create_table("events", partitions=PARTITIONS)

    started = time.monotonic()
    reports = run_workers(
        s3_workers.produce,
        [
            (
                s3_location.url,
                s3_location.options,
                w,
                RECORDS_PER_PROCESS,
                PRODUCER_OPTIONS,
                SYNC_EVERY,
                PARTITIONS,
            )
            for w in range(PROCESSES)
        ],
    )
    elapsed = time.monotonic() - started
    errors = [r for r in reports if r[0] != "ok"]
    assert not errors, "\n".join(r[2] for r in errors)

    acked: dict[tuple[int, int], bytes] = {}
    conflicts = 0
    commits = 0
    for _, _worker, acks, lost, made in reports:
        commits += made
        conflicts += lost
        assert len(acks) == RECORDS_PER_PROCESS
        for partition, offset, value in acks:
            assert (partition, offset) not in acked, f"offset {partition}/{offset} acked twice"
            acked[(partition, offset)] = value
    assert len(acked) == PROCESSES * RECORDS_PER_PROCESS
    # The processes really raced for log versions.
    assert conflicts > 0, "no lost commit races: the test did not exercise contention"

    per_partition = Counter(p for p, _ in acked)
    for p in wh.table("events").describe().partitions:
        assert p.high_watermark == per_partition[p.partition]
        assert p.last_stable_offset == p.high_watermark
        assert p.open_transactions == ()

    for level in ("read_uncommitted", "read_committed"):
        records, positions = drain(wh, "events", PARTITIONS, level)
        read: dict[tuple[int, int], bytes | None] = {}
        for partition, recs in records.items():
            offsets = [r.offset for r in recs]
            # Dense and unique: exactly 0..HW-1, each once.
            assert offsets == list(range(per_partition[partition])), level
            assert positions[partition] == per_partition[partition]
            for r in recs:
                assert r.key == r.value
                read[(partition, r.offset)] = r.value
        # Every acknowledged record exactly once, at exactly its acknowledged offset.
        assert read == acked, level
    print(
        f"\n{PROCESSES} processes x {RECORDS_PER_PROCESS} records: {commits} commits, "
        f"{conflicts} lost commit races, per partition {dict(sorted(per_partition.items()))}, "
        f"{elapsed:.1f}s"
    )
    wh.store.close()
