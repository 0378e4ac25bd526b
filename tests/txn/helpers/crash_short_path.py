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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: tableutil

from tableutil import decide_like_an_earlier_client  # noqa: E402

from txntable import Producer, Warehouse  # noqa: E402

TID = "short-crash"


def main() -> int:
    wh = Warehouse(sys.argv[1])
    producer = Producer(wh, transactional_id=TID, linger_ms=3_600_000, batch_size=1 << 30)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send("t", value=b"decided-%d" % i, partition=0)
    decide_like_an_earlier_client(producer)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # decided; nothing written to the table
    return 3


if __name__ == "__main__":
    sys.exit(main())
