"""A transactional producer the test pauses as a zombie: ``python zombie_producer.py URL``.

It initialises transactional id ``zombie``, begins a transaction, writes ``z-flushed`` to
``orders`` partition 0 (flushed: in the log), buffers ``z-buffered`` for partition 1, prints
one JSON line (producer id and epoch) and waits for a line on standard input. Then it tries
to commit and prints the outcome: ``committed`` or the exception's class name.
"""

from __future__ import annotations

import json
import sys

from txntable import Producer, Warehouse
from txntable.errors import TxnTableError


def main() -> None:
    wh = Warehouse(sys.argv[1])
    p = Producer(wh, transactional_id="zombie", linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("orders", value=b"z-flushed", partition=0)
    p.flush()
    p.send("orders", value=b"z-buffered", partition=1)
    print(json.dumps({"pid": p.producer_id, "epoch": p.producer_epoch}), flush=True)
    sys.stdin.readline()
    try:
        p.commit_transaction()
        outcome = "committed"
    except TxnTableError as e:
        outcome = type(e).__name__
    print(json.dumps({"outcome": outcome}), flush=True)
    try:
        p.close(timeout=10)
    except TxnTableError:
        pass  # a fenced producer's close may report the fencing again: the outcome is out


if __name__ == "__main__":
    main()
