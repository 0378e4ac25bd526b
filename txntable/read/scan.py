"""``Table.scan``: a bulk read of a table as Arrow, under either isolation level.

A scan pins one snapshot (the latest, or ``version``) and plans its segment slices when it
is created (:mod:`txntable.read.planning`, the planning of every reader); reading them
(:mod:`txntable.read.reader`) happens in ``to_batches`` / ``to_arrow`` / ``to_pandas``, with the
segments fetched by a bounded thread pool ahead of the one being returned. Rows come out in
:data:`~txntable.protocol.records.READ_SCHEMA` (the Spark source's columns), partition by partition,
each in offset order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txntable import config
from txntable.errors import InvalidConfigurationError, SchemaMismatchError
from txntable.protocol.records import READ_SCHEMA
from txntable.protocol.schema import TypedLayout, layout_of
from txntable.protocol.snapshot import TableSnapshot
from txntable.read.planning import (
    EARLIEST,
    LATEST,
    OffsetRange,
    SegmentSlice,
    offset_spec,
    resolve_ranges,
    slices_in_ranges,
)
from txntable.read.reader import SegmentReader, prefetch
from txntable.structs import (
    READ_COMMITTED,
)
from txntable.util import within_timeout

if TYPE_CHECKING:
    import pandas as pd

    from txntable.table import Table

Offsets = str | int | Mapping[int, int] | None


class TableScan:
    """A planned read of one table; see :meth:`txntable.table.Table.scan`.

    Attributes:
        snapshot: The snapshot the scan reads.
        ranges: Per partition read, the offsets ``[start, end)`` covered.
        slices: The segment rows returned, in output order.
    """

    def __init__(
        self,
        table: Table,
        isolation_level: str = READ_COMMITTED,
        starting_offsets: Offsets = "earliest",
        ending_offsets: Offsets = "latest",
        partitions: Iterable[int] | None = None,
        version: int | None = None,
        max_workers: int = config.SCAN_WORKERS_DEFAULT,
        max_bytes_in_flight: int = config.FETCH_MAX_BYTES_DEFAULT,
        columns: Sequence[str] | None = None,
        request_timeout_ms: int = config.REQUEST_TIMEOUT_MS_DEFAULT,
    ) -> None:
        config.validate_arguments(config.SCAN_ARGUMENTS, locals())
        if columns is not None and (
            isinstance(columns, str) or not all(isinstance(c, str) for c in columns)
        ):
            raise InvalidConfigurationError(f"columns must be a list of names, not {columns!r}")
        read_committed = isolation_level == READ_COMMITTED
        if partitions is not None:
            partitions = list(dict.fromkeys(partitions))
            for p in partitions:
                if not config.is_int(p):
                    raise InvalidConfigurationError(f"partitions must be ints, not {p!r}")
        self.table = table
        self.isolation_level = isolation_level
        self.max_workers = max_workers
        self.max_bytes_in_flight = max_bytes_in_flight
        self.request_timeout_ms = request_timeout_ms
        starting = offset_spec(starting_offsets, EARLIEST)
        ending = offset_spec(ending_offsets, LATEST)
        if version is None:
            within_timeout(table.snapshot, request_timeout_ms, f"loading table {table.name}")
            if read_committed:
                table.finish_stuck_transactions()  # a dead producer's prepared txn pins no LSO
            self.snapshot: TableSnapshot = table.snapshot(refresh=False)
        else:
            self.snapshot = within_timeout(
                lambda: table.snapshot_at(version),
                request_timeout_ms,
                f"loading table {table.name} at version {version}",
            )
        # Planned now, from the snapshot as it is: a handle's snapshot is refreshed in place,
        # so planning later could mix versions.
        self.ranges: list[OffsetRange] = resolve_ranges(
            self.snapshot, starting, ending, read_committed, partitions=partitions
        )
        self.slices: list[SegmentSlice] = slices_in_ranges(
            self.snapshot, self.ranges, read_committed
        )
        #: A typed table's layout at the snapshot (``None``: Kafka's record).
        self.layout: TypedLayout | None = layout_of(self.snapshot.metadata)
        self.columns = None if columns is None else list(columns)
        self.schema: pa.Schema = self._output_schema()

    def _output_schema(self) -> pa.Schema:
        if self.layout is not None:
            return self.layout.read_schema(self.columns)
        if self.columns is None:
            return READ_SCHEMA
        unknown = [c for c in self.columns if c not in READ_SCHEMA.names]
        if unknown:
            raise SchemaMismatchError(
                f"no column {unknown[0]!r}; the columns are {READ_SCHEMA.names}"
            )
        return pa.schema([READ_SCHEMA.field(c) for c in self.columns])

    def _reader(self) -> SegmentReader:
        columns = self.columns if self.layout is not None else None
        return SegmentReader(self.table.store, self.layout, columns, self.request_timeout_ms)

    def count(self) -> int:
        """Number of records the scan returns.

        From the plan, without reading, except a merged segment the range starts or ends
        inside: its offsets have gaps, so it is read to count the records in range.

        Raises:
            MissingSegmentError, CorruptLogError, SchemaMismatchError: Reading such a
                merged segment failed.
        """
        reader = self._reader()  # opens nothing until asked to read
        return sum(
            s.rows if s.rows == s.min_rows else reader.read_slice(s).num_rows
            for s in self.slices
        )

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The records as Arrow record batches (one or more per segment), streaming.

        Memory stays bounded: at most ``max_workers`` segments, and at most
        ``max_bytes_in_flight`` bytes of them (always at least one), are fetched ahead of
        the batch being returned.

        Raises:
            MissingSegmentError: A segment of a committed batch is gone.
            CorruptLogError, SchemaMismatchError: A segment does not match its batch.
        """
        reader = self._reader()
        topic = self.table.name
        select = self.layout is None and self.columns is not None
        tables = prefetch(
            self.slices,
            lambda s: (
                reader.read_output(s, topic).select(self.columns)
                if select
                else reader.read_output(s, topic)
            ),
            min(self.max_workers, len(self.slices)),
            size=lambda s: s.size,
            max_bytes=self.max_bytes_in_flight,
        )
        for table in tables:
            yield from table.to_batches()

    def to_arrow(self) -> pa.Table:
        """All records as one Arrow table in :attr:`schema`
        (:data:`~txntable.protocol.records.READ_SCHEMA`
        for Kafka's record; a typed table's columns, then partition, offset, timestamp).

        Raises:
            MissingSegmentError, CorruptLogError, SchemaMismatchError: See
                :meth:`to_batches`.
        """
        return pa.Table.from_batches(list(self.to_batches()), schema=self.schema)

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        """All records as a pandas DataFrame (needs pandas); ``kwargs`` go to pyarrow."""
        return self.to_arrow().to_pandas(**kwargs)

    def __repr__(self) -> str:
        return (
            f"TableScan({self.table.name!r}, version={self.snapshot.version}, "
            f"{self.isolation_level}, {len(self.slices)} slices)"
        )
