"""Executor side of a read: planned segment slices in, Arrow record batches out; and the
input partition (:class:`ScanPartition`) that carries them there from the driver.

Runs inside Spark's Python workers. Reading is the core's (:mod:`txntable.read.reader`, shared
with ``Table.scan`` and the consumer): segments are fetched a few at a time in threads
because object-store reads are latency bound. What is Spark's is here: the store is reopened
from the warehouse URL and the storage options carried by the input partition (and cached
per worker process, since workers are reused across tasks), and small slices are merged
into batches of about :data:`TARGET_BATCH_ROWS` rows because every batch crossing to the
JVM has a fixed cost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from txntable.protocol.schema import TypedLayout
from txntable.read.reader import SegmentReader, prefetch
from txntable.storage import Store, open_store
from txntable.table import Table
from txntable.warehouse import Warehouse

from .options import ReadOptions, TableLocation
from .planning import SegmentSlice
from .schema import to_spark_batches, typed_arrow_schema, typed_spark_schema

#: Rows per record batch handed to Spark (small segments are merged up to this).
TARGET_BATCH_ROWS = 65_536
#: Segments fetched concurrently per task.
PREFETCH = 8

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], Store] = {}
_stores_lock = threading.Lock()


def cached_store(url: str, storage_options: dict[str, str]) -> Store:
    """The store for ``url``, opened once per worker process and options."""
    key = (url, tuple(sorted(storage_options.items())))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(url, storage_options)
        return store


def read_slices(
    url: str,
    storage_options: dict[str, str],
    topic: str,
    slices: list[SegmentSlice],
    include_headers: bool = True,
    layout: TypedLayout | None = None,
    columns: Sequence[str] | None = None,
    arrow_schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``slices``, in order, in the exact output schema (a typed table's:
    ``columns`` of it, only those read from Parquet)."""
    if not slices:
        return
    reader = SegmentReader(cached_store(url, storage_options), layout, columns)
    target = arrow_schema
    if layout is not None and target is None:
        target = typed_arrow_schema(typed_spark_schema(layout, columns))
    window = min(PREFETCH, len(slices))
    buffered: list[pa.Table] = []
    rows = 0
    def read(s: SegmentSlice) -> pa.Table:
        out = reader.read_output(s, topic, include_headers)
        return out if target is None else to_spark_batches(out, target)

    for table in prefetch(slices, read, window):
        buffered.append(table)
        rows += table.num_rows
        if rows >= TARGET_BATCH_ROWS:
            yield from _flush(buffered)
            buffered, rows = [], 0
    if buffered:
        yield from _flush(buffered)


def _flush(tables: list[pa.Table]) -> Iterator[pa.RecordBatch]:
    merged = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    yield from merged.combine_chunks().to_batches(max_chunksize=TARGET_BATCH_ROWS * 4)


class ScanPartition(InputPartition):
    """One Spark task's work: segment slices plus what it needs to reopen the store."""

    def __init__(
        self,
        location: TableLocation,
        slices: list[SegmentSlice],
        include_headers: bool = True,
        layout: TypedLayout | None = None,
        columns: tuple[str, ...] | None = None,
        arrow_schema: pa.Schema | None = None,
    ) -> None:
        super().__init__(None)
        self.location = location
        self.slices = slices
        self.include_headers = include_headers
        #: A typed table's layout and the columns read (``None``: Kafka's record / all).
        self.layout = layout
        self.columns = columns
        self.arrow_schema = arrow_schema

    @classmethod
    def of(cls, opts: ReadOptions, slices: list[SegmentSlice]) -> ScanPartition:
        """The input partition reading ``slices`` as ``opts`` says."""
        return cls(
            opts.location,
            slices,
            opts.include_headers,
            opts.layout,
            opts.columns,
            opts.arrow_schema,
        )

    def __repr__(self) -> str:
        # InputPartition's default repr prints every attribute; keep credentials out.
        return f"ScanPartition({self.location!r}, {len(self.slices)} slices)"


def open_table(location: TableLocation, finish_stuck_transactions: bool = True) -> Table:
    """A fresh handle on the table at ``location``.

    Raises:
        TableNotFoundError: If the warehouse has no such table.
    """
    warehouse = Warehouse(
        location.warehouse_url,
        location.storage_options,
        finish_stuck_transactions=finish_stuck_transactions,
    )
    return warehouse.table(location.table)


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor entry point shared by the batch and the streaming reader."""
    if not isinstance(partition, ScanPartition):
        return iter(())  # Spark's placeholder partition for an empty plan
    loc = partition.location
    return read_slices(
        loc.warehouse_url,
        loc.storage_options,
        loc.table,
        partition.slices,
        partition.include_headers,
        partition.layout,
        partition.columns,
        partition.arrow_schema,
    )
