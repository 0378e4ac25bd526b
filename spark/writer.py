"""Writes: ``df.write.format("txntable")`` (atomic append) and ``writeStream`` (exactly once).

Input columns follow Spark's Kafka sink: ``value`` (required, binary or string), ``key``
(binary or string), ``partition`` (int), ``headers`` (array<struct<key: string, value:
binary>>) and ``timestamp`` (timestamp, floored to milliseconds as Spark's Kafka sink floors
it; the write time when absent or null). Strings are
encoded as UTF-8. ``topic`` and ``offset`` are ignored (the path names the table; offsets
are assigned at commit), so a DataFrame read from a txntable can be written back as is; any
other column is refused (``SchemaMismatchError``) rather than silently lost.

A batch write with ``txnAppId`` and ``txnVersion`` is idempotent as in Delta: it commits
its version with ``AppTxn(txnAppId, txnVersion)`` unless the table already records that
version or a later one for the app id, in which case it writes nothing.

Each Spark task routes its rows to table partitions (the ``partition`` column when set,
else Kafka's murmur2 partitioner of ``key``, else one sticky partition per task for null
keys), writes one Parquet segment per table partition (more when a partition exceeds
``maxBytesPerSegment``) and returns :class:`~txntable.protocol.append.PendingBatch` descriptors. The
driver commits every batch of the job as ONE log version: nothing is visible until then, and
everything is at once. Batches are non-transactional (producer id -1), so the commit
never conflicts with producers; a lost race only rebases offsets.

A streaming micro-batch commits the same way plus an
:class:`~txntable.protocol.actions.AppTxn` ``(appId, batchId)``, ``appId`` being the query's
id (:mod:`txntable_spark.checkpoint`) or ``txnAppId``; the check "batchId already applied?"
runs inside the commit's retry loop against the refreshed snapshot, so a batch replayed after
a restart is skipped even when its first attempt's commit raced with other writers.
"""

from __future__ import annotations

import io
import logging
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from txntable import layout
from txntable.errors import (
    IllegalStateError,
    InvalidConfigurationError,
    SchemaMismatchError,
    TxnTableError,
    UnknownTopicOrPartitionError,
)
from txntable.layout import new_segment_name, spark_abort_key
from txntable.producer.partitioner import partitions_for_keys
from txntable.protocol.actions import AppTxn, Batch, CommitPlan
from txntable.protocol.append import AppendResult, PendingBatch, plan_append
from txntable.protocol.records import SEGMENT_SCHEMA
from txntable.protocol.schema import layout_of
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage import Store
from txntable.table import Table
from txntable.util import now_ms

from .checkpoint import app_id_of_query, checkpoint_option, read_query_id, task_query_id
from .options import WriteOptions, parse_write_options
from .scan import cached_store, open_table
from .timeconv import floor_timestamps
from .typedwrite import TypedWrite, plan_typed_write

__all__ = [
    "TxnCommitMessage",
    "TxnTableStreamWriter",
    "TxnTableWriter",
    "parse_write_options",
]

_SEG_HEADERS = SEGMENT_SCHEMA.field("headers").type
_SEG_TIMESTAMP = SEGMENT_SCHEMA.field("timestamp").type
_INT_TYPES = (IntegerType, LongType, ShortType, ByteType)


_log = logging.getLogger(__name__)


@dataclass
class TxnCommitMessage(WriterCommitMessage):
    """What a task sends the driver: the segments it wrote, not yet visible."""

    batches: list[PendingBatch] = field(default_factory=list)
    rows: int = 0
    #: A streaming task's query id (Spark's local property), checked by the driver.
    query_id: str | None = None


#: Columns a write accepts: the record's, plus the read-only ones of a txntable read
#: (``topic``, ``offset``), so that a DataFrame read from a table can be written back.
RECORD_COLUMNS = ("key", "value", "headers", "timestamp", "partition")
IGNORED_COLUMNS = ("topic", "offset")


