"""Spark's timestamp conversions, applied when a DataFrame is written into a table.

Spark has two timestamp types, both in microseconds: ``TIMESTAMP`` (an instant; its Arrow
batches carry the session time zone as their zone) and ``TIMESTAMP_NTZ`` (a wall clock, no
zone). Writing one into a column of the other kind follows Spark's casts, which use the
session time zone (``spark.sql.session.timeZone``):

* ``TIMESTAMP`` → a naive column: the instant's wall clock in the session time zone;
* ``TIMESTAMP_NTZ`` → a zoned column: the wall clock read in the session time zone, as
  ``java.time.LocalDateTime.atZone`` reads it (a time in a DST gap moves later by the gap,
  an ambiguous one takes the earlier instant).

A column (or a Kafka timestamp) of a coarser unit than microseconds gets the value floored,
as Spark floors microseconds to milliseconds (``DateTimeUtils.microsToMillis``): -1.5 ms is
-2 ms, not -1. The same rules apply inside structs, lists and maps.

The session time zone is known exactly when the batch has a zoned column (Spark labels it
with the zone) or the session set it explicitly (a task's local property); otherwise it is
the driver JVM's default zone, which the Python worker finds as the JVM does (``TZ``, then
``/etc/timezone``, then ``/etc/localtime``) — unless the JVM was given ``-Duser.timezone``:
then set ``spark.sql.session.timeZone``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txntable.errors import SerializationError

from .session import task_property

__all__ = ["conform_timestamps", "floor_timestamps", "needs_conversion", "session_time_zone"]

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

#: How a write learns the session time zone (only asked when a wall clock must be read).
Zone = Callable[[], str]


def session_time_zone(schema: pa.Schema) -> str:
    """The Spark session time zone a task writes a batch of ``schema`` under."""
    for f in schema:
        tz = _zone_in(f.type)
        if tz is not None:
            return tz
    return task_property("spark.sql.session.timeZone") or _process_time_zone()


def _zone_in(t: pa.DataType) -> str | None:
    if pa.types.is_timestamp(t):
        return t.tz
    for child in _children(t):
        tz = _zone_in(child.type)
        if tz is not None:
            return tz
    return None


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [t.value_field]
    return []


def _process_time_zone() -> str:
    # The JVM's own lookup on Linux (TimeZone.getDefault), so both sides agree.
    tz = os.environ.get("TZ", "").lstrip(":").strip()
    if tz:
        return tz
    try:
        with open("/etc/timezone") as f:
            name = f.read().strip()
        if name:
            return name
    except OSError:
        pass
    target = os.path.realpath("/etc/localtime")
    if "/zoneinfo/" in target:
        return target.split("/zoneinfo/", 1)[1]
    return "UTC"


def needs_conversion(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether storing ``src`` as ``dst`` changes a timestamp's kind or coarsens its unit
    (anywhere inside it)."""
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        return (src.tz is None) != (dst.tz is None) or _PER_SECOND[dst.unit] < _PER_SECOND[
            src.unit
        ]
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        names = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        return any(
            f.name in names and needs_conversion(f.type, names[f.name]) for f in _children(src)
        )
    if pa.types.is_map(src) and pa.types.is_map(dst):
        return needs_conversion(src.key_type, dst.key_type) or needs_conversion(
            src.item_type, dst.item_type
        )
    if _is_list(src) and pa.types.is_list(dst):
        return needs_conversion(src.value_type, dst.value_type)
    return False


def conform_timestamps(
    column: pa.ChunkedArray, dst: pa.DataType, zone: Zone, name: str
) -> pa.ChunkedArray:
    """``column`` with every timestamp in it converted by Spark's rules for storing it as
    ``dst`` (other values untouched; the caller casts the rest).

    Raises:
        SerializationError: The session time zone is unknown to Arrow, or a value does not
            fit the column's unit (named by ``name``).
    """
    if not needs_conversion(column.type, dst):
        return column
    try:
        return pa.chunked_array([_convert(c, dst, zone) for c in column.chunks])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SerializationError(f"txntable write: column {name!r}: {e}") from None


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _convert(arr: pa.Array, dst: pa.DataType, zone: Zone) -> pa.Array:
    src = arr.type
    if not needs_conversion(src, dst):
        return arr
    if pa.types.is_timestamp(src):
        if src.tz is not None and dst.tz is None:
            arr = pc.local_timestamp(arr)  # the wall clock in the session zone
        elif src.tz is None and dst.tz is not None:
            arr = _at_zone(arr, zone())
        return floor_timestamps(arr, dst.unit).cast(dst)
    if arr.offset:
        arr = pa.concat_arrays([arr])  # a copy from offset 0: from_arrays refuses slices
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(src):
        names = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        fields, children = [], []
        for i, f in enumerate(_children(src)):
            child = arr.field(i)
            if f.name in names:
                child = _convert(child, names[f.name], zone)
            fields.append(f.with_type(child.type))
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_map(src):
        keys = _convert(arr.keys, dst.key_type, zone)
        items = _convert(arr.items, dst.item_type, zone)
        t = pa.map_(src.key_field.with_type(keys.type), src.item_field.with_type(items.type))
        return pa.MapArray.from_arrays(arr.offsets, keys, items, type=t, mask=mask)
    values = _convert(arr.values, dst.value_type, zone)
    t = pa.list_(src.value_field.with_type(values.type))
    return pa.ListArray.from_arrays(arr.offsets.cast(pa.int32()), values, type=t, mask=mask)


def _at_zone(arr: pa.Array, tz: str) -> pa.Array:
    """Naive wall clocks as instants of zone ``tz``, by ``LocalDateTime.atZone``'s rule:
    the offset in force before a transition (the earlier instant of an overlap; a time in
    a gap shifted later by the gap)."""
    before = pc.assume_timezone(arr, timezone=tz, ambiguous="earliest", nonexistent="earliest")
    # In a gap `before` is the last instant ahead of it; its offset is the one to use.
    offset = pc.subtract(pc.local_timestamp(before).cast(pa.int64()), before.cast(pa.int64()))
    return pc.subtract(arr.cast(pa.int64()), offset).cast(pa.timestamp(arr.type.unit, tz=tz))


def floor_timestamps(arr: pa.Array, unit: str) -> pa.Array:
    """``arr`` in ``unit``, floored when ``unit`` is coarser (Spark's rule), exact otherwise."""
    t = arr.type
    factor = _PER_SECOND[t.unit] // _PER_SECOND[unit]
    target = pa.timestamp(unit, tz=t.tz)
    if factor <= 1:
        return arr.cast(target)
    ints = arr.cast(pa.int64())
    values = np.floor_divide(ints.fill_null(0).to_numpy(zero_copy_only=False), factor)
    mask = ints.is_null().to_numpy(zero_copy_only=False) if ints.null_count else None
    return pa.array(values, pa.int64(), mask=mask).cast(target)
