"""Worker processes for the concurrent maintenance test.

Usage: ``python maint_worker.py ROLE WAREHOUSE_URL [ARG]``

* ``produce N``: N transactions of 2 records on each of partitions 0 and 1, every third one
  aborted, then one committed transaction of ``END`` records; prints one JSON line per
  committed record: ``[partition, offset, value]``.
* ``consume``: read_committed from the beginning until both partitions gave ``END``; prints
  one JSON line per record.
* ``maintain STOPFILE``: ``Table.maintain()`` in a loop until STOPFILE exists; prints the
  number of rounds that merged something.
"""

from __future__ import annotations

import json
import os
import sys
import time

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)


def produce(wh: Warehouse, n: int) -> None:
    p = Producer(wh, transactional_id="conc", linger_ms=600_000, batch_size=1 << 30,
                 auto_maintenance=False)
    p.init_transactions()
    for i in range(n + 1):
        end = i == n
        p.begin_transaction()
        futures = [
            p.send("t", value=b"END" if end else f"{i}-{p_}-{j}".encode(), partition=p_)
            for p_ in (0, 1)
            for j in range(1 if end else 2)
        ]
        p.flush()
        if i % 3 == 2 and not end:
            p.abort_transaction()
            continue
        p.commit_transaction()
        for f in futures:
            md = f.result()
            print(json.dumps([md.partition, md.offset, None]), flush=True)
    p.close()


def consume(wh: Warehouse) -> None:
    c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    c.assign(tps)
    ended: set[int] = set()
    deadline = time.monotonic() + 240
    while len(ended) < 2 and time.monotonic() < deadline:
        for tp, records in c.poll(timeout_ms=100, max_records=7).items():
            for r in records:
                print(json.dumps([tp.partition, r.offset, r.value.decode()]), flush=True)
                if r.value == b"END":
                    ended.add(tp.partition)
    c.close()


def maintain(wh: Warehouse, stop: str) -> None:
    merged = 0
    while not os.path.exists(stop):
        report = wh.table("t").maintain()
        if report.errors:
            print(json.dumps({"errors": report.errors}), flush=True)
        if report.rewrite is not None and report.rewrite.version is not None:
            merged += 1
        time.sleep(0.05)
    print(json.dumps({"merged": merged}), flush=True)


def main() -> None:
    role, url = sys.argv[1], sys.argv[2]
    wh = Warehouse(url)
    if role == "produce":
        produce(wh, int(sys.argv[3]))
    elif role == "consume":
        consume(wh)
    else:
        maintain(wh, sys.argv[3])


if __name__ == "__main__":
    main()
