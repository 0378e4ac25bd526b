"""The main demo: produce, abort, commit, and read back, on a local-disk warehouse.

Run it with ``examples/run_demo.sh [WAREHOUSE_DIR]``. It creates table ``orders`` with 2
partitions, writes one committed transaction, one aborted transaction and some idempotent
(non-transactional) records, leaves one transaction open, and prints what each isolation
level returns, with the high watermark (HW) and last stable offset (LSO) per partition.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)


def run_scenario(wh: Warehouse) -> None:
    """The demo on any warehouse: commit, abort, idempotent writes, an open transaction."""
    wh.create_table("orders", partitions=2)
    print(f"warehouse {wh.url}: created table 'orders' with 2 partitions")

    txn = Producer(wh, transactional_id="demo-etl")
    txn.init_transactions()

    txn.begin_transaction()
    for i in range(3):
        txn.send("orders", key=b"user-%d" % i, value=b"order %d (committed)" % i, partition=0)
    txn.commit_transaction()
    print("committed a transaction of 3 records")

    txn.begin_transaction()
    txn.send("orders", key=b"user-9", value=b"order 9 (aborted)", partition=0)
    txn.flush()  # the record is in the log now: read_uncommitted sees it
    txn.abort_transaction()
    print("aborted a transaction of 1 record (flushed to the log first)")

    plain = Producer(wh, enable_idempotence=True)
    for i in range(2):
        plain.send("orders", key=b"k", value=b"idempotent %d" % i, partition=1)
    plain.flush()
    print("wrote 2 idempotent records to partition 1")

    txn.begin_transaction()
    txn.send("orders", value=b"still open", partition=1).result()
    print("left a transaction open on partition 1 (holds the LSO back)")
    plain.send("orders", value=b"after the open txn", partition=1).result()

    print_offsets(wh)
    tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
    for level in ("read_committed", "read_uncommitted"):
        consumer = Consumer(wh, isolation_level=level)
        consumer.assign(tps)
        consumer.seek_to_beginning()
        print(f"\n{level}:")
        for tp, records in sorted(consumer.poll(timeout_ms=500).items()):
            for r in records:
                print(f"  {tp.topic}[{tp.partition}] offset {r.offset}: {r.value!r}")
        ends = consumer.end_offsets(tps)
        print(
            "  positions:",
            {tp.partition: consumer.position(tp) for tp in tps},
            "end offsets:",
            {tp.partition: ends[tp] for tp in tps},
        )
        consumer.close()

    txn.commit_transaction()
    print("\ncommitted the open transaction; partition 1 is now stable:")
    print_offsets(wh)
    txn.close()
    plain.close()


def print_offsets(wh: Warehouse) -> None:
    """Log start, HW, LSO and open transactions per partition of ``orders``."""
    for p in wh.table("orders").describe().partitions:
        opens = ", ".join(f"pid {t.producer_id} from {t.first_offset}" for t in p.open_transactions)
        print(
            f"partition {p.partition}: log start {p.log_start_offset}, HW {p.high_watermark}, "
            f"LSO {p.last_stable_offset}, open transactions: [{opens}]"
        )


def main() -> None:
    # Never delete anything: a directory given on the command line may hold other data; a
    # second run there stops at create_table with TableExistsError.
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "lake"
    run_scenario(Warehouse(root.resolve().as_uri()))


if __name__ == "__main__":
    main()
