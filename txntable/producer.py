"""The producer: batching, idempotence and transactions on top of table appends.

Records are buffered per table partition. A flush — ``batch_size`` reached, ``linger_ms``
elapsed, ``flush()`` or ``commit_transaction()`` — writes one Parquet segment per partition
and commits all of a table's segments as one log version. Each batch carries the producer
id, epoch and base sequence, so a retried append is recognised as a duplicate and gets its
original offsets back, as with Kafka's idempotent producer.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from txntable import config
from txntable.actions import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE
from txntable.append import PendingBatch
from txntable.coordinator import TransactionCoordinator, TxnMetadata
from txntable.errors import (
    BufferExhaustedError,
    IllegalStateError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
    SerializationError,
    TransientStorageError,
    TxnTableError,
)
from txntable.groups import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    check_offsets,
    open_group_table,
    plan_offset_commit,
)
from txntable.log import now_ms
from txntable.maintenance import AutoMaintenance
from txntable.partitioner import StickyPartitioner
from txntable.producer_state import BatchMetadata
from txntable.records import Header, ProducerRecord, RecordMetadata, TopicPartition, encode_segment
from txntable.recovery import StuckTransactionFinisher
from txntable.retry import retry_transient
from txntable.table import Table
from txntable.transaction_manager import ClientTxnState, TransactionManager
from txntable.vacuum import new_segment_name
from txntable.warehouse import Warehouse, require_warehouse

_C = ClientTxnState
T = TypeVar("T")
_log = logging.getLogger(__name__)


_BYTES = (bytes, bytearray, memoryview)


def _make_record(
    key: object, value: object, headers: Sequence[Header] | None, timestamp: object
) -> ProducerRecord:
    """Validate what ``send`` was given (Kafka's serializers would) and build the record.

    Raises:
        SerializationError: A key, value or header value that is not bytes (or None), a
            header key that is not a string, or a timestamp that is not a non-negative int.
    """

    def as_bytes(name: str, v: object) -> bytes | None:
        if v is None:
            return None
        if not isinstance(v, _BYTES):
            raise SerializationError(f"{name} must be bytes or None, not {type(v).__name__}")
        return bytes(v)

    key_bytes, value_bytes = as_bytes("key", key), as_bytes("value", value)
    pairs: list[tuple[str, bytes | None]] = []
    for item in headers or ():
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise SerializationError(f"a header must be a (key, value) pair, not {item!r:.80}")
        hk, hv = item
        if not isinstance(hk, str):
            raise SerializationError(f"a header key must be a str, not {type(hk).__name__}")
        pairs.append((hk, as_bytes(f"header {hk!r}", hv)))
    if timestamp is not None and (
        not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < 0
    ):
        raise SerializationError("timestamp must be a non-negative int of milliseconds")
    return ProducerRecord(
        key_bytes, value_bytes, tuple(pairs), now_ms() if timestamp is None else timestamp
    )


@dataclass
class _Buffer:
    records: list[ProducerRecord] = field(default_factory=list)
    futures: list[Future[RecordMetadata]] = field(default_factory=list)
    size: int = 0
    created: float = 0.0


@dataclass
class _Drained:
    tp: TopicPartition
    records: list[ProducerRecord]
    futures: list[Future[RecordMetadata]]
    size: int


class Producer:
    """Writes records to tables, idempotently and optionally in transactions.

    Args:
        warehouse: The warehouse of the tables.
        transactional_id: Enables transactions; one live producer per id (others are fenced).
        enable_idempotence: Carry producer id and sequences so retries never duplicate
            (Kafka's default, and required for transactions).
        batch_size: Bytes buffered for one partition that trigger a flush.
        linger_ms: How long a record may wait in the buffer for others to join it.
        buffer_memory: Bytes the producer may buffer; ``send`` blocks when it is full.
        max_block_ms: How long ``send`` blocks on a full buffer before raising.
        max_request_size: Largest record accepted.
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
        self._buffers: dict[TopicPartition, _Buffer] = {}
        self._buffered_bytes = 0
        self._in_flight: list[Future[RecordMetadata]] = []
        self._maintenance = AutoMaintenance(warehouse.table) if auto_maintenance else None
        self._flush_requested = False
        self._closed = False
        self._exiting = False
        self._cond = threading.Condition()
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

        Raises:
            ProducerFencedError: A newer instance took over; nothing of this
                transaction becomes visible.
            TxnTableError: A send of the transaction failed; call ``abort_transaction``.
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

    def _take_for_short_path(self) -> list[_Drained] | None:
        """Take the buffers if the whole transaction is still buffered, else ``None``."""
        with self._cond:
            if self._in_flight or self._txn_partitions or not self._buffers:
                return None
            drained = [
                _Drained(tp, b.records, b.futures, b.size) for tp, b in self._buffers.items()
            ]
            self._buffers = {}
            return drained

    def _commit_short_path(self, drained: list[_Drained]) -> None:
        """Commit with P segment PUTs, a CAS to PrepareCommit with the intent, one log version
        per table (data and markers together) and a CAS to CompleteCommit."""
        txn = self._require_txn()
        by_table: dict[str, list[_Drained]] = {}
        for d in sorted(drained, key=lambda d: d.tp):
            by_table.setdefault(d.tp.topic, []).append(d)
        try:
            intent = {t: tuple(self._write_segments(t, items)) for t, items in by_table.items()}
        except TxnTableError as e:
            for d in drained:
                for f in d.futures:
                    f.set_exception(e)
            txn.fail(e, fatal=isinstance(e, ProducerFencedError))
            raise
        finally:
            with self._cond:
                self._buffered_bytes -= sum(d.size for d in drained)
                self._cond.notify_all()
        self._end_retry = lambda: self._finish_short_path(by_table, intent)
        self._end_retry()

    def _finish_short_path(
        self, by_table: dict[str, list[_Drained]], intent: dict[str, tuple[PendingBatch, ...]]
    ) -> None:
        txn = self._require_txn()
        tid = self.transactional_id or ""
        pid, epoch = self.producer_id, self.producer_epoch
        try:
            done, etag = self._retry(
                lambda: self.coordinator.commit_short_path(
                    tid, pid, epoch, intent, self._coordinator_cache
                )
            )
        except (TransientStorageError, OSError) as e:
            self._coordinator_cache = None
            raise KafkaTimeoutError(
                f"commit outcome unknown ({e}); call commit_transaction() again to finish it"
            ) from e
        except TxnTableError as e:
            self._coordinator_cache = None
            self._end_retry = None
            for items in by_table.values():
                for d in items:
                    for f in d.futures:
                        f.set_exception(e)
            txn.fail(e, fatal=isinstance(e, ProducerFencedError))
            raise
        for topic, items in by_table.items():
            table = self._table(topic)
            for d, batch in zip(items, intent[topic], strict=True):
                meta = self._committed_batch(table, d.tp.partition, batch)
                if meta is None:  # another client finished our decision: catch up once
                    table.snapshot(refresh=True)
                    meta = self._committed_batch(table, d.tp.partition, batch)
                assert meta is not None, "a committed short-path batch is in the log"
                for i, (r, f) in enumerate(zip(d.records, d.futures, strict=True)):
                    offset = meta.base_offset + i
                    f.set_result(RecordMetadata(topic, d.tp.partition, offset, r.timestamp))
        self._coordinator_cache = (done, etag)
        self._transaction_ended(done.producer_id, done.producer_epoch)
        for topic in by_table:
            self._finish_stuck_transactions(self._table(topic))

    @staticmethod
    def _committed_batch(table: Table, partition: int, batch: PendingBatch) -> BatchMetadata | None:
        entry = table.snapshot(refresh=False).partition(partition).producers.get(batch.producer_id)
        if entry is None:
            return None
        return entry.find_duplicate(batch.producer_epoch, batch.base_sequence, batch.last_sequence)

    def _transaction_ended(self, producer_id: int, producer_epoch: int) -> None:
        """Continue under the epoch the completed transaction bumped to (KIP-890)."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._sequences.clear()
        self._txn_partitions = {}
        self._txn_error = None
        self._end_retry = None
        self._require_txn().transition(_C.READY)

    def abort_transaction(self) -> None:
        """Abort: drop unsent records, then write ABORT markers where data was committed."""
        txn = self._require_txn()
        if txn.state is _C.ABORTING_TRANSACTION and self._end_retry is not None:
            self._end_retry()  # the previous attempt's outcome was unknown: finish it
            return
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
        txn.require("send offsets to a transaction", _C.IN_TRANSACTION)
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
            group_table().commit(
                lambda s: plan_offset_commit(
                    s, meta.group_id, offsets, meta.generation_id, pid, epoch
                ),
                tid,
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
        try:
            # Transient errors (an unresolved ambiguous write) are retried: EndTxn resumes its
            # own prepared decision, so a retry never decides twice.
            new_pid, new_epoch = self._retry(
                lambda: self.coordinator.end_transaction(tid, pid, epoch, commit)
            )
        except (TransientStorageError, OSError) as e:
            # Outcome unknown (Kafka's commit timeout): the same call must be retried.
            self._end_retry = lambda: self._end_transaction(commit)
            verb = "commit" if commit else "abort"
            raise KafkaTimeoutError(
                f"{verb} outcome unknown ({e}); call {verb}_transaction() again to finish it"
            ) from e
        except ProducerFencedError as e:
            txn.fail(e, fatal=True)
            raise
        except TxnTableError as e:
            if commit:
                self._end_retry = None
                txn.fail(e, fatal=False)
            else:
                # An abort stays ABORTING_TRANSACTION (it never falls back to an abortable
                # error, as in Kafka): calling abort_transaction() again retries it.
                self._end_retry = lambda: self._end_transaction(commit)
            raise
        self._transaction_ended(new_pid, new_epoch)

    # --- sending -------------------------------------------------------------------------

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self.warehouse.table(name)
            table.snapshot()
            self._tables[name] = table  # only once loaded: a failed load is tried again
        return table

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | None = None,
        timestamp: int | None = None,
    ) -> Future[RecordMetadata]:
        """Buffer a record for ``topic``; the future completes when its batch is committed.

        Raises:
            RecordTooLargeError: The record is larger than ``max_request_size``.
            BufferExhaustedError: The buffer stayed full for ``max_block_ms``.
            KafkaTimeoutError: The table's first load kept failing for ``max_block_ms``.
            InvalidTxnStateError: A transactional producer is not in a transaction.
            ProducerFencedError: The producer was fenced.
        """
        if self._closed:
            raise IllegalStateError("cannot send after the producer is closed")
        if self._sender_error is not None:
            raise IllegalStateError(
                f"producer sender failed: {self._sender_error!r}"
            ) from self._sender_error
        if self.txn is not None:
            self.txn.require("send", _C.IN_TRANSACTION)
        if not isinstance(topic, str):
            raise InvalidArgumentTypeError(f"topic must be a str, not {type(topic).__name__}")
        if partition is not None and not config.is_int(partition):
            raise InvalidArgumentTypeError(
                f"partition must be an int or None, not {type(partition).__name__}"
            )
        record = _make_record(key, value, headers, timestamp)
        size = record.size_in_bytes()
        if size > self.max_request_size:
            raise RecordTooLargeError(
                f"record of {size} bytes is larger than max_request_size {self.max_request_size}"
            )
        if size > self.buffer_memory:
            raise RecordTooLargeError(
                f"record of {size} bytes is larger than the whole buffer: buffer_memory is "
                f"{self.buffer_memory}"
            )
        table = self._tables.get(topic) or self._blocking(
            f"loading table {topic}", lambda: self._table(topic)
        )
        n = table.num_partitions
        if partition is None:
            partition = self._partitioner.partition(topic, record.key, n)
        elif not 0 <= partition < n:
            from txntable.errors import UnknownTopicOrPartitionError

            raise UnknownTopicOrPartitionError(f"table {topic} has no partition {partition}")
        tp = TopicPartition(topic, partition)
        future: Future[RecordMetadata] = Future()
        deadline = time.monotonic() + self.max_block_ms / 1000
        with self._cond:
            while self._buffered_bytes + size > self.buffer_memory:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BufferExhaustedError(
                        f"failed to allocate {size} bytes within max_block_ms={self.max_block_ms}"
                    )
                self._cond.wait(remaining)
            buf = self._buffers.get(tp)
            if buf is None:
                buf = self._buffers[tp] = _Buffer(created=time.monotonic())
            buf.records.append(record)
            buf.futures.append(future)
            buf.size += size
            self._buffered_bytes += size
            if buf.size >= self.batch_size or self.linger_ms <= 0:
                self._cond.notify_all()
            elif len(buf.records) == 1:
                self._cond.notify_all()  # the sender recomputes its linger deadline
        return future

    def flush(self) -> None:
        """Send everything buffered and wait until it is committed (or failed)."""
        self._wait_all()

    def _wait_all(self) -> None:
        with self._cond:
            futures = [f for b in self._buffers.values() for f in b.futures] + list(self._in_flight)
            # Only a non-empty buffer needs the flag (the sender clears it when it drains);
            # set with nothing buffered, it outlived this call and the next record was sent
            # at once, ignoring linger_ms.
            if self._buffers:
                self._flush_requested = True
            self._cond.notify_all()
        for f in futures:
            try:
                f.result()
            except TxnTableError:
                pass  # the error is the future's; transactional errors are kept separately

    def _drop_buffered(self, error: TxnTableError) -> None:
        with self._cond:
            buffers, self._buffers = self._buffers, {}
            for buf in buffers.values():
                self._buffered_bytes -= buf.size
                for f in buf.futures:
                    f.set_exception(error)
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Abort an incomplete transaction, flush what is buffered and stop the sender.

        As Kafka's producer does on a graceful close ("Aborting incomplete transaction due
        to shutdown"), so a closed producer never leaves a transaction pinning the LSO
        until its timeout.
        """
        if self._closed:
            return
        if self.txn is not None and (
            self.txn.state in (_C.IN_TRANSACTION, _C.ABORTABLE_ERROR)
            or (self.txn.state is _C.ABORTING_TRANSACTION and self._end_retry is not None)
        ):
            try:
                self.abort_transaction()
            except ProducerFencedError as e:
                # A newer instance owns the id and has aborted this transaction already.
                _log.info("not aborting on close: %s", e)
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._sender.join(timeout)
        _LIVE.discard(self)

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
            unsent = sum(len(b.records) for b in self._buffers.values())
            self._exiting = self._closed = True
        self._drop_buffered(
            IllegalStateError("the producer was not closed before the interpreter exited")
        )
        self._sender.join(EXIT_JOIN_TIMEOUT_S)
        state = self.txn.state if self.txn is not None else None
        unfinished = state not in (None, _C.UNINITIALIZED, _C.READY, _C.FATAL_ERROR)
        if unsent or unfinished:
            _log.warning(
                "txntable producer %s was not closed before exit: %d buffered records were "
                "not sent%s",
                self.transactional_id or hex(id(self)),
                unsent,
                f"; its transaction was left {state.value} (recover() or its timeout "
                "finishes it)"
                if unfinished and state is not None
                else "",
            )

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the sender ----------------------------------------------------------------------

    def _ready(self, now: float) -> tuple[bool, float | None]:
        if not self._buffers:
            return False, None
        if self._flush_requested:
            return True, None
        oldest = min(b.created for b in self._buffers.values())
        due = oldest + self.linger_ms / 1000
        full = any(b.size >= self.batch_size for b in self._buffers.values())
        return (full or now >= due), max(due - now, 0.0)

    def _run_sender(self) -> None:
        while True:
            with self._cond:
                while True:
                    ready, wait = self._ready(time.monotonic())
                    if ready:
                        break
                    if self._closed and not self._buffers:
                        return
                    self._flush_requested = False if not self._buffers else self._flush_requested
                    self._cond.wait(wait)
                drained = [
                    _Drained(tp, b.records, b.futures, b.size) for tp, b in self._buffers.items()
                ]
                self._buffers = {}
                self._flush_requested = False
                self._in_flight = [f for d in drained for f in d.futures]
            try:
                self._send(drained)
            finally:
                with self._cond:
                    self._buffered_bytes -= sum(d.size for d in drained)
                    self._in_flight = []
                    self._cond.notify_all()

    def _ensure_producer_id(self) -> None:
        if self.enable_idempotence and self.producer_id == NO_PRODUCER_ID:
            self.producer_id = self.coordinator.allocator.allocate()
            self.producer_epoch = 0

    def _send(self, drained: list[_Drained]) -> None:
        by_table: dict[str, list[_Drained]] = {}
        for d in drained:
            by_table.setdefault(d.tp.topic, []).append(d)
        for topic, items in by_table.items():
            try:
                self._send_table(topic, sorted(items, key=lambda d: d.tp.partition))
            except TxnTableError as e:
                for d in items:
                    for f in d.futures:
                        if not f.done():
                            f.set_exception(e)
                self._on_send_error(e)
            except Exception as e:  # noqa: BLE001 - a bug must still fail the futures
                # Unexpected (a bug or an unmapped library error): fail these futures and
                # every later call, rather than let the sender thread die and sends hang.
                _log.exception("producer sender failed")
                for d in items:
                    for f in d.futures:
                        if not f.done():
                            f.set_exception(e)
                self._sender_error = e
                if self.txn is not None:
                    self.txn.fail(IllegalStateError(f"producer sender failed: {e!r}"), fatal=True)

    def _on_send_error(self, error: TxnTableError) -> None:
        if self.txn is not None:
            fatal = isinstance(error, ProducerFencedError)
            self._txn_error = error
            self.txn.fail(error, fatal=fatal)
        elif isinstance(error, OutOfOrderSequenceError):
            # Sequences of the lost batch are burnt: continue under a fresh epoch (KIP-360).
            self.producer_epoch += 1
            self._sequences.clear()

    def _write_segments(self, topic: str, items: list[_Drained]) -> list[PendingBatch]:
        """Write one segment per drained partition; assign sequences (once, kept on retry)."""
        table = self._table(topic)
        pending: list[PendingBatch] = []
        for d in items:
            seq = NO_SEQUENCE
            if self.enable_idempotence:
                seq = self._sequences.get(d.tp, 0)
                self._sequences[d.tp] = (seq + len(d.records)) % (2**31)
            path = table.segment_key(d.tp.partition, new_segment_name())
            data = encode_segment(d.records)
            self._put_segment(path, data)
            stamps = [r.timestamp for r in d.records]
            pending.append(
                PendingBatch(
                    partition=d.tp.partition,
                    path=path,
                    count=len(d.records),
                    size=len(data),
                    producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch,
                    base_sequence=seq,
                    transactional=self.txn is not None,
                    min_timestamp=min(stamps),
                    max_timestamp=max(stamps),
                    transactional_id=self.transactional_id,
                )
            )
            self._partitioner.on_new_batch(topic, table.num_partitions)
        return pending

    def _send_table(self, topic: str, items: list[_Drained]) -> None:
        self._ensure_producer_id()
        table = self._table(topic)
        pending = self._write_segments(topic, items)
        if self.txn is not None:
            new = {d.tp.partition for d in items} - self._txn_partitions.get(topic, set())
            if new:
                assert self.transactional_id is not None
                self._coordinator_cache = None
                tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
                self._retry(lambda: self.coordinator.add_partitions(tid, pid, epoch, {topic: new}))
                self._txn_partitions.setdefault(topic, set()).update(new)
        result, _ = self._retry(
            lambda: table.append(pending, transactional_id=self.transactional_id)
        )
        # Before the futures complete, so a flush() returns with stuck transactions gone.
        self._finish_stuck_transactions(table)
        if self._maintenance is not None:
            self._maintenance.after_commit(table)
        for d, base in zip(items, result.base_offsets, strict=True):
            for i, (r, f) in enumerate(zip(d.records, d.futures, strict=True)):
                f.set_result(RecordMetadata(topic, d.tp.partition, base + i, r.timestamp))

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

    def _put_segment(self, path: str, data: bytes) -> None:
        self._retry(lambda: self.store.put_data_file(path, data))

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
        try:
            return self._retry(fn, self.max_block_ms)
        except (TransientStorageError, OSError) as e:
            raise KafkaTimeoutError(
                f"{what} did not finish within max_block_ms={self.max_block_ms} ({e})"
            ) from e

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