def check_input_schema(schema: StructType) -> None:
    """Validate the DataFrame's columns against the Kafka-sink mapping.

    Raises:
        SchemaMismatchError: If ``value`` is missing, a known column has a wrong type, or
            there are other columns (they would be lost: a record has no place for them).
    """
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    accepted = RECORD_COLUMNS + IGNORED_COLUMNS
    extra = [f.name for f in schema.fields if f.name.lower() not in accepted]
    if extra:
        raise SchemaMismatchError(
            f"txntable write: columns {extra} have no place in a record (key, value, headers, "
            "timestamp, partition); select or drop them, or pack them into value (e.g. "
            "to_json(struct(...)))"
        )

    def bad(name: str, dtype: DataType, want: str) -> SchemaMismatchError:
        return SchemaMismatchError(
            f"txntable write: column {name} has type {dtype.simpleString()}, expected {want}"
        )

    if "value" not in fields:
        raise SchemaMismatchError("txntable write needs a 'value' column (binary or string)")
    for name in ("key", "value"):
        dtype = fields.get(name)
        if dtype is not None and not isinstance(dtype, BinaryType | StringType):
            raise bad(name, dtype, "binary or string")
    if "partition" in fields and not isinstance(fields["partition"], _INT_TYPES):
        raise bad("partition", fields["partition"], "int")
    if "timestamp" in fields and not isinstance(fields["timestamp"], TimestampType):
        raise bad("timestamp", fields["timestamp"], "timestamp")
    if "headers" in fields:
        h = fields["headers"]
        ok = (
            isinstance(h, ArrayType)
            and isinstance(h.elementType, StructType)
            and [f.name for f in h.elementType.fields] == ["key", "value"]
            and isinstance(h.elementType.fields[0].dataType, StringType)
            and isinstance(h.elementType.fields[1].dataType, BinaryType | StringType)
        )
        if not ok:
            raise bad("headers", h, "array<struct<key:string,value:binary>>")


# --- executor side: routing and segment writing ----------------------------------------------


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    for i, n in enumerate(batch.schema.names):
        if n.lower() == name:
            return batch.column(i)
    return None


def _as_binary(arr: pa.Array | None, n: int) -> pa.Array:
    if arr is None:
        return pa.nulls(n, pa.binary())
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.large_binary()).cast(pa.binary())
    # string -> binary is a reinterpretation of the same UTF-8 bytes.
    return arr.cast(pa.binary())


def _as_headers(arr: pa.Array | None, n: int) -> pa.Array:
    if arr is None:
        return pa.array([[] for _ in range(n)], _SEG_HEADERS)
    if arr.null_count:
        arr = pc.if_else(pc.is_null(arr), pa.scalar([], arr.type), arr)
    values = arr.flatten()
    if values.null_count or values.field("key").null_count:
        raise SchemaMismatchError("txntable write: a header or a header key is null")
    return arr.cast(_SEG_HEADERS)


def _as_timestamps(arr: pa.Array | None, n: int, now: int) -> pa.Array:
    if arr is None:
        return pa.array(np.full(n, now, dtype=np.int64)).cast(_SEG_TIMESTAMP)
    # Spark sends microseconds; segments keep Kafka's milliseconds, floored as Spark's
    # Kafka sink floors them (-1.5 ms is -2 ms).
    ms = floor_timestamps(arr, "ms").cast(_SEG_TIMESTAMP)
    if ms.null_count:
        ms = ms.cast(pa.int64()).fill_null(now).cast(_SEG_TIMESTAMP)
    return ms


