"""Finishing what dead producers left: prepared transactions and expired open ones.

Any client may run this: the CAS on the coordinator object makes exactly one of several
racing recoverers win each transition, and markers are idempotent, so running it twice, or
concurrently with the producer's own ``init_transactions``, writes every marker once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from txntable.coordinator import TransactionCoordinator, TxnMetadata, TxnState
from txntable.errors import PreconditionFailedError, TxnTableError
from txntable.log import now_ms
from txntable.storage.base import Store

_log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What ``recover`` did, by transactional id."""

    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)
    #: Transactional ids whose recovery failed, with the error; the others still ran.
    failed: dict[str, str] = field(default_factory=dict)


def abort_if_expired(
    coordinator: TransactionCoordinator, transactional_id: str, now: int
) -> int | None:
    """Abort ``transactional_id``'s Ongoing transaction if it is past its timeout.

    Returns:
        ``None`` if it was aborted or nothing is open; else the time (ms) at which the open
        transaction expires, so a caller can skip it until then.

    Raises:
        PreconditionFailedError: Another client moved the object first.
    """
    loaded = coordinator.load(transactional_id)
    if loaded is None:
        return None
    return _abort_expired(coordinator, *loaded, now)


def _abort_expired(
    coordinator: TransactionCoordinator, meta: TxnMetadata, etag: str, now: int
) -> int | None:
    if meta.state is not TxnState.ONGOING:
        return None
    deadline = meta.txn_start_timestamp + meta.timeout_ms
    if now <= deadline:
        return deadline
    _log.info(
        "aborting the transaction of %s: open since %d, timeout %d ms",
        meta.transactional_id,
        meta.txn_start_timestamp,
        meta.timeout_ms,
    )
    coordinator.fence_and_abort(meta, etag)
    return None


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
    for tid in coordinator.transactional_ids():
        try:
            loaded = coordinator.load(tid)
            if loaded is None:
                continue
            meta, etag = loaded
            if meta.state is TxnState.PREPARE_COMMIT:
                coordinator.complete(meta, etag)
                report.committed.append(tid)
            elif meta.state is TxnState.PREPARE_ABORT:
                coordinator.complete(meta, etag)
                report.aborted.append(tid)
            elif meta.state is TxnState.ONGOING:
                if _abort_expired(coordinator, meta, etag, clock) is None:
                    report.timed_out.append(tid)
        except PreconditionFailedError:
            report.lost_race.append(tid)  # another client moved it first; it finishes it
        except TxnTableError as e:
            # One damaged object or unreachable table must not stop the recovery of the
            # others; the failure is reported (and the CLI exits non-zero).
            report.failed[tid] = f"{type(e).__name__}: {e}"
    return report
