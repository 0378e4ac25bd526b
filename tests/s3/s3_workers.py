"""Code run in child processes by the multi-process S3 tests (spawned: must be importable).

Each child opens its own ``Warehouse`` by URL and storage options, exactly as a separate
program would, and reports back through a queue.
"""

from __future__ import annotations

import traceback
from typing import Any


def produce(
    url: str,
    options: dict[str, str],
    worker: int,
    count: int,
    producer_options: dict[str, Any],
    sync_every: int,
    partitions: int,
    barrier: Any,
    results: Any,
) -> None:
    """Send ``count`` keyed records with an idempotent producer; report every acknowledgement.

    Every ``sync_every`` records the child waits for the last acknowledgement.

    Puts ``("ok", worker, [(partition, offset, value), ...], lost_races, commits)`` or
    ``("error", worker, traceback)`` on ``results``.
    """
    try:
        from txntable import Producer, Warehouse

        wh = Warehouse(url, storage_options=options)
        producer = Producer(wh, **producer_options)
        assert len(producer.partitions_for("events")) == partitions  # loads the table
        barrier.wait(timeout=120)
        futures = []
        for i in range(count):
            value = b"w%d-%d" % (worker, i)
            # Each group of ``sync_every`` records goes to one partition: one segment per
            # commit; the processes start on different partitions.
            partition = (i // sync_every + worker) % partitions
            futures.append(producer.send("events", key=value, value=value, partition=partition))
            if i % sync_every == sync_every - 1:
                # Wait now and then, so the records go out in many small commits that
                # interleave with the other processes' (instead of a few big ones).
                futures[-1].result(timeout=120)
        producer.flush()
        acks = []
        for i, future in enumerate(futures):
            meta = future.result(timeout=120)
            acks.append((meta.partition, meta.offset, b"w%d-%d" % (worker, i)))
        stats = producer.metadata.table("events").log.stats
        conflicts = stats.conflicts
        producer.close()
        wh.store.close()
        results.put(("ok", worker, acks, conflicts, stats.commits))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put(("error", worker, traceback.format_exc()))
