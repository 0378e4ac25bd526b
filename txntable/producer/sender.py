"""The producer's sender (Kafka's ``Sender``): the background thread and the commit rounds.

The sender thread waits until the accumulator has a round ready, drains it, writes each
partition's batch as one Parquet segment (puts on a small pool, so object-store latency and
fsyncs overlap), registers new partitions with the transaction, appends each table's
segments as one log version (through group commit when the table has it), and completes the
batches' futures with their offsets or errors. Transient storage errors are retried within
``delivery_timeout_ms`` per round; what still fails is the batch's error, never the
thread's: a failed batch is reported to the transaction manager and the next one goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from txntable.errors import (
    IllegalStateError,
    InternalError,
    KafkaTimeoutError,
    TxnTableError,
)
from txntable.layout import new_segment_name
from txntable.maintenance.maintain import AutoMaintenance
from txntable.producer.accumulator import (
    ProducerBatch,
    RecordAccumulator,
    Round,
    return_freed_memory,
    segment_rows,
    segment_scratch,
    timestamp_range,
)
from txntable.producer.futures import ProduceResult
from txntable.producer.metadata import ProducerMetadata
from txntable.producer.retries import Retries
from txntable.producer.transaction_manager import TransactionManager
from txntable.protocol.append import AppendResult, PendingBatch
from txntable.protocol.records import encode_table, encoding_room
from txntable.structs import TopicPartition
from txntable.util import RETRIABLE, remaining_ms

_log = logging.getLogger(__name__)

#: Segment puts of one round in flight at once (on object storage this overlaps request
#: latency, on local disk the fsyncs).
SEGMENT_PUTS = 4


class Sender:
    """Drains the accumulator round by round on its own thread and commits each round.

    Args:
        accumulator: Where the rounds come from.
        transaction_manager: Producer id, epoch and sequences of the batches; told about
            failed batches and new partitions.
        metadata: The table handles appended through.
        retries: The retry budgets (``delivery_timeout_ms`` per round).
        maintenance: Checks after each commit whether a table needs maintenance (``None``:
            off).

    Attributes:
        error: The unexpected error that broke the sender's own machinery, if any: the
            producer refuses further sends with it.
    """

    def __init__(
        self,
        accumulator: RecordAccumulator,
        transaction_manager: TransactionManager,
        metadata: ProducerMetadata,
        retries: Retries,
        maintenance: AutoMaintenance | None,
    ) -> None:
        self._accumulator = accumulator
        self._txn = transaction_manager
        self._metadata = metadata
        self._retries = retries
        self.maintenance = maintenance
        self.error: Exception | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: The appends of a round's tables (a transaction's several tables), at once.
        self._appends: ThreadPoolExecutor | None = None
        self._thread = threading.Thread(target=self.run, name="txntable-sender", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the thread (it stops once the accumulator is
        closed and drained)."""
        self._thread.join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """:meth:`join`, then let the puts' and appends' pools go."""
        self._thread.join(timeout)
        for pool in (self._pool, self._appends):
            if pool is not None:
                pool.shutdown(wait=False)

    def run(self) -> None:
        """The thread: one round after the other until the accumulator is closed and empty."""
        accumulator = self._accumulator
        # pyarrow imports pandas (when installed) on its first conversion of Python objects:
        # 0.25-0.5 s of the process's first commit, here while the caller starts up instead.
        try:
            pa.array([b""], pa.binary())
        except Exception as e:  # noqa: BLE001 - a warm-up only: a broken pandas install
            # raises again at the first real conversion, where the caller's batch gets it;
            # here it would end the sender thread and leave every send waiting.
            _log.warning("pyarrow's first conversion failed: %s", e)
        while accumulator.await_ready():
            try:
                accumulator.seal_all()
            except Exception as e:  # noqa: BLE001 - a batch's failure is its futures'; this
                self._on_unexpected_error(e)  # is the sender's own machinery failing
            by_table = accumulator.drain()
            if by_table:
                try:
                    self._send(by_table)
                finally:
                    accumulator.round_done([b for items in by_table.values() for b in items])

    def _on_unexpected_error(self, e: Exception) -> None:
        # Unexpected (a bug or an unmapped library error): fail every later call, rather
        # than let the sender thread die and sends hang.
        _log.error("producer sender failed", exc_info=e)
        self.error = e
        if self._txn.transactional:
            self._txn.fail(IllegalStateError(f"producer sender failed: {e!r}"), fatal=True)

    def _send(self, by_table: Round) -> None:
        if len(by_table) == 1:
            for topic, batches in by_table.items():
                try:
                    self._send_table(topic, batches)
                except Exception as e:  # noqa: BLE001 - a bug fails this batch, not the sender
                    self._fail(topic, batches, e)
            return
        txn = self._txn
        try:
            txn.ensure_producer_id()
            # A transaction's tables join it in one AddPartitionsToTxn (one CAS of the
            # coordinator object, not one per table, each a round trip before its data).
            txn.add_tables_partitions(
                {t: {b.partition for b in batches} for t, batches in by_table.items()},
                self._retries.delivery_deadline(),
            )
        except Exception as e:  # noqa: BLE001 - a bug fails these batches, not the sender
            for topic, batches in by_table.items():
                self._fail(topic, batches, e)
            return
        self._send_tables(by_table)

    def _fail(self, topic: str, batches: list[ProducerBatch], e: Exception) -> None:
        """Fail ``topic``'s unsettled batches of the round with ``e`` as the caller sees it."""
        if isinstance(e, RETRIABLE):
            # Kafka's batch expiry: the outcome is unknown, the time is up.
            error: TxnTableError = KafkaTimeoutError(
                f"batch of {topic} not committed within delivery_timeout_ms="
                f"{self._retries.delivery_timeout_ms} (outcome unknown: {e})"
            )
            error.__cause__ = e
        else:
            error = InternalError.wrap(e)
            if error is not e:
                _log.error("sending a batch of %s failed", topic, exc_info=e)
        # The producer's state first: a caller woken by a failed future sees it.
        self._txn.batch_failed(error)
        for batch in batches:
            if not batch.settled:
                batch.fail(error)

    def _send_table(self, topic: str, batches: list[ProducerBatch]) -> None:
        """Write and commit one round's batches of ``topic``, retrying transient storage
        errors for ``delivery_timeout_ms`` in all (Kafka's ``delivery.timeout.ms``)."""
        deadline = self._retries.delivery_deadline()
        self._txn.ensure_producer_id()
        pending = self.write_segments(topic, batches, deadline)
        self._resolve(batches, self._commit_table(topic, batches, pending, deadline))

    def _send_tables(self, by_table: Round) -> None:
        """A round of several tables (a transaction's registered): every table's segments
        are put, then every table's append is made, at once — a round trip each for the
        round, not per table. Encoding stays on this thread, and the futures complete on
        it, in table order (callbacks never run concurrently, as in Kafka's producer)."""
        deadline = self._retries.delivery_deadline()
        if self._appends is None:
            self._appends = ThreadPoolExecutor(SEGMENT_PUTS, thread_name_prefix="txntable-append")
        staged: list[tuple[str, list[ProducerBatch], Future[AppendResult]]] = []
        for topic, batches in by_table.items():
            try:
                pending, puts = self._encode_segments(topic, batches, deadline)
            except Exception as e:  # noqa: BLE001 - a bug fails this batch, not the sender
                self._fail(topic, batches, e)
                continue
            append = self._appends.submit(
                self._commit_written, topic, batches, pending, puts, deadline
            )
            staged.append((topic, batches, append))
        for topic, batches, append in staged:
            try:
                self._resolve(batches, append.result())
            except Exception as e:  # noqa: BLE001 - a bug fails this batch, not the sender
                self._fail(topic, batches, e)

    def _commit_written(
        self,
        topic: str,
        batches: list[ProducerBatch],
        pending: list[PendingBatch],
        puts: list[Future[None]],
        deadline: float,
    ) -> AppendResult:
        """:meth:`_commit_table` once every segment put succeeded."""
        self._await_puts(topic, batches, puts)
        return self._commit_table(topic, batches, pending, deadline)

    def _commit_table(
        self, topic: str, batches: list[ProducerBatch], pending: list[PendingBatch], deadline: float
    ) -> AppendResult:
        """Register and append ``topic``'s written segments (retried until ``deadline``)."""
        txn = self._txn
        table = self._metadata.table(topic)
        txn.add_partitions(topic, {b.partition for b in batches}, deadline)
        result, _ = self._retries.delivery(
            lambda: table.append(
                pending,
                transactional_id=txn.transactional_id,
                timeout_ms=remaining_ms(deadline),
            ),
            remaining_ms(deadline),
        )
        # Before the futures complete, so a flush() returns with stuck transactions gone.
        txn.finish_stuck_transactions(table)
        if self.maintenance is not None:
            self.maintenance.after_commit(table)
        return result

    @staticmethod
    def _resolve(batches: list[ProducerBatch], result: AppendResult) -> None:
        for batch, base in zip(batches, result.base_offsets, strict=True):
            batch.resolve(base)

    def write_segments(
        self, topic: str, batches: list[ProducerBatch], deadline: float
    ) -> list[PendingBatch]:
        """Write one segment per batch; take their sequences (once, kept on retry).
        Failing puts are retried until ``deadline`` (``time.monotonic()``)."""
        pending, puts = self._encode_segments(topic, batches, deadline, last_here=True)
        self._await_puts(topic, batches, puts)
        return pending

    def _encode_segments(
        self, topic: str, batches: list[ProducerBatch], deadline: float, last_here: bool = False
    ) -> tuple[list[PendingBatch], list[Future[None]]]:
        """Encode one segment per batch and put each on the pool as it is ready (``last_here``:
        the last one on this thread, for a caller that waits for the puts next); take their
        sequences (once, kept on retry). If encoding fails, the puts made end first."""
        table = self._metadata.table(topic)
        txn = self._txn
        sequences = [
            txn.next_sequence(TopicPartition(topic, b.partition), b.count) for b in batches
        ]
        typed = topic in self._metadata.typed
        # Encoding here, one segment after the other (pyarrow releases the GIL, so callers
        # keep running), puts on the pool as each is ready: object-store latency (and fsync
        # on local disk) overlaps, and only this thread allocates Arrow memory.
        pending: list[PendingBatch] = []
        puts: list[Future[None]] = []
        # Whether zstd pays for key and value, decided once per batch of the caller's (the
        # segments of one send_batch call, one per partition, hold the same kind of data).
        samples: dict[ProduceResult, dict[str, bool]] = {}
        try:
            last = len(batches) - 1
            for i, (batch, seq) in enumerate(zip(batches, sequences, strict=True)):
                rows = segment_rows(batch) if typed else batch.table()
                one = batch.runs[0].result if len(batch.runs) == 1 else None
                known = None if one is None else samples.setdefault(one, {})
                data = encode_table(rows, segment_scratch(encoding_room(rows)), known)
                low, high = timestamp_range(rows)
                path = table.segment_key(batch.partition, new_segment_name())
                puts.append(self._submit_put(path, data, deadline, here=last_here and i == last))
                pending.append(
                    PendingBatch(
                        partition=batch.partition,
                        path=path,
                        count=rows.num_rows,
                        size=len(data),
                        producer_id=txn.producer_id,
                        producer_epoch=txn.producer_epoch,
                        base_sequence=seq,
                        transactional=txn.transactional,
                        min_timestamp=low,
                        max_timestamp=high,
                        transactional_id=txn.transactional_id,
                    )
                )
            return_freed_memory()
        except BaseException:
            for put in puts:
                put.exception()  # every put ends before this raises
            raise
        return pending, puts

    def _await_puts(
        self, topic: str, batches: list[ProducerBatch], puts: list[Future[None]]
    ) -> None:
        """Wait for every segment put; raise the first that failed."""
        errors = [f.exception() for f in puts]  # every put ends before this returns
        for error in errors:
            if error is not None:
                raise error
        num_partitions = self._metadata.table(topic).num_partitions
        for _ in batches:
            self._accumulator.batch_written(topic, num_partitions)

    def _submit_put(
        self, path: str, data: bytes, deadline: float, here: bool = False
    ) -> Future[None]:
        """Put an encoded segment on the writer pool (``here``: on this thread, for the last
        one of a caller that waits for them anyway: a small transaction's only segment then
        costs no hand-over to a put thread and back); its bytes count as buffer memory."""
        self._accumulator.add_memory(len(data))
        store = self._metadata.store

        def put() -> None:
            try:
                self._retries.delivery(
                    lambda: store.put_data_file(path, data), remaining_ms(deadline)
                )
            finally:
                self._accumulator.release(len(data))

        if not here:
            return self._put_pool().submit(put)
        done: Future[None] = Future()
        try:
            put()
        except Exception as e:  # noqa: BLE001 - raised by _await_puts, in batch order
            done.set_exception(e)
        else:
            done.set_result(None)
        return done

    def _put_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SEGMENT_PUTS, thread_name_prefix="txntable-put")
        return self._pool

    def write_transaction(
        self, by_table: Round, before: Callable[[], None] | None = None
    ) -> dict[str, tuple[PendingBatch, ...]]:
        """Write the segments of a whole transaction drained for a one-log commit (on the
        caller's thread), beside ``before()`` (the table's registration: both must be done
        before the append, in either order); their commit is the transaction manager's.
        Frees the round.

        Raises:
            TxnTableError: ``before()`` failed (its error first: a fenced producer is
                fatal) or a segment could not be written; every batch fails with it and the
                transaction can only be aborted.
        """
        batches = [b for items in by_table.values() for b in items]
        try:
            # Submitted first, so that it has a put thread of its own.
            registering = None if before is None else self._put_pool().submit(before)
            try:
                deadline = self._retries.delivery_deadline()
                written = {
                    t: tuple(self.write_segments(t, items, deadline))
                    for t, items in by_table.items()
                }
            except BaseException as segment_error:
                failed = None if registering is None else registering.exception()
                if failed is None:
                    raise
                raise failed from segment_error
            if registering is not None:
                registering.result()
            return written
        except Exception as e:
            error = InternalError.wrap(e)
            for batch in batches:
                batch.fail(error)
            # Its sequences may be taken: an abort moves the producer to a new epoch.
            self._txn.batch_failed(error)
            if error is e:
                raise
            raise error from e
        except BaseException as e:
            for batch in batches:
                batch.fail(e)
            raise
        finally:
            self._accumulator.round_done(batches)
