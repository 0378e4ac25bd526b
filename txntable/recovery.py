"""Finishing what dead producers left: prepared transactions and expired open ones.

Any client may run this: the CAS on the coordinator object makes exactly one of several
racing recoverers win each transition, and markers are idempotent, so running it twice, or
concurrently with the producer's own ``init_transactions``, writes every marker once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from txntable import config
from txntable.coordinator import TransactionCoordinator, TxnMetadata, TxnState
from txntable.errors import (
    KafkaTimeoutError,
    PreconditionFailedError,
    TransientStorageError,
    TxnTableError,
)
from txntable.log import now_ms
from txntable.retry import retry_transient
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


def _recover_one(coordinator: TransactionCoordinator, tid: str, now: int) -> str | None:
    """Finish or expire one id's transaction; return its report list's name, if any."""
    loaded = coordinator.load(tid)
    if loaded is None:
        return None
    meta, etag = loaded
    if meta.state is TxnState.PREPARE_COMMIT:
        coordinator.complete(meta, etag)
        return "committed"
    if meta.state is TxnState.PREPARE_ABORT:
        coordinator.complete(meta, etag)
        return "aborted"
    if meta.state is TxnState.ONGOING and _abort_expired(coordinator, meta, etag, now) is None:
        return "timed_out"
    return None


def recover(
    store: Store,
    coordinator: TransactionCoordinator | None = None,
    now: int | None = None,
    timeout_ms: int = config.RECOVERY_TIMEOUT_MS_DEFAULT,
) -> RecoveryReport:
    """Roll forward PrepareCommit, finish PrepareAbort, abort Ongoing past its timeout.

    A timed-out transaction is aborted through PrepareEpochFence with the epoch bumped, so
    the late original producer is fenced at its next coordinator CAS or table commit.
    Transient storage errors are retried for up to ``timeout_ms``: of the listing, then of
    each id (from a fresh load: every step is safe to repeat).

    Raises:
        KafkaTimeoutError: Listing the coordinator objects kept failing for ``timeout_ms``.
    """
    coordinator = coordinator or TransactionCoordinator(store)
    clock = now_ms() if now is None else now
    report = RecoveryReport()
    try:
        tids = retry_transient(lambda: list(coordinator.transactional_ids()), timeout_ms)
    except (TransientStorageError, OSError) as e:
        raise KafkaTimeoutError(
            f"recover: listing the coordinator objects failed for {timeout_ms} ms ({e})"
        ) from e
    for tid in tids:
        try:
            outcome = retry_transient(partial(_recover_one, coordinator, tid, clock), timeout_ms)
            if outcome is not None:
                getattr(report, outcome).append(tid)
        except PreconditionFailedError:
            report.lost_race.append(tid)  # another client moved it first; it finishes it
        except TxnTableError as e:
            # One damaged object or unreachable table must not stop the recovery of the
            # others; the failure is reported (and the CLI exits non-zero).
            report.failed[tid] = f"{type(e).__name__}: {e}"
    return report
