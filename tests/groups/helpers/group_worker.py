"""A group member process for the multi-process tests (run as a script; killed by them).

``ctp``: consume-transform-produce: each poll's records go to table ``out`` (value
``"<partition>:<offset>"``) in one transaction with the group offsets
(``send_offsets_to_transaction(..., consumer.group_metadata())``); a refused commit aborts
and rewinds to the committed offsets. ``stall``: plain commits after a "processing" pause
(1 s, or the optional eighth argument), logging each commit's outcome and whether the
process was stopped during the pause.
The status file (JSON) is rewritten after every poll.
"""

from __future__ import annotations

import json
import os
import sys
import time

from txntable import (
    Consumer,
    OffsetAndMetadata,
    Producer,
    Warehouse,
)
from txntable.errors import CommitFailedError, UnstableOffsetCommitError

#: The "processing" pause of mode ``stall`` (unless the command line gives one).
PAUSE_S = 1.0


def _write(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _rewind(c: Consumer) -> None:
    for tp in c.assignment():
        try:
            committed = c.committed(tp)
        except UnstableOffsetCommitError:
            committed = None
        if committed is None:
            c.seek_to_beginning([tp])
        else:
            c.seek(tp, committed.offset)


def main() -> None:
    url, name, status_dir, mode, session_ms, strategy = sys.argv[1:7]
    options = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    pause_s = float(sys.argv[8]) if len(sys.argv) > 8 else PAUSE_S
    wh = Warehouse(url, options)
    c = Consumer(
        wh,
        group_id="g",
        client_id=name,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=int(session_ms),
        heartbeat_interval_ms=100,
        partition_assignment_strategy=strategy,
        unstable_offset_timeout_ms=0,
        enable_auto_commit=False,  # commits are the worker's (or its transactions')
    )
    c.subscribe(["in"])
    status = os.path.join(status_dir, f"{name}.json")
    stop = os.path.join(status_dir, "stop")
    producer = None
    if mode == "ctp":
        producer = Producer(wh, transactional_id=f"ctp-{name}", transaction_timeout_ms=3000)
        producer.init_transactions()
    commits: list[dict[str, object]] = []
    processed = 0
    while not os.path.exists(stop):
        recs = c.poll(100, max_records=7)
        meta = c.group_metadata()
        base = {
            "pid": os.getpid(),
            "assignment": sorted(tp.partition for tp in c.assignment()),
            "generation": meta.generation_id,
            "processed": processed,
            "commits": commits,
        }
        _write(status, {**base, "phase": "polled"})
        if not recs:
            continue
        offsets = {tp: OffsetAndMetadata(rs[-1].offset + 1) for tp, rs in recs.items()}
        if producer is not None:
            producer.begin_transaction()
            for tp, rs in recs.items():
                for r in rs:
                    producer.send("out", value=f"{tp.partition}:{r.offset}".encode(), partition=0)
            try:
                producer.send_offsets_to_transaction(offsets, meta)
                producer.commit_transaction()
                processed += sum(len(rs) for rs in recs.values())
            except CommitFailedError:
                producer.abort_transaction()
                _rewind(c)
        else:
            # ``until``: when the pause ends (wall clock, read by the test's process), so
            # that a stop meant for the pause is not sent during the commit after it.
            _write(status, {**base, "phase": "processing", "until": time.time() + pause_s})
            started = time.monotonic()
            time.sleep(pause_s)
            stalled = time.monotonic() - started > pause_s + 1.0
            try:
                c.commit(offsets)
                outcome = "ok"
                processed += sum(len(rs) for rs in recs.values())
            except CommitFailedError as e:
                outcome = type(e).__name__
                _rewind(c)
            commits.append(
                {
                    "stalled": stalled,
                    "outcome": outcome,
                    "offsets": {str(tp.partition): o.offset for tp, o in offsets.items()},
                }
            )
    if producer is not None:
        producer.close()
    c.close()


if __name__ == "__main__":
    main()
