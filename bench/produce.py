"""Producer throughput against baselines measured in the same run on the same data.

1M records (16 B keys, 100 B random values), 8 partitions, 10 transactions, local disk:

- ``send_batch``: one ``Producer.send_batch`` per transaction, against
  ``deltalake.write_deltalake`` appends of the same Arrow data (one per transaction) and
  ``pyarrow.parquet.write_table`` of the same data (one file per transaction and partition,
  zstd, like the segments);
- ``send()``: one ``Producer.send`` per record, default configuration, against a plain
  Python loop that builds the same columns (key, value, timestamp lists, then one Arrow
  table).

Cases run interleaved (every round runs each case once, in turn) and the medians are
printed with the ratios. Run: ``python bench/produce.py [--records 1000000] [--rounds 5]``
(needs the ``bench`` extra: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from txntable import Producer, Warehouse
from txntable.producer.partitioner import partitions_for_keys
from txntable.protocol.records import SEGMENT_SCHEMA

PARTITIONS = 8
TXNS = 10


def make_data(records: int, seed: int = 7) -> pa.Table:
    """Random 16 B keys and 100 B values, one timestamp, in the segment schema."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, size=(records, 16), dtype=np.uint8).tobytes()
    values = rng.integers(0, 256, size=(records, 100), dtype=np.uint8).tobytes()

    def binary(buf: bytes, width: int) -> pa.Array:
        offsets = pa.py_buffer((np.arange(records + 1, dtype=np.int32) * width).tobytes())
        return pa.Array.from_buffers(pa.binary(), records, [None, offsets, pa.py_buffer(buf)])

    now = int(time.time() * 1000)
    return pa.table(
        {
            "key": binary(keys, 16),
            "value": binary(values, 100),
            "headers": pa.array([[]] * records, SEGMENT_SCHEMA.field("headers").type),
            "timestamp": pa.array(np.full(records, now), pa.timestamp("ms", tz="UTC")),
        },
        schema=SEGMENT_SCHEMA,
    )


def slices(data: pa.Table) -> list[pa.Table]:
    step = -(-data.num_rows // TXNS)
    return [data.slice(i, step) for i in range(0, data.num_rows, step)]


def run_send_batch(root: str, data: pa.Table) -> None:
    wh = Warehouse(f"file://{root}/lake")
    wh.create_table("t", partitions=PARTITIONS)
    with Producer(wh, transactional_id="bench") as p:
        p.init_transactions()
        for part in slices(data):
            p.begin_transaction()
            p.send_batch("t", part)
            p.commit_transaction()


def run_deltalake(root: str, data: pa.Table) -> None:
    from deltalake import write_deltalake

    for part in slices(data):
        write_deltalake(f"{root}/delta", part, mode="append")


def run_parquet(root: str, data: pa.Table) -> None:
    import os

    for t, part in enumerate(slices(data)):
        # The same split as the segments: rows grouped by their partition.
        partition = pa.array(partitions_for_keys(part.column("key"), PARTITIONS))
        for p in range(PARTITIONS):
            os.makedirs(f"{root}/pq/{p}", exist_ok=True)
            rows = part.filter(pa.compute.equal(partition, p))
            pq.write_table(rows, f"{root}/pq/{p}/{t}.parquet", compression="zstd")


def run_send(root: str, keys: list[bytes], values: list[bytes]) -> None:
    wh = Warehouse(f"file://{root}/lake")
    wh.create_table("t", partitions=PARTITIONS)
    step = -(-len(keys) // TXNS)
    with Producer(wh, transactional_id="bench") as p:
        p.init_transactions()
        send = p.send
        for start in range(0, len(keys), step):
            p.begin_transaction()
            for i in range(start, min(start + step, len(keys))):
                send("t", value=values[i], key=keys[i])
            p.commit_transaction()


def run_loop(root: str, keys: list[bytes], values: list[bytes]) -> None:
    """What a caller does to build the same columns itself: append per record, one table."""
    out_keys: list[bytes] = []
    out_values: list[bytes] = []
    stamps: list[int] = []
    for i in range(len(keys)):
        out_keys.append(keys[i])
        out_values.append(values[i])
        stamps.append(int(time.time() * 1000))
    pa.table(
        {
            "key": pa.array(out_keys, pa.binary()),
            "value": pa.array(out_values, pa.binary()),
            "timestamp": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
        }
    )


def timed(fn: Callable[[str], None]) -> float:
    root = tempfile.mkdtemp(prefix="txntable-bench-")
    try:
        start = time.perf_counter()
        fn(root)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="send_batch,deltalake,parquet,send,loop")
    args = parser.parse_args()
    data = make_data(args.records)
    keys = data.column("key").to_pylist()
    values = data.column("value").to_pylist()
    cases: dict[str, Callable[[str], None]] = {
        "send_batch": lambda root: run_send_batch(root, data),
        "deltalake": lambda root: run_deltalake(root, data),
        "parquet": lambda root: run_parquet(root, data),
        "send": lambda root: run_send(root, keys, values),
        "loop": lambda root: run_loop(root, keys, values),
    }
    chosen = args.cases.split(",")
    times: dict[str, list[float]] = {name: [] for name in chosen}
    for r in range(args.rounds):
        for name in chosen:
            times[name].append(timed(cases[name]))
        print(f"round {r + 1}: " + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in chosen))
    rate = {n: args.records / statistics.median(times[n]) for n in chosen}
    print(f"\n{args.records:,} records, {PARTITIONS} partitions, {TXNS} transactions, "
          f"median of {args.rounds} interleaved rounds")  # fmt: skip
    print(f"{'case':<12}{'records/s':>14}{'median s':>10}")
    for n in chosen:
        print(f"{n:<12}{rate[n]:>14,.0f}{statistics.median(times[n]):>10.3f}")
    pairs = [("send_batch", "deltalake"), ("send_batch", "parquet"), ("send", "loop")]
    for a, b in pairs:
        if a in rate and b in rate:
            print(f"{a} / {b}: {rate[a] / rate[b]:.2f}x")


if __name__ == "__main__":
    main()
