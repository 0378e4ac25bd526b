"""Run a transaction over 2 tables x 3 partitions (plus a group offset) and SIGKILL itself.

Usage: ``python crash_txn.py WAREHOUSE_URL CRASH_POINT [TIMEOUT_MS]``

The warehouse must hold tables ``ta`` and ``tb`` (3 partitions each). The script runs one
committed warm-up transaction (``t1-*`` records, group offset 1), then transaction ``t2``
(``t2-*`` records, group offset 2) with a crash armed at ``CRASH_POINT``; the crash is a
real ``os.kill(os.getpid(), SIGKILL)`` from inside a monkeypatched library call. Before
arming, it prints one JSON line with the producer id and epoch. Exit code 3 means the
crash point was never reached.

Crash points:

* ``registered``: the partitions of both tables registered (one AddPartitions for the
  sender's round), before any data commit of t2.
* ``data_committed``: all data of t2 committed, before the PrepareCommit CAS.
* ``prepare_commit``: PrepareCommit written, before any marker.
* ``some_markers``: COMMIT markers of ``ta`` written, not those of ``tb`` (the markers of
  the participants are written at once: ``tb``'s never land).
* ``all_markers``: every COMMIT marker written, before the CompleteCommit CAS.
* ``prepare_abort``: the producer aborts t2; PrepareAbort written, before any marker.
* ``some_abort_markers``: ABORT markers of ``ta`` written, not those of ``tb``.
* ``buffered_prepare_commit``, ``buffered_some_markers``, ``buffered_all_markers``: as
  above, but t2 sends no group offsets and nothing before the commit. A one-table
  transaction would take the short path; across two tables the producer takes the normal
  path (issue 25.2), so the data is in both logs as open transactional batches before the
  decision and holds each LSO until its markers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from txntable import Producer, TopicPartition, Warehouse
from txntable.structs import OffsetAndMetadata
from txntable.table import Table
from txntable.txn.coordinator import TransactionCoordinator, TxnState

TID = "crash-tid"
GROUP = "crash-g"
TABLES = ("ta", "tb")
PARTITIONS = 3
RECORDS_PER_PARTITION = 4
SOURCE_TP = TopicPartition("src", 0)
POINTS = (
    "registered",
    "data_committed",
    "prepare_commit",
    "some_markers",
    "all_markers",
    "prepare_abort",
    "some_abort_markers",
    "buffered_prepare_commit",
    "buffered_some_markers",
    "buffered_all_markers",
)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    """Monkeypatch the library so the process SIGKILLs itself at ``point``."""
    point = point.removeprefix("buffered_")
    orig_append = Table.append
    orig_cas = TransactionCoordinator.cas

    def append(self, batches, markers=None, app_txn=None, transactional_id=None, timeout_ms=None):  # type: ignore[no-untyped-def]  # noqa: E501
        if point == "registered" and batches:
            die()  # add_partitions for the tables returned; their data is not committed
        if markers and self.name == "tb" and point in ("some_markers", "some_abort_markers"):
            threading.Event().wait()  # never lands: ta's append kills the process
        result = orig_append(self, batches, markers, app_txn, transactional_id, timeout_ms)
        if markers and self.name == "ta":
            kind = markers[0].type
            if (point, kind) in (("some_markers", "COMMIT"), ("some_abort_markers", "ABORT")):
                die()  # ta's markers are in its log; tb's are not
        return result

    def cas(self, meta, etag):  # type: ignore[no-untyped-def]
        if point == "data_committed" and meta.state is TxnState.PREPARE_COMMIT:
            die()
        if point == "all_markers" and meta.state is TxnState.COMPLETE_COMMIT:
            die()
        new_etag = orig_cas(self, meta, etag)
        if (point, meta.state) in (
            ("prepare_commit", TxnState.PREPARE_COMMIT),
            ("prepare_abort", TxnState.PREPARE_ABORT),
        ):
            die()
        return new_etag

    Table.append = append  # type: ignore[method-assign]
    TransactionCoordinator.cas = cas  # type: ignore[method-assign]


def send_all(producer: Producer, tag: str) -> None:
    for table in TABLES:
        for p in range(PARTITIONS):
            for i in range(RECORDS_PER_PARTITION):
                value = f"{tag}-{table}-{p}-{i}".encode()
                producer.send(table, value=value, key=value, partition=p)


def main() -> int:
    url, point = sys.argv[1], sys.argv[2]
    timeout_ms = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    if point not in POINTS:
        print(f"unknown crash point {point!r}", file=sys.stderr)
        return 2
    wh = Warehouse(url)
    # Huge linger and batch size: nothing is sent before flush/commit, so the order of
    # library calls (and so each crash point) is deterministic.
    producer = Producer(
        wh,
        transactional_id=TID,
        transaction_timeout_ms=timeout_ms,
        linger_ms=3_600_000,
        batch_size=1 << 30,
    )
    producer.init_transactions()

    producer.begin_transaction()
    send_all(producer, "t1")
    producer.send_offsets_to_transaction({SOURCE_TP: OffsetAndMetadata(1, "t1")}, GROUP)
    producer.commit_transaction()

    print(json.dumps({"producer_id": producer.producer_id, "epoch": producer.producer_epoch}))
    sys.stdout.flush()
    arm(point)

    producer.begin_transaction()
    send_all(producer, "t2")
    if not point.startswith("buffered_"):
        producer.send_offsets_to_transaction({SOURCE_TP: OffsetAndMetadata(2, "t2")}, GROUP)
    if point in ("prepare_abort", "some_abort_markers"):
        producer.flush()
        producer.abort_transaction()
    else:
        producer.commit_transaction()
    return 3  # the crash point was never reached


if __name__ == "__main__":
    sys.exit(main())
