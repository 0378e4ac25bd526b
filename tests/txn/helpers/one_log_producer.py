"""A transactional producer whose one-log commit stops at a named point:
``python one_log_producer.py URL POINT``.

It initialises transactional id ``one``, commits ``t1-0`` and ``t1-1`` to ``orders`` (a
one-log transaction: the table is registered), prints one JSON line (producer id and epoch),
then begins transaction t2 (``t2-0`` to partition 0, ``t2-1`` to partition 1, or to table
``other`` for ``registered``) and commits it with the point armed:

* ``registered``: SIGKILL right after RegisterTable's CAS (``other`` is new to the id);
* ``segments_written``: SIGKILL once t2's segments are written, before its append;
* ``appended``: SIGKILL once t2's append returned, before ``commit_transaction`` does;
* ``pause_before_append`` / ``pause_after_append``: print ``{"paused": true}`` there and
  wait for a line on standard input (the test SIGSTOPs it meanwhile), then go on and print
  ``{"outcome": ...}``: ``committed`` or the exception's class name.

Exit code 3 means a kill point was never reached.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from txntable import Producer, Warehouse
from txntable.errors import TxnTableError
from txntable.table import Table
from txntable.txn.coordinator import TransactionCoordinator

POINTS = (
    "registered",
    "segments_written",
    "appended",
    "pause_before_append",
    "pause_after_append",
)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def pause() -> None:
    print(json.dumps({"paused": True}), flush=True)
    sys.stdin.readline()


def arm(point: str) -> None:
    orig_append = Table.append
    orig_cas = TransactionCoordinator.cas

    def append(self, batches, markers=None, app_txn=None, transactional_id=None, timeout_ms=None):  # type: ignore[no-untyped-def]  # noqa: E501
        if point == "segments_written":
            die()
        if point == "pause_before_append":
            pause()
        result = orig_append(self, batches, markers, app_txn, transactional_id, timeout_ms)
        if point == "appended":
            die()
        if point == "pause_after_append":
            pause()
        return result

    def cas(self, meta, etag):  # type: ignore[no-untyped-def]
        new_etag = orig_cas(self, meta, etag)
        if point == "registered" and "other" in meta.tables:
            die()
        return new_etag

    Table.append = append  # type: ignore[method-assign]
    TransactionCoordinator.cas = cas  # type: ignore[method-assign]


def main() -> int:
    url, point = sys.argv[1], sys.argv[2]
    if point not in POINTS:
        print(f"unknown point {point!r}", file=sys.stderr)
        return 2
    wh = Warehouse(url)
    # Nothing is sent before the commit: the transactions take the one-log path.
    p = Producer(wh, transactional_id="one", linger_ms=3_600_000, batch_size=1 << 30)
    p.init_transactions()
    p.begin_transaction()
    for i in range(2):
        p.send("orders", value=b"t1-%d" % i, partition=i)
    p.commit_transaction()
    print(json.dumps({"pid": p.producer_id, "epoch": p.producer_epoch}), flush=True)
    arm(point)
    p.begin_transaction()
    table = "other" if point == "registered" else "orders"
    for i in range(2):
        p.send(table, value=b"t2-%d" % i, partition=i)
    try:
        p.commit_transaction()
        outcome = "committed"
    except TxnTableError as e:
        outcome = type(e).__name__
    if point.startswith("pause_"):
        print(json.dumps({"outcome": outcome}), flush=True)
        try:
            p.close(timeout=10)
        except TxnTableError:
            pass  # a fenced producer's close may report the fencing again
        return 0
    return 3


if __name__ == "__main__":
    sys.exit(main())