class Router:
    """Kafka's partition choice: explicit partition, murmur2 of the key, or sticky.

    Vectorised: one murmur2 pass over the keys that need it, no Python work per row.
    """

    def __init__(self, num_partitions: int, sticky: int) -> None:
        self.num_partitions = num_partitions
        self.sticky = sticky % num_partitions

    def route(self, keys: pa.Array | pa.ChunkedArray, explicit: pa.Array | None) -> np.ndarray:
        """Target partition of every row."""
        n = len(keys)
        out = np.full(n, self.sticky, dtype=np.int64)
        need_key = np.ones(n, dtype=bool)
        if explicit is not None:
            valid = explicit.is_valid().to_numpy(zero_copy_only=False)
            vals = explicit.fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False)
            bad = valid & ((vals < 0) | (vals >= self.num_partitions))
            if bad.any():
                raise UnknownTopicOrPartitionError(
                    f"partition {int(vals[bad][0])} is outside the table's "
                    f"{self.num_partitions} partitions"
                )
            out[valid] = vals[valid]
            need_key = ~valid
        if keys.null_count < n and need_key.any():
            rows = np.flatnonzero(need_key)
            hashed = partitions_for_keys(
                keys if rows.size == n else keys.take(pa.array(rows)), self.num_partitions
            )
            keyed = hashed >= 0  # -1: a null key stays on the sticky partition
            out[rows[keyed]] = hashed[keyed]
        return out


def encode_table(table: pa.Table) -> bytes:
    """A segment's bytes (same layout and codec as
    :func:`txntable.protocol.records.encode_segment`)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


class SegmentWriter:
    """Buffers one task's rows per table partition and writes them as segments."""

    def __init__(self, store: Store, table: str, write_id: str, max_bytes: int) -> None:
        self.store = store
        self.table = table
        self.write_id = write_id
        self.max_bytes = max_bytes
        self.buffers: dict[int, list[pa.Table]] = {}
        self.buffered_bytes: dict[int, int] = {}
        self.written: list[PendingBatch] = []
        self.rows = 0

    def add(self, partition: int, rows: pa.Table) -> None:
        """Buffer rows for ``partition``; write a segment once the buffer is large."""
        self.buffers.setdefault(partition, []).append(rows)
        self.buffered_bytes[partition] = self.buffered_bytes.get(partition, 0) + rows.nbytes
        if self.buffered_bytes[partition] >= self.max_bytes:
            self._flush(partition)

    def _flush(self, *partitions: int) -> None:
        """Write the buffers of ``partitions`` as segments, together: one
        ``put_data_files`` (S3: in parallel; local disk: one fsync pass)."""
        items: list[tuple[str, bytes]] = []
        batches: list[PendingBatch] = []
        for partition in partitions:
            parts = self.buffers.pop(partition, [])
            self.buffered_bytes.pop(partition, None)
            if not parts:
                continue
            table = pa.concat_tables(parts).combine_chunks()
            data = encode_table(table)
            key = segment_key(self.table, partition, self.write_id)
            items.append((key, data))
            stamps = pc.min_max(table.column("timestamp").cast(pa.int64()))
            batches.append(
                PendingBatch(
                    partition=partition,
                    path=key,
                    count=table.num_rows,
                    size=len(data),
                    min_timestamp=stamps["min"].as_py(),
                    max_timestamp=stamps["max"].as_py(),
                )
            )
        if not items:
            return
        self.store.put_data_files(items)
        # Spark may call abort while tasks still run; abort writes its tombstone before it
        # lists the job's files, so segments put after that listing are removed here.
        if self.store.head(abort_tombstone(self.table, self.write_id)) is not None:
            self.store.delete_many([key for key, _ in items])
            raise IllegalStateError(f"write job {self.write_id} was aborted")
        self.written.extend(batches)
        self.rows += sum(b.count for b in batches)

    def finish(self) -> TxnCommitMessage:
        """Write every remaining buffer; the message lists all segments, by partition."""
        self._flush(*sorted(self.buffers))
        return TxnCommitMessage(self.written, self.rows)


def abort_tombstone(table: str, write_id: str) -> str:
    """Key marking a batch write job as aborted (tasks still running then clean up)."""
    return spark_abort_key(table, write_id)


def segment_key(table: str, partition: int, write_id: str) -> str:
    """A new segment key; the write id prefix lets abort find every file of the job."""
    # The name carries its creation time, so vacuum can date it without storage metadata.
    return layout.segment_key(table, partition, new_segment_name(write_id + "-"))


