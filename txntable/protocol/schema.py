"""Typed tables: the record schema of a table's own columns (protocol v3).

A typed table declares an Arrow schema of user columns in its ``metadata``. Its segments
hold those columns plus the system ``timestamp`` (and a merged segment's ``offset``), and
every reader returns the user columns plus ``partition``, ``offset`` and ``timestamp``.
This module is pure (no I/O): the JSON form of a schema, the types allowed, validation of
what producers are given, schema evolution, and casting older segments to the newest
schema.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import re
import zoneinfo
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txntable.errors import SchemaMismatchError, SerializationError
from txntable.protocol.records import (
    OFFSET_COLUMN,
    READ_TIMESTAMP,
    as_arrow_table,
    binary_lengths,
    timestamp_column,
)


@dataclass(frozen=True)
class Field:
    """One column of the record schema."""

    name: str
    type: str
    nullable: bool = True
    #: Fields of a nested type of a typed table (``list``: one, ``map``: key and value,
    #: ``struct``: its fields); empty otherwise and absent from the JSON.
    children: tuple[Field, ...] = ()


#: Protocol version of a table with a record schema of its own (``metadata.typed``).
TYPED_PROTOCOL_VERSION = 3

#: Names the system gives every read row (and a segment stores): not user column names.
TIMESTAMP_COLUMN = "timestamp"
PARTITION_COLUMN = "partition"
RESERVED_NAMES = frozenset({TIMESTAMP_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN})

SEGMENT_TIMESTAMP = pa.timestamp("ms", tz="UTC")
SYSTEM_READ_FIELDS = (
    pa.field(PARTITION_COLUMN, pa.int32(), nullable=False),
    pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
    pa.field(TIMESTAMP_COLUMN, READ_TIMESTAMP, nullable=False),
)

#: Primitive type names of the JSON form, and their Arrow types.
PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date32": pa.date32(),
}
_PRIMITIVE_NAMES = {t: name for name, t in PRIMITIVES.items()}
_DECIMAL = re.compile(r"^decimal\((\d+),(-?\d+)\)$")
_TIMESTAMP = re.compile(r"^timestamp\((s|ms|us|ns)(?:,(.+))?\)$")
#: Integer types a key column may have (besides string and binary): their decimal text is
#: the key's bytes.
_KEY_TYPES = ("string", "binary", "int8", "int16", "int32", "int64")

#: Type widenings schema evolution allows (old type name -> the new ones).
WIDENINGS: dict[str, tuple[str, ...]] = {
    "int8": ("int16", "int32", "int64"),
    "int16": ("int32", "int64"),
    "int32": ("int64",),
    "float32": ("float64",),
}


# --- JSON form ------------------------------------------------------------------------------


def type_name(t: pa.DataType) -> str:
    """The JSON type name of an allowed Arrow type (nested types: ``list``, ``struct``,
    ``map``, whose fields are the JSON field's ``children``).

    Raises:
        SchemaMismatchError: The type is not allowed in a record schema.
    """
    if t in _PRIMITIVE_NAMES:
        return _PRIMITIVE_NAMES[t]
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return "string" if pa.types.is_large_string(t) else "binary"
    if pa.types.is_decimal128(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return f"timestamp({t.unit},{t.tz})" if t.tz else f"timestamp({t.unit})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_struct(t):
        return "struct"
    raise SchemaMismatchError(f"type {t} is not allowed in a record schema")


def field_to_json(f: pa.Field) -> Field:
    """An Arrow field as the ``metadata.schema`` entry (a :class:`Field` with children)."""
    t = f.type
    children: tuple[Field, ...] = ()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        children = (field_to_json(pa.field("element", t.value_type, t.value_field.nullable)),)
    elif pa.types.is_map(t):
        children = (
            field_to_json(pa.field("key", t.key_type, nullable=False)),
            field_to_json(pa.field("value", t.item_type, t.item_field.nullable)),
        )
    elif pa.types.is_struct(t):
        children = tuple(field_to_json(t.field(i)) for i in range(t.num_fields))
    return Field(f.name, type_name(t), f.nullable, children)


def field_from_json(f: Field) -> pa.Field:
    """The Arrow field of a ``metadata.schema`` entry.

    Raises:
        SchemaMismatchError: Unknown type name or wrong children for the type.
    """
    name = f.type.replace(" ", "")
    kids = f.children
    t: pa.DataType
    if name in PRIMITIVES and not kids:
        t = PRIMITIVES[name]
    elif (m := _DECIMAL.match(name)) and not kids:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 38:
            raise SchemaMismatchError(
                f"column {f.name!r}: decimal precision {precision} is not in 1..38"
            )
        if not 0 <= scale <= precision:
            # Parquet's and Spark's rule; Arrow alone would take any scale.
            raise SchemaMismatchError(
                f"column {f.name!r}: decimal scale {scale} is not in [0, {precision}]"
            )
        t = pa.decimal128(precision, scale)
    elif (m := _TIMESTAMP.match(f.type.replace(", ", ","))) and not kids:
        if m.group(2) is not None:
            _check_zone(m.group(2), f.name)
        t = pa.timestamp(m.group(1), tz=m.group(2))
    elif name == "list" and len(kids) == 1:
        t = pa.list_(field_from_json(kids[0]).with_name("element"))
    elif name == "map" and len(kids) == 2 and not kids[0].nullable:
        key, item = field_from_json(kids[0]), field_from_json(kids[1])
        t = pa.map_(key.type, item)
    elif name == "struct" and kids:
        t = pa.struct([field_from_json(k) for k in kids])
    else:
        raise SchemaMismatchError(f"column {f.name!r}: {_type_problem(f)}")
    return pa.field(f.name, t, f.nullable)


_OFFSET_ZONE = re.compile(r"^[+-]([01]\d|2[0-3]):[0-5]\d$")


@functools.cache
def _check_zone(zone: str, column: str) -> None:
    """Refuse a time zone readers could not convert: an IANA name the zone database does
    not know (``Europe/Pari``) or an offset that is not ``±HH:MM``.

    Raises:
        SchemaMismatchError: Naming the column and the zone.
    """
    if _OFFSET_ZONE.match(zone):
        return
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise SchemaMismatchError(
            f"column {column!r}: unknown time zone {zone!r} (an IANA name such as "
            "'Europe/Paris' or 'UTC', or an offset such as '+05:30')"
        ) from None


#: The type names of the JSON form (``children`` give a nested type's fields).
TYPE_NAMES = (
    *PRIMITIVES,
    "decimal(P,S)",
    "timestamp(UNIT)",
    "timestamp(UNIT,TZ)",
    "list",
    "map",
    "struct",
)
#: What each nested type takes as ``children``.
_CHILDREN = {
    "list": "one child (its element)",
    "map": "two children (key, not nullable, and value)",
    "struct": "one child or more (its fields)",
}


def _type_problem(f: Field) -> str:
    """Why ``field_from_json`` refused ``f``'s type, in words."""
    name = f.type.replace(" ", "")
    if name in _CHILDREN:
        return f"a {name} takes {_CHILDREN[name]}; got {len(f.children)}"
    known = name in PRIMITIVES or _DECIMAL.match(name) or _TIMESTAMP.match(name)
    if known:
        return f"{f.type!r} takes no children; got {len(f.children)}"
    return f"unknown type {f.type!r}; allowed: {', '.join(TYPE_NAMES)}"


def schema_to_json(schema: pa.Schema) -> tuple[Field, ...]:
    """``metadata.schema`` of a typed table."""
    return tuple(field_to_json(f) for f in schema)


def schema_from_json(fields: Sequence[Field]) -> pa.Schema:
    """The Arrow schema of a typed table's ``metadata.schema``."""
    return pa.schema([field_from_json(f) for f in fields])


def normalize_schema(schema: object, key_columns: Sequence[str] = ()) -> pa.Schema:
    """Check a record schema a user gives and return it in its canonical Arrow form
    (large strings and lists as regular ones, list items named ``element``).

    Raises:
        SchemaMismatchError: Not a ``pyarrow.Schema``, no column, a name empty, reserved
            or repeated (at any level), a type not allowed, a key column that is not a
            top-level string, binary or integer column.
    """
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatchError(f"schema must be a pyarrow.Schema, not {type(schema).__name__}")
    if len(schema) == 0:
        raise SchemaMismatchError("a record schema needs at least one column")
    for f in schema:
        if f.name in RESERVED_NAMES:
            raise SchemaMismatchError(
                f"column name {f.name!r} is reserved for the system columns "
                f"{sorted(RESERVED_NAMES)}"
            )
    _check_names(list(schema), "")
    canonical = schema_from_json(schema_to_json(schema))
    keys = list(key_columns)
    if len(set(keys)) != len(keys):
        raise SchemaMismatchError(f"key columns repeat a name: {keys}")
    for k in keys:
        if k not in canonical.names:
            raise SchemaMismatchError(f"key column {k!r} is not a column of the schema")
        if type_name(canonical.field(k).type) not in _KEY_TYPES:
            raise SchemaMismatchError(
                f"key column {k!r} has type {canonical.field(k).type}; keys are "
                f"{', '.join(_KEY_TYPES)}"
            )
    return canonical


def _check_names(fields: list[pa.Field], where: str) -> None:
    names = [f.name for f in fields]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise SchemaMismatchError(f"column names {names}{where} are empty or repeated")
    for f in fields:
        t = f.type
        if pa.types.is_struct(t):
            _check_names([t.field(i) for i in range(t.num_fields)], f" (in {f.name!r})")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            _check_names([t.value_field], f" (in {f.name!r})")


# --- evolution -----------------------------------------------------------------------------


def check_evolution(old: pa.Schema, new: pa.Schema) -> None:
    """Check that ``new`` is an allowed evolution of ``old``.

    Allowed: the old columns first, in their order, each of the same type or widened
    (:data:`WIDENINGS`, also inside structs and lists), a non-nullable column may become
    nullable; new columns (also new struct fields) at the end, nullable.

    Raises:
        SchemaMismatchError: Anything else (the message names the column).
    """
    _check_fields(list(old), list(new), "")


def _check_fields(old: list[pa.Field], new: list[pa.Field], prefix: str) -> None:
    if [f.name for f in new[: len(old)]] != [f.name for f in old]:
        raise SchemaMismatchError(
            f"schema change refused: columns {[prefix + f.name for f in old]} must stay, "
            f"in order, before any new column; got {[prefix + f.name for f in new]}"
        )
    for o, n in zip(old, new, strict=False):
        _check_field(o, n, prefix + o.name)
    for f in new[len(old) :]:
        if not f.nullable:
            raise SchemaMismatchError(
                f"schema change refused: new column {prefix + f.name!r} must be nullable"
            )


def _check_field(old: pa.Field, new: pa.Field, path: str) -> None:
    if old.nullable and not new.nullable:
        raise SchemaMismatchError(f"schema change refused: column {path!r} cannot become not null")
    ot, nt = old.type, new.type
    if ot == nt:
        return
    if pa.types.is_struct(ot) and pa.types.is_struct(nt):
        _check_fields(
            [ot.field(i) for i in range(ot.num_fields)],
            [nt.field(i) for i in range(nt.num_fields)],
            path + ".",
        )
        return
    if pa.types.is_list(ot) and pa.types.is_list(nt):
        _check_field(ot.value_field, nt.value_field, path + ".element")
        return
    if type_name(nt) in WIDENINGS.get(type_name(ot), ()):
        return
    raise SchemaMismatchError(
        f"schema change refused: column {path!r} cannot change from {ot} to {nt} "
        "(allowed: widen int8/int16/int32 to a wider integer, float32 to float64)"
    )


def merge_schemas(table: pa.Schema, data: pa.Schema) -> pa.Schema:
    """The table's schema evolved to hold ``data`` (Spark's ``mergeSchema``): columns of
    ``data`` the table lacks are added (nullable), narrower table types widened.

    Raises:
        SchemaMismatchError: A column of ``data`` does not fit an allowed evolution, or
            differs from a column of the table only by case.
    """
    existing = {n.lower(): n for n in table.names}
    for d in data:
        clash = existing.get(d.name.lower())
        if d.name not in table.names and clash is not None:
            # Spark resolves names case-insensitively: such a column could never be told
            # apart from the existing one by a Spark reader or writer.
            raise SchemaMismatchError(
                f"schema change refused: new column {d.name!r} differs from column "
                f"{clash!r} only by case"
            )
    fields = []
    for f in table:
        if f.name in data.names:
            d = data.field(f.name)
            if d.type != f.type and type_name(d.type) in WIDENINGS.get(type_name(f.type), ()):
                f = f.with_type(d.type)
            elif not castable(d.type, f.type):
                raise SchemaMismatchError(
                    f"schema change refused: column {f.name!r} of type {f.type} cannot hold "
                    f"{d.type}"
                )
        fields.append(f)
    for d in data:
        if d.name not in table.names and d.name not in RESERVED_NAMES:
            fields.append(d.with_nullable(True))
    merged = normalize_schema(pa.schema(fields))
    check_evolution(table, merged)
    return merged


# --- the layout of a typed table -----------------------------------------------------------


@dataclass(frozen=True)
class TypedLayout:
    """How a typed table's records are written and read: its schema and key columns."""

    schema: pa.Schema
    key_columns: tuple[str, ...] = ()

    @property
    def segment_schema(self) -> pa.Schema:
        """Columns of a segment: the user's, then ``timestamp``."""
        return self.schema.append(pa.field(TIMESTAMP_COLUMN, SEGMENT_TIMESTAMP, nullable=False))

    @property
    def merged_segment_schema(self) -> pa.Schema:
        """Columns of a merged segment: ``offset`` first, then the segment's."""
        return pa.schema(
            [pa.field(OFFSET_COLUMN, pa.int64(), nullable=False), *self.segment_schema]
        )

    def read_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        """What readers return: the user's columns, then partition, offset and timestamp;
        or exactly ``columns`` (user or system), in their order.

        Raises:
            SchemaMismatchError: ``columns`` names an unknown column or one twice.
        """
        if columns is None:
            return pa.schema([*self.schema, *SYSTEM_READ_FIELDS])
        self.user_columns(columns)  # checks the names
        if len(set(columns)) != len(columns):
            raise SchemaMismatchError(f"columns repeat a name: {list(columns)}")
        system = {f.name: f for f in SYSTEM_READ_FIELDS}
        return pa.schema([system.get(c) or self.schema.field(c) for c in columns])

    def user_columns(self, columns: Sequence[str] | None) -> list[str]:
        """The user columns among ``columns`` (all when ``None``), checked.

        Raises:
            SchemaMismatchError: A name that is neither a user nor a system column.
        """
        if columns is None:
            return list(self.schema.names)
        for c in columns:
            if c not in self.schema.names and c not in RESERVED_NAMES:
                raise SchemaMismatchError(
                    f"no column {c!r}; the columns are {[*self.schema.names, *RESERVED_NAMES]}"
                )
        return [c for c in columns if c in self.schema.names]

    # --- writing ---------------------------------------------------------------------------

    def conform(self, data: object, now: int, what: str = "send_batch") -> pa.Table:
        """What ``send_batch`` was given, as segment rows (user columns cast to the schema,
        then ``timestamp``).

        Accepts a ``pyarrow.Table`` / ``RecordBatch``, a pandas DataFrame or a dict of
        columns. Missing nullable columns are null; ``timestamp`` (Arrow timestamp or int
        milliseconds) is optional (absent or null: ``now``). ``what`` names the caller in
        messages (the API the user called).

        Raises:
            SerializationError: Not tabular, an unknown column, a missing non-nullable
                column, a value that does not cast or a null where none is allowed (the
                message names the column and the first bad row). Nothing is written.
        """
        table = as_arrow_table(data)
        names = table.column_names
        if len(set(names)) != len(names):
            raise SerializationError(f"{what}: duplicate column names {names}")
        unknown = [n for n in names if n not in self.schema.names and n != TIMESTAMP_COLUMN]
        if unknown:
            raise SerializationError(
                f"{what}: unknown column {unknown[0]!r}; the table's columns are "
                f"{self.schema.names}"
            )
        n = table.num_rows
        columns = []
        for f in self.schema:
            if f.name not in names:
                if not f.nullable:
                    raise SerializationError(f"{what}: column {f.name!r} is missing")
                columns.append(pa.nulls(n, f.type))
                continue
            columns.append(_cast_column(table.column(f.name), f, what))
        columns.append(timestamp_column(table, n, now, what))
        return fill_required(pa.Table.from_arrays(columns, schema=self.segment_schema))

    def converters(self) -> dict[str, Callable[[Any], Any]]:
        """Per column, a function returning a Python value ``send`` was given as sealing
        converts it, or raising ``ValueError`` if the column cannot hold it (built once
        per layout)."""
        return {f.name: _converter(f.type) for f in self.schema}

    def rows_table(self, rows: Sequence[Mapping[str, Any]], timestamps: np.ndarray) -> pa.Table:
        """Checked records of ``send`` (dicts) as segment rows."""
        columns = [
            pa.array([r.get(f.name) for r in rows], f.type) for f in self.schema
        ]
        columns.append(pa.array(timestamps, SEGMENT_TIMESTAMP))
        return fill_required(pa.Table.from_arrays(columns, schema=self.segment_schema))

    def keys(self, table: pa.Table) -> pa.ChunkedArray:
        """Every row's key bytes for the partitioner (binary; null when there is none).

        No key columns: every key is null. One column: its bytes (UTF-8 of a string, the
        decimal text of an integer). Several: their texts joined by a unit separator
        (0x1F). A null in any key column makes the key null.
        """
        n = table.num_rows
        if not self.key_columns:
            return pa.chunked_array([pa.nulls(n, pa.binary())])
        parts = [_key_bytes(table.column(k)) for k in self.key_columns]
        if len(parts) == 1:
            return parts[0]
        return pc.binary_join_element_wise(*parts, b"\x1f")

    # --- reading ---------------------------------------------------------------------------

    def file_columns(
        self, names: Sequence[str], columns: Sequence[str] | None, merged: bool
    ) -> list[str]:
        """The Parquet columns to read from a file holding ``names``: the requested user
        columns it has, ``timestamp`` if requested, and a merged segment's ``offset``."""
        wanted = [*([OFFSET_COLUMN] if merged else []), *self.user_columns(columns)]
        if columns is None or TIMESTAMP_COLUMN in columns:
            wanted.append(TIMESTAMP_COLUMN)
        return [c for c in wanted if c in names]

    def conform_segment(
        self,
        table: pa.Table,
        path: str,
        expected_count: int,
        merged: bool = False,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """A decoded segment (possibly written under an older schema, possibly only some
        columns read) as the columns of :meth:`segment_schema` that were asked for: older
        columns upcast, columns added since filled with nulls.

        Raises:
            SchemaMismatchError: A column appears twice, does not cast, is missing although
                not nullable, ``timestamp`` (or a merged segment's ``offset``) is missing,
                or the row count differs from the batch's.
        """
        names = table.column_names
        if len(set(names)) != len(names):
            raise SchemaMismatchError(f"segment {path} has a column name twice: {names}")
        if table.num_rows != expected_count:
            raise SchemaMismatchError(
                f"segment {path} has {table.num_rows} records, its batch says {expected_count}"
            )
        target = self.merged_segment_schema if merged else self.segment_schema
        keep = set(self.user_columns(columns)) | {OFFSET_COLUMN}
        if columns is None or TIMESTAMP_COLUMN in columns:
            keep.add(TIMESTAMP_COLUMN)
        fields = [f for f in target if f.name in keep]
        out = table.select([])  # keeps the row count when no column is read
        for f in fields:
            if f.name not in names:
                if not f.nullable:
                    raise SchemaMismatchError(f"segment {path} lacks column {f.name!r}")
                out = out.append_column(f, pa.chunked_array([pa.nulls(table.num_rows, f.type)]))
                continue
            column = table.column(f.name)
            if column.type != f.type:
                try:
                    column = column.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    raise SchemaMismatchError(
                        f"segment {path}: column {f.name!r} of type {column.type} does not "
                        f"cast to {f.type} ({e})"
                    ) from None
            if not f.nullable and column.null_count:
                raise SchemaMismatchError(f"segment {path}: column {f.name!r} holds nulls")
            out = out.append_column(f, column)
        return out

    def output(
        self,
        rows: pa.Table,
        offsets: np.ndarray,
        partition: int,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Segment rows of one partition with their offsets -> :meth:`read_schema`."""
        n = rows.num_rows
        schema = self.read_schema(columns)
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for f in schema:
            if f.name == PARTITION_COLUMN:
                arrays.append(pa.repeat(pa.scalar(partition, pa.int32()), n))
            elif f.name == OFFSET_COLUMN:
                arrays.append(
                    pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)])
                )
            elif f.name == TIMESTAMP_COLUMN:
                arrays.append(rows.column(TIMESTAMP_COLUMN).cast(READ_TIMESTAMP))
            elif f.name in rows.column_names:
                column = rows.column(f.name)
                arrays.append(column if column.type == f.type else column.cast(f.type))
            else:  # decoded under an older schema than this one
                arrays.append(pa.nulls(n, f.type))
        if not arrays:  # no column asked for: the rows still count
            return rows.select([])
        return pa.Table.from_arrays(arrays, schema=schema)


class SchemaMetadata(Protocol):
    """What :func:`layout_of` reads of a ``metadata`` action (actions.py imports this
    module, so the action class is not named here)."""

    @property
    def typed(self) -> bool: ...
    @property
    def schema(self) -> tuple[Field, ...]: ...
    @property
    def keyColumns(self) -> tuple[str, ...]: ...


_LAYOUTS: dict[int, tuple[SchemaMetadata, TypedLayout]] = {}


def layout_of(metadata: SchemaMetadata | None) -> TypedLayout | None:
    """The layout of a typed table's ``metadata``; ``None`` for Kafka's default record.

    Parsed once per metadata action (readers ask on every poll).
    """
    if metadata is None or not metadata.typed:
        return None
    cached = _LAYOUTS.get(id(metadata))
    if cached is not None and cached[0] is metadata:
        return cached[1]
    layout = TypedLayout(schema_from_json(metadata.schema), tuple(metadata.keyColumns))
    if len(_LAYOUTS) > 256:
        _LAYOUTS.clear()
    _LAYOUTS[id(metadata)] = (metadata, layout)
    return layout


# --- conversion helpers --------------------------------------------------------------------


def _key_bytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A key column's bytes: a binary's own (any bytes, not only UTF-8), a string's UTF-8,
    an integer's decimal text."""
    if pa.types.is_integer(column.type):
        column = column.cast(pa.string())
    return column.cast(pa.binary())


def _cast_column(column: pa.ChunkedArray, f: pa.Field, what: str) -> pa.ChunkedArray:
    if column.type != f.type:
        if not castable(column.type, f.type):
            raise SerializationError(
                f"{what}: column {f.name!r} has type {column.type}, the schema says {f.type}"
            )
        if _has_struct(column.type):
            column = pa.chunked_array([_blank_under_nulls(c) for c in column.chunks], column.type)
        try:
            cast = column.cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            row = _first_bad_row(column, f.type)
            raise SerializationError(
                f"{what}: column {f.name!r}, row {row}: value does not fit {f.type} ({e})"
            ) from None
        if _infinities(cast) > _infinities(column):
            # Arrow's cast to float32 rounds a finite value beyond its range to ±inf:
            # refused, as a cast to an integer type refuses a value out of its range.
            row = next(i for i in range(len(column)) if _overflows(column.slice(i, 1), f.type))
            raise SerializationError(
                f"{what}: column {f.name!r}, row {row}: value is out of range for {f.type}"
            )
        column = cast
    if not f.nullable and column.null_count:
        row = int(np.flatnonzero(np.asarray(column.is_null()))[0])
        raise SerializationError(f"{what}: column {f.name!r}, row {row}: null in a not-null column")
    _check_nested_nulls(column, f, what)
    return column


def _infinities(column: pa.ChunkedArray | pa.Array) -> int:
    """How many ±inf values the floating-point leaves of ``column`` hold (0 without any)."""
    t = column.type
    if pa.types.is_floating(t):
        return int(pc.sum(pc.is_inf(column)).as_py() or 0)
    if isinstance(column, pa.ChunkedArray):
        return sum(_infinities(c) for c in column.chunks)
    if pa.types.is_struct(t):
        return sum(_infinities(child) for child in column.flatten())
    if pa.types.is_map(t):  # as the list of its entries (list_flatten has no map kernel)
        entries = pa.struct([pa.field("key", t.key_type, nullable=False), t.item_field])
        return _infinities(column.cast(pa.list_(entries)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _infinities(column.flatten())
    return 0


def _overflows(column: pa.ChunkedArray, t: pa.DataType) -> bool:
    """Whether casting ``column`` to ``t`` turns a finite value into ±inf."""
    return _infinities(column.cast(t)) > _infinities(column)


def castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a column of ``src`` may be stored as ``dst`` (a lossless kind of cast: no
    string parsing, no float to integer, nothing to or from strings but string kinds)."""
    if pa.types.is_null(src):
        return True
    if pa.types.is_integer(dst):
        return pa.types.is_integer(src)
    if pa.types.is_floating(dst):
        return pa.types.is_integer(src) or pa.types.is_floating(src)
    if pa.types.is_decimal(dst):
        return pa.types.is_integer(src) or pa.types.is_decimal(src)
    if pa.types.is_string(dst):
        return pa.types.is_string(src) or pa.types.is_large_string(src) or (
            hasattr(pa.types, "is_string_view") and pa.types.is_string_view(src)
        )
    if pa.types.is_binary(dst):
        return pa.types.is_binary(src) or pa.types.is_large_binary(src) or (
            pa.types.is_fixed_size_binary(src)
        )
    if pa.types.is_timestamp(dst):
        return pa.types.is_timestamp(src)
    if pa.types.is_date(dst):
        return pa.types.is_date(src)
    if pa.types.is_boolean(dst):
        return pa.types.is_boolean(src)
    if pa.types.is_list(dst):
        return (pa.types.is_list(src) or pa.types.is_large_list(src)) and castable(
            src.value_type, dst.value_type
        )
    if pa.types.is_map(dst):
        return pa.types.is_map(src) and castable(src.key_type, dst.key_type) and castable(
            src.item_type, dst.item_type
        )
    if pa.types.is_struct(dst):
        if not pa.types.is_struct(src):
            return False
        names = {src.field(i).name: src.field(i).type for i in range(src.num_fields)}
        dst_names = {dst.field(i).name for i in range(dst.num_fields)}
        return set(names) <= dst_names and all(
            castable(names[dst.field(i).name], dst.field(i).type)
            for i in range(dst.num_fields)
            if dst.field(i).name in names
        )
    return False


def _first_bad_row(column: pa.ChunkedArray, t: pa.DataType) -> int:
    """The first row whose value does not cast to ``t`` (only on the error path)."""
    at = 0
    for chunk in column.chunks:
        for i in range(len(chunk)):
            try:
                chunk.slice(i, 1).cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return at + i
        at += len(chunk)
    return -1


def _check_nested_nulls(column: pa.ChunkedArray, f: pa.Field, what: str) -> None:
    """Refuse a null inside a list or struct where the schema says not null (Arrow's cast
    does not check it)."""
    t = f.type
    for chunk in column.chunks:
        if pa.types.is_struct(t):
            valid = np.asarray(chunk.is_valid())
            for i in range(t.num_fields):
                child_field = t.field(i)
                child = chunk.field(i)
                if not child_field.nullable:
                    bad = np.flatnonzero(valid & np.asarray(child.is_null()))
                    if bad.size:
                        raise SerializationError(
                            f"{what}: column {f.name!r}, row {int(bad[0])}: null in "
                            f"not-null field {child_field.name!r}"
                        )
                _check_nested_nulls(pa.chunked_array([child]), child_field, what)
        elif pa.types.is_list(t) and not t.value_field.nullable:
            if chunk.values.null_count:
                offsets = np.asarray(chunk.offsets)
                first = int(np.flatnonzero(np.asarray(chunk.values.is_null()))[0])
                row = int(np.searchsorted(offsets, first + offsets[0], side="right")) - 1
                raise SerializationError(
                    f"{what}: column {f.name!r}, row {row}: null list element in a list of "
                    "not-null elements"
                )


def _has_required_child(t: pa.DataType) -> bool:
    """Whether a nested type has a not-null field below its top level."""
    if pa.types.is_struct(t):
        return any(
            not t.field(i).nullable or _has_required_child(t.field(i).type)
            for i in range(t.num_fields)
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return not t.value_field.nullable or _has_required_child(t.value_type)
    if pa.types.is_map(t):
        return _has_required_child(t.item_type)
    return False


def _default(t: pa.DataType) -> Any:
    """A placeholder value of type ``t`` (what Arrow's own conversion puts under a null
    struct for a not-null field)."""
    if pa.types.is_struct(t):
        return {t.field(i).name: _default(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t) or pa.types.is_map(t) or pa.types.is_large_list(t):
        return []
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_date(t):
        return datetime.date(1970, 1, 1)
    if pa.types.is_decimal(t):
        return decimal.Decimal(0)
    return 0


def _fill_required(chunk: pa.Array) -> pa.Array:
    """``chunk`` with null values of not-null nested fields (under null parents) replaced
    by placeholders: Parquet writers refuse a null in a not-null field even there."""
    t = chunk.type
    if pa.types.is_struct(t):
        parent_null = chunk.is_null()
        children = []
        for i in range(t.num_fields):
            f = t.field(i)
            child = _fill_required(chunk.field(i))
            if not f.nullable and child.null_count:
                child = pc.if_else(child.is_null(), pa.scalar(_default(f.type), f.type), child)
            children.append(child)
        mask = parent_null if chunk.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t) and _has_required_child(t):
        values = _fill_required(chunk.values)
        f = t.value_field
        if not f.nullable and values.null_count:
            values = pc.if_else(values.is_null(), pa.scalar(_default(f.type), f.type), values)
        offsets = chunk.offsets
        if chunk.null_count:
            offsets = pc.if_else(
                pa.concat_arrays([chunk.is_null(), pa.array([False])]), pa.scalar(None, pa.int32()),
                offsets,
            )
        return pa.ListArray.from_arrays(offsets, values, type=t)
    return chunk


def _has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_struct(t.value_type)
    if pa.types.is_map(t):
        return _has_struct(t.item_type)
    return False


def _blank_under_nulls(chunk: pa.Array) -> pa.Array:
    """``chunk`` with every value below a null struct replaced by a placeholder (those
    values are invisible; a cast to a type with not-null fields would refuse them)."""
    t = chunk.type
    if pa.types.is_struct(t):
        children = [_blank_under_nulls(chunk.field(i)) for i in range(t.num_fields)]
        if not chunk.null_count:
            return pa.StructArray.from_arrays(children, fields=list(t))
        parent_null = chunk.is_null()
        children = [
            pc.if_else(parent_null, pa.scalar(_default(c.type), c.type), c) for c in children
        ]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=parent_null)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _has_struct(t.value_type):
        offsets = chunk.offsets
        if chunk.null_count:
            mask = pa.concat_arrays([chunk.is_null(), pa.array([False])])
            offsets = pc.if_else(mask, pa.scalar(None, offsets.type), offsets)
        return type(chunk).from_arrays(offsets, _blank_under_nulls(chunk.values), type=t)
    return chunk


def fill_required(table: pa.Table) -> pa.Table:
    """``table`` ready for Parquet: see :func:`_fill_required` (columns without a not-null
    nested field are returned as they are)."""
    for i, f in enumerate(table.schema):
        if _has_required_child(f.type):
            column = table.column(i)
            fixed = pa.chunked_array([_fill_required(c) for c in column.chunks], f.type)
            table = table.set_column(i, f, fixed)
    return table




# --- checking Python values of send() --------------------------------------------------------

#: Smallest magnitude a double rounds to infinity at in float32 (halfway between float32's
#: largest finite value and 2**128; the tie rounds to even, which is infinity).
_FLOAT32_OVERFLOW = float(2**128 - 2**103)


def _converter(t: pa.DataType) -> Callable[[Any], Any]:  # noqa: C901 - one case per type
    """A function returning a Python value as ``pyarrow.array`` stores it in a column of
    ``t`` (maps as lists of pairs, mappings as dicts, numbers as Python numbers), or raising
    ``ValueError`` if it cannot be stored: whatever it accepts converts when the records are
    sealed, so a bad value fails its ``send`` and never the producer's batch. (``None`` is
    checked by the caller, which knows the nullability.)"""
    if pa.types.is_boolean(t):

        def check_bool(v: Any) -> Any:
            if v.__class__ is not bool:
                raise ValueError(f"expected bool, got {type(v).__name__}")
            return v

        return check_bool
    if pa.types.is_integer(t):
        lo, hi = -(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1

        def check_int(v: Any) -> Any:
            if v.__class__ is not int:
                if not isinstance(v, int | np.integer) or isinstance(v, bool):
                    raise ValueError(f"expected int, got {type(v).__name__}")
                v = int(v)
            if not lo <= v <= hi:
                raise ValueError(f"{v} is out of range for {t}")
            return v

        return check_int
    if pa.types.is_floating(t):
        # A finite value float32 cannot hold would be stored as infinity: refused, as an
        # integer column refuses an integer out of its range.
        limit = _FLOAT32_OVERFLOW if t == pa.float32() else math.inf

        def check_float(v: Any) -> Any:
            if v.__class__ is not float:
                if not isinstance(v, float | int | np.floating | np.integer) or isinstance(
                    v, bool | np.bool_
                ):
                    raise ValueError(f"expected float, got {type(v).__name__}")
                try:
                    v = float(v)
                except OverflowError:
                    bits = v.bit_length()
                    raise ValueError(f"an integer of {bits} bits is out of range for {t}") from None
            if abs(v) >= limit and math.isfinite(v):
                raise ValueError(f"{v!r} is out of range for {t}")
            return v

        return check_float
    if pa.types.is_string(t):

        def check_str(v: Any) -> Any:
            if not isinstance(v, str):
                raise ValueError(f"expected str, got {type(v).__name__}")
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError as e:
                    raise ValueError(f"not valid UTF-8 text ({e.reason})") from None
            return v

        return check_str
    if pa.types.is_binary(t):

        def check_bytes(v: Any) -> Any:
            if v.__class__ is bytes:
                return v
            if not isinstance(v, bytes | bytearray | memoryview):
                raise ValueError(f"expected bytes, got {type(v).__name__}")
            return bytes(v)

        return check_bytes
    if pa.types.is_date(t):

        def check_date(v: Any) -> Any:
            if not isinstance(v, datetime.date) or isinstance(v, datetime.datetime):
                raise ValueError(f"expected datetime.date, got {type(v).__name__}")
            return v

        return check_date
    if pa.types.is_timestamp(t) or pa.types.is_decimal(t):
        kinds: tuple[type, ...]
        if pa.types.is_timestamp(t):
            kinds, expected = (datetime.datetime, int), "datetime.datetime or int"
        else:
            kinds, expected = (decimal.Decimal, int), "decimal.Decimal or int"

        def check_scalar(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, kinds):
                raise ValueError(f"expected {expected}, got {type(v).__name__}")
            try:
                pa.scalar(v, t)  # the conversion sealing does: range, precision, scale
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                raise ValueError(f"{v!r} does not fit {t} ({e})") from None
            return v

        return check_scalar
    if pa.types.is_list(t):
        item = _converter(t.value_type)
        item_nullable = t.value_field.nullable

        def check_list(v: Any) -> Any:
            if not isinstance(v, list | tuple):
                raise ValueError(f"expected a list, got {type(v).__name__}")
            out: list[Any] = []
            for x in v:
                if x is None:
                    if not item_nullable:
                        raise ValueError("null element in a list of not-null elements")
                    out.append(None)
                else:
                    out.append(item(x))
            return out

        return check_list
    if pa.types.is_map(t):
        key, value = _converter(t.key_type), _converter(t.item_type)
        value_nullable = t.item_field.nullable

        def check_map(v: Any) -> Any:
            if isinstance(v, Mapping):
                pairs: Any = v.items()
            elif isinstance(v, list | tuple):
                pairs = v
            else:
                raise ValueError(f"expected a dict or a list of pairs, got {type(v).__name__}")
            out: list[tuple[Any, Any]] = []
            for pair in pairs:
                # A JSON map arrives as [[key, value], ...]: 2-element lists are pairs too.
                if not isinstance(pair, tuple | list) or len(pair) != 2:
                    raise ValueError(f"a map entry must be a (key, value) pair, got {pair!r:.40}")
                k, x = pair
                if k is None:
                    raise ValueError("null map key")
                if x is None:
                    if not value_nullable:
                        raise ValueError(f"null value of map key {k!r:.40}")
                    out.append((key(k), None))
                else:
                    out.append((key(k), value(x)))
            return out

        return check_map
    if pa.types.is_struct(t):
        children = [(t.field(i).name, t.field(i).nullable, _converter(t.field(i).type))
                    for i in range(t.num_fields)]  # fmt: skip
        names = {c[0] for c in children}

        def check_struct(v: Any) -> Any:
            if not isinstance(v, Mapping):
                raise ValueError(f"expected a dict, got {type(v).__name__}")
            extra = [k for k in v if k not in names]
            if extra:
                raise ValueError(f"unknown field {extra[0]!r}")
            out: dict[str, Any] = {}
            for name, nullable, convert in children:
                x = v.get(name)
                if x is None:
                    if not nullable:
                        raise ValueError(f"field {name!r} is null")
                    out[name] = None
                else:
                    try:
                        out[name] = convert(x)
                    except ValueError as e:
                        raise ValueError(f"field {name!r}: {e}") from None
            return out

        return check_struct
    raise SchemaMismatchError(f"type {t} is not allowed in a record schema")  # pragma: no cover


def check_record(
    value: object, layout: TypedLayout, converters: Mapping[str, Callable[[Any], Any]]
) -> tuple[dict[str, Any], int]:
    """Check one record given to ``send``; return it as the row sealing converts (a new
    dict: the caller may reuse its own) and its approximate size in bytes.

    Raises:
        SerializationError: Not a mapping, an unknown column, a missing or null not-null
            column, a value of the wrong type or out of its column's range (the message
            names the column).
    """
    if not isinstance(value, Mapping):
        raise SerializationError(
            f"a typed table's record is a dict of its columns, not {type(value).__name__}"
        )
    for name in value:
        if name not in converters:
            raise SerializationError(
                f"send: unknown column {name!r}; the table's columns are {layout.schema.names}"
            )
    size = 0
    record: dict[str, Any] = {}
    for f in layout.schema:
        v = value.get(f.name)
        if v is None:
            if not f.nullable:
                raise SerializationError(f"send: column {f.name!r} is null or missing")
            continue
        try:
            v = converters[f.name](v)
        except (ValueError, TypeError) as e:
            raise SerializationError(f"send: column {f.name!r}: {e}") from None
        record[f.name] = v
        size += len(v) if isinstance(v, str | bytes) else 8
    return record, size


def typed_record_sizes(table: pa.Table) -> np.ndarray:
    """Approximate bytes of every row of segment rows (int64): string and binary columns
    by their lengths, other columns by their share of the column's buffers."""
    n = table.num_rows
    sizes = np.full(n, 21, dtype=np.int64)
    if n == 0:
        return sizes
    for column in table.columns:
        t = column.type
        if pa.types.is_string(t) or pa.types.is_binary(t):
            sizes += binary_lengths(column)
        else:
            sizes += max(1, column.nbytes // n)
    return sizes
