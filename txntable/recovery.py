"""Finishing what dead producers left: prepared transactions and expired open ones.

Any client may run this: the CAS on the coordinator object makes exactly one of several
racing recoverers win each transition, and markers are idempotent, so running it twice, or
concurrently with the producer's own ``init_transactions``, writes every marker once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txntable.coordinator import COORDINATOR_DIR, TransactionCoordinator, TxnState
from txntable.errors import PreconditionFailedError
from txntable.log import now_ms
from txntable.storage.base import Store


@dataclass
class RecoveryReport:
    """What ``recover`` did, by transactional id."""

    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)


def recover(
    store: Store, coordinator: TransactionCoordinator | None = None, now: int | None = None
) -> RecoveryReport:
    """Roll forward PrepareCommit, finish PrepareAbort, abort Ongoing past its timeout.

    A timed-out transaction is aborted through PrepareEpochFence with the epoch bumped, so
    the late original producer is fenced at its next coordinator CAS or table commit.
    """
    coordinator = coordinator or TransactionCoordinator(store)
    clock = now_ms() if now is None else now
    report = RecoveryReport()
    prefix = f"{COORDINATOR_DIR}/txn/"
    for key in store.list(prefix):
        if not key.endswith(".json"):
            continue
        tid = key[len(prefix) : -len(".json")]
        loaded = coordinator.load(tid)
        if loaded is None:
            continue
        meta, etag = loaded
        try:
            if meta.state is TxnState.PREPARE_COMMIT:
                coordinator.complete(meta, etag)
                report.committed.append(tid)
            elif meta.state is TxnState.PREPARE_ABORT:
                coordinator.complete(meta, etag)
                report.aborted.append(tid)
            elif meta.state in (TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE) and (
                clock - meta.txn_start_timestamp > meta.timeout_ms
            ):
                if meta.state is TxnState.PREPARE_EPOCH_FENCE:
                    from dataclasses import replace

                    meta = replace(meta, state=TxnState.ONGOING)
                coordinator.fence_and_abort(meta, etag)
                report.timed_out.append(tid)
        except PreconditionFailedError:
            report.lost_race.append(tid)  # another client moved it first; it finishes it
    return report
