"""The producer: Kafka's ``KafkaProducer`` API over three parts, as kafka-python divides it.

- :class:`~txntable.producer.accumulator.RecordAccumulator` owns the buffers: ``send``
  appends to per-table column lists, ``send_batch`` queues Arrow data as it is; sealing
  chooses partitions vectorised; memory is bounded by ``buffer_memory``.
- :class:`~txntable.producer.sender.Sender` owns the background thread: when a round is
  ready (``batch_size`` reached, ``linger_ms`` elapsed, a ``send`` waiting for memory,
  ``flush()`` or ``commit_transaction()``) it writes one Parquet segment of at most
  ``max_request_size`` record bytes per partition and commits all of a table's segments as
  one log version; partitions holding more go on in further rounds.
- :class:`~txntable.producer.transaction_manager.TransactionManager` owns the producer id,
  epoch and sequences (each batch carries them, so a retried append is recognised as a
  duplicate and gets its original offsets back), the client state machine and the
  coordinator calls.

The producer checks the caller's arguments, wires the parts and orders them where an
operation spans two (a commit flushes the accumulator, then ends the transaction).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from txntable import config
from txntable.errors import (
    IllegalStateError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    ProducerFencedError,
    RecordTooLargeError,
    SerializationError,
    TxnTableError,
    UnknownTopicOrPartitionError,
)
from txntable.groups.offsets import check_offsets
from txntable.maintenance.maintain import AutoMaintenance
from txntable.producer.accumulator import PY_RECORD_OVERHEAD, RecordAccumulator
from txntable.producer.futures import FutureRecordMetadata, FutureSendBatch, ProduceResult
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.producer.sender import Sender
from txntable.producer.transaction_manager import ClientTxnState, TransactionManager
from txntable.protocol.records import record_sizes, to_record_table
from txntable.protocol.schema import check_record, typed_record_sizes
from txntable.structs import (
    RECORD_OVERHEAD,
    ConsumerGroupMetadata,
    Header,
    OffsetAndMetadata,
    TopicPartition,
)
from txntable.txn.coordinator import TransactionCoordinator
from txntable.warehouse import Warehouse, require_warehouse

_C = ClientTxnState
_IN_TRANSACTION = ClientTxnState.IN_TRANSACTION
_log = logging.getLogger(__name__)


_BYTES = (bytes, bytearray, memoryview)
_time = time.time


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

    Attributes:
        metadata: The tables' handles, partition counts and layouts.
        accumulator: The buffers (:class:`~txntable.producer.accumulator.RecordAccumulator`).
        transaction_manager: Producer id, epoch, sequences, the transaction's state and the
            coordinator calls (:class:`~txntable.producer.transaction_manager.TransactionManager`).
        sender: The background thread and its commit rounds
            (:class:`~txntable.producer.sender.Sender`).

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
        # Records larger than this are refused (they could never be buffered or sent).
        self._record_limit = min(max_request_size, buffer_memory)
        #: Partition counts of the tables of Kafka's records sent to (``send``'s hot path).
        self._plain_partitions: dict[str, int] = {}
        self._retries = Retries(delivery_timeout_ms, max_block_ms)
        self.metadata = ProducerMetadata(warehouse, self._retries)
        self.transaction_manager = TransactionManager(
            self.metadata,
            self._retries,
            transactional_id,
            enable_idempotence,
            transaction_timeout_ms,
        )
        self.accumulator = RecordAccumulator(
            self.metadata,
            batch_size=batch_size,
            linger_ms=linger_ms,
            buffer_memory=buffer_memory,
            max_block_ms=max_block_ms,
            max_request_size=max_request_size,
            on_unsent_failure=lambda error: self.transaction_manager.batch_failed(
                error, sequenced=False
            ),
        )
        self.sender = Sender(
            self.accumulator,
            self.transaction_manager,
            self.metadata,
            self._retries,
            AutoMaintenance(warehouse.table) if auto_maintenance else None,
        )
        self.sender.start()
        _track(self)

    # --- what the parts hold -------------------------------------------------------------

    @property
    def txn(self) -> TransactionManager | None:
        """The transaction manager of a transactional producer, else ``None``."""
        manager = self.transaction_manager
        return manager if manager.transactional else None

    @property
    def coordinator(self) -> TransactionCoordinator:
        """The transaction coordinator this producer talks to."""
        return self.transaction_manager.coordinator

    @property
    def producer_id(self) -> int:
        """The producer id (-1 before the first batch of an idempotent producer)."""
        return self.transaction_manager.producer_id

    @property
    def producer_epoch(self) -> int:
        """The producer epoch (-1 before the first batch of an idempotent producer)."""
        return self.transaction_manager.producer_epoch

    # --- transactions --------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register the transactional id: fence older instances and finish their transaction.

        A transaction the previous instance left Ongoing is aborted; one it left prepared
        is completed. The epoch is bumped, and every table the id committed a one-log
        transaction to receives a fence of the new epoch before this returns, so the old
        instance is fenced everywhere.
        """
        self.transaction_manager.init_transactions()

    def begin_transaction(self) -> None:
        """Start a transaction; every ``send`` until commit or abort belongs to it."""
        self.transaction_manager.begin_transaction()

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
        txn = self.transaction_manager
        if txn.retry_unfinished_commit():
            return
        txn.begin_commit()
        # CommitOneLog: the whole transaction still buffered, for one table, one batch per
        # partition: its segments, then one append of them and their COMMIT markers (the
        # table registered with the coordinator once, so that a new instance fences it).
        whole = self.accumulator.drain_whole(txn.short_path_allowed)
        if whole is not None:
            ((topic, items),) = whole.items()
            register = None if txn.registered(topic) else (lambda: txn.register_table(topic))
            pending = self.sender.write_transaction(whole, register)
            txn.commit_one_log(topic, items, pending[topic])
            return
        self.accumulator.flush()
        txn.commit()

    def abort_transaction(self) -> None:
        """Abort: drop unsent records, then write ABORT markers where data was committed."""
        txn = self.transaction_manager
        if txn.retry_unfinished_abort():
            return
        txn.begin_abort()
        self.accumulator.abort_undrained(InvalidTxnStateError("transaction aborted before send"))
        self.accumulator.flush()
        txn.end_transaction(commit=False)

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
        self.transaction_manager.require_transactional()
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
        self.transaction_manager.send_offsets(offsets, meta)

    # --- sending -------------------------------------------------------------------------

    def _too_large(self, size: int, prefix: str = "", suffix: str = "") -> RecordTooLargeError:
        if size > self.max_request_size:
            limit = f"max_request_size {self.max_request_size}"
        else:
            limit = f"the whole buffer: buffer_memory is {self.buffer_memory}"
        return RecordTooLargeError(f"{prefix}record of {size} bytes is larger than {limit}{suffix}")

    def _check_usable(self) -> None:
        if self.accumulator.closed:
            raise IllegalStateError("cannot send after the producer is closed")
        error = self.sender.error
        if error is not None:
            raise IllegalStateError(f"producer sender failed: {error!r}") from error

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
        # The per-record path: validation here, then one append to the accumulator.
        if timestamp_ms is not None:
            if timestamp is not None:
                raise InvalidArgumentTypeError("give timestamp or timestamp_ms, not both")
            timestamp = timestamp_ms
        accumulator = self.accumulator
        if accumulator.closed or self.sender.error is not None:
            self._check_usable()
        txn = self.transaction_manager
        if txn.transactional_id is not None and txn.state is not _IN_TRANSACTION:
            txn.require("send", _IN_TRANSACTION)
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
        # No timestamp: the accumulator reads the clock (one float per record, converted
        # to milliseconds per batch).
        if timestamp is not None and (timestamp.__class__ is not int or timestamp < 0):
            raise SerializationError("timestamp must be a non-negative int of milliseconds")
        if topic.__class__ is not str or (partition is not None and partition.__class__ is not int):
            _check_target(topic, partition)
        if size > self._record_limit:
            raise self._too_large(size)
        # One look-up for a table of Kafka's records already loaded; else load it, and
        # refuse a typed table's.
        num_partitions = self._plain_partitions.get(topic)
        if num_partitions is None:
            num_partitions = self._plain_partition_count(topic)
        if partition is None:
            partition = -1
        elif not 0 <= partition < num_partitions:
            raise UnknownTopicOrPartitionError(f"table {topic} has no partition {partition}")
        return accumulator.append(
            topic, key, value, timestamp, partition, pairs, size, size + PY_RECORD_OVERHEAD
        )

    def _plain_partition_count(self, topic: str) -> int:
        """The partition count of ``topic``, a table of Kafka's records (loaded now if it
        is not yet).

        Raises:
            SerializationError: The table has a record schema.
            KafkaTimeoutError: The table's first load kept failing for ``max_block_ms``.
        """
        metadata = self.metadata
        num_partitions = metadata.partition_count(topic)
        if topic in metadata.typed:
            raise SerializationError(
                f"table {topic} has a record schema: send its record as a dict of columns"
            )
        self._plain_partitions[topic] = num_partitions
        return num_partitions

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
        if timestamp is not None and (timestamp.__class__ is not int or timestamp < 0):
            raise SerializationError("timestamp must be a non-negative int of milliseconds")
        if topic.__class__ is not str or (partition is not None and partition.__class__ is not int):
            _check_target(topic, partition)
        metadata = self.metadata
        num_partitions = metadata.partition_counts.get(topic) or metadata.partition_count(topic)
        layout = metadata.layout(topic)
        if layout is None:
            raise SerializationError(
                f"table {topic} has Kafka's record: value must be bytes, not {type(value).__name__}"
            )
        try:
            record, size = check_record(value, layout, metadata.converters(topic))
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
        # The key is computed from the key columns when sealed.
        return self.accumulator.append(
            topic, None, record, timestamp, partition, (), size, size + PY_RECORD_OVERHEAD
        )

    def _reload_layout(self, topic: str) -> bool:
        """Reload a typed table's schema (another client may have evolved it); records
        buffered under the older one are sealed first. Whether it changed."""
        layout = self.metadata.newer_layout(topic)
        if layout is None:
            return False
        self.accumulator.seal(topic)
        self.metadata.use_layout(topic, layout)
        return True

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
        self.transaction_manager.require_sendable()
        _check_target(topic, partition)
        num_partitions = self.metadata.partition_count(topic)
        layout = self.metadata.layout(topic)
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
        self.accumulator.append_rows(topic, table, sizes, partition, result)
        return FutureSendBatch(result)

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
        if not self.accumulator.flush(timeout):
            raise KafkaTimeoutError(f"flush: records still in flight after {timeout} s")

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
        if self.accumulator.closed:
            return
        if self.transaction_manager.transactional:
            self._end_on_close()
        self.flush()
        self.accumulator.close()
        self.sender.close(timeout)
        self.metadata.close()
        self.transaction_manager.close()
        _LIVE.discard(self)

    def _end_on_close(self) -> None:
        txn = self.transaction_manager
        state = txn.state
        try:
            if state is _C.COMMITTING_TRANSACTION and txn.end_unfinished:
                self.commit_transaction()  # finish it: it may be decided
            elif state in (_C.IN_TRANSACTION, _C.ABORTABLE_ERROR) or (
                state is _C.ABORTING_TRANSACTION and txn.end_unfinished
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
                decided[txn.decided],
                e,
            )
            self.accumulator.abort_undrained(IllegalStateError("the producer was closed"))

    def _stop_at_exit(self) -> None:
        """Stop the sender at interpreter exit, before pyarrow finalizes its S3 client.

        A producer nobody closed is treated as if its process had died, not as a graceful
        close: nothing more is written, buffered records fail with ``IllegalStateError``, an
        open transaction is left to its timeout, and the batch being written gets no retry
        after its current attempt.
        """
        unsent = self.accumulator.close()
        if unsent is None:
            return  # closed already
        self._retries.stop()
        self.accumulator.abort_undrained(
            IllegalStateError("the producer was not closed before the interpreter exited")
        )
        self.sender.join(EXIT_JOIN_TIMEOUT_S)
        txn = self.transaction_manager
        state = txn.state if txn.transactional else None
        unfinished = state not in (None, _C.UNINITIALIZED, _C.READY, _C.FATAL_ERROR)
        decided = {True: ", decided to commit", False: ", decided to abort", None: ""}
        if unsent or unfinished:
            _log.warning(
                "txntable producer %s was not closed before exit: %d buffered records were "
                "not sent%s",
                self.transactional_id or hex(id(self)),
                unsent,
                f"; its transaction was left {state.value}{decided[txn.decided]} "
                "(recover() or its timeout finishes it)"
                if unfinished and state is not None
                else "",
            )

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions_for(self, topic: str) -> list[int]:
        """Partition numbers of ``topic``.

        Raises:
            KafkaTimeoutError: The table could not be loaded within ``max_block_ms``.
        """
        return list(range(self.metadata.load(topic).num_partitions))


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