def write_task(
    batches: Iterable[pa.RecordBatch],
    opts: WriteOptions,
    num_partitions: int,
    write_id: str,
    typed: TypedWrite | None = None,
) -> TxnCommitMessage:
    """Executor side of both writers: route, write segments, describe them (a typed
    table's rows conformed by ``typed``, routed by its key columns)."""
    loc = opts.location
    store = cached_store(loc.warehouse_url, loc.storage_options)
    router = Router(num_partitions, _sticky_partition(num_partitions))
    out = SegmentWriter(store, loc.table, write_id, opts.max_bytes_per_segment)
    now = now_ms()
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        keys: pa.Array | pa.ChunkedArray
        if typed is not None:
            rows = typed.conform(pa.Table.from_batches([batch]), now)
            keys = typed.layout.keys(rows)
        else:
            value = _column(batch, "value")
            if value is None:
                raise SchemaMismatchError("txntable write needs a 'value' column")
            keys = _as_binary(_column(batch, "key"), n)
            rows = pa.Table.from_arrays(
                [
                    keys,
                    _as_binary(value, n),
                    _as_headers(_column(batch, "headers"), n),
                    _as_timestamps(_column(batch, "timestamp"), n, now),
                ],
                schema=SEGMENT_SCHEMA,
            )
        targets = router.route(keys, _column(batch, "partition"))
        if (targets == targets[0]).all():
            out.add(int(targets[0]), rows)
            continue
        order = np.argsort(targets, kind="stable")
        rows = rows.take(pa.array(order))
        sorted_targets = targets[order]
        bounds = np.flatnonzero(np.diff(sorted_targets)) + 1
        for lo, hi in zip(
            np.concatenate(([0], bounds)), np.concatenate((bounds, [n])), strict=True
        ):
            out.add(int(sorted_targets[lo]), rows.slice(int(lo), int(hi - lo)))
    return out.finish()


def _sticky_partition(num_partitions: int) -> int:
    # Null-key rows of one task stick to one partition (KIP-480); spreading tasks by their
    # partition id keeps the choice deterministic for a given job.
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return ctx.partitionId() % num_partitions
    except ImportError:  # pragma: no cover - always importable on an executor
        pass
    return random.randrange(num_partitions)


def _batches(messages: Iterable[WriterCommitMessage | None]) -> list[PendingBatch]:
    out = [b for m in messages if isinstance(m, TxnCommitMessage) for b in m.batches]
    # A deterministic order makes offsets reproducible for a given set of task outputs.
    return sorted(out, key=lambda b: (b.partition, b.path))


def _delete(store: Store, keys: Iterable[str]) -> None:
    for key in keys:
        try:
            store.delete(key)
        except (TxnTableError, OSError) as e:
            # Best effort while Spark is already failing the job: an orphan is invisible and
            # vacuum removes it later; the job's own error is the one to surface.
            _log.warning("could not delete segment %s of an aborted write: %s", key, e)


def _job_files(store: Store, table: str, num_partitions: int, write_id: str) -> list[str]:
    keys: list[str] = []
    for p in range(num_partitions):
        keys.extend(store.list(f"{layout.data_dir(table, p)}{write_id}-"))
    return keys


def app_txn_append(
    batches: list[PendingBatch], app_id: str, version: int, operation: str
) -> Callable[[TableSnapshot], CommitPlan[AppendResult | None]]:
    """The commit ``build`` of an idempotent write: append ``batches`` with
    ``AppTxn(app_id, version)``, or nothing (result ``None``) if the table already records
    ``version`` or a later one for ``app_id`` (Delta's ``txn`` rule). Pure, so the commit
    loop re-decides against every newer snapshot it rebases onto."""

    def build(s: TableSnapshot) -> CommitPlan[AppendResult | None]:
        prev = s.app_txns.get(app_id)
        if prev is not None and prev.version >= version:
            return CommitPlan([], None, operation)  # already in the table
        now = now_ms()
        plan = plan_append(s, batches, [], AppTxn(app_id, version, now), now)
        return CommitPlan(plan.actions, plan.result, operation)

    return build


