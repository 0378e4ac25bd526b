"""Finishing what dead producers left: prepared transactions and expired open ones.

Any client may run this: the CAS on the coordinator object makes exactly one of several
racing recoverers win each transition, and markers are idempotent, so running it twice, or
concurrently with the producer's own ``init_transactions``, writes every marker once.

``recover`` sweeps every transactional id (maintenance). :class:`StuckTransactionFinisher`
does the same for the transactions a reader or writer sees pinning a table's LSO, as a
side effect of polling or writing, so a dead producer never blocks read_committed readers
until someone runs ``recover``.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from functools import partial

from txntable import config
from txntable.errors import (
    KafkaTimeoutError,
    PreconditionFailedError,
    TransientStorageError,
    TxnTableError,
)
from txntable.layout import sweep_key
from txntable.protocol.actions import loads_strict
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage.base import Store
from txntable.storage.cas import load_object, put_cas
from txntable.txn.coordinator import TransactionCoordinator, TxnState
from txntable.util import now_ms, retry_transient

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


@dataclass(frozen=True)
class StuckCheck:
    """What :func:`finish_if_stuck` found and did for one transactional id."""

    #: ``"committed"`` / ``"aborted"`` (a prepared transaction completed), ``"timed_out"``
    #: (an expired Ongoing one aborted), or ``None`` (nothing done).
    finished: str | None = None
    #: When the transaction could next need finishing (ms), if that is known: the end of
    #: the grace period of a prepared one, the timeout of an Ongoing one.
    next_check: int | None = None


def finish_if_stuck(
    coordinator: TransactionCoordinator,
    transactional_id: str,
    now: int,
    grace_ms: int | None,
    abort_expired: bool = True,
) -> StuckCheck:
    """Finish ``transactional_id``'s transaction if its producer left it stuck.

    A PrepareCommit / PrepareAbort older than ``grace_ms`` (any, with ``None``) is
    completed: the decision is durable, so writing the markers is what the producer would
    have done (Kafka's coordinator does it itself). With ``abort_expired``, an Ongoing
    transaction past its timeout is aborted with the epoch bumped (fencing its producer).

    Raises:
        PreconditionFailedError: Another client moved the object first (it finishes it).
    """
    loaded = coordinator.load(transactional_id)
    if loaded is None:
        return StuckCheck()
    meta, etag = loaded
    if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
        ready = meta.last_update_timestamp + (grace_ms or 0)
        if grace_ms is not None and now < ready:
            return StuckCheck(next_check=ready)
        _log.info(
            "completing the %s of %s, prepared at %d by a producer that did not finish it",
            meta.state.value,
            transactional_id,
            meta.last_update_timestamp,
        )
        coordinator.complete(meta, etag)
        committed = meta.state is TxnState.PREPARE_COMMIT
        return StuckCheck("committed" if committed else "aborted")
    if meta.state is TxnState.ONGOING:
        if not abort_expired:
            return StuckCheck()  # it may be prepared (and then stuck) at any moment
        deadline = meta.txn_start_timestamp + meta.timeout_ms
        if now <= deadline:
            return StuckCheck(next_check=deadline)
        _log.info(
            "aborting the transaction of %s: open since %d, timeout %d ms",
            transactional_id,
            meta.txn_start_timestamp,
            meta.timeout_ms,
        )
        coordinator.fence_and_abort(meta, etag)
        return StuckCheck("timed_out")
    return StuckCheck()


SWEEP_FORMAT_VERSION = 1


def claim_sweep(store: Store, root: str, interval_ms: int, now: int) -> bool:
    """Whether this client is the one to sweep ``root``'s decided transactions now.

    At most one client per ``interval_ms`` (by the writers' clocks): the last sweep's time
    is a CAS object, so many producers of a table cost one GET each per interval and one
    sweep in all. A damaged object is replaced. Safety never depends on it.
    """
    key = sweep_key(root)
    obj = load_object(store, key)
    if obj is not None:
        try:
            last = loads_strict(obj.data)["sweptMs"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            last = 0
        if isinstance(last, int) and now < last + interval_ms:
            return False
    body = json.dumps(
        {"version": SWEEP_FORMAT_VERSION, "sweptMs": now, "writeId": uuid.uuid4().hex},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    try:
        put_cas(store, key, body, None if obj is None else obj.etag)
    except PreconditionFailedError:
        return False  # another client claimed it
    return True


def finish_decided(
    coordinator: TransactionCoordinator,
    table_name: str,
    now: int,
    grace_ms: int,
    skip: str | None = None,
) -> list[str]:
    """Complete every PrepareCommit / PrepareAbort naming ``table_name`` whose grace
    period has passed (the producer that decided it is gone).

    An earlier client's decided short-path commit leaves no trace in its table before its
    markers (its data travels in the coordinator object), so no reader or writer of the
    table sees it; this finds it through the coordinator objects: one LIST and one GET per
    transactional id, a maintenance step, never on a hot path. Failures are logged, never raised.

    Returns:
        The transactional ids completed.
    """
    finished = []
    for tid in coordinator.transactional_ids():
        if tid == skip:
            continue
        try:
            loaded = coordinator.load(tid)
            if loaded is None:
                continue
            meta, etag = loaded
            decided = meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
            if not decided or table_name not in meta.partitions:
                continue
            if now < meta.last_update_timestamp + grace_ms:
                continue  # its producer may still be finishing it
            _log.info("completing the %s of %s (decided, never finished)", meta.state.value, tid)
            coordinator.complete(meta, etag)
            finished.append(tid)
        except PreconditionFailedError:
            continue  # another client completed it
        except TxnTableError as e:
            _log.warning("could not complete the transaction of %s: %s", tid, e)
    return finished


class StuckTransactionFinisher:
    """Finishes, on a table's behalf, transactions that dead producers left open.

    A transaction holding back a partition's LSO shows in the snapshot (its first batch
    names its transactional id). Each such id's coordinator object is read once, then not
    again before the moment it could need finishing (or ``recheck_ms`` when unknown), so a
    reader or writer calling :meth:`check` on every poll or flush costs no request while
    nothing is stuck, and one GET per stuck transactional id per period when something is.

    Args:
        coordinator: Completes and aborts transactions (its table handles write markers).
        grace_ms: How long a prepared transaction is left to its producer.
        abort_expired: Also abort Ongoing transactions past their timeout (writers do;
            readers only finish transactions whose outcome is decided).
        recheck_ms: When to look again at an id whose object gave no deadline.
        own_id: A transactional id never to touch (the calling producer's own).
    """

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        grace_ms: int,
        abort_expired: bool,
        recheck_ms: int,
        own_id: str | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.grace_ms = grace_ms
        self.abort_expired = abort_expired
        self.recheck_ms = recheck_ms
        self.own_id = own_id
        self._next_check: dict[str, int] = {}
        self._lock = threading.Lock()

    def finish_decided(self, table_name: str, now: int | None = None) -> list[str]:
        """:func:`finish_decided` for ``table_name`` with this finisher's grace period."""
        clock = now_ms() if now is None else now
        return finish_decided(self.coordinator, table_name, clock, self.grace_ms, self.own_id)

    def check(self, snap: TableSnapshot, now: int | None = None) -> list[str]:
        """Finish what is due among the transactions open in ``snap``.

        Never raises for someone else's transaction: a failure (for example read-only
        credentials) is logged and retried after ``recheck_ms``.

        Returns:
            The transactional ids finished (the caller's snapshot is then behind).
        """
        candidates: set[str] = set()
        for part in snap.partitions:
            if part.ongoing:
                candidates.update(part.open_transaction_ids())
        if not candidates:
            return []
        clock = now_ms() if now is None else now
        with self._lock:
            due = [
                tid
                for tid in sorted(candidates)
                if tid != self.own_id and clock >= self._next_check.get(tid, 0)
            ]
            for tid in due:  # claimed: a concurrent check skips them
                self._next_check[tid] = clock + self.recheck_ms
        finished = []
        for tid in due:
            try:
                result = finish_if_stuck(
                    self.coordinator, tid, clock, self.grace_ms, self.abort_expired
                )
            except PreconditionFailedError:
                continue  # another client moved it first; it finishes the transaction
            except TxnTableError as e:
                # Not ours to fail a read or a send over; recover() reports such failures.
                _log.warning("could not finish the transaction of %s: %s", tid, e)
                continue
            if result.finished is not None:
                finished.append(tid)
            elif result.next_check is not None:
                with self._lock:
                    self._next_check[tid] = max(result.next_check, clock + 1)
        return finished


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
            # Every step is safe to repeat from a fresh load.
            result = retry_transient(
                partial(finish_if_stuck, coordinator, tid, clock, None), timeout_ms
            )
            if result.finished is not None:
                getattr(report, result.finished).append(tid)
        except PreconditionFailedError:
            report.lost_race.append(tid)  # another client moved it first; it finishes it
        except TxnTableError as e:
            # One damaged object or unreachable table must not stop the recovery of the
            # others; the failure is reported (and the CLI exits non-zero).
            report.failed[tid] = f"{type(e).__name__}: {e}"
    return report
