"""The producer: batching, idempotence and transactions on top of table appends.

Records are accumulated as columns (:mod:`txntable.producer.accumulator`): ``send`` appends to
per-table column lists, ``send_batch`` takes Arrow data as it is. A flush — ``batch_size``
reached, ``linger_ms`` elapsed, a ``send`` waiting for buffer memory, ``flush()`` or
``commit_transaction()`` — seals the lists into Arrow (partitions chosen vectorised),
writes one Parquet segment of at most ``max_request_size`` record bytes per partition and
commits all of a table's segments as one log version; partitions holding more go on in
further rounds. Each batch carries the producer id, epoch and base sequence, so a retried
append is recognised as a duplicate and gets its original offsets back, as with Kafka's
idempotent producer.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from threading import get_ident as _get_ident
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from txntable import config
from txntable.errors import (
    BufferExhaustedError,
    IllegalStateError,
    InternalError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    OffsetsUnknownError,
    ProducerFencedError,
    RecordTooLargeError,
    SerializationError,
    TableNotFoundError,
    TransientStorageError,
    TxnTableError,
    UnknownTopicOrPartitionError,
)
from txntable.groups.offsets import (
    check_offset_targets,
    check_offsets,
    open_group_table,
)
from txntable.layout import new_segment_name
from txntable.maintenance.maintain import AutoMaintenance
from txntable.producer.accumulator import (
    PY_RECORD_OVERHEAD,
    ROW_BOOKKEEPING,
    PartitionQueue,
    ProducerBatch,
    QueuedRows,
    RecordColumns,
    choose_partitions,
    greedy_cuts,
    seal,
    segment_rows,
    timestamp_range,
    typed_columns,
)
from txntable.producer.futures import FutureRecordMetadata, FutureSendBatch, ProduceResult
from txntable.producer.partitioner import StickyPartitioner
from txntable.producer.transaction_manager import ClientTxnState, TransactionManager
from txntable.protocol.actions import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Batch
from txntable.protocol.append import AppendResult, PendingBatch
from txntable.protocol.records import (
    encode_table,
    record_sizes,
    to_record_table,
)
from txntable.protocol.schema import TypedLayout, check_record, typed_record_sizes
from txntable.protocol.sequencing import OffsetCommitOp
from txntable.structs import (
    RECORD_OVERHEAD,
    ConsumerGroupMetadata,
    Header,
    OffsetAndMetadata,
    TopicPartition,
)
from txntable.table import Table
from txntable.txn.coordinator import MAX_PRODUCER_EPOCH, TransactionCoordinator, TxnMetadata
from txntable.txn.recovery import StuckTransactionFinisher
from txntable.util import (
    RETRIABLE,
    deadline_after,
    remaining_ms,
    retry_transient,
    within_timeout,
)
from txntable.warehouse import Warehouse, require_warehouse

_C = ClientTxnState
T = TypeVar("T")
_log = logging.getLogger(__name__)


_BYTES = (bytes, bytearray, memoryview)
_time = time.time
#: Segment puts of one round in flight at once (on object storage this overlaps request
#: latency, on local disk the fsyncs).
_SEGMENT_PUTS = 4


def _return_freed_memory() -> None:
    """Hand memory Arrow freed in this thread back to the OS.

    pyarrow's default allocator (mimalloc) keeps freed pages in per-thread heaps; with a
    sender, writer threads and callers all encoding and copying, that retention alone was
    several times ``buffer_memory``. Cheap (under a microsecond) when nothing is held.
    """
    pa.default_memory_pool().release_unused()


def _check_target(topic: object, partition: object) -> None:
    """Refuse a topic that is not a ``str`` or a partition that is not an ``int`` (or None).

    Raises:
        InvalidArgumentTypeError: Naming the argument.
    """
    if not isinstance(topic, str):
        raise InvalidArgumentTypeError(f"topic must be a str, not {type(topic).__name__}")
    if partition is not None and not config.is_int(partition):
        raise InvalidArgumentTypeError(
            f"partition must be an int or None, not {type(partition).__name__}"
        )


def _as_bytes(name: str, v: object) -> bytes:
    """A key, value or header value that is not ``bytes``: accept bytes-likes, refuse others.

    Raises:
        SerializationError: Not bytes, bytearray or memoryview (Kafka's serializers would).
    """
    if not isinstance(v, _BYTES):
        raise SerializationError(f"{name} must be bytes or None, not {type(v).__name__}")
    return bytes(v)


def _check_headers(headers: Sequence[Header]) -> tuple[tuple[Header, ...], int]:
    """Validated ``(key, value)`` pairs and their record bytes.

    Raises:
        SerializationError: An item that is not a pair, a key that is not a str, or a value
            that is not bytes (or None).
    """
    pairs: list[Header] = []
    size = 0
    for item in headers:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise SerializationError(f"a header must be a (key, value) pair, not {item!r:.80}")
        hk, hv = item
        if not isinstance(hk, str):
            raise SerializationError(f"a header key must be a str, not {type(hk).__name__}")
        if hv is not None and type(hv) is not bytes:
            hv = _as_bytes(f"header {hk!r}", hv)
        pairs.append((hk, hv))
        size += len(hk.encode()) + (len(hv) if hv is not None else 0) + 2
    return tuple(pairs), size


class Producer:
    """Writes records to tables, idempotently and optionally in transactions.

    Args:
        warehouse: The warehouse of the tables.
        transactional_id: Enables transactions; one live producer per id (others are fenced).
        enable_idempotence: Carry producer id and sequences so retries never duplicate
            (Kafka's default, and required for transactions).
        batch_size: Record bytes buffered for one partition (or, before their partitions
            are chosen, for one table) that trigger a flush. It starts a flush, it does not
            cut one: a segment holds what accumulated, up to ``max_request_size``.
        linger_ms: How long a record may wait in the buffer for others to join it.
        buffer_memory: Bytes of this process's memory the buffered records may occupy
            (Python objects, Arrow buffers and encoded segments in flight); ``send`` and
            ``send_batch`` block when it is full.
        max_block_ms: How long ``send`` blocks on a full buffer before raising.
        max_request_size: Largest record accepted, and the most record bytes in one segment.
        transaction_timeout_ms: After this, the transaction may be aborted by others.
        delivery_timeout_ms: How long a flush retries transient storage errors.
        auto_maintenance: After its commits, check (at most once per the table's
            ``maintenance.interval.ms``) whether a table needs merge or retention, and run
            ``Table.maintain`` in a background thread if so (never on the commit path).

    Raises:
        InvalidConfigurationError: An argument has the wrong type or is out of range (see
            :data:`txntable.config.PRODUCER_ARGUMENTS`); the message names it.
        InvalidTableNameError: The transactional id has characters outside
            ``[A-Za-z0-9._-]``.
    """

    def __init__(
        self,
        warehouse: Warehouse,
        transactional_id: str | None = None,
        enable_idempotence: bool = True,
        batch_size: int = config.BATCH_SIZE_DEFAULT,
        linger_ms: int = config.LINGER_MS_DEFAULT,
        buffer_memory: int = config.BUFFER_MEMORY_DEFAULT,
        max_block_ms: int = config.MAX_BLOCK_MS_DEFAULT,
        max_request_size: int = config.MAX_REQUEST_SIZE_DEFAULT,
        transaction_timeout_ms: int = config.TRANSACTION_TIMEOUT_MS_DEFAULT,
        delivery_timeout_ms: int = config.DELIVERY_TIMEOUT_MS_DEFAULT,
        auto_maintenance: bool = True,
    ) -> None:
        require_warehouse(warehouse)
        config.validate_arguments(config.PRODUCER_ARGUMENTS, locals())
        if transactional_id is not None and not enable_idempotence:
            raise InvalidConfigurationError("transactions need enable_idempotence=True")
        self.warehouse = warehouse
        self.store = warehouse.store
        self.transactional_id = transactional_id
        self.enable_idempotence = enable_idempotence
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.max_request_size = max_request_size
        self.transaction_timeout_ms = transaction_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.coordinator = TransactionCoordinator(self.store, table_provider=self._table)
        self.txn = TransactionManager(transactional_id) if transactional_id else None
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._sequences: dict[TopicPartition, int] = {}
        self._txn_partitions: dict[str, set[int]] = {}
        self._txn_error: TxnTableError | None = None
        self._coordinator_cache: tuple[TxnMetadata, str] | None = None
        self._end_retry: Callable[[], None] | None = None
        #: Whether the transaction being ended is decided: True (PrepareCommit), False
        #: (PrepareAbort), None (not known to be).
        self._decided: bool | None = None
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
        self._sender_error: Exception | None = None
        self._groups: dict[str, Table | None] = {}
        self._tables: dict[str, Table] = {}
        self._partitioner = StickyPartitioner()
        self._num_partitions: dict[str, int] = {}
        #: Typed tables sent to: their layouts and per-column value converters.
        self._typed: set[str] = set()
        self._layouts: dict[str, TypedLayout] = {}
        self._converters: dict[str, dict[str, Callable[[Any], Any]]] = {}
        # Records larger than this are refused (they could never be buffered or sent).
        self._record_limit = min(max_request_size, buffer_memory)
        # send() seals a table's column lists once they hold this many record bytes, so
        # most buffered records sit in compact Arrow buffers, not Python objects.
        self._seal_bytes = max(batch_size, min(max_request_size, buffer_memory // 8))
        # send_batch() queues its rows in pieces of this many record bytes, so a call
        # larger than buffer_memory streams instead of being copied whole.
        self._piece_bytes = max(max_request_size, buffer_memory // 4)
        # Lock order: _seal_lock, then _lock or _cond (never both at once).
        self._lock = threading.Lock()  # adding and removing open records (never per record)
        self._seal_lock = threading.Lock()  # one sealer at a time: keeps partitions in order
        self._cond = threading.Condition()  # queues, memory, rounds in flight, flush
        self._open: dict[str, RecordColumns] = {}
        self._sealing: set[ProduceResult] = set()  # under _lock: taken from _open, not queued
        self._queues: dict[TopicPartition, PartitionQueue] = {}
        self._queued_memory = 0  # under _cond: queued and in-flight rows, encoded segments
        self._memory_waiters = 0  # under _cond: callers blocked on a full buffer
        self._sending: list[ProducerBatch] = []  # the round in flight
        self._pool: ThreadPoolExecutor | None = None
        self._maintenance = AutoMaintenance(warehouse.table) if auto_maintenance else None
        self._flush_requested = False
        self._closed = False
        self._exiting = False
        self._sender = threading.Thread(
            target=self._run_sender, name="txntable-sender", daemon=True
        )
        self._sender.start()
        _track(self)

    # --- transactions --------------------------------------------------------------------

    def _require_txn(self) -> TransactionManager:
        if self.txn is None:
            raise InvalidTxnStateError("this producer has no transactional_id")
        return self.txn

    def init_transactions(self) -> None:
        """Register the transactional id: fence older instances and finish their transaction.

        A transaction the previous instance left Ongoing is aborted; one it left prepared
        is completed. The epoch is bumped, so the old instance is fenced everywhere.
        """
        txn = self._require_txn()
        if txn.state is not _C.INITIALIZING:  # INITIALIZING: retrying a timed-out attempt
            txn.transition(_C.INITIALIZING)
        tid = self.transactional_id or ""
        try:
            self.producer_id, self.producer_epoch = self._retry(
                lambda: self.coordinator.init_producer_id(tid, self.transaction_timeout_ms)
            )
        except (TransientStorageError, OSError) as e:
            raise KafkaTimeoutError(
                f"init_transactions did not finish ({e}); call it again to retry"
            ) from e
        except TxnTableError as e:
            # Not a timeout: the producer cannot become usable (Kafka treats it as fatal).
            txn.fail(e, fatal=True)
            raise
        self._sequences.clear()
        txn.transition(_C.READY)

    def begin_transaction(self) -> None:
        """Start a transaction; every ``send`` until commit or abort belongs to it."""
        txn = self._require_txn()
        txn.require("begin a transaction", _C.READY)
        self._txn_partitions = {}
        self._txn_error = None
        txn.transition(_C.IN_TRANSACTION)

    def commit_transaction(self) -> None:
        """Flush, then commit: markers on every partition written, atomically decided.

        Once the commit is decided (the coordinator's PrepareCommit), this call either
        finishes it or raises ``KafkaTimeoutError``, after which the only legal call is
        ``commit_transaction()`` again (``abort_transaction()`` is refused): a decided
        commit is never reported as failed.

        Raises:
            KafkaTimeoutError: The outcome is unknown, or the commit is decided but not
                finished within ``delivery_timeout_ms``; call ``commit_transaction()``
                again to finish it.
            ProducerFencedError: A newer instance took over; nothing of this
                transaction becomes visible.
            TxnTableError: A send of the transaction failed, or the commit was refused
                before it was decided; call ``abort_transaction``.
        """
        txn = self._require_txn()
        if txn.state is _C.COMMITTING_TRANSACTION and self._end_retry is not None:
            self._end_retry()  # the previous attempt's outcome was unknown: finish it
            return
        txn.require("commit a transaction", _C.IN_TRANSACTION)
        txn.transition(_C.COMMITTING_TRANSACTION)
        short = self._take_for_short_path()
        if short is not None:
            self._commit_short_path(short)
            return
        self._wait_all()
        if self._txn_error is not None:
            txn.fail(self._txn_error, fatal=isinstance(self._txn_error, ProducerFencedError))
            raise self._txn_error
        self._end_transaction(commit=True)

    def _take_for_short_path(self) -> dict[str, list[ProducerBatch]] | None:
        """Take the buffers if the whole transaction is still buffered, goes to one table
        and fits one segment per partition, else ``None``.

        One log only: its one version makes data and markers visible at once. Across
        several logs the versions land one after the other, and a transaction whose
        producer dies between them must hold the others' LSO (the normal path's open
        batches do; a short path's data is in no log before its markers).
        """
        self._seal_all()
        with self._cond:
            if self._sending or self._txn_partitions or self._txn_error is not None:
                return None
            queues = sorted((tp, q) for tp, q in self._queues.items() if q.runs)
            if not queues or any(q.record_bytes > self.max_request_size for _, q in queues):
                return None
            if len({tp.topic for tp, _ in queues}) > 1:
                return None
            by_table: dict[str, list[ProducerBatch]] = {}
            for tp, q in queues:
                segment = ProducerBatch(tp.partition, q.take(self.max_request_size))
                by_table.setdefault(tp.topic, []).append(segment)
            self._sending = [s for items in by_table.values() for s in items]
            return by_table

    def _commit_short_path(self, by_table: dict[str, list[ProducerBatch]]) -> None:
        """Commit with P segment PUTs, a CAS to PrepareCommit with the intent, one log version
        per table (data and markers together) and a CAS to CompleteCommit."""
        txn = self._require_txn()
        segments = [s for items in by_table.values() for s in items]
        try:
            deadline = deadline_after(self.delivery_timeout_ms)
            intent = {
                t: tuple(self._write_segments(t, items, deadline)) for t, items in by_table.items()
            }
        except Exception as e:
            error = InternalError.wrap(e)
            for segment in segments:
                segment.fail(error)
            txn.fail(error, fatal=isinstance(error, ProducerFencedError))
            if error is e:
                raise
            raise error from e
        except BaseException as e:
            for segment in segments:
                segment.fail(e)
            raise
        finally:
            self._round_done(segments)
        self._end_retry = lambda: self._finish_short_path(by_table, intent)
        self._end_retry()

    def _finish_short_path(
        self, by_table: dict[str, list[ProducerBatch]], intent: dict[str, tuple[PendingBatch, ...]]
    ) -> None:
        txn = self._require_txn()
        tid = self.transactional_id or ""
        pid, epoch = self.producer_id, self.producer_epoch
        results: dict[str, AppendResult] = {}
        deadline = deadline_after(self.delivery_timeout_ms)
        try:
            done, etag = self._retry(
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
            txn.fail(error, fatal=isinstance(error, ProducerFencedError))
            if error is e:
                raise
            raise error from e
        for topic, items in by_table.items():
            table = self._table(topic)
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
            self._finish_stuck_transactions(self._table(topic))

    def _committed_offset(self, table: Table, partition: int, batch: PendingBatch) -> int | None:
        """The base offset of a short-path batch another client committed: by its
        sequences in the producer state, else by its segment in the partition's batches
        (the producer state may have expired). ``None`` if neither holds it any more."""
        part = self._retry(table.snapshot).partition(partition)
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
        loaded = self._retry(lambda: self.coordinator.load(tid))
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
        self._txn_partitions = {}
        self._txn_error = None
        self._end_retry = None
        self._decided = None
        self._require_txn().transition(_C.READY)

    def abort_transaction(self) -> None:
        """Abort: drop unsent records, then write ABORT markers where data was committed."""
        txn = self._require_txn()
        if txn.state is _C.ABORTING_TRANSACTION and self._end_retry is not None:
            self._end_retry()  # the previous attempt's outcome was unknown: finish it
            return
        if txn.state is _C.COMMITTING_TRANSACTION and self._end_retry is not None:
            # Kafka: after a commit timed out, only retrying the commit is legal. Its
            # decision may have been made: aborting now could report a commit as aborted.
            decided = " (it is decided to commit)" if self._decided else ""
            raise InvalidTxnStateError(
                f"cannot abort: commit_transaction() did not finish{decided}; call "
                "commit_transaction() again to finish it"
            )
        txn.require("abort a transaction", _C.IN_TRANSACTION, _C.ABORTABLE_ERROR)
        txn.transition(_C.ABORTING_TRANSACTION)
        self._drop_buffered(InvalidTxnStateError("transaction aborted before send"))
        self._wait_all()
        self._end_transaction(commit=False)

    def send_offsets_to_transaction(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Make the group's offsets part of the transaction (consume-transform-produce).

        The offsets become the group's committed offsets only with the COMMIT marker; after
        an abort, or if this producer is fenced, they never become visible.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``max_block_ms``; the transaction
                must be aborted.
            ProducerFencedError: The producer was fenced.
            InvalidConfigurationError: ``group_metadata`` comes from a consumer that
                auto-commits (nothing is sent; the transaction is unaffected).
            UnknownTopicOrPartitionError: A table or partition that does not exist; nothing
                is sent and the transaction goes on.
        """
        txn = self._require_txn()
        offsets = check_offsets(offsets)  # before anything: a wrong type fails no transaction
        if isinstance(group_metadata, str):
            meta = ConsumerGroupMetadata(group_metadata)
        elif isinstance(group_metadata, ConsumerGroupMetadata):
            meta = group_metadata
        else:
            raise InvalidArgumentTypeError(
                "group_metadata must be a ConsumerGroupMetadata (consumer.group_metadata()) or "
                f"a group id, not {type(group_metadata).__name__}"
            )
        if meta.auto_commit:
            # Its plain commits of positions would move the group past records whose
            # transaction may still abort: exactly-once needs auto-commit off (Kafka too).
            raise InvalidConfigurationError(
                f"the consumer of group {meta.group_id} auto-commits its positions: create it "
                "with enable_auto_commit=False to commit its offsets in transactions"
            )
        txn.require("send offsets to a transaction", _C.IN_TRANSACTION)
        check_offset_targets(meta.group_id, offsets, self._offset_partition_count)
        assert self.transactional_id is not None
        tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch

        def group_table() -> Table:
            table = self._groups.get(meta.group_id)
            if table is None:
                table = open_group_table(self.store, meta.group_id)
                assert table is not None
                self._groups[meta.group_id] = table
            return table

        def register() -> None:
            name = group_table().name
            if 0 not in self._txn_partitions.get(name, set()):
                self._coordinator_cache = None
                self.coordinator.add_partitions(tid, pid, epoch, {name: {0}})
                self._txn_partitions.setdefault(name, set()).add(0)

        def commit() -> None:
            # A retry after an unresolved ambiguous commit may write the same pending
            # offsets twice: the later one wins, with the same values.
            group_table().submit(
                OffsetCommitOp.of(meta.group_id, offsets, meta.generation_id, pid, epoch), tid
            )

        try:
            # Each step is retried for max_block_ms, as Kafka's sendOffsetsToTransaction
            # blocks for it; AddPartitionsToTxn and reads are safe to repeat.
            self._blocking("send_offsets_to_transaction", register)
            self._blocking("send_offsets_to_transaction", commit)
        except TxnTableError as e:
            # Also on a timeout: the offsets may or may not be pending, so the transaction
            # can only be aborted.
            txn.fail(e, fatal=isinstance(e, ProducerFencedError))
            raise

    def _end_transaction(self, commit: bool) -> None:
        txn = self._require_txn()
        if not self._txn_partitions:
            self._transaction_ended(self.producer_id, self.producer_epoch)  # nothing registered
            return
        self._coordinator_cache = None
        tid, pid, epoch = self.transactional_id or "", self.producer_id, self.producer_epoch
        deadline = deadline_after(self.delivery_timeout_ms)
        try:
            # Transient errors (an unresolved ambiguous write) are retried: EndTxn resumes its
            # own prepared decision, so a retry never decides twice.
            new_pid, new_epoch = self._retry(
                lambda: self.coordinator.end_transaction(
                    tid, pid, epoch, commit, deadline, self._on_decided
                ),
                remaining_ms(deadline),
            )
        except ProducerFencedError as e:
            txn.fail(e, fatal=True)
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
                self._end_retry = lambda: self._end_transaction(commit)
                raise self._unfinished(commit, e) from e
            error = InternalError.wrap(e)
            if commit:
                self._end_retry = None
                txn.fail(error, fatal=False)
            else:
                # An abort stays ABORTING_TRANSACTION (it never falls back to an abortable
                # error, as in Kafka): calling abort_transaction() again retries it.
                self._end_retry = lambda: self._end_transaction(commit)
            if error is e:
                raise
            raise error from e
        self._transaction_ended(new_pid, new_epoch)

    # --- sending -------------------------------------------------------------------------

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self.warehouse.table(name)
            table.snapshot()
            self._tables[name] = table  # only once loaded: a failed load is tried again
        return table

    def _too_large(self, size: int, prefix: str = "", suffix: str = "") -> RecordTooLargeError:
        if size > self.max_request_size:
            limit = f"max_request_size {self.max_request_size}"
        else:
            limit = f"the whole buffer: buffer_memory is {self.buffer_memory}"
        return RecordTooLargeError(f"{prefix}record of {size} bytes is larger than {limit}{suffix}")

    def _partition_count(self, topic: str) -> int:
        n = self._num_partitions.get(topic)
        if n is None:
            table = self._tables.get(topic) or self._blocking(
                f"loading table {topic}", lambda: self._table(topic)
            )
            layout = table.layout
            if layout is not None:
                self._converters[topic] = layout.converters()
                self._layouts[topic] = layout
                self._typed.add(topic)
            n = self._num_partitions[topic] = table.num_partitions
        return n

    def _offset_partition_count(self, topic: str) -> int | None:
        """A table's partition count for an offset commit, ``None`` if there is no such
        table."""
        try:
            return self._partition_count(topic)
        except TableNotFoundError:
            return None

    def _check_usable(self) -> None:
        if self._closed:
            raise IllegalStateError("cannot send after the producer is closed")
        if self._sender_error is not None:
            raise IllegalStateError(
                f"producer sender failed: {self._sender_error!r}"
            ) from self._sender_error

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | None = None,
        timestamp: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Buffer a record for ``topic``; the future completes when its batch is committed.

        With no ``partition``, the partition is chosen when the buffered records are sealed
        (vectorised murmur2 of the key as Kafka's Java client; the sticky partition for a
        null key), and reported by the future. ``timestamp_ms`` is kafka-python's name of
        ``timestamp`` (give one of them; kafka-python's positional order differs after
        ``key``: pass ``headers``, ``partition`` and the timestamp by name).

        Raises:
            SerializationError: Key, value, a header or the timestamp has the wrong type.
            RecordTooLargeError: The record is larger than ``max_request_size``.
            BufferExhaustedError: The buffer stayed full for ``max_block_ms``.
            UnknownTopicOrPartitionError: ``partition`` is outside the table.
            InvalidArgumentTypeError: ``topic`` is not a str or ``partition`` not an int.
            KafkaTimeoutError: The table's first load kept failing for ``max_block_ms``.
            InvalidTxnStateError: A transactional producer is not in a transaction.
            ProducerFencedError: The producer was fenced.
        """
        # The per-record path: validation, one tuple appended without a lock, and a handle.
        # Partitioning, Arrow conversion, futures and memory accounting are per batch.
        if timestamp_ms is not None:
            if timestamp is not None:
                raise InvalidArgumentTypeError("give timestamp or timestamp_ms, not both")
            timestamp = timestamp_ms
        if self._closed or self._sender_error is not None:
            self._check_usable()
        txn = self.txn
        if txn is not None and txn.state is not _C.IN_TRANSACTION:
            txn.require("send", _C.IN_TRANSACTION)
        size = RECORD_OVERHEAD
        if value is not None:
            if value.__class__ is not bytes:
                if isinstance(value, Mapping):
                    return self._send_typed(topic, value, key, partition, headers, timestamp)
                value = _as_bytes("value", value)
            size += len(value)
        if key is not None:
            if key.__class__ is not bytes:
                key = _as_bytes("key", key)
            size += len(key)
        pairs: tuple[Header, ...] = ()
        if headers:
            pairs, header_bytes = _check_headers(headers)
            size += header_bytes
        if timestamp is None:
            timestamp = int(_time() * 1000)
        elif timestamp.__class__ is not int or timestamp < 0:
            raise SerializationError("timestamp must be a non-negative int of milliseconds")
        if topic.__class__ is not str or (partition is not None and partition.__class__ is not int):
            _check_target(topic, partition)
        if size > self._record_limit:
            raise self._too_large(size)
        num_partitions = self._num_partitions.get(topic) or self._partition_count(topic)
        if topic in self._typed:
            raise SerializationError(
                f"table {topic} has a record schema: send its record as a dict of columns"
            )
        if partition is None:
            partition = -1
        elif not 0 <= partition < num_partitions:
            raise UnknownTopicOrPartitionError(f"table {topic} has no partition {partition}")
        row_memory = size + PY_RECORD_OVERHEAD
        ident = _get_ident()
        while True:
            columns = self._open.get(topic)
            if columns is None or columns.budget < row_memory:
                columns = self._make_room(topic, row_memory)
            # No lock: this thread appends to its own lists, and a sealer closes the
            # object, then waits until ``inside`` is empty (each step is atomic).
            inside = columns.inside
            inside.append(None)
            if columns.closed:  # sealed meanwhile: append to the table's next object
                inside.pop()
                continue
            mine = columns.threads.get(ident) or columns.for_thread(ident)
            index = len(mine.keys)
            mine.keys.append(key)
            mine.values.append(value)
            mine.timestamps.append(timestamp)
            mine.partitions.append(partition)
            if pairs:
                mine.headers[index] = pairs
            mine.record_bytes += size
            buffered = mine.record_bytes
            columns.budget -= row_memory  # approximate if threads race; renewed when spent
            inside.pop()
            break
        if mine.slot:
            index |= mine.slot << 32
        if buffered >= self._seal_bytes:
            self._seal(topic)
        if index == 0 or (buffered >= self.batch_size > buffered - size):
            with self._cond:  # a new linger deadline, or a full batch: wake the sender
                self._cond.notify_all()
        return FutureRecordMetadata(columns.result, index)

    def _send_typed(
        self,
        topic: str,
        value: Mapping[str, Any],
        key: object,
        partition: int | None,
        headers: object,
        timestamp: int | None,
    ) -> FutureRecordMetadata:
        """``send`` of a record of a typed table: a dict of its columns, checked now.

        Raises:
            SerializationError: The table is not typed, ``key`` or ``headers`` were given
                (a typed record's key is its key columns; it has no headers), a column is
                unknown (after reloading the table's schema once), missing though not null,
                or holds a value of the wrong type.
        """
        if key is not None or headers:
            raise SerializationError(
                "a typed table's record has no key or headers argument: its key is its key "
                "columns"
            )
        if timestamp is None:
            timestamp = int(_time() * 1000)
        elif timestamp.__class__ is not int or timestamp < 0:
            raise SerializationError("timestamp must be a non-negative int of milliseconds")
        if topic.__class__ is not str or (partition is not None and partition.__class__ is not int):
            _check_target(topic, partition)
        num_partitions = self._num_partitions.get(topic) or self._partition_count(topic)
        layout = self._layouts.get(topic)
        if layout is None:
            raise SerializationError(
                f"table {topic} has Kafka's record: value must be bytes, not {type(value).__name__}"
            )
        try:
            record, size = check_record(value, layout, self._converters[topic])
        except SerializationError:
            if not self._reload_layout(topic):
                raise
            return self._send_typed(topic, value, key, partition, headers, timestamp)
        size += RECORD_OVERHEAD
        if size > self._record_limit:
            raise self._too_large(size)
        if partition is None:
            partition = -1
        elif not 0 <= partition < num_partitions:
            raise UnknownTopicOrPartitionError(f"table {topic} has no partition {partition}")
        row_memory = size + PY_RECORD_OVERHEAD
        ident = _get_ident()
        while True:  # as send(): lock-free appends to this thread's lists
            columns = self._open.get(topic)
            if columns is None or columns.budget < row_memory:
                columns = self._make_room(topic, row_memory)
            inside = columns.inside
            inside.append(None)
            if columns.closed:
                inside.pop()
                continue
            mine = columns.threads.get(ident) or columns.for_thread(ident)
            index = len(mine.keys)
            mine.keys.append(None)  # computed from the key columns when sealed
            mine.values.append(record)  # type: ignore[arg-type]
            mine.timestamps.append(timestamp)
            mine.partitions.append(partition)
            mine.record_bytes += size
            buffered = mine.record_bytes
            columns.budget -= row_memory
            inside.pop()
            break
        if mine.slot:
            index |= mine.slot << 32
        if buffered >= self._seal_bytes:
            self._seal(topic)
        if index == 0 or (buffered >= self.batch_size > buffered - size):
            with self._cond:
                self._cond.notify_all()
        return FutureRecordMetadata(columns.result, index)

    def _reload_layout(self, topic: str) -> bool:
        """Reload a typed table's schema (another client may have evolved it); records
        buffered under the older one are sealed first. Whether it changed."""
        table = self._table(topic)
        self._blocking(f"loading table {topic}", table.snapshot)
        layout = table.layout
        if layout is None or layout == self._layouts.get(topic):
            return False
        self._seal(topic)
        self._converters[topic] = layout.converters()
        self._layouts[topic] = layout
        return True

    def _keys(self, topic: str, rows: pa.Table) -> pa.ChunkedArray:
        """The partitioner's keys of segment rows (a typed table's come from its key
        columns)."""
        layout = self._layouts.get(topic)
        return rows.column("key") if layout is None else layout.keys(rows)

    def send_batch(
        self, topic: str, data: object, partition: int | None = None
    ) -> FutureSendBatch:
        """Buffer many records at once, given as columns; the future completes when all are
        committed.

        ``data`` is a ``pyarrow.Table`` or ``RecordBatch``, or anything ``pyarrow.table()``
        accepts (a pandas DataFrame, a dict of columns), with a binary ``value`` column and
        optional ``key`` (binary), ``headers`` (list of ``{key: string, value: binary}``)
        and ``timestamp`` (timestamp, or int milliseconds; null or absent: now) columns.
        Rows are partitioned as ``send`` partitions records (``partition`` puts them all in
        one), keep their order within each partition, and are written idempotently in
        segments of at most ``max_request_size`` record bytes, inside the current
        transaction if there is one. No Python work is done per row.

        A call larger than a quarter of ``buffer_memory`` is queued in pieces, waiting for
        memory between them. If the buffer then stays full for ``max_block_ms``, the rows
        not queued yet fail with ``BufferExhaustedError`` (the queued ones are still sent;
        a transaction that got only part of the rows must be aborted).

        Returns:
            A future whose result is a :class:`~txntable.producer.futures.SendBatchResult`: the
            offset range of each committed segment and every row's partition and offset.

        Raises:
            SerializationError: A column is missing, unknown or of the wrong type (named in
                the message); nothing is buffered.
            RecordTooLargeError: A row is larger than ``max_request_size``; nothing is
                buffered.
            BufferExhaustedError: The buffer stayed full for ``max_block_ms``.
            UnknownTopicOrPartitionError: ``partition`` is outside the table.
            InvalidArgumentTypeError: ``topic`` is not a str or ``partition`` not an int.
            InvalidTxnStateError: A transactional producer is not in a transaction.
        """
        self._check_usable()
        if self.txn is not None:
            self.txn.require("send", _C.IN_TRANSACTION)
        _check_target(topic, partition)
        num_partitions = self._partition_count(topic)
        layout = self._layouts.get(topic)
        if layout is None:
            table = to_record_table(data, int(_time() * 1000))
            sizes = record_sizes(table)
        else:
            try:
                table = layout.conform(data, int(_time() * 1000))
            except SerializationError:
                if not self._reload_layout(topic):
                    raise
                return self.send_batch(topic, data, partition)
            sizes = typed_record_sizes(table)
        if partition is not None and not 0 <= partition < num_partitions:
            raise UnknownTopicOrPartitionError(f"table {topic} has no partition {partition}")
        n = table.num_rows
        result = ProduceResult(topic)
        result.start(n, np.asarray(table.column("timestamp").cast(pa.int64())))
        if n and int(sizes.max()) > self._record_limit:
            row = int(np.argmax(sizes))
            raise self._too_large(int(sizes[row]), f"row {row}: ", "; nothing was sent")
        start = 0
        for stop in greedy_cuts(sizes, self._piece_bytes):
            piece = table.slice(start, stop - start)
            copies = 1 if partition is None else 0  # sorting rows by partition copies them
            estimate = piece.nbytes * (1 + copies) + (stop - start) * ROW_BOOKKEEPING
            try:
                self._wait_for_memory(topic, estimate, reserve=True)
                self._queue_rows(
                    topic, piece, sizes[start:stop], partition, result, start, estimate
                )
            except Exception as e:
                error = InternalError.wrap(e)
                result.fail(n - start, error)
                if start and self.txn is not None:
                    self.txn.fail(error, fatal=False)  # half a batch must not be committed
                if error is e:
                    raise
                raise error from e
            _return_freed_memory()
            start = stop
        return FutureSendBatch(result)

    def _queue_rows(
        self,
        topic: str,
        rows: pa.Table,
        sizes: np.ndarray,
        partition: int | None,
        result: ProduceResult,
        first_row: int,
        reserved: int,
    ) -> None:
        """Partition and queue rows of ``send_batch`` whose memory was reserved."""
        with self._seal_lock:
            self._seal_locked(topic)  # records sent before this call stay ahead of it
            explicit = None if partition is None else np.full(len(sizes), partition, np.int32)
            try:
                partitions = choose_partitions(
                    self._keys(topic, rows),
                    explicit,
                    sizes,
                    topic,
                    self._partition_count(topic),
                    self._partitioner,
                    self.max_request_size,
                )
                runs = seal(rows, sizes, partitions, result, first_row)
            except BaseException:
                self._release(reserved)
                raise
            self._enqueue(topic, runs, reserved)

    def _enqueue(self, topic: str, runs: list[tuple[int, QueuedRows]], reserved: int) -> None:
        """Queue sealed runs; their memory replaces ``reserved`` bytes of reservation."""
        with self._cond:
            for partition, run in runs:
                tp = TopicPartition(topic, partition)
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = PartitionQueue()
                queue.push(run)
            self._queued_memory += sum(run.memory for _, run in runs) - reserved
            self._cond.notify_all()

    def _open_memory(self) -> int:
        return sum(c.memory for c in tuple(self._open.values()))

    def _free_memory(self) -> int:
        return self.buffer_memory - self._open_memory() - self._queued_memory

    def _make_room(self, topic: str, memory: int) -> RecordColumns:
        """``send``'s slow path: no open records for the table, or their budget is spent.

        Waits for buffer memory and gives the table's open records a new budget (the memory
        free now), so ``send`` compares one number per record instead of summing the buffer.
        """
        self._wait_for_memory(topic, memory, reserve=False)
        with self._lock:
            columns = self._open.get(topic)
            if columns is None:
                columns = self._open[topic] = RecordColumns(topic, 0)
            columns.budget = max(self._free_memory(), memory)
            return columns

    def _wait_for_memory(self, topic: str, memory: int, reserve: bool) -> None:
        """Block until ``memory`` more bytes fit in ``buffer_memory`` (and reserve them).

        Raises:
            BufferExhaustedError: They did not fit within ``max_block_ms``.
        """
        deadline = time.monotonic() + self.max_block_ms / 1000
        if topic in self._open and self._free_memory() < memory:
            self._seal(topic)  # Arrow holds the waiting records in less memory
        with self._cond:
            # Something must be buffered to wait for; a reservation larger than the whole
            # buffer goes ahead alone rather than never.
            # While someone waits, the sender sends what is buffered at once, whatever
            # batch_size and linger_ms say (Kafka's accumulator counts an exhausted buffer
            # as ready): else a buffer full of lingering records frees nothing.
            self._memory_waiters += 1
            try:
                while (used := self._open_memory() + self._queued_memory) + memory > (
                    self.buffer_memory
                ) and used > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BufferExhaustedError(
                            f"failed to allocate {memory} bytes within "
                            f"max_block_ms={self.max_block_ms}"
                        )
                    self._cond.notify_all()  # the sender, waiting for a linger deadline
                    self._cond.wait(remaining)
            finally:
                self._memory_waiters -= 1
            if reserve:
                self._queued_memory += memory

    def _release(self, memory: int) -> None:
        with self._cond:
            self._queued_memory -= memory
            self._cond.notify_all()

    def _seal(self, topic: str) -> None:
        with self._seal_lock:
            self._seal_locked(topic)

    def _seal_all(self) -> None:
        with self._seal_lock:
            for topic in list(self._open):
                self._seal_locked(topic)

    def _seal_locked(self, topic: str) -> None:
        """Turn ``topic``'s column lists into queued Arrow runs (holding ``_seal_lock``)."""
        with self._lock:
            columns = self._open.pop(topic, None)
            if columns is None:
                return
            self._sealing.add(columns.result)  # flush() waits for it meanwhile
        try:
            self._seal_columns(topic, columns)
        finally:
            with self._lock:
                self._sealing.discard(columns.result)

    def _seal_columns(self, topic: str, columns: RecordColumns) -> None:
        columns.close()
        # The rows stay counted (as a reservation) until their Arrow copy replaces them.
        with self._cond:
            self._queued_memory += columns.memory
        n = len(columns)
        result = columns.result
        try:
            layout = self._layouts.get(topic)
            if layout is None:
                table, timestamps, explicit, bases = columns.columns()
                sizes = record_sizes(table)
            else:
                try:
                    table, timestamps, explicit, bases = typed_columns(columns, layout)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    # A value send() let through that does not convert after all.
                    raise SerializationError(f"a record of table {topic}: {e}") from e
                sizes = typed_record_sizes(table)
            result.bases = bases
            partitions = choose_partitions(
                self._keys(topic, table),
                explicit if (explicit >= 0).any() else None,
                sizes,
                topic,
                self._partition_count(topic),
                self._partitioner,
                self.max_request_size,
            )
            result.start(n, timestamps)
            runs = seal(table, sizes, partitions, result, 0)
        except Exception as e:
            # Sealing runs in whichever thread fills the buffer: the batch's records fail
            # (their futures hold the error) and the producer goes on with the next batch.
            error = InternalError.wrap(e)
            if error is not e:
                _log.error("sealing a batch of %s failed", topic, exc_info=e)
            self._fail_columns(columns, error)
            self._on_send_error(error, sequenced=False)
            return
        except BaseException as e:
            self._fail_columns(columns, e)
            raise
        self._enqueue(topic, runs, columns.memory)  # the lists are freed with ``columns``
        _return_freed_memory()

    def _fail_columns(self, columns: RecordColumns, error: BaseException) -> None:
        n = len(columns)
        if not columns.result.started:
            columns.result.start(n, np.zeros(n, np.int64))
        columns.result.fail(n, error)
        self._release(columns.memory)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait until it is committed (or failed).

        Args:
            timeout: Seconds to wait at most (kafka-python's argument); ``None``: no limit.

        Raises:
            KafkaTimeoutError: Records were still in flight after ``timeout`` seconds (they
                stay buffered and are still sent).
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
        ):
            raise InvalidArgumentTypeError(f"timeout must be seconds >= 0, not {timeout!r:.40}")
        if not self._wait_all(timeout):
            raise KafkaTimeoutError(f"flush: records still in flight after {timeout} s")

    def _pending_results(self) -> set[ProduceResult]:
        with self._lock:
            pending = {c.result for c in self._open.values()} | self._sealing
        with self._cond:
            for queue in self._queues.values():
                pending.update(run.result for run in queue.runs)
            for segment in self._sending:
                pending.update(segment.results())
        return pending

    def _wait_all(self, timeout: float | None = None) -> bool:
        """Wait for every buffered record; whether all were done within ``timeout``."""
        pending = self._pending_results()
        if not pending:
            return True
        with self._cond:
            # Only buffered records need the flag (the sender clears it when it drains);
            # set with nothing buffered, it outlived this call and the next record was sent
            # at once, ignoring linger_ms.
            if self._open or self._sealing or any(q.runs for q in self._queues.values()):
                self._flush_requested = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in pending:  # an error is the future's; transactional errors kept apart
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not result.wait(left):
                return False
        return True

    def _drop_buffered(self, error: TxnTableError) -> None:
        with self._seal_lock:
            with self._lock:
                opened, self._open = self._open, {}
            with self._cond:
                runs = [run for q in self._queues.values() for run in q.runs]
                self._queues = {}
                self._queued_memory -= sum(run.memory for run in runs)
                self._cond.notify_all()
        for columns in opened.values():
            columns.close()
            columns.result.start(len(columns), np.zeros(len(columns), np.int64))
            columns.result.fail(len(columns), error)
        for run in runs:
            run.result.fail(len(run.rows), error)

    def close(self, timeout: float | None = None) -> None:
        """Abort an incomplete transaction, flush what is buffered and stop the sender.

        As Kafka's producer does on a graceful close ("Aborting incomplete transaction due
        to shutdown"), so a closed producer never leaves a transaction pinning the LSO
        until its timeout. A commit that did not finish (``commit_transaction`` raised a
        timeout) is finished instead: it may be decided. Ending the transaction is tried
        once; if it fails, that is logged and the producer closes all the same (whatever
        was decided is finished by ``recover()``, a reader or writer of its tables after
        the grace period, or maintenance; an undecided one is aborted at its timeout).
        """
        if self._closed:
            return
        if self.txn is not None:
            self._end_on_close(self.txn)
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._sender.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        # A producer committing rounds for other writers hands that over now.
        for table in [*self._tables.values(), *(t for t in self._groups.values() if t)]:
            table.close()
        self.coordinator.close()
        _LIVE.discard(self)

    def _end_on_close(self, txn: TransactionManager) -> None:
        state = txn.state
        try:
            if state is _C.COMMITTING_TRANSACTION and self._end_retry is not None:
                self.commit_transaction()  # finish it: it may be decided
            elif state in (_C.IN_TRANSACTION, _C.ABORTABLE_ERROR) or (
                state is _C.ABORTING_TRANSACTION and self._end_retry is not None
            ):
                self.abort_transaction()
        except ProducerFencedError as e:
            # A newer instance owns the id and has ended this transaction already.
            _log.info("not ending the transaction on close: %s", e)
        except TxnTableError as e:
            decided = {True: "decided to commit", False: "decided to abort", None: "open"}
            _log.warning(
                "producer %s closes with its transaction %s and not finished (%s): "
                "recover(), a reader or writer of its tables, or its timeout finishes it",
                self.transactional_id,
                decided[self._decided],
                e,
            )
            self._drop_buffered(IllegalStateError("the producer was closed"))

    def _stop_at_exit(self) -> None:
        """Stop the sender at interpreter exit, before pyarrow finalizes its S3 client.

        A producer nobody closed is treated as if its process had died, not as a graceful
        close: nothing more is written, buffered records fail with ``IllegalStateError``, an
        open transaction is left to its timeout, and the batch being written gets no retry
        after its current attempt.
        """
        with self._cond:
            if self._closed:
                return
            unsent = sum(len(c) for c in self._open.values()) + sum(
                len(run.rows) for q in self._queues.values() for run in q.runs
            )
            self._exiting = self._closed = True
        self._drop_buffered(
            IllegalStateError("the producer was not closed before the interpreter exited")
        )
        self._sender.join(EXIT_JOIN_TIMEOUT_S)
        state = self.txn.state if self.txn is not None else None
        unfinished = state not in (None, _C.UNINITIALIZED, _C.READY, _C.FATAL_ERROR)
        decided = {True: ", decided to commit", False: ", decided to abort", None: ""}
        if unsent or unfinished:
            _log.warning(
                "txntable producer %s was not closed before exit: %d buffered records were "
                "not sent%s",
                self.transactional_id or hex(id(self)),
                unsent,
                f"; its transaction was left {state.value}{decided[self._decided]} "
                "(recover() or its timeout finishes it)"
                if unfinished and state is not None
                else "",
            )

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the sender ----------------------------------------------------------------------

    def _has_buffered(self) -> bool:
        return bool(self._open or self._sealing) or any(q.runs for q in self._queues.values())

    def _ready(self, now: float) -> tuple[bool, float | None]:
        opened = tuple(self._open.values())
        queues = [q for q in self._queues.values() if q.runs]
        if not opened and not queues:
            return False, None
        if self._flush_requested or self._closed or self._memory_waiters:
            return True, None
        if any(c.record_bytes >= self.batch_size for c in opened) or any(
            q.record_bytes >= self.batch_size for q in queues
        ):
            return True, None
        oldest = min([c.created for c in opened] + [q.created for q in queues])
        due = oldest + self.linger_ms / 1000
        return now >= due, max(due - now, 0.0)

    def _run_sender(self) -> None:
        while True:
            with self._cond:
                while True:
                    ready, wait = self._ready(time.monotonic())
                    if ready:
                        break
                    if self._closed and not self._has_buffered():
                        return
                    if not self._has_buffered():
                        self._flush_requested = False
                    self._cond.wait(wait)
            try:
                self._seal_all()
            except Exception as e:  # noqa: BLE001 - a batch's failure is its futures'; this
                self._on_unexpected_error(e)  # is the sender's own machinery failing
            with self._cond:
                segments = self._take_round()
                if not self._has_buffered():
                    self._flush_requested = False
            if segments:
                try:
                    self._send(segments)
                finally:
                    self._round_done([s for items in segments.values() for s in items])

    def _take_round(self) -> dict[str, list[ProducerBatch]]:
        """Dequeue one segment's worth per partition (holding ``_cond``)."""
        by_table: dict[str, list[ProducerBatch]] = {}
        for tp in sorted(self._queues):
            queue = self._queues[tp]
            if queue.runs:
                segment = ProducerBatch(tp.partition, queue.take(self.max_request_size))
                by_table.setdefault(tp.topic, []).append(segment)
        self._sending = [s for items in by_table.values() for s in items]
        return by_table

    def _round_done(self, segments: list[ProducerBatch]) -> None:
        _return_freed_memory()
        with self._cond:
            self._queued_memory -= sum(s.memory for s in segments)
            self._sending = []
            self._cond.notify_all()

    def _ensure_producer_id(self) -> None:
        if self.enable_idempotence and self.producer_id == NO_PRODUCER_ID:
            self.producer_id = self.coordinator.allocator.allocate()
            self.producer_epoch = 0

    def _send(self, by_table: dict[str, list[ProducerBatch]]) -> None:
        for topic, segments in by_table.items():
            try:
                self._send_table(topic, segments)
            except Exception as e:  # noqa: BLE001 - a bug fails this batch, not the sender
                if isinstance(e, RETRIABLE):
                    # Kafka's batch expiry: the outcome is unknown, the time is up.
                    error: TxnTableError = KafkaTimeoutError(
                        f"batch of {topic} not committed within delivery_timeout_ms="
                        f"{self.delivery_timeout_ms} (outcome unknown: {e})"
                    )
                    error.__cause__ = e
                else:
                    error = InternalError.wrap(e)
                    if error is not e:
                        _log.error("sending a batch of %s failed", topic, exc_info=e)
                # The producer's state first: a caller woken by a failed future sees it.
                self._on_send_error(error)
                for segment in segments:
                    if not segment.settled:
                        segment.fail(error)

    def _on_unexpected_error(self, e: Exception) -> None:
        # Unexpected (a bug or an unmapped library error): fail every later call, rather
        # than let the sender thread die and sends hang.
        _log.error("producer sender failed", exc_info=e)
        self._sender_error = e
        if self.txn is not None:
            self.txn.fail(IllegalStateError(f"producer sender failed: {e!r}"), fatal=True)

    def _on_send_error(self, error: TxnTableError, sequenced: bool = True) -> None:
        """A batch failed: a transaction can only be aborted now; an idempotent producer
        whose batch took sequence numbers (``sequenced``) continues under a new epoch."""
        if self.txn is not None:
            fatal = isinstance(error, ProducerFencedError)
            self._txn_error = error
            self.txn.fail(error, fatal=fatal)
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

    def _write_segments(
        self, topic: str, segments: list[ProducerBatch], deadline: float
    ) -> list[PendingBatch]:
        """Write one segment per partition; assign sequences (once, kept on retry).
        Failing puts are retried until ``deadline`` (``time.monotonic()``)."""
        table = self._table(topic)
        sequences = []
        for segment in segments:
            seq = NO_SEQUENCE
            if self.enable_idempotence:
                tp = TopicPartition(topic, segment.partition)
                seq = self._sequences.get(tp, 0)
                self._sequences[tp] = (seq + segment.count) % (2**31)
            sequences.append(seq)

        # Encoding here, one segment after the other (pyarrow releases the GIL, so callers
        # keep running), puts on the pool as each is ready: object-store latency (and fsync
        # on local disk) overlaps, and only this thread allocates Arrow memory.
        pending: list[PendingBatch] = []
        puts: list[Future[None]] = []
        try:
            for segment, seq in zip(segments, sequences, strict=True):
                rows = segment.table() if topic not in self._typed else segment_rows(segment)
                data = encode_table(rows)
                low, high = timestamp_range(rows)
                path = table.segment_key(segment.partition, new_segment_name())
                puts.append(self._submit_put(path, data, deadline))
                pending.append(
                    PendingBatch(
                        partition=segment.partition,
                        path=path,
                        count=rows.num_rows,
                        size=len(data),
                        producer_id=self.producer_id,
                        producer_epoch=self.producer_epoch,
                        base_sequence=seq,
                        transactional=self.txn is not None,
                        min_timestamp=low,
                        max_timestamp=high,
                        transactional_id=self.transactional_id,
                    )
                )
            _return_freed_memory()
        finally:
            errors = [f.exception() for f in puts]  # every put ends before this returns
        for error in errors:
            if error is not None:
                raise error
        for _ in segments:
            self._partitioner.on_new_batch(topic, table.num_partitions)
        return pending

    def _submit_put(self, path: str, data: bytes, deadline: float) -> Future[None]:
        """Put an encoded segment on the writer pool; its bytes count as buffer memory."""
        with self._cond:
            self._queued_memory += len(data)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_SEGMENT_PUTS, thread_name_prefix="txntable-put")

        def put() -> None:
            try:
                self._retry(
                    lambda: self.store.put_data_file(path, data), remaining_ms(deadline)
                )
            finally:
                self._release(len(data))

        return self._pool.submit(put)

    def _send_table(self, topic: str, segments: list[ProducerBatch]) -> None:
        """Write and commit one round's segments of ``topic``, retrying transient storage
        errors for ``delivery_timeout_ms`` in all (Kafka's ``delivery.timeout.ms``)."""
        deadline = deadline_after(self.delivery_timeout_ms)
        self._ensure_producer_id()
        table = self._table(topic)
        pending = self._write_segments(topic, segments, deadline)
        if self.txn is not None:
            new = {s.partition for s in segments} - self._txn_partitions.get(topic, set())
            if new:
                assert self.transactional_id is not None
                self._coordinator_cache = None
                tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
                self._retry(
                    lambda: self.coordinator.add_partitions(tid, pid, epoch, {topic: new}),
                    remaining_ms(deadline),
                )
                self._txn_partitions.setdefault(topic, set()).update(new)
        result, _ = self._retry(
            lambda: table.append(
                pending,
                transactional_id=self.transactional_id,
                timeout_ms=remaining_ms(deadline),
            ),
            remaining_ms(deadline),
        )
        # Before the futures complete, so a flush() returns with stuck transactions gone.
        self._finish_stuck_transactions(table)
        if self._maintenance is not None:
            self._maintenance.after_commit(table)
        for segment, base in zip(segments, result.base_offsets, strict=True):
            segment.resolve(base)

    def _finish_stuck_transactions(self, table: Table) -> None:
        """Finish other producers' transactions that pin this table's LSO.

        Kafka's coordinator expires and completes transactions itself; here whichever
        client notices first does it: an Ongoing one past its timeout is aborted, a
        prepared one older than the grace period is completed. Each open transaction's
        coordinator object is read once and then not again before its deadline, so this
        costs nothing while no transaction is stuck (see ``StuckTransactionFinisher``).
        """
        if self._finisher is not None:
            self._finisher.check(table.snapshot(refresh=False))

    def _retry(self, fn: Callable[[], T], timeout_ms: int | None = None) -> T:
        """Run ``fn``, retrying transient storage errors until ``delivery_timeout_ms``.

        A retried append carries the same producer id, epoch and sequences, so if an earlier
        attempt did land the log recognises the duplicate and returns the original offsets.
        At interpreter exit the sender stops retrying (see :func:`_stop_at_exit`).
        """
        timeout = self.delivery_timeout_ms if timeout_ms is None else timeout_ms
        return retry_transient(fn, timeout, give_up=lambda: self._exiting)

    def _blocking(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying transient storage errors for up to ``max_block_ms``.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``max_block_ms`` (Kafka's
                ``TimeoutException`` of a blocking producer call).
        """
        return within_timeout(
            fn, self.max_block_ms, what, "max_block_ms", give_up=lambda: self._exiting
        )

    def partitions_for(self, topic: str) -> list[int]:
        """Partition numbers of ``topic``.

        Raises:
            KafkaTimeoutError: The table could not be loaded within ``max_block_ms``.
        """
        table = self._blocking(f"loading table {topic}", lambda: self._table(topic))
        return list(range(table.num_partitions))


#: Producers whose sender thread may still run; stopped at interpreter exit.
_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_exit_hook_registered = False
#: Seconds the exit hook waits for a sender to finish the batch it is writing.
EXIT_JOIN_TIMEOUT_S = 30.0


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        producers = list(_LIVE)
    for producer in producers:
        producer._stop_at_exit()


def _track(producer: Producer) -> None:
    """Remember a live producer; register the exit hook with the first one.

    ``threading._register_atexit`` hooks run when the main thread finishes, before any
    ``atexit`` function, so the senders stop while pyarrow's S3 client (finalized by an
    ``atexit`` function) is still usable. The plain ``atexit`` fallback runs before
    functions registered earlier, pyarrow's included, since ``pyarrow.fs`` is imported
    before any producer exists.
    """
    global _exit_hook_registered
    with _LIVE_LOCK:
        _LIVE.add(producer)
        if _exit_hook_registered:
            return
        _exit_hook_registered = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_stop_all_at_exit)
    except RuntimeError:  # missing, or the interpreter is already shutting down
        atexit.register(_stop_all_at_exit)