def plain_append(
    batches: list[PendingBatch],
) -> Callable[[TableSnapshot], CommitPlan[AppendResult]]:
    """The commit ``build`` of :meth:`Table.append` of ``batches`` (pure)."""

    def build(s: TableSnapshot) -> CommitPlan[AppendResult]:
        return plan_append(s, batches, [], None, now_ms())

    return build


# --- the writers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteSetup:
    """What the driver fixes once for a batch write job or a streaming query."""

    #: How the tasks conform rows to a typed table (``None``: Kafka's record).
    typed: TypedWrite | None
    num_partitions: int
    #: The table version the write started from.
    version: int
    #: Prefix of the job's segment names (abort finds the job's files by it).
    write_id: str


def prepare_write(opts: WriteOptions, schema: StructType) -> WriteSetup:
    """Check the DataFrame's schema against the table and fix the write's parameters (the
    batch and the streaming writer's common setup).

    Raises:
        SchemaMismatchError: The DataFrame's columns do not fit the table.
    """
    snap = open_table(opts.location).snapshot()
    table_layout = layout_of(snap.metadata)
    typed: TypedWrite | None = None
    if table_layout is not None:
        typed = plan_typed_write(table_layout, schema, opts.merge_schema)
    else:
        check_input_schema(schema)
    return WriteSetup(typed, snap.num_partitions, snap.version, uuid.uuid4().hex)


