"""Producer throughput against baselines measured in the same run on the same data.

Three shapes of data, 8 partitions, 10 transactions, local disk; for each, one
``Producer.send_batch`` per transaction against ``deltalake.write_deltalake`` appends of the
same Arrow table (one per transaction), both writers handed the very same table:

- ``segment``: 1M records given in the segment schema (16 B random keys, 100 B random
  values, empty headers, one timestamp) — the producer's own layout, nothing to convert;
- ``kv``: 400k records as a user hands them over, a table of just ``key`` and ``value``
  (16 B keys, 100 B random values);
- ``text``: the same with compressible values, 100 B of JSON-like text (the common case).

``pq.write_table`` of the same rows split by partition (zstd, like the segments) runs
alongside for the ``segment`` shape: the cost of the Parquet encoding alone.

Per record: ``Producer.send()`` per record (default configuration) against a plain Python
loop that appends each key and value to a list and builds one Arrow table (no timestamp
call per record: what a caller building the columns does).

Cases run interleaved (every round runs each case once, in turn) and the medians are
printed with the ratios (throughput, > 1: txntable is faster), and the same ratio of CPU
time per record (every thread of this process: moved less than wall time by other
processes on a loaded machine, but blind to parallelism). Run:
``python bench/produce.py [--rounds 5] [--shapes segment,kv,text] [--no-send]``
(``--shapes ''``: the ``send()`` case alone)
(needs the ``bench`` extra, delta-rs: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txntable import Producer, Warehouse
from txntable.producer.partitioner import partitions_for_keys
from txntable.protocol.actions import Batch
from txntable.protocol.records import SEGMENT_SCHEMA

PARTITIONS = 8
TXNS = 10
KEY_BYTES = 16
VALUE_BYTES = 100


def _fixed_binary(buf: bytes, records: int, width: int) -> pa.Array:
    offsets = pa.py_buffer((np.arange(records + 1, dtype=np.int32) * width).tobytes())
    return pa.Array.from_buffers(pa.binary(), records, [None, offsets, pa.py_buffer(buf)])


def random_keys(records: int, rng: np.random.Generator) -> pa.Array:
    return _fixed_binary(
        rng.integers(0, 256, size=(records, KEY_BYTES), dtype=np.uint8).tobytes(),
        records,
        KEY_BYTES,
    )


def random_values(records: int, rng: np.random.Generator) -> pa.Array:
    return _fixed_binary(
        rng.integers(0, 256, size=(records, VALUE_BYTES), dtype=np.uint8).tobytes(),
        records,
        VALUE_BYTES,
    )


EVENTS = ["click", "view", "purchase", "add_to_cart", "search", "logout"]
COUNTRIES = ["DE", "FR", "US", "GB", "IN", "BR", "JP", "NL"]


def text_values(records: int, rng: np.random.Generator) -> pa.Array:
    """100 B of JSON-like text per record: repeated field names, a few small vocabularies,
    random ids — what an event stream's values look like (zstd shrinks them ~3x)."""
    users = rng.integers(0, 1_000_000, records)
    events = rng.integers(0, len(EVENTS), records)
    countries = rng.integers(0, len(COUNTRIES), records)
    pages = rng.integers(0, 10_000, records)
    out = []
    for i in range(records):
        s = (
            f'{{"user":{users[i]},"event":"{EVENTS[events[i]]}",'
            f'"country":"{COUNTRIES[countries[i]]}","page":"/p/{pages[i]}","ok":true}}'
        )
        out.append(s.ljust(VALUE_BYTES)[:VALUE_BYTES].encode())
    return pa.array(out, pa.binary())


