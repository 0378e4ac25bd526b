"""The producer's transaction manager (Kafka's ``TransactionManager``): who the producer is
and where its transaction stands.

It owns the producer id and epoch, the next sequence number of every partition, the client
state machine, the partitions registered with the open transaction and every call to the
transaction coordinator (InitProducerId, AddPartitionsToTxn, offsets, EndTxn and the short
path's one-round commit). The sender asks it for sequences and tells it about failed
batches; the producer's transactional methods delegate to it. It never touches the buffers:
flushing before a transaction ends is the producer's part.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import TypeVar

from txntable.errors import (
    InternalError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    OffsetsUnknownError,
    ProducerFencedError,
    TransientStorageError,
    TxnTableError,
)
from txntable.groups.offsets import check_offset_targets
from txntable.producer.accumulator import ProducerBatch
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.protocol.actions import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Batch
from txntable.protocol.append import AppendResult, PendingBatch
from txntable.protocol.sequencing import OffsetCommitOp
from txntable.structs import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from txntable.table import Table
from txntable.txn.coordinator import MAX_PRODUCER_EPOCH, TransactionCoordinator, TxnMetadata
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
        self.coordinator = TransactionCoordinator(metadata.store, table_provider=metadata.table)
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._sequences: dict[TopicPartition, int] = {}
        #: Partitions registered with the open transaction (AddPartitionsToTxn).
        self._partitions: dict[str, set[int]] = {}
        #: The first failed batch of the open transaction.
        self._batch_error: TxnTableError | None = None
        self._coordinator_cache: tuple[TxnMetadata, str] | None = None
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
        try:
            self.producer_id, self.producer_epoch = self._retries.delivery(
                lambda: self.coordinator.init_producer_id(tid, self.transaction_timeout_ms)
            )
        except (TransientStorageError, OSError) as e:
            raise KafkaTimeoutError(
                f"init_transactions did not finish ({e}); call it again to retry"
            ) from e
        except TxnTableError as e:
            # Not a timeout: the producer cannot become usable (Kafka treats it as fatal).
            self.fail(e, fatal=True)
            raise
        self._sequences.clear()
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
        if self.transactional_id is None:
            return
        new = partitions - self._partitions.get(topic, set())
        if not new:
            return
        self._coordinator_cache = None
        tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
        self._retries.delivery(
            lambda: self.coordinator.add_partitions(tid, pid, epoch, {topic: new}),
            remaining_ms(deadline),
        )
        self._partitions.setdefault(topic, set()).update(new)

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
                self._coordinator_cache = None
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
        """Whether the transaction may still commit in one round: no batch of it was
        appended (nothing registered) and none failed."""
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
            self._transaction_ended(self.producer_id, self.producer_epoch)  # nothing registered
            return
        self._coordinator_cache = None
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

    def commit_short_path(
        self, by_table: dict[str, list[ProducerBatch]], intent: dict[str, tuple[PendingBatch, ...]]
    ) -> None:
        """Commit a transaction whose batches were never appended: a CAS to PrepareCommit
        with ``intent`` (their written segments), one log version per table (data and
        markers together) and a CAS to CompleteCommit. Completes the batches.

        Raises:
            KafkaTimeoutError: Decided or outcome unknown, not finished: call
                ``commit_transaction()`` again.
            TxnTableError: Refused before it was decided (the batches fail with it).
        """
        self._end_retry = lambda: self._finish_short_path(by_table, intent)
        self._end_retry()

    def _finish_short_path(
        self, by_table: dict[str, list[ProducerBatch]], intent: dict[str, tuple[PendingBatch, ...]]
    ) -> None:
        tid = self.transactional_id or ""
        pid, epoch = self.producer_id, self.producer_epoch
        results: dict[str, AppendResult] = {}
        deadline = self._retries.delivery_deadline()
        try:
            done, etag = self._retries.delivery(
                lambda: self.coordinator.commit_short_path(
                    tid,
                    pid,
                    epoch,
                    intent,
                    self._coordinator_cache,
                    results,
                    deadline,
                    self._on_decided,
                ),
                remaining_ms(deadline),
            )
        except Exception as e:
            self._coordinator_cache = None
            if self._decided is not None or isinstance(e, RETRIABLE):
                raise self._unfinished(True, e) from e
            error = InternalError.wrap(e)
            self._end_retry = None
            for items in by_table.values():
                for segment in items:
                    segment.fail(error)
            self.fail(error, fatal=isinstance(error, ProducerFencedError))
            if error is e:
                raise
            raise error from e
        for topic, items in by_table.items():
            table = self._metadata.table(topic)
            appended = results.get(topic)
            if appended is not None:  # our own append: its offsets, without a read
                for segment, base in zip(items, appended.base_offsets, strict=True):
                    segment.resolve(base)
                continue
            for segment, batch in zip(items, intent[topic], strict=True):
                # Another client finished our decision: find the batch it committed.
                found = self._committed_offset(table, segment.partition, batch)
                if found is None:
                    segment.fail(
                        OffsetsUnknownError(
                            f"the transaction committed {batch.count} records to {topic} "
                            f"partition {segment.partition}, completed by another client; "
                            "their offsets are no longer known (merged or expired since)"
                        )
                    )
                else:
                    segment.resolve(found)
        self._coordinator_cache = (done, etag)
        self._transaction_ended(done.producer_id, done.producer_epoch)
        for topic in by_table:
            self.finish_stuck_transactions(self._metadata.table(topic))

    def _committed_offset(self, table: Table, partition: int, batch: PendingBatch) -> int | None:
        """The base offset of a short-path batch another client committed: by its
        sequences in the producer state, else by its segment in the partition's batches
        (the producer state may have expired). ``None`` if neither holds it any more."""
        part = self._retries.delivery(table.snapshot).partition(partition)
        entry = part.producers.get(batch.producer_id)
        if entry is not None:
            meta = entry.find_duplicate(
                batch.producer_epoch, batch.base_sequence, batch.last_sequence
            )
            if meta is not None:
                return meta.base_offset
        for committed in reversed(part.entries):  # rare: only after a completion by another
            if isinstance(committed, Batch) and committed.path == batch.path:
                return committed.baseOffset
        return None

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
        """Continue under the epoch the completed transaction bumped to (KIP-890)."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._sequences.clear()
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
