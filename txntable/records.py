"""Records and their Parquet segments.

A segment holds one producer batch of one partition: columns ``key``, ``value``,
``headers`` and ``timestamp`` (the default record schema). Offsets are not stored; a reader
computes them as the batch's base offset plus the row index.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txntable.errors import (
    CorruptLogError,
    InvalidArgumentTypeError,
    MissingSegmentError,
    ObjectNotFoundError,
    SchemaMismatchError,
)
from txntable.storage.base import Store

Header = tuple[str, bytes | None]

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())])
SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("item", HEADER_TYPE, nullable=False))),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    ]
)

#: A merged segment (protocol v2) carries each record's offset explicitly, first.
OFFSET_COLUMN = "offset"
MERGED_SEGMENT_SCHEMA = pa.schema(
    [pa.field(OFFSET_COLUMN, pa.int64(), nullable=False), *SEGMENT_SCHEMA]
)

#: Bytes a record costs beyond its key, value and headers (Kafka's record overhead, roughly).
RECORD_OVERHEAD = 21


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A partition of a table (a topic, in Kafka's words)."""

    topic: str
    partition: int


def check_topic_partition(tp: object, what: str = "partition") -> TopicPartition:
    """``tp`` if it is a :class:`TopicPartition`.

    Raises:
        InvalidArgumentTypeError: Otherwise (a tuple, a string, a partition number, ...).
    """
    if not isinstance(tp, TopicPartition):
        raise InvalidArgumentTypeError(
            f"{what} must be a TopicPartition, not {type(tp).__name__} {tp!r:.60}"
        )
    return tp


def check_topic_partitions(tps: object, what: str = "partitions") -> list[TopicPartition]:
    """A list of the :class:`TopicPartition` in the iterable ``tps``.

    Raises:
        InvalidArgumentTypeError: ``tps`` is a single partition, a string, not iterable, or
            holds something else.
    """
    if isinstance(tps, TopicPartition | str | bytes) or not isinstance(tps, Iterable):
        raise InvalidArgumentTypeError(
            f"{what} must be a list of TopicPartition, not {type(tps).__name__} {tps!r:.60}"
        )
    return [check_topic_partition(tp, f"each of {what}") for tp in tps]


@dataclass(frozen=True)
class ProducerRecord:
    """A record waiting in the producer."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = 0

    def size_in_bytes(self) -> int:
        """Approximate serialized size, used for batch size, buffer memory and limits."""
        size = RECORD_OVERHEAD + len(self.key or b"") + len(self.value or b"")
        for k, v in self.headers:
            size += len(k.encode()) + len(v or b"") + 2
        return size


@dataclass(frozen=True)
class ConsumerRecord:
    """A record returned by :meth:`Consumer.poll`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list)
    timestamp: int = 0


@dataclass(frozen=True)
class RecordMetadata:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


def encode_segment(records: list[ProducerRecord]) -> bytes:
    """Encode one batch of records as a Parquet segment."""
    table = pa.table(
        {
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records],
                SEGMENT_SCHEMA.field("headers").type,
            ),
            "timestamp": pa.array([r.timestamp for r in records], pa.timestamp("ms", tz="UTC")),
        },
        schema=SEGMENT_SCHEMA,
    )
    return encode_table(table)


def decode_segment(
    data: bytes, path: str, expected_count: int, merged: bool = False
) -> pa.Table:
    """Decode a Parquet segment and check it against its batch.

    Raises:
        CorruptLogError: If the bytes are not a readable Parquet file.
        SchemaMismatchError: If its schema or row count does not match the batch.
    """
    try:
        # ParquetFile, not read_table: the dataset reader refuses a file with a column
        # name twice, which is valid Parquet (and a schema mismatch, reported below).
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptLogError(f"segment is not readable Parquet ({e})", path) from None
    return check_segment(table, path, expected_count, merged)


def check_segment(
    table: pa.Table, path: str, expected_count: int, merged: bool = False
) -> pa.Table:
    """Check a decoded segment's schema and row count against its batch (or segment) action.

    Columns are taken by name and cast to the segment schema (``merged``: the merged-segment
    schema, with its offset column): their order is free and columns of other names are
    ignored (the spec's "any Parquet file that casts").

    Raises:
        SchemaMismatchError: A segment column is missing, present twice or does not cast,
            or the row count differs from the batch's.
    """
    schema = MERGED_SEGMENT_SCHEMA if merged else SEGMENT_SCHEMA
    if not table.schema.equals(schema):
        try:
            table = table.select(schema.names).cast(schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise SchemaMismatchError(
                f"segment {path} does not match the record schema: {e}"
            ) from None
    if table.num_rows != expected_count:
        raise SchemaMismatchError(
            f"segment {path} has {table.num_rows} records, its batch says {expected_count}"
        )
    return table


def read_segment(store: Store, path: str, expected_count: int, merged: bool = False) -> pa.Table:
    """Read a committed batch's segment (``merged``: a merged segment, with its offsets).

    Raises:
        MissingSegmentError: If the segment object is gone.
    """
    try:
        data = store.get_data_file(path)
    except ObjectNotFoundError:
        raise MissingSegmentError(f"segment {path} of a committed batch is missing", path) from None
    return decode_segment(data, path, expected_count, merged)


def encode_table(table: pa.Table) -> bytes:
    """Encode an Arrow table of records (segment or merged-segment schema) as Parquet."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def table_to_records(
    table: pa.Table, topic: str, partition: int, base_offset: int, start: int, stop: int
) -> list[ConsumerRecord]:
    """Turn rows ``[start, stop)`` of a segment into consumer records.

    A merged segment's offsets come from its offset column, a batch's from ``base_offset``.
    """
    sliced = table.slice(start, stop - start)
    if OFFSET_COLUMN in sliced.column_names:
        offsets = sliced.column(OFFSET_COLUMN).to_pylist()
    else:
        offsets = list(range(base_offset + start, base_offset + stop))
    keys = sliced.column("key").to_pylist()
    values = sliced.column("value").to_pylist()
    headers: list[Any] = sliced.column("headers").to_pylist()
    stamps = sliced.column("timestamp").cast(pa.int64()).to_pylist()
    return [
        ConsumerRecord(
            topic,
            partition,
            offsets[i],
            keys[i],
            values[i],
            [(h["key"], h["value"]) for h in headers[i] or []],
            stamps[i],
        )
        for i in range(len(keys))
    ]