def make_data(shape: str, records: int, seed: int = 7) -> pa.Table:
    """The table both writers are given for ``shape`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    keys = random_keys(records, rng)
    if shape == "segment":
        now = int(time.time() * 1000)
        return pa.table(
            {
                "key": keys,
                "value": random_values(records, rng),
                "headers": pa.array([[]] * records, SEGMENT_SCHEMA.field("headers").type),
                "timestamp": pa.array(np.full(records, now), pa.timestamp("ms", tz="UTC")),
            },
            schema=SEGMENT_SCHEMA,
        )
    values = random_values(records, rng) if shape == "kv" else text_values(records, rng)
    return pa.table({"key": keys, "value": values})


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
    for t, part in enumerate(slices(data)):
        # The same split as the segments: rows grouped by their partition.
        partition = pa.array(partitions_for_keys(part.column("key"), PARTITIONS))
        for p in range(PARTITIONS):
            os.makedirs(f"{root}/pq/{p}", exist_ok=True)
            rows = part.filter(pc.equal(partition, p))
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
    for i in range(len(keys)):
        out_keys.append(keys[i])
        out_values.append(values[i])
    pa.table({"key": pa.array(out_keys, pa.binary()), "value": pa.array(out_values, pa.binary())})


def cpu_seconds() -> float:
    """CPU time of this process, every thread (user + system: page faults count)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[str], None]) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn`` in a fresh directory."""
    root = tempfile.mkdtemp(prefix="txntable-bench-")
    try:
        cpu = cpu_seconds()
        start = time.perf_counter()
        fn(root)
        return time.perf_counter() - start, cpu_seconds() - cpu
    finally:
        shutil.rmtree(root, ignore_errors=True)


def segments_and_versions(fn: Callable[[str], None]) -> tuple[int, int]:
    """Segments (batches) and log versions of table ``t`` after ``fn`` (an untimed run):
    how the producer cut the transactions into rounds."""
    root = tempfile.mkdtemp(prefix="txntable-bench-")
    try:
        fn(root)
        log = Warehouse(f"file://{root}/lake").table("t").log
        batches = versions = 0
        while (actions := log.read_version(versions)) is not None:
            batches += sum(isinstance(a, Batch) for a in actions)
            versions += 1
        return batches, versions
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="segment shape")
    parser.add_argument("--kv-records", type=int, default=400_000, help="kv and text shapes")
    parser.add_argument("--send-records", type=int, default=400_000, help="send() vs loop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", default="segment,kv,text")
    parser.add_argument("--no-parquet", action="store_true", help="skip pq.write_table")
    parser.add_argument("--no-send", action="store_true", help="skip send() vs loop")
    args = parser.parse_args()

    cases: dict[str, Callable[[str], None]] = {}
    records: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    for shape in [s for s in args.shapes.split(",") if s]:  # --shapes '': send() only
        n = args.records if shape == "segment" else args.kv_records
        data = make_data(shape, n)
        mb = (data.column("key").nbytes + data.column("value").nbytes) / 1e6
        print(f"{shape}: {n:,} records, {mb:.0f} MB of keys and values, {data.column_names}")
        cases[f"send_batch[{shape}]"] = lambda root, d=data: run_send_batch(root, d)
        cases[f"deltalake[{shape}]"] = lambda root, d=data: run_deltalake(root, d)
        pairs.append((f"send_batch[{shape}]", f"deltalake[{shape}]"))
        if shape == "segment" and not args.no_parquet:
            cases[f"parquet[{shape}]"] = lambda root, d=data: run_parquet(root, d)
            pairs.append((f"send_batch[{shape}]", f"parquet[{shape}]"))
        for name in list(cases):
            records.setdefault(name, n)
    if not args.no_send:
        data = make_data("kv", args.send_records)
        keys = data.column("key").to_pylist()
        values = data.column("value").to_pylist()
        cases["send"] = lambda root: run_send(root, keys, values)
        cases["loop"] = lambda root: run_loop(root, keys, values)
        records["send"] = records["loop"] = args.send_records
        pairs.append(("send", "loop"))

    times: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.rounds):
        for name, fn in cases.items():
            wall, cpu = timed(fn)
            times[name].append(wall)
            cpus[name].append(cpu)
        print(f"round {r + 1}: " + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in cases), flush=True)
    median = {n: statistics.median(ts) for n, ts in times.items()}
    cpu = {n: statistics.median(ts) for n, ts in cpus.items()}
    rate = {n: records[n] / median[n] for n in cases}
    print(f"\n{PARTITIONS} partitions, {TXNS} transactions, median of {args.rounds} "
          f"interleaved rounds; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'case':<22}{'records':>10}{'records/s':>14}{'median s':>10}{'CPU s':>8}")
    for n in cases:
        print(f"{n:<22}{records[n]:>10,}{rate[n]:>14,.0f}{median[n]:>10.3f}{cpu[n]:>8.3f}")
    for a, b in pairs:
        print(
            f"{a} / {b}: {rate[a] / rate[b]:.2f}x "
            f"(CPU: {cpu[b] / records[b] / (cpu[a] / records[a]):.2f}x)"
        )
    for name in cases:
        if name.startswith("send"):
            segments, versions = segments_and_versions(cases[name])
            print(f"{name}: {segments} segments, {versions} log versions (with the table's "
                  f"creation) for {TXNS} transactions")  # fmt: skip


if __name__ == "__main__":
    main()
