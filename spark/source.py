"""The ``txntable`` PySpark data source: batch reads here, streaming and writes beside it.

Spark creates the reader in a planning worker on the driver, pickles it into every task,
then calls :meth:`TxnTableReader.partitions` once. The reader therefore holds only parsed
options; the snapshot is loaded inside ``partitions()`` (once per query plan) and only the
planned slices travel to executors, inside :class:`ScanPartition`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.types import StructType

from txntable import config
from txntable.errors import InvalidConfigurationError
from txntable.protocol.schema import TypedLayout, layout_of
from txntable.protocol.snapshot import TableSnapshot
from txntable.read.timestamps import version_at_timestamp
from txntable.table import Table
from txntable.util import within_timeout

from .options import (
    ReadOptions,
    check_read_options,
    parse_bool,
    parse_columns,
    parse_int,
    parse_location,
    parse_read_options,
    parse_write_options,
)
from .planning import Pruning, plan_scan
from .scan import ScanPartition, open_table, read_partition
from .schema import spark_schema, typed_arrow_schema, typed_spark_schema
from .stream import TxnTableStreamReader
from .timepos import resolve_time_options
from .writer import TxnTableStreamWriter, TxnTableWriter

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT_NAME = "txntable"

#: Spark refuses its default save mode (ErrorIfExists) and Ignore for a Python data source
#: before the source is asked, advising Append or Overwrite: the refusal of Overwrite says
#: what does work, once.
APPEND_ONLY = (
    'a txntable is an append-only log: write with .mode("append"), the only save mode it '
    "supports (not Overwrite, nor Spark's default ErrorIfExists, nor Ignore)"
)


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
        KafkaTimeoutError: Storage kept failing for the request timeout (every step is
            a read, retried as the Python clients retry theirs).
    """
    return within_timeout(
        lambda: _load_table_snapshot(opts),
        config.REQUEST_TIMEOUT_MS_DEFAULT,
        f"loading table {opts.location.table}",
    )


def _load_table_snapshot(opts: ReadOptions) -> tuple[Table, TableSnapshot]:
    table = open_table(opts.location, opts.finish_stuck_transactions)
    if opts.version_as_of is not None:
        return table, table.snapshot_at(opts.version_as_of)
    if opts.timestamp_as_of is not None:
        return table, table.snapshot_at(version_at_timestamp(table, opts.timestamp_as_of))
    table.snapshot()
    table.finish_stuck_transactions()  # a dead producer's prepared transaction pins no LSO
    return table, table.snapshot(refresh=False)


def load_layout(options: dict[str, Any]) -> TypedLayout | None:
    """The layout of the table the options name (at ``versionAsOf`` if given): a typed
    table's schema decides the read schema.

    Raises:
        TableNotFoundError: No such table.
    """
    location = parse_location(options)
    version = parse_int(options, "versionAsOf", None, 0)

    def load() -> TableSnapshot:
        table = open_table(location, finish_stuck_transactions=False)
        return table.snapshot_at(version) if version is not None else table.snapshot()

    snap = within_timeout(load, config.REQUEST_TIMEOUT_MS_DEFAULT, f"loading {location.table}")
    return layout_of(snap.metadata)


def typed_read_options(
    opts: ReadOptions, layout: TypedLayout, schema: StructType | None
) -> ReadOptions:
    """``opts`` for a typed table: the layout, and the columns to read — the ``columns``
    option, or those of a user-given schema (``spark.read.schema(...)``), which Spark passes
    to the reader: the Python data source API (pyspark 4.3) has no column pruning of its
    own, so this is how a read asks for only some Parquet columns.

    Raises:
        InvalidConfigurationError: A user-given schema with a column the table does not
            have or of another type.
    """
    columns = opts.columns
    if schema is not None and schema != typed_spark_schema(layout, columns):
        table_schema = typed_spark_schema(layout)
        full = {f.name: f.dataType for f in table_schema.fields}
        for f in schema.fields:
            if f.name not in full:
                raise InvalidConfigurationError(
                    f"column {f.name} of the given schema is not a column of the table "
                    f"({table_schema.simpleString()})"
                )
            if full[f.name] != f.dataType:
                raise InvalidConfigurationError(
                    f"column {f.name} is {full[f.name].simpleString()} in the table, not "
                    f"{f.dataType.simpleString()} as the given schema says (a read does not "
                    "cast)"
                )
        columns = tuple(schema.names)
    else:
        schema = typed_spark_schema(layout, columns)
    return replace(opts, layout=layout, columns=columns, arrow_schema=typed_arrow_schema(schema))


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
        self.pruning = Pruning()

    def partitions(self) -> Sequence[InputPartition]:
        """Load the snapshot once and plan (see :func:`txntable_spark.planning.plan_scan`)."""
        table, snap = load_table_snapshot(self.opts)
        opts = resolve_time_options(table, snap, self.opts)
        groups = self.pruning.prune(plan_scan(snap, opts))
        return [ScanPartition.of(self.opts, g) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the partition's records as Arrow batches in :data:`ARROW_SCHEMA`."""
        return read_partition(partition)


class TxnTableFilteringReader(TxnTableReader):
    """The batch reader with filter pushdown (option ``pushFilters``): Spark refuses a
    reader implementing ``pushFilters`` unless ``spark.sql.python.filterPushdown.enabled``
    is set, so it is only used when asked for."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Filters on ``partition`` (``=``, ``IN``) and ``offset`` (comparisons) prune the
        planned segments; every filter is still returned for Spark to apply to the rows
        read."""
        for f in filters:
            self.pruning = self.pruning.narrowed(f)
        return filters


class TxnTableDataSource(DataSource):
    """``spark.read.format("txntable")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``txntable``."""
        return FORMAT_NAME

    def schema(self) -> StructType:
        """The read schema: Kafka's record (without ``headers`` if ``includeHeaders`` is
        false), or a typed table's columns (only those of ``columns`` if given), then
        partition, offset and timestamp."""
        options = self._options()
        check_read_options(options)
        layout = load_layout(options)
        columns = parse_columns(options)
        if layout is not None:
            return typed_spark_schema(layout, columns)
        if columns is not None:
            raise InvalidConfigurationError("the columns option applies to typed tables only")
        return spark_schema(parse_bool(options, "includeHeaders", True))

    def _read_options(self, schema: StructType, streaming: bool) -> ReadOptions:
        options = self._options()
        opts = parse_read_options(options, streaming=streaming)
        layout = load_layout(options)
        if layout is not None:
            return typed_read_options(opts, layout, schema)
        check_schema(schema, opts)
        return opts

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader; options are validated here, at planning time."""
        opts = self._read_options(schema, streaming=False)
        if parse_bool(self._options(), "pushFilters", False):
            return TxnTableFilteringReader(opts)
        return TxnTableReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader (see :mod:`txntable_spark.stream`); a typed table is read
        with the schema it had when the query started (a change fails the query, asking
        for a restart)."""
        return TxnTableStreamReader(self._read_options(schema, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """An atomic append writer (see :mod:`txntable_spark.writer`)."""
        if overwrite:
            raise InvalidConfigurationError(APPEND_ONLY)
        return TxnTableWriter(parse_write_options(self._options()), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """An exactly-once micro-batch writer (see :mod:`txntable_spark.writer`)."""
        if overwrite:
            raise InvalidConfigurationError(
                'a txntable is an append-only log: write the stream with outputMode("append")'
            )
        options = self._options()
        opts = parse_write_options(options, streaming=True)
        return TxnTableStreamWriter(opts, schema, options)

    def _options(self) -> dict[str, Any]:
        return dict(self.options.items())
