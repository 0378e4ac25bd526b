"""The producer's and consumer's typed-table path, beside the default record path.

``send`` of a typed table appends each record (a checked dict) to the same per-thread
column lists as Kafka's records; this module turns those lists into segment rows when they
are sealed, and turns read rows back into dicts for ``poll``. The schema logic itself is in
:mod:`txntable.protocol.schema`.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from txntable.errors import CorruptLogError, MissingSegmentError, ObjectNotFoundError
from txntable.producer.accumulator import RecordColumns, Segment
from txntable.protocol.records import decode_segment
from txntable.protocol.schema import TIMESTAMP_COLUMN, TypedLayout, fill_required
from txntable.storage.base import Store
from txntable.structs import ConsumerRecord


def typed_columns(
    columns: RecordColumns, layout: TypedLayout
) -> tuple[pa.Table, np.ndarray, np.ndarray, list[int]]:
    """:meth:`RecordColumns.columns` for records of a typed table (their values are dicts):
    segment rows, timestamps, explicit partitions (-1: by key) and each thread's first row.

    Raises:
        pyarrow.ArrowInvalid: A value ``send`` let through does not convert after all
            (the records' futures fail with it).
    """
    parts = sorted(columns.threads.values(), key=lambda t: t.slot)
    values: list[Any] = [v for t in parts for v in t.values]
    stamps = np.array([x for t in parts for x in t.timestamps], dtype=np.int64)
    explicit = np.array([p for t in parts for p in t.partitions], dtype=np.int32)
    bases = list(itertools.accumulate((len(t.keys) for t in parts), initial=0))[:-1]
    return layout.rows_table(values, stamps), stamps, explicit, bases


def read_typed(
    store: Store, path: str, count: int, merged: bool, layout: TypedLayout
) -> pa.Table:
    """A typed table's whole segment, conformed to ``layout`` (what maintenance reads).

    Raises:
        MissingSegmentError: The object is gone.
        CorruptLogError: Not readable Parquet.
        SchemaMismatchError: See :meth:`TypedLayout.conform_segment`.
    """
    try:
        data = store.get_data_file(path)
    except ObjectNotFoundError:
        raise MissingSegmentError(f"segment {path} of a committed batch is missing", path) from None
    return decode_typed(data, path, count, merged, layout)


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


def segment_rows(segment: Segment) -> pa.Table:
    """A typed segment's rows; runs sealed before and after a schema change are unified
    (new columns null, widened types upcast), as a reader would read them anyway."""
    tables = [r.table for r in segment.runs]
    if len(tables) == 1 or all(t.schema.equals(tables[0].schema) for t in tables):
        return pa.concat_tables(tables)
    return fill_required(pa.concat_tables(tables, promote_options="permissive"))


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
        return [
            ConsumerRecord(topic, partition, offset, key, value, [], stamp)
            for offset, key, value, stamp in zip(offsets, keys, values, stamps, strict=True)
        ]
    finally:
        if was_enabled:
            gc.enable()
