"""The Spark schema of a txntable read, and its exact Arrow counterpart.

Columns follow Spark's Kafka source (without ``timestampType``)::

    key        binary     nullable      (Kafka allows a null key)
    value      binary     nullable      (a tombstone has a null value)
    topic      string     NOT NULL      (the table name)
    partition  int        NOT NULL
    offset     bigint     NOT NULL
    timestamp  timestamp  NOT NULL      (UTC; segments store milliseconds)
    headers    array<struct<key: string NOT NULL, value: binary>> NOT NULL,
               elements NOT NULL        (a record without headers has an empty array)

With the read option ``includeHeaders=false`` the ``headers`` column is left out
(:func:`spark_schema`, :data:`ARROW_SCHEMA_NO_HEADERS`).

Every record has a topic, partition, offset, timestamp and a (possibly empty) header list,
so those are declared non-null, unlike the Kafka source, which declares everything
nullable; header values may be null as in Kafka. Python data sources must yield Arrow
batches whose schema equals ``to_arrow_schema(SPARK_SCHEMA, timezone="UTC")`` exactly:
:data:`ARROW_SCHEMA` is that schema (a test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txntable.protocol.records import (
    READ_HEADER_STRUCT,
    READ_HEADERS,
    READ_SCHEMA,
    READ_SCHEMA_NO_HEADERS,
    READ_TIMESTAMP,
)
from txntable.protocol.schema import TypedLayout, fill_required

HEADER_STRUCT = StructType(
    [StructField("key", StringType(), False), StructField("value", BinaryType(), True)]
)

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("headers", ArrayType(HEADER_STRUCT, containsNull=False), False),
    ]
)

# The Arrow side is the core's read schema, shared with Table.scan and the Arrow poll.
ARROW_HEADER_STRUCT = READ_HEADER_STRUCT
ARROW_HEADERS = READ_HEADERS
ARROW_TIMESTAMP = READ_TIMESTAMP
ARROW_SCHEMA = READ_SCHEMA
#: :data:`ARROW_SCHEMA` without ``headers`` (``includeHeaders=false``).
ARROW_SCHEMA_NO_HEADERS = READ_SCHEMA_NO_HEADERS


def spark_schema(include_headers: bool = True) -> StructType:
    """The read schema; without the ``headers`` column when ``includeHeaders`` is false."""
    if include_headers:
        return SPARK_SCHEMA
    return StructType([f for f in SPARK_SCHEMA.fields if f.name != "headers"])


# --- typed tables ----------------------------------------------------------------------------


def typed_spark_schema(layout: TypedLayout, columns: Sequence[str] | None = None) -> StructType:
    """The Spark schema of a typed table's read: its columns (or ``columns``), then
    ``partition``, ``offset``, ``timestamp``. Zoned timestamps are Spark timestamps, naive
    ones ``timestamp_ntz``; int8/int16 are ``tinyint``/``smallint``.

    Raises:
        SchemaMismatchError: ``columns`` names a column the table does not have.
    """
    read = layout.read_schema(columns)
    # Nested fields are declared nullable to Spark: Spark (toArrow, its Arrow conversions)
    # refuses a null below a null struct in a not-null field, which Parquet decoding yields.
    relaxed = pa.schema([f.with_type(_nullable_inside(f.type)) for f in read])
    return from_arrow_schema(relaxed, prefer_timestamp_ntz=True)


def _nullable_inside(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (map keys stay not null, as Arrow needs)."""
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(_nullable_inside(t.field(i).type)).with_nullable(True)
             for i in range(t.num_fields)]  # fmt: skip
        )
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _nullable_inside(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field("value", _nullable_inside(t.item_type)))
    return t


def typed_arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects of batches of ``schema`` (every timestamp in
    microseconds, zoned ones in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def to_spark_batches(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A typed read's rows cast to :func:`typed_arrow_schema` (nanosecond timestamps are
    truncated to Spark's microseconds; everything else casts exactly). Nulls of not-null
    nested fields under null parents (as Parquet decodes them) get placeholders: Spark's
    worker refuses them."""
    table = fill_required(table)
    if table.schema.equals(schema):
        return table
    columns = []
    for f, column in zip(schema, table.columns, strict=True):
        if column.type != f.type:
            safe = not (pa.types.is_timestamp(f.type) and column.type.unit == "ns")
            column = column.cast(f.type, safe=safe)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema of a DataFrame's columns (what its Arrow batches carry)."""
    return to_arrow_schema(schema, timezone="UTC")
