"""Transactions across logs: what atomicity over several logs costs, against one log.

    python bench/transactions.py [--latency-ms 20] [--txns 30] [--rounds 3]

Local disk behind ``LatencyStore`` (20 ms per request, as an object store's round trip),
one transactional producer (default settings), two tables of one partition. For each
shape, ``--txns`` transactions of 10 records of 100 B, each timed from
``begin_transaction`` to ``commit_transaction``'s return, in ``--rounds`` interleaved
rounds (medians over every transaction of a shape):

1. one table (CommitOneLog: data and marker in one version) — the baseline;
2. two tables (through the coordinator: AddPartitionsToTxn per table, EndTxn's prepare,
   a marker per table, complete);
3. consume-transform-produce: one table and the group's offsets
   (``send_offsets_to_transaction``: the group's offset log is the second log).

Prints p50 / p99 latency, requests per transaction by kind, and each shape's p50 as a
multiple of the baseline's (lower is better; the floor is its extra round trips).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from txntable import Producer, TopicPartition, Warehouse
from txntable.storage import CountingStore, LatencyStore, LocalStore
from txntable.structs import OffsetAndMetadata

VALUE = b"v" * 100
RECORDS = 10


def build(latency_ms: float) -> tuple[Producer, CountingStore]:
    root = tempfile.mkdtemp(prefix="txntable-bench-txns-")
    plain = Warehouse(store=LocalStore(root))
    plain.create_table("a", partitions=1)
    plain.create_table("b", partitions=1)
    counter = CountingStore(LatencyStore(LocalStore(root), latency_ms))
    producer = Producer(Warehouse(store=counter), transactional_id="bench")
    producer.init_transactions()
    return producer, counter


def shapes(producer: Producer) -> dict[str, Callable[[], None]]:
    consumed = [0]

    def send(table: str) -> None:
        for _ in range(RECORDS):
            producer.send(table, value=VALUE, partition=0)

    def one_table() -> None:
        producer.begin_transaction()
        send("a")
        producer.commit_transaction()

    def two_tables() -> None:
        producer.begin_transaction()
        send("a")
        send("b")
        producer.commit_transaction()

    def consume_transform_produce() -> None:
        producer.begin_transaction()
        send("b")
        consumed[0] += RECORDS
        offsets = {TopicPartition("a", 0): OffsetAndMetadata(consumed[0])}
        producer.send_offsets_to_transaction(offsets, "bench-group")
        producer.commit_transaction()

    return {
        "one table": one_table,
        "two tables": two_tables,
        "consume-transform-produce": consume_transform_produce,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--txns", type=int, default=30, help="transactions per shape per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    producer, counter = build(args.latency_ms)
    cases = shapes(producer)
    for run in cases.values():
        run()  # warm: each log loaded, each table registered, the group log created
    times: dict[str, list[float]] = {name: [] for name in cases}
    requests: dict[str, dict[str, int]] = {name: {} for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            counter.reset()
            for _ in range(args.txns):
                start = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - start) * 1000)
            for kind, n in counter.snapshot().items():
                requests[name][kind] = requests[name].get(kind, 0) + n
    producer.close()
    total = args.txns * args.rounds
    base = statistics.median(times["one table"])
    print(f"local disk + LatencyStore({args.latency_ms:g} ms), {RECORDS} records of 100 B, "
          f"{total} transactions per shape in {args.rounds} interleaved rounds")
    print(f"{'shape':<28}{'p50 ms':>8}{'p99 ms':>8}{'req/txn':>9}{'x one table':>13}  requests")
    for name, values in times.items():
        values.sort()
        p50 = statistics.median(values)
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        kinds = {k: n / total for k, n in requests[name].items() if n}
        per_txn = sum(kinds.values())
        detail = ", ".join(f"{k} {v:.1f}" for k, v in kinds.items())
        print(f"{name:<28}{p50:>8.0f}{p99:>8.0f}{per_txn:>9.1f}{p50 / base:>13.2f}  {detail}")


if __name__ == "__main__":
    main()
