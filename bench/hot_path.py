"""Hot-path cost at a short and a long history: commit, poll and a fresh snapshot load.

Prints requests and wall time per operation at version ~V1 and ~V2 and their ratio; a
ratio near 1 means the operation does not grow with history (checkpoints + incremental
refresh). Run: ``python bench/hot_path.py [--short 100] [--long 3000]``.

Then, on a store that lists in order (the memory store, as S3) behind ``--latency-ms``
(20) per request: a cold load 1, 50 and 99 versions after the newest checkpoint, and a
refresh of a handle 1, 10 and 100 versions behind — wall time, GETs, and the time in
requests' worth (ms / latency) with its ratio to the first case: what a tail or a lag
costs in round trips.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.storage.local import LocalStore
from txntable.storage.memory import MemoryStore
from txntable.storage.wrappers import CountingStore, LatencyStore


def measure(versions: int, ops: int = 50) -> dict[str, float]:
    store = CountingStore(LocalStore(tempfile.mkdtemp()))
    wh = Warehouse(store=store)
    wh.create_table("t", partitions=1)
    producer = Producer(wh, linger_ms=0)
    for i in range(versions):
        producer.send("t", value=b"%d" % i, partition=0).result()
    tp = TopicPartition("t", 0)
    consumer = Consumer(wh, auto_offset_reset="latest")
    consumer.assign([tp])
    consumer.position(tp)
    out: dict[str, float] = {}

    store.reset()
    start = time.perf_counter()
    for i in range(ops):
        producer.send("t", value=b"x%d" % i, partition=0).result()
    out["commit_ms"] = (time.perf_counter() - start) * 1000 / ops
    out["commit_requests"] = sum(store.snapshot().values()) / ops

    store.reset()
    start = time.perf_counter()
    for _ in range(ops):
        consumer.poll(timeout_ms=0)
    out["poll_ms"] = (time.perf_counter() - start) * 1000 / ops
    out["poll_requests"] = sum(store.snapshot().values()) / ops

    store.reset()
    start = time.perf_counter()
    wh.table("t").snapshot()
    out["load_ms"] = (time.perf_counter() - start) * 1000
    out["load_requests"] = sum(store.snapshot().values())
    producer.close()
    return out


def measure_tails(latency_ms: float) -> list[tuple[str, float, int]]:
    """(case, wall ms, GETs): cold loads after a checkpoint, refreshes of a handle behind."""
    name = f"hot-path-{uuid.uuid4().hex}"
    memory = MemoryStore(name)
    try:
        wh = Warehouse(store=memory, group_commit=False)
        wh.create_table("t", partitions=1)
        producer = Producer(wh, linger_ms=0)
        slow = CountingStore(LatencyStore(memory, latency_ms))
        out: list[tuple[str, float, int]] = []
        written = 0
        for tail in (1, 50, 99):  # the checkpoint is at version 100 (every 100 versions)
            while written < 100 + tail:
                producer.send("t", value=b"%d" % written, partition=0).result()
                written += 1
            slow.reset()
            start = time.perf_counter()
            Warehouse(store=slow, group_commit=False).table("t").snapshot()
            out.append((f"load, tail {tail}", (time.perf_counter() - start) * 1000,
                        slow.snapshot()["GET"]))
        handle = Warehouse(store=slow, group_commit=False).table("t")
        handle.snapshot()
        for behind in (1, 10, 100):
            for _ in range(behind):
                producer.send("t", value=b"x", partition=0).result()
            slow.reset()
            start = time.perf_counter()
            handle.snapshot()
            out.append((f"refresh, {behind} behind", (time.perf_counter() - start) * 1000,
                        slow.snapshot()["GET"]))
        producer.close()
        return out
    finally:
        MemoryStore.drop(name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=3000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    a, b = measure(args.short), measure(args.long)
    print(f"{'metric':<18}{'v~' + str(args.short):>12}{'v~' + str(args.long):>12}{'ratio':>8}")
    for key in a:
        ratio = b[key] / a[key] if a[key] else float("nan")
        print(f"{key:<18}{a[key]:>12.2f}{b[key]:>12.2f}{ratio:>8.2f}")
    print(f"\nordered store (memory) + {args.latency_ms:g} ms per request")
    print(f"{'case':<22}{'ms':>8}{'GETs':>6}{'requests':>10}{'ratio':>8}")
    rows = measure_tails(args.latency_ms)
    for (case, ms, gets), first in zip(rows, [rows[0]] * 3 + [rows[3]] * 3, strict=True):
        worth = ms / args.latency_ms
        print(f"{case:<22}{ms:>8.0f}{gets:>6}{worth:>10.1f}{ms / first[1]:>8.2f}")


if __name__ == "__main__":
    main()
