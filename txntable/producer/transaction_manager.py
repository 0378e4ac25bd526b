"""The producer's transaction manager (Kafka's ``TransactionManager``): who the producer is
and where its transaction stands.

It owns the producer id and epoch, the next sequence number of every partition, the client
state machine, the partitions registered with the open transaction and every call to the
transaction coordinator (InitProducerId, AddPartitionsToTxn, offsets, EndTxn), and the
one-log commit: a transaction whose data all goes to one table commits as one append of its
batches and COMMIT markers, with no coordinator write but the table's registration (once).
The sender asks it for sequences and tells it about failed batches; the producer's
transactional methods delegate to it. It never touches the buffers: flushing before a
transaction ends is the producer's part.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import TypeVar

from txntable.errors import (
    CommitConflictError,
    InternalError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    ProducerFencedError,
    StorageError,
    TransientStorageError,
    TxnTableError,
)
from txntable.groups.offsets import check_offset_targets
from txntable.producer.accumulator import ProducerBatch
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.protocol.actions import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Batch
from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.sequencing import OffsetCommitOp
from txntable.structs import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from txntable.table import Table
from txntable.txn.coordinator import MAX_PRODUCER_EPOCH, TransactionCoordinator
from txntable.txn.recovery import StuckTransactionFinisher
from txntable.util import RETRIABLE, remaining_ms

T = TypeVar("T")


class ClientTxnState(enum.Enum):
    """Where a transactional producer is in its life cycle."""

    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


C = ClientTxnState
#: Legal previous states of each state (Kafka's ``State.isTransitionValid``).
LEGAL_TRANSITIONS: dict[ClientTxnState, frozenset[ClientTxnState]] = {
    C.UNINITIALIZED: frozenset(),
    C.INITIALIZING: frozenset({C.UNINITIALIZED, C.ABORTING_TRANSACTION}),
    C.READY: frozenset({C.INITIALIZING, C.COMMITTING_TRANSACTION, C.ABORTING_TRANSACTION}),
    C.IN_TRANSACTION: frozenset({C.READY}),
    C.COMMITTING_TRANSACTION: frozenset({C.IN_TRANSACTION}),
    C.ABORTING_TRANSACTION: frozenset({C.IN_TRANSACTION, C.ABORTABLE_ERROR}),
    C.ABORTABLE_ERROR: frozenset(
        {C.IN_TRANSACTION, C.COMMITTING_TRANSACTION, C.ABORTABLE_ERROR, C.ABORTING_TRANSACTION}
    ),
    C.FATAL_ERROR: frozenset(ClientTxnState),
}


class TransactionManager:
    """Producer id, epoch, sequences, the client state machine and the coordinator calls.

    An idempotent producer has one too (no ``transactional_id``): its producer id, epoch
    and sequences live here, and its state stays ``UNINITIALIZED``.

    Args:
        metadata: The producer's table handles (the coordinator writes markers through them).
        retries: The producer's retry budgets.
        transactional_id: The transactional id, or ``None`` for a producer without
            transactions.
        enable_idempotence: Whether batches carry the producer id and sequences.
        transaction_timeout_ms: Registered with the coordinator by ``init_transactions``.
    """

    def __init__(
        self,
        metadata: ProducerMetadata,
        retries: Retries,
        transactional_id: str | None,
        enable_idempotence: bool,
        transaction_timeout_ms: int,
    ) -> None:
        self.transactional_id = transactional_id
        self.enable_idempotence = enable_idempotence
        self.transaction_timeout_ms = transaction_timeout_ms
        self._metadata = metadata
        self._retries = retries
        self.coordinator = TransactionCoordinator(metadata.store, table_provider=metadata.log_table)
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._sequences: dict[TopicPartition, int] = {}
        #: Partitions registered with the open transaction (AddPartitionsToTxn).
        self._partitions: dict[str, set[int]] = {}
        #: The first failed batch of the open transaction (its sequences may be taken and
        #: not in the log: an abort with nothing registered then moves to a new epoch).
        self._batch_error: TxnTableError | None = None
        #: The tables the coordinator object lists (one-log transactions; InitProducerId
        #: fences them), as of this producer's last InitProducerId or RegisterTable.
        self._tables: frozenset[str] = frozenset()
        #: Finishes the transaction's end that did not finish (the same call retries it).
        self._end_retry: Callable[[], None] | None = None
        #: Whether the transaction being ended is decided: True (PrepareCommit), False
        #: (PrepareAbort), None (not known to be).
        self._decided: bool | None = None
        warehouse = metadata.warehouse
        self._finisher = (
            StuckTransactionFinisher(
                self.coordinator,
                grace_ms=warehouse.stuck_transaction_grace_ms,
                abort_expired=True,
                # An object that gave no deadline (the transaction completed meanwhile) is
                # looked at again only after a while, never on every flush.
                recheck_ms=max(1000, transaction_timeout_ms // 10),
                own_id=transactional_id,
            )
            if warehouse.finish_stuck_transactions
            else None
        )
        self.state = ClientTxnState.UNINITIALIZED
        self.last_error: TxnTableError | None = None
        self._lock = threading.Lock()

    # --- the state machine ---------------------------------------------------------------

    @property
    def transactional(self) -> bool:
        """Whether the producer has a transactional id."""
        return self.transactional_id is not None

    @property
    def decided(self) -> bool | None:
        """How the transaction being ended is decided: True (commit), False (abort), None
        (not known to be)."""
        return self._decided

    @property
    def end_unfinished(self) -> bool:
        """Whether a commit or abort did not finish and must be called again."""
        return self._end_retry is not None

    def transition(self, to: ClientTxnState, error: TxnTableError | None = None) -> None:
        """Move to ``to``.

        Raises:
            InvalidTxnStateError: If the move is illegal; the message names both states.
        """
        with self._lock:
            if self.state is ClientTxnState.FATAL_ERROR and to is not ClientTxnState.FATAL_ERROR:
                assert self.last_error is not None
                raise self.last_error
            if self.state not in LEGAL_TRANSITIONS[to]:
                raise InvalidTxnStateError(
                    f"TransactionalId {self.transactional_id}: invalid transition attempted from "
                    f"state {self.state.value} to state {to.value}"
                )
            self.state = to
            if error is not None:
                self.last_error = error
            elif to in (ClientTxnState.READY, ClientTxnState.IN_TRANSACTION):
                self.last_error = None

    def require(self, operation: str, *allowed: ClientTxnState) -> None:
        """Raise unless the state is one of ``allowed`` (the error state's error if any)."""
        state = self.state
        if state in allowed:
            return
        if state in (ClientTxnState.FATAL_ERROR, ClientTxnState.ABORTABLE_ERROR):
            assert self.last_error is not None
            raise self.last_error
        raise InvalidTxnStateError(f"cannot {operation} in state {state.value}")

    def require_transactional(self) -> None:
        """Raise unless the producer has a transactional id.

        Raises:
            InvalidTxnStateError: It has none.
        """
        if self.transactional_id is None:
            raise InvalidTxnStateError("this producer has no transactional_id")

    def require_sendable(self) -> None:
        """Raise unless records may be sent now: always without transactions, else only
        in a transaction."""
        if self.transactional_id is not None and self.state is not C.IN_TRANSACTION:
            self.require("send", C.IN_TRANSACTION)

    def fail(self, error: TxnTableError, fatal: bool) -> None:
        """Enter ABORTABLE_ERROR or FATAL_ERROR because of ``error``.

        A non-fatal error while the transaction is being aborted changes nothing (Kafka's
        ``transitionToAbortableError``): the abort is already what the error calls for.
        """
        with self._lock:
            if self.state is ClientTxnState.FATAL_ERROR:
                return
            if not fatal and self.state is ClientTxnState.ABORTING_TRANSACTION:
                return
            self.state = ClientTxnState.FATAL_ERROR if fatal else ClientTxnState.ABORTABLE_ERROR
            self.last_error = error

    # --- producer id and sequences -------------------------------------------------------

    def ensure_producer_id(self) -> None:
        """Allocate a producer id for an idempotent producer's first batch."""
        if self.enable_idempotence and self.producer_id == NO_PRODUCER_ID:
            self.producer_id = self.coordinator.allocator.allocate()
            self.producer_epoch = 0

    def next_sequence(self, tp: TopicPartition, count: int) -> int:
        """The base sequence of a batch of ``count`` records to ``tp`` (taken: the next
        batch follows it), or ``NO_SEQUENCE`` without idempotence."""
        if not self.enable_idempotence:
            return NO_SEQUENCE
        seq = self._sequences.get(tp, 0)
        self._sequences[tp] = (seq + count) % (2**31)
        return seq

    def batch_failed(self, error: TxnTableError, sequenced: bool = True) -> None:
        """A batch failed: a transaction can only be aborted now; an idempotent producer
        whose batch took sequence numbers (``sequenced``) continues under a new epoch."""
        if self.transactional_id is not None:
            self._batch_error = error
            self.fail(error, fatal=isinstance(error, ProducerFencedError))
        elif sequenced and self.enable_idempotence and self.producer_id != NO_PRODUCER_ID:
            # KIP-360: the failed batch's sequences were taken and never reached the log (or
            # its outcome is unknown), so the next batch would leave a gap and be refused as
            # out of order; continuing under a fresh epoch restarts every sequence at 0
            # without reusing one that may be in the log.
            if self.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
                self.producer_id = NO_PRODUCER_ID  # exhausted: a new id at the next send
            else:
                self.producer_epoch += 1
            self._sequences.clear()

    # --- coordinator calls ---------------------------------------------------------------

    def init_transactions(self) -> None:
        """InitProducerId: fence older instances and finish their transaction.

        Raises:
            KafkaTimeoutError: Storage kept failing; call it again to retry.
        """
        self.require_transactional()
        if self.state is not C.INITIALIZING:  # INITIALIZING: retrying a timed-out attempt
            self.transition(C.INITIALIZING)
        tid = self.transactional_id or ""
        deadline = self._retries.delivery_deadline()
        try:
            meta = self._retries.delivery(
                lambda: self.coordinator.init_producer_id(
                    tid, self.transaction_timeout_ms, deadline
                ),
                remaining_ms(deadline),
            )
        except (TransientStorageError, OSError) as e:
            raise KafkaTimeoutError(
                f"init_transactions did not finish ({e}); call it again to retry"
            ) from e
        except TxnTableError as e:
            # Not a timeout: the producer cannot become usable (Kafka treats it as fatal).
            self.fail(e, fatal=True)
            raise
        self.producer_id, self.producer_epoch = meta.producer_id, meta.producer_epoch
        self._tables = frozenset(meta.tables)
        self._sequences.clear()
        self._batch_error = None
        self.transition(C.READY)

    def begin_transaction(self) -> None:
        """Start a transaction: nothing registered, no failed batch."""
        self.require_transactional()
        self.require("begin a transaction", C.READY)
        self._partitions = {}
        self._batch_error = None
        self.transition(C.IN_TRANSACTION)

    def add_partitions(self, topic: str, partitions: set[int], deadline: float) -> None:
        """AddPartitionsToTxn for those of ``partitions`` of ``topic`` not registered yet
        (nothing without a transaction), retried until ``deadline``."""
        self.add_tables_partitions({topic: partitions}, deadline)

    def add_tables_partitions(self, partitions: dict[str, set[int]], deadline: float) -> None:
        """AddPartitionsToTxn for those of ``partitions`` (by table) not registered yet, in
        one step (one CAS however many tables), retried until ``deadline``."""
        if self.transactional_id is None:
            return
        new = {t: ps - self._partitions.get(t, set()) for t, ps in partitions.items()}
        new = {t: ps for t, ps in new.items() if ps}
        if not new:
            return
        tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
        self._retries.delivery(
            lambda: self.coordinator.add_partitions(tid, pid, epoch, new),
            remaining_ms(deadline),
        )
        for topic, added in new.items():
            self._partitions.setdefault(topic, set()).update(added)

    def send_offsets(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], meta: ConsumerGroupMetadata
    ) -> None:
        """Make checked ``offsets`` of ``meta``'s group pending in the transaction.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``max_block_ms``; the transaction
                must be aborted.
            ProducerFencedError: The producer was fenced.
            UnknownTopicOrPartitionError: A table or partition that does not exist; nothing
                is sent and the transaction goes on.
        """
        self.require("send offsets to a transaction", C.IN_TRANSACTION)
        check_offset_targets(meta.group_id, offsets, self._metadata.offset_partition_count)
        assert self.transactional_id is not None
        tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch

        def register() -> None:
            name = self._metadata.group_table(meta.group_id).name
            if 0 not in self._partitions.get(name, set()):
                self.coordinator.add_partitions(tid, pid, epoch, {name: {0}})
                self._partitions.setdefault(name, set()).add(0)

        def commit() -> None:
            # A retry after an unresolved ambiguous commit may write the same pending
            # offsets twice: the later one wins, with the same values.
            self._metadata.group_table(meta.group_id).submit(
                OffsetCommitOp.of(meta.group_id, offsets, meta.generation_id, pid, epoch), tid
            )

        try:
            # Each step is retried for max_block_ms, as Kafka's sendOffsetsToTransaction
            # blocks for it; AddPartitionsToTxn and reads are safe to repeat.
            self._retries.blocking("send_offsets_to_transaction", register)
            self._retries.blocking("send_offsets_to_transaction", commit)
        except TxnTableError as e:
            # Also on a timeout: the offsets may or may not be pending, so the transaction
            # can only be aborted.
            self.fail(e, fatal=isinstance(e, ProducerFencedError))
            raise

    # --- ending a transaction ------------------------------------------------------------

    def retry_unfinished_commit(self) -> bool:
        """Finish a commit whose previous attempt did not finish; whether there was one."""
        self.require_transactional()
        if self.state is C.COMMITTING_TRANSACTION and self._end_retry is not None:
            self._end_retry()  # the previous attempt's outcome was unknown: finish it
            return True
        return False

    def begin_commit(self) -> None:
        """Enter COMMITTING_TRANSACTION (from IN_TRANSACTION only)."""
        self.require("commit a transaction", C.IN_TRANSACTION)
        self.transition(C.COMMITTING_TRANSACTION)

    def short_path_allowed(self) -> bool:
        """Whether the transaction may still commit as one append (CommitOneLog): no batch
        of it was appended (nothing registered) and none failed."""
        return not self._partitions and self._batch_error is None

    def commit(self) -> None:
        """EndTxn(commit) once every batch of the transaction was sent.

        Raises:
            TxnTableError: A batch of the transaction failed (the transaction must be
                aborted), or as :meth:`end_transaction`.
        """
        if self._batch_error is not None:
            self.fail(self._batch_error, fatal=isinstance(self._batch_error, ProducerFencedError))
            raise self._batch_error
        self.end_transaction(commit=True)

    def retry_unfinished_abort(self) -> bool:
        """Finish an abort whose previous attempt did not finish; whether there was one.

        Raises:
            InvalidTxnStateError: A commit did not finish: only retrying it is legal.
        """
        self.require_transactional()
        if self.state is C.ABORTING_TRANSACTION and self._end_retry is not None:
            self._end_retry()  # the previous attempt's outcome was unknown: finish it
            return True
        if self.state is C.COMMITTING_TRANSACTION and self._end_retry is not None:
            # Kafka: after a commit timed out, only retrying the commit is legal. Its
            # decision may have been made: aborting now could report a commit as aborted.
            decided = " (it is decided to commit)" if self._decided else ""
            raise InvalidTxnStateError(
                f"cannot abort: commit_transaction() did not finish{decided}; call "
                "commit_transaction() again to finish it"
            )
        return False

    def begin_abort(self) -> None:
        """Enter ABORTING_TRANSACTION (from IN_TRANSACTION or ABORTABLE_ERROR)."""
        self.require("abort a transaction", C.IN_TRANSACTION, C.ABORTABLE_ERROR)
        self.transition(C.ABORTING_TRANSACTION)

    def end_transaction(self, commit: bool) -> None:
        """EndTxn: decide and write the markers of every registered partition.

        Raises:
            KafkaTimeoutError: The outcome is unknown or the decision is not finished; the
                same call must be made again.
            ProducerFencedError: A newer instance took over.
            TxnTableError: The end was refused before it was decided.
        """
        if not self._partitions:
            if not commit and self._batch_error is not None:
                # Nothing in any log, but a failed batch (or a refused one-log append) took
                # sequences the log never saw: the next batch would be out of order, so
                # move to a new epoch, whose sequences start at 0 (KIP-360).
                self._bump_epoch()
            self._transaction_ended(self.producer_id, self.producer_epoch)
            return
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.producer_epoch
        deadline = self._retries.delivery_deadline()
        try:
            # Transient errors (an unresolved ambiguous write) are retried: EndTxn resumes its
            # own prepared decision, so a retry never decides twice.
            new_pid, new_epoch = self._retries.delivery(
                lambda: self.coordinator.end_transaction(
                    tid, pid, epoch, commit, deadline, self._on_decided
                ),
                remaining_ms(deadline),
            )
        except ProducerFencedError as e:
            self.fail(e, fatal=True)
            raise
        except Exception as e:
            if self._decided is not None and self._decided != commit:
                # It completed the other way (a commit whose decision this producer never
                # saw land, found by the abort): it is over; say how it ended.
                self._end_other_way(tid, pid, epoch)
                raise
            if self._decided is not None or isinstance(e, RETRIABLE):
                # Decided (markers still missing) or outcome unknown (Kafka's commit
                # timeout): only the same call may follow, and it finishes the decision.
                self._end_retry = lambda: self.end_transaction(commit)
                raise self._unfinished(commit, e) from e
            error = InternalError.wrap(e)
            if commit:
                self._end_retry = None
                self.fail(error, fatal=False)
            else:
                # An abort stays ABORTING_TRANSACTION (it never falls back to an abortable
                # error, as in Kafka): calling abort_transaction() again retries it.
                self._end_retry = lambda: self.end_transaction(commit)
            if error is e:
                raise
            raise error from e
        self._transaction_ended(new_pid, new_epoch)

    def registered(self, topic: str) -> bool:
        """Whether the coordinator object lists ``topic`` as this producer last saw it."""
        return topic in self._tables

    def register_table(self, topic: str) -> None:
        """RegisterTable before the first one-log commit of this id to ``topic``, so that
        every later InitProducerId fences the table (nothing once it is registered).

        Raises:
            ProducerFencedError: A newer instance took over.
        """
        if self.registered(topic):
            return
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.producer_epoch
        meta = self._retries.delivery(
            lambda: self.coordinator.register_table(tid, pid, epoch, topic)
        )
        self._tables = frozenset(meta.tables)

    def commit_one_log(
        self, topic: str, items: list[ProducerBatch], pending: tuple[PendingBatch, ...]
    ) -> None:
        """CommitOneLog: one append of the transaction's written segments (``pending``, of
        table ``topic``, registered) and a COMMIT marker per partition. Completes the
        batches; the producer stays under its epoch and its sequences continue.

        Raises:
            KafkaTimeoutError: The outcome is unknown: call ``commit_transaction()`` again,
                which makes the same append (the log recognises it if one landed).
            ProducerFencedError: A newer instance fenced the table (fatal).
            TxnTableError: The append was refused (nothing of it is in the log): the
                transaction can only be aborted.
        """
        self._end_retry = lambda: self._append_one_log(topic, items, pending, again=True)
        self._append_one_log(topic, items, pending, again=False)

    def _append_one_log(
        self,
        topic: str,
        items: list[ProducerBatch],
        pending: tuple[PendingBatch, ...],
        again: bool,
    ) -> None:
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.producer_epoch
        table = self._metadata.table(topic)
        markers = [PendingMarker(b.partition, pid, epoch, "COMMIT") for b in pending]
        deadline = self._retries.delivery_deadline()

        def append() -> list[int]:
            if again:
                # An earlier attempt may have landed and its producer state expired since
                # (the log would take the batches as new): find them by their segments.
                landed = _committed_offsets(table, pending)
                if landed is not None:
                    return landed
            result, _ = table.append(
                list(pending), markers, transactional_id=tid, timeout_ms=remaining_ms(deadline)
            )
            return result.base_offsets

        try:
            offsets = self._retries.delivery(append, remaining_ms(deadline))
        except Exception as e:
            if _outcome_unknown(e):
                # Landed or not, or still to be decided (an intent): only the same append
                # may follow; if one landed, its batches are duplicates and it adds nothing.
                raise self._unfinished(True, e) from e
            error: TxnTableError = InternalError.wrap(e)
            if isinstance(error, ProducerFencedError) and type(error) is not ProducerFencedError:
                # InvalidProducerEpoch: a newer instance's fence is in the log (Kafka's
                # client reports it as ProducerFenced too).
                error = ProducerFencedError(
                    f"transactional id {tid}: producer {pid} epoch {epoch} is fenced on table "
                    f"{topic} ({e})"
                )
            self._end_retry = None
            for batch in items:
                batch.fail(error)
            self.batch_failed(error)  # the segments' sequences are not in the log
            if error is e:
                raise
            raise error from e
        for batch, base in zip(items, offsets, strict=True):
            batch.resolve(base)
        self._transaction_ended(pid, epoch)
        self.finish_stuck_transactions(table)

    def _bump_epoch(self) -> None:
        """BumpEpoch: continue under a new epoch between transactions (KIP-360)."""
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.producer_epoch
        try:
            meta = self._retries.delivery(
                lambda: self.coordinator.bump_epoch(tid, pid, epoch)
            )
        except ProducerFencedError as e:
            self.fail(e, fatal=True)
            raise
        except Exception as e:
            # The abort stays ABORTING_TRANSACTION: calling abort_transaction() again retries.
            self._end_retry = lambda: self.end_transaction(commit=False)
            if isinstance(e, RETRIABLE):
                raise self._unfinished(False, e) from e
            raise
        self.producer_id, self.producer_epoch = meta.producer_id, meta.producer_epoch
        self._sequences.clear()

    def _end_other_way(self, tid: str, pid: int, epoch: int) -> None:
        """Continue after a transaction that completed the other way than asked."""
        loaded = self._retries.delivery(lambda: self.coordinator.load(tid))
        if loaded is not None and TransactionCoordinator.completed_for(loaded[0], pid, epoch):
            self._transaction_ended(loaded[0].producer_id, loaded[0].producer_epoch)

    def _on_decided(self, committed: bool) -> None:
        """The coordinator's Prepare CAS landed (or was found): from now on the transaction
        can only be finished, never ended the other way."""
        self._decided = committed

    def _unfinished(self, commit: bool, error: BaseException) -> KafkaTimeoutError:
        """What ``commit_transaction`` / ``abort_transaction`` raises when its end did not
        finish: the same call must be made again (Kafka's rule after a timeout)."""
        verb = "commit" if commit else "abort"
        if self._decided is None:
            state = f"{verb} outcome unknown"
        else:
            decided = "commit" if self._decided else "abort"
            state = f"the transaction is decided to {decided}, but not finished"
        return KafkaTimeoutError(
            f"{state} ({type(error).__name__}: {error}); call {verb}_transaction() again "
            "to finish it"
        )

    def _transaction_ended(self, producer_id: int, producer_epoch: int) -> None:
        """Continue under the epoch the completed transaction bumped to (KIP-890), with
        sequences from 0; under the same one (a one-log commit, nothing registered), with
        the sequences continuing: the log has the epoch's batches up to them."""
        if (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
            self._sequences.clear()
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._partitions = {}
        self._batch_error = None
        self._end_retry = None
        self._decided = None
        self.transition(C.READY)

    def finish_stuck_transactions(self, table: Table) -> None:
        """Finish other producers' transactions that pin this table's LSO.

        Kafka's coordinator expires and completes transactions itself; here whichever
        client notices first does it: an Ongoing one past its timeout is aborted, a
        prepared one older than the grace period is completed. Each open transaction's
        coordinator object is read once and then not again before its deadline, so this
        costs nothing while no transaction is stuck (see ``StuckTransactionFinisher``).
        """
        if self._finisher is not None:
            self._finisher.check(table.snapshot(refresh=False))

    def close(self) -> None:
        """Release the coordinator's resources."""
        self.coordinator.close()


def _outcome_unknown(error: BaseException) -> bool:
    """Whether a failed append may have landed or may still be decided: a storage error, a
    timeout, a lost race, an unexpected failure. A refusal by the log's rules (fenced, out
    of sequence, an unknown partition, a newer protocol) is definite: nothing of it is in."""
    if isinstance(error, (KafkaTimeoutError, StorageError, CommitConflictError, *RETRIABLE)):
        return True
    return not isinstance(error, TxnTableError)


def _committed_offsets(table: Table, pending: tuple[PendingBatch, ...]) -> list[int] | None:
    """The base offsets of ``pending`` if the table holds every one of them (found by its
    segment), else ``None``. Reads each partition's entries: for a retry only."""
    snap = table.snapshot()
    found: list[int] = []
    for batch in pending:
        entries = snap.partition(batch.partition).entries
        base = next(
            (
                e.baseOffset
                for e in reversed(entries)
                if isinstance(e, Batch) and e.path == batch.path
            ),
            None,
        )
        if base is None:
            return None
        found.append(base)
    return found
