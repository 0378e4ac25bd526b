"""Peak memory of one large transaction: does ``buffer_memory`` bound the producer?

Each case runs in a fresh subprocess: it opens a warehouse on local disk, starts a producer
(``buffer_memory`` 32 MiB by default), measures its resident set (the baseline), writes one
transaction of ``--total-mib`` of records with ``send()`` or ``send_batch()``, commits, and
reports its peak resident set (``ru_maxrss``) above the baseline. Records are made on the
fly (``send_batch`` gets 4 MiB tables), so the caller holds little itself. The baseline is
taken after a small warm-up transaction, so it already holds the library code pages.

Goal: peak above baseline <= buffer_memory + 64 MiB, at 1 KB and at 100 B records.
Run: ``python bench/memory.py [--total-mib 1024] [--buffer-mib 32]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

CASES = [("send", 1000), ("send", 100), ("send_batch", 1000), ("send_batch", 100)]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(api: str, record_bytes: int, total_mib: int, buffer_mib: int) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa

    from txntable import Producer, Warehouse

    root = tempfile.mkdtemp(prefix="txntable-mem-")
    wh = Warehouse(f"file://{root}/lake")
    wh.create_table("t", partitions=8)
    producer = Producer(
        wh,
        transactional_id="mem",
        buffer_memory=buffer_mib * 2**20,
        transaction_timeout_ms=3_600_000,
    )
    producer.init_transactions()
    # Warm up (a small transaction through both paths) so the baseline already holds the
    # library code and allocator state that do not grow with the data.
    producer.begin_transaction()
    producer.send("t", value=b"warm-up", key=b"w")
    producer.send_batch("t", {"key": [b"w"] * 1000, "value": [b"x" * 100] * 1000})
    producer.commit_transaction()
    value_bytes = record_bytes - 16
    records = total_mib * 2**20 // record_bytes
    blob = np.random.default_rng(1).integers(0, 256, 2**20 + value_bytes, np.uint8).tobytes()
    baseline = rss_mib()
    start = time.perf_counter()
    producer.begin_transaction()
    if api == "send":
        send = producer.send
        for i in range(records):
            at = (i * 7919) % 2**20
            send("t", value=blob[at : at + value_bytes], key=b"%016d" % i)
    else:
        rows = max(1, 4 * 2**20 // record_bytes)
        rng = np.random.default_rng(2)
        for first in range(0, records, rows):
            n = min(rows, records - first)
            offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * value_bytes).tobytes())
            data = pa.py_buffer(rng.integers(0, 256, n * value_bytes, np.uint8).tobytes())
            values = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets, data])
            keys = pa.array([b"%016d" % i for i in range(first, first + n)], pa.binary())
            producer.send_batch("t", pa.table({"key": keys, "value": values}))
    producer.commit_transaction()
    elapsed = time.perf_counter() - start
    producer.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutil.rmtree(root, ignore_errors=True)  # up to 1 GiB of segments per case
    return {"baseline_mib": baseline, "peak_mib": peak, "records": records, "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total-mib", type=int, default=1024)
    parser.add_argument("--buffer-mib", type=int, default=32)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        api, size = args.child
        print(json.dumps(child(api, int(size), args.total_mib, args.buffer_mib)))
        return
    limit = args.buffer_mib + 64
    print(f"one transaction of {args.total_mib} MiB, buffer_memory {args.buffer_mib} MiB, "
          f"goal: peak above baseline <= {limit} MiB")  # fmt: skip
    print(f"{'api':<12}{'record':>8}{'records':>11}{'seconds':>9}{'peak-base MiB':>15}  goal")
    for api, size in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--child", api, str(size),
             "--total-mib", str(args.total_mib), "--buffer-mib", str(args.buffer_mib)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        r = json.loads(out.strip().splitlines()[-1])
        above = r["peak_mib"] - r["baseline_mib"]
        verdict = "ok" if above <= limit else "OVER"
        print(f"{api:<12}{size:>7}B{int(r['records']):>11,}{r['seconds']:>9.1f}{above:>15.1f}  "
              f"{verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
