"""Run ``Table.optimize()`` on a local table and SIGKILL itself before its Nth storage write.

Usage: ``python crash_merge.py WAREHOUSE_URL N``. Exit code 0: the merge finished before
write N (every write point has been covered).
"""

from __future__ import annotations

import os
import signal
import sys

from txntable import Warehouse
from txntable.storage.local import LocalStore

WRITES = ("put", "put_if_absent", "put_if_match", "put_data_file", "delete")


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    count = 0
    for name in WRITES:
        original = getattr(LocalStore, name)

        def wrapped(self, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal count
            count += 1
            if count == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return _original(self, *args, **kwargs)

        setattr(LocalStore, name, wrapped)
    Warehouse(url).table("t").optimize()
    print(f"done after {count} writes")


if __name__ == "__main__":
    main()
