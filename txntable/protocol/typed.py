"""Typed tables' segments, beside the default record path: decoding a segment's bytes
against its table's schema, and turning read rows back into dicts for ``poll``. Pure.

The schema logic itself is in :mod:`txntable.protocol.schema`; the producer's side (sealed
column lists into segment rows) is in :mod:`txntable.producer.accumulator`, reading segments
from the store in :mod:`txntable.read.reader`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txntable.errors import CorruptLogError
from txntable.protocol.records import build_records, decode_segment
from txntable.protocol.schema import TIMESTAMP_COLUMN, TypedLayout
from txntable.structs import ConsumerRecord, Header


def decode_typed(
    data: bytes, path: str, count: int, merged: bool, layout: TypedLayout | None
) -> pa.Table:
    """Decode a segment's bytes and check them against its batch (pure); a typed table's
    (``layout``) conformed to its schema, any other as :func:`records.decode_segment`.

    Raises:
        CorruptLogError: Not readable Parquet.
        SchemaMismatchError: The columns or row count do not match.
    """
    if layout is None:
        return decode_segment(data, path, count, merged)
    try:
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptLogError(f"segment is not readable Parquet ({e})", path) from None
    return layout.conform_segment(table, path, count, merged)


def rows_to_dict_records(
    rows: pa.Table, offsets: Sequence[int], topic: str, partition: int, layout: TypedLayout
) -> list[ConsumerRecord]:
    """Segment rows of a typed table -> consumer records whose ``value`` is a dict of the
    user's columns (``key``: the key columns' dict, ``None`` without key columns)."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()  # as records.rows_to_records: nothing built here forms a cycle
    try:
        user = rows.select([c for c in layout.schema.names if c in rows.column_names])
        values = user.to_pylist()
        stamps = rows.column(TIMESTAMP_COLUMN).cast(pa.int64()).to_pylist()
        if layout.key_columns:
            keys: list[Any] = [{k: v[k] for k in layout.key_columns} for v in values]
        else:
            keys = [None] * len(values)
        n = len(values)
        no_headers: Iterator[list[Header]] = ([] for _ in range(n))
        no_sizes = (repeat(-1, n), repeat(-1, n), repeat(-1, n))  # nothing was serialized
        return build_records(
            topic, partition, offsets, stamps, keys, values, no_headers, no_sizes
        )
    finally:
        if was_enabled:
            gc.enable()
