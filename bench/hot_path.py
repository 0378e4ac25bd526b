"""Hot-path cost at a short and a long history: commit, poll and a fresh snapshot load.

Prints requests and wall time per operation at version ~V1 and ~V2 and their ratio; a
ratio near 1 means the operation does not grow with history (checkpoints + incremental
refresh). Run: ``python bench/hot_path.py [--short 100] [--long 3000]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.storage.local import LocalStore
from txntable.storage.wrappers import CountingStore


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=3000)
    args = parser.parse_args()
    a, b = measure(args.short), measure(args.long)
    print(f"{'metric':<18}{'v~' + str(args.short):>12}{'v~' + str(args.long):>12}{'ratio':>8}")
    for key in a:
        ratio = b[key] / a[key] if a[key] else float("nan")
        print(f"{key:<18}{a[key]:>12.2f}{b[key]:>12.2f}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
