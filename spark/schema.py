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

import pyarrow as pa
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

ARROW_HEADER_STRUCT = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)
ARROW_HEADERS = pa.list_(pa.field("element", ARROW_HEADER_STRUCT, nullable=False))
ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", ARROW_TIMESTAMP, nullable=False),
        pa.field("headers", ARROW_HEADERS, nullable=False),
    ]
)


def spark_schema(include_headers: bool = True) -> StructType:
    """The read schema; without the ``headers`` column when ``includeHeaders`` is false."""
    if include_headers:
        return SPARK_SCHEMA
    return StructType([f for f in SPARK_SCHEMA.fields if f.name != "headers"])


#: :data:`ARROW_SCHEMA` without ``headers`` (``includeHeaders=false``).
ARROW_SCHEMA_NO_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))
