"""Spark writes into typed tables as Spark writes into tables of its own (issue 26): column
names resolved case-insensitively, the session time zone in TIMESTAMP ↔ TIMESTAMP_NTZ,
binary keys of any bytes, commits next to another client's schema evolution."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from txntable import Producer, Warehouse
from txntable.producer.partitioner import partition_for_key

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_binary_key_column_takes_any_bytes(spark: Any, lake: str) -> None:
    """The key bytes of a binary key column are its own bytes, UTF-8 or not: through
    Spark, ``send_batch`` and ``send`` alike."""
    wh = Warehouse(lake)
    schema = pa.schema([pa.field("k", pa.binary(), nullable=False), ("v", pa.int32())])
    table = wh.create_table("t", 4, schema=schema, key=["k"])
    spark_keys = [b"\xff\xfe", b"\x00\x80\x81", b"plain", b"\xc3\x28"]
    spark.createDataFrame(
        [(bytearray(k), i) for i, k in enumerate(spark_keys)], "k binary, v int"
    ).write.format("txntable").mode("append").save(f"{lake}/t")
    with Producer(wh) as producer:
        producer.send_batch("t", {"k": [b"\xfe\xff", b"\x80"], "v": [10, 11]}).get()
        producer.send("t", {"k": b"\xe2\x82", "v": 12}).get()
    rows = table.scan(columns=["k", "v", "partition"]).to_arrow().sort_by("v").to_pylist()
    keys = [*spark_keys, b"\xfe\xff", b"\x80", b"\xe2\x82"]
    values = [0, 1, 2, 3, 10, 11, 12]
    assert [(r["k"], r["v"]) for r in rows] == list(zip(keys, values, strict=True))
    # Routed by the bytes themselves, as a Kafka producer routes a key.
    assert all(r["partition"] == partition_for_key(r["k"], 4) for r in rows)
