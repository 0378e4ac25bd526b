"""Commit a one-table transaction as a client of the previous protocol version did (its
short path: segments, then a CAS to PrepareCommit carrying them as the object's ``intent``)
and SIGKILL itself right after that CAS (issue 25.2): the decision is made, its data is only
in the coordinator object's intent, and no table shows anything. Clients of this version
commit such a transaction as one append (CommitOneLog) and never write an intent, but every
client still completes one an earlier client left.

Usage: ``python crash_short_path.py WAREHOUSE_URL`` (the warehouse holds table ``t``, one
partition). Exit code 3 means the crash point was never reached.
"""

from __future__ import annotations

import os
import signal
import sys

from txntable import Producer, Warehouse
from txntable.txn.coordinator import TxnState
from txntable.util import now_ms

TID = "short-crash"


def main() -> int:
    wh = Warehouse(sys.argv[1])
    producer = Producer(wh, transactional_id=TID, linger_ms=3_600_000, batch_size=1 << 30)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send("t", value=b"decided-%d" % i, partition=0)
    txn = producer.transaction_manager
    whole = producer.accumulator.drain_whole(txn.short_path_allowed)
    assert whole is not None
    intent = producer.sender.write_transaction(whole)
    coordinator = txn.coordinator
    loaded = coordinator.load(TID)
    assert loaded is not None
    meta, etag = loaded
    partitions = {t: tuple(sorted({b.partition for b in bs})) for t, bs in intent.items()}
    prepared = meta.transition(
        TxnState.PREPARE_COMMIT, partitions=partitions, intent=intent, txn_start_timestamp=now_ms()
    )
    coordinator.cas(prepared, etag)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # decided; nothing written to the table
    return 3


if __name__ == "__main__":
    sys.exit(main())