class TxnTableWriter(DataSourceArrowWriter):
    """Batch append: every task's segments become visible in one log version, or none do."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        setup = prepare_write(opts, schema)
        #: How the tasks conform rows to a typed table (``None``: Kafka's record).
        self.typed = setup.typed
        self.num_partitions = setup.num_partitions
        self.start_version = setup.version
        self.write_id = setup.write_id
        self.committed_version: int | None = None
        #: Set when ``txnVersion`` was already applied and nothing was committed.
        self.skipped = False

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Executor: write this task's segments (invisible until the driver commits)."""
        return write_task(iterator, self.opts, self.num_partitions, self.write_id, self.typed)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: commit all segments as one log version (no version if nothing was written).

        With ``txnAppId`` + ``txnVersion`` (Delta's idempotent write) the version is skipped,
        and its segments deleted, when the table already records that version (or a later
        one) for the app id; the check runs inside the commit loop, against the newest
        version.
        """
        batches = _batches(messages)
        if not batches:
            return
        table = open_table(self.opts.location)
        opts = self.opts
        if opts.txn_app_id is not None and opts.txn_version is not None:
            build = app_txn_append(batches, opts.txn_app_id, opts.txn_version, "WRITE")
            if self.typed is not None:
                build = self.typed.commit_build(build)
            plan, version = table.commit(build)
            if plan.result is None:
                self.skipped = True
                _delete(table.store, [b.path for b in batches])
                committed: set[str] = set()
            else:
                self.committed_version = version
                committed = {b.path for b in batches}
        elif self.typed is not None:
            append = self.typed.commit_build(plain_append(batches))
            _, self.committed_version = table.commit(append)
            committed = {b.path for b in batches}
        else:
            _, self.committed_version = table.append(batches)
            committed = {b.path for b in batches}
        # Files of failed or speculative task attempts are in no message: remove them.
        leftovers = [
            k
            for k in _job_files(table.store, table.name, self.num_partitions, self.write_id)
            if k not in committed
        ]
        _delete(table.store, leftovers)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: delete the job's segments, but only once the log shows none committed.

        Spark also calls this when :meth:`commit` raised, and a commit whose outcome was
        ambiguous may have landed: the log after ``start_version`` is read first, and if
        any of the job's segments is referenced (or the log cannot be read) nothing is
        deleted. Spark does not wait for cancelled tasks, so a tombstone is written first:
        a task finishing a segment after that deletes it itself.
        """
        table = open_table(self.opts.location)
        try:
            ours = set(_job_files(table.store, table.name, self.num_partitions, self.write_id))
            ours |= {b.path for b in _batches(messages)}
            if self._landed(table, ours):
                return
            # From here on a late task deletes its own segment (see SegmentWriter._flush).
            table.store.put(abort_tombstone(table.name, self.write_id), b"")
            ours |= set(_job_files(table.store, table.name, self.num_partitions, self.write_id))
        except (TxnTableError, OSError) as e:
            # Without proof that nothing landed, keep the files (vacuum removes orphans).
            _log.warning("abort of write %s keeps its files: %s", self.write_id, e)
            return
        _delete(table.store, sorted(ours))

    def _landed(self, table: Table, paths: set[str]) -> bool:
        """Whether a log version after ``start_version`` references any of ``paths``."""
        version = self.start_version + 1
        while (actions := table.log.read_version(version)) is not None:
            if any(isinstance(a, Batch) and a.path in paths for a in actions):
                return True
            version += 1
        return False


class TxnTableStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once micro-batch sink: one log version per batch, tagged ``AppTxn(app, batch)``.

    The app id is ``txnAppId`` if given, else the query's id read from its checkpoint (see
    :mod:`txntable_spark.checkpoint`).
    """

    def __init__(self, opts: WriteOptions, schema: StructType, options: dict[str, str]) -> None:
        self.opts = opts
        #: The query id read from the checkpoint (``None`` with an explicit ``txnAppId``).
        self.query_id: str | None = None
        if opts.txn_app_id is not None:
            self.app_id = opts.txn_app_id
        else:
            location = checkpoint_option(options)
            if location is None:
                raise InvalidConfigurationError(
                    "a txntable streaming write needs option checkpointLocation (its query "
                    "id is the idempotency key of its micro-batches) or txnAppId"
                )
            self.query_id = read_query_id(location)
            self.app_id = app_id_of_query(self.query_id)
        setup = prepare_write(opts, schema)
        self.typed = setup.typed
        self.num_partitions = setup.num_partitions
        self.write_id = setup.write_id
        self.last_result: str | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Executor: write this task's segments of the micro-batch."""
        message = write_task(iterator, self.opts, self.num_partitions, self.write_id, self.typed)
        message.query_id = task_query_id()
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: commit the micro-batch unless ``batchId`` was already applied.

        Raises:
            InvalidConfigurationError: A task ran for another query than the one whose
                checkpoint the writer read (the location was resolved unlike Spark).
        """
        self._check_query(messages)
        batches = _batches(messages)
        table = open_table(self.opts.location)
        if not batches:
            self.last_result = "empty"
            return
        build = app_txn_append(batches, self.app_id, batchId, "STREAMING UPDATE")
        if self.typed is not None:
            build = self.typed.commit_build(build)
        plan, _ = table.commit(build)
        if plan.result is None:
            self.last_result = "skipped"
            _delete(table.store, [b.path for b in batches])
        else:
            self.last_result = "committed"

    def _check_query(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.query_id is None:
            return
        for m in messages:
            if isinstance(m, TxnCommitMessage) and m.query_id not in (None, self.query_id):
                raise InvalidConfigurationError(
                    f"the checkpoint the txntable sink read holds query id {self.query_id}, "
                    f"but the query running is {m.query_id}: checkpointLocation was "
                    "resolved differently from Spark (a non-local default file system?); "
                    "set option txnAppId"
                )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: delete the batch's segments if no commit of ``batchId`` is in the log.

        When the log already records ``batchId`` for this app the files are kept: they may
        be the committed ones (a commit that raised after landing).
        """
        try:
            table = open_table(self.opts.location)
            prev = table.snapshot().app_txns.get(self.app_id)
        except (TxnTableError, OSError) as e:
            # Cannot prove the batch did not land: keep the files (vacuum removes orphans).
            _log.warning("abort of micro-batch %d keeps its files: %s", batchId, e)
            return
        if prev is None or prev.version < batchId:
            _delete(table.store, [b.path for b in _batches(messages)])

