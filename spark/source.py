"""The ``txntable`` PySpark data source: batch reads here, streaming and writes beside it.

Spark creates the reader in a planning worker on the driver, pickles it into every task,
then calls :meth:`TxnTableReader.partitions` once. The reader therefore holds only parsed
options; the snapshot is loaded inside ``partitions()`` (once per query plan) and only the
planned slices travel to executors, inside :class:`ScanPartition`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from txntable.errors import InvalidConfigurationError
from txntable.snapshot import TableSnapshot
from txntable.table import Table
from txntable.timestamps import version_at_timestamp
from txntable.warehouse import Warehouse

from .options import ReadOptions, TableLocation, parse_bool, parse_read_options
from .planning import SegmentSlice, plan_scan
from .scan import read_slices
from .schema import spark_schema
from .timepos import resolve_time_options

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT_NAME = "txntable"


class ScanPartition(InputPartition):
    """One Spark task's work: segment slices plus what it needs to reopen the store."""

    def __init__(
        self, location: TableLocation, slices: list[SegmentSlice], include_headers: bool = True
    ) -> None:
        super().__init__(None)
        self.location = location
        self.slices = slices
        self.include_headers = include_headers

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


def load_snapshot(opts: ReadOptions) -> TableSnapshot:
    """The snapshot a batch read plans from: the latest, or ``versionAsOf``.

    Raises:
        VersionNotFoundError: ``versionAsOf`` is beyond the newest version.
    """
    return load_table_snapshot(opts)[1]


def load_table_snapshot(opts: ReadOptions) -> tuple[Table, TableSnapshot]:
    """The table handle and the snapshot a batch read plans from (``versionAsOf`` /
    ``timestampAsOf`` time travel, else the latest).

    Raises:
        VersionNotFoundError: ``versionAsOf`` is beyond the newest version, or
            ``timestampAsOf`` before the first or after the latest commit.
    """
    table = open_table(opts.location, opts.finish_stuck_transactions)
    if opts.version_as_of is not None:
        return table, table.snapshot_at(opts.version_as_of)
    if opts.timestamp_as_of is not None:
        return table, table.snapshot_at(version_at_timestamp(table, opts.timestamp_as_of))
    table.snapshot()
    table.finish_stuck_transactions()  # a dead producer's prepared transaction pins no LSO
    return table, table.snapshot(refresh=False)


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
    )


def check_schema(schema: StructType, opts: ReadOptions) -> None:
    """Reject a user-specified schema other than the fixed one (per ``includeHeaders``).

    Raises:
        InvalidConfigurationError: If ``schema`` differs from :func:`spark_schema`.
    """
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise InvalidConfigurationError(
            f"txntable has a fixed schema {expected.simpleString()}; got "
            f"{schema.simpleString()}"
        )


class TxnTableReader(DataSourceReader):
    """Batch reader: plans segment slices on the driver, reads them on executors."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """Load the snapshot once and plan (see :func:`txntable_spark.planning.plan_scan`)."""
        table, snap = load_table_snapshot(self.opts)
        groups = plan_scan(snap, resolve_time_options(table, snap, self.opts))
        return [ScanPartition(self.opts.location, g, self.opts.include_headers) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the partition's records as Arrow batches in :data:`ARROW_SCHEMA`."""
        return read_partition(partition)


class TxnTableDataSource(DataSource):
    """``spark.read.format("txntable")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``txntable``."""
        return FORMAT_NAME

    def schema(self) -> StructType:
        """The fixed read schema, without ``headers`` if ``includeHeaders`` is false."""
        return spark_schema(parse_bool(self._options(), "includeHeaders", True))

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader; options are validated here, at planning time."""
        opts = parse_read_options(self._options())
        check_schema(schema, opts)
        return TxnTableReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader (see :mod:`txntable_spark.stream`)."""
        from .stream import TxnTableStreamReader

        opts = parse_read_options(self._options(), streaming=True)
        check_schema(schema, opts)
        return TxnTableStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """An atomic append writer (see :mod:`txntable_spark.writer`)."""
        from .writer import TxnTableWriter, parse_write_options

        if overwrite:
            raise InvalidConfigurationError("txntable supports only mode('append')")
        return TxnTableWriter(parse_write_options(self._options()), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """An exactly-once micro-batch writer (see :mod:`txntable_spark.writer`)."""
        from .writer import (
            TxnTableStreamWriter,
            parse_write_options,
            stream_app_id,
        )

        if overwrite:
            raise InvalidConfigurationError("txntable supports only outputMode('append')")
        options = self._options()
        opts = parse_write_options(options, streaming=True)
        return TxnTableStreamWriter(opts, schema, stream_app_id(opts, options))

    def _options(self) -> dict[str, Any]:
        return dict(self.options.items())
