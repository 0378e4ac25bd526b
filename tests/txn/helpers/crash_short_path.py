"""Commit a one-table transaction by the short path and SIGKILL itself right after the
PrepareCommit CAS (issue 25.2): the decision is made, its data is only in the coordinator
object's intent, and no table shows anything.

Usage: ``python crash_short_path.py WAREHOUSE_URL`` (the warehouse holds table ``t``, one
partition). Exit code 3 means the crash point was never reached.
"""

from __future__ import annotations

import os
import signal
import sys

from txntable import Producer, Warehouse
from txntable.txn.coordinator import TransactionCoordinator, TxnState

TID = "short-crash"


def main() -> int:
    wh = Warehouse(sys.argv[1])
    producer = Producer(wh, transactional_id=TID, linger_ms=3_600_000, batch_size=1 << 30)
    producer.init_transactions()
    real_cas = TransactionCoordinator.cas

    def cas(self, meta, etag):  # type: ignore[no-untyped-def]
        new_etag = real_cas(self, meta, etag)
        if meta.state is TxnState.PREPARE_COMMIT:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # decided; nothing written to the table
        return new_etag

    TransactionCoordinator.cas = cas  # type: ignore[method-assign]
    producer.begin_transaction()
    for i in range(3):
        producer.send("t", value=b"decided-%d" % i, partition=0)
    producer.commit_transaction()
    return 3


if __name__ == "__main__":
    sys.exit(main())
