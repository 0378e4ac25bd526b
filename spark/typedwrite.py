"""Spark writes into a typed table: which schema the segments get and what a commit adds.

The driver fixes a :class:`TypedWrite` once per batch job or streaming query, from the
table's schema and the DataFrame's; every task conforms its rows with it, and the commit
builds its log version with :meth:`TypedWrite.commit_build`.

Columns are matched by name as Spark matches them (``spark.sql.caseSensitive=false``, its
default): ``Customer`` writes the table's ``customer``, an exact match winning, and
``mergeSchema`` never adds a column that differs from an existing one only by case. With
``spark.sql.caseSensitive=true`` (seen by the tasks as a Spark local property) a match that
needs another case is refused.

A write that does not evolve the schema writes segments of the schema the table had when it
started, and commits them unchanged whatever schema the table has by then: another client
may have added a column or widened one meanwhile, and readers cast such segments (the spec's
writer requirements for typed tables). A ``mergeSchema`` write that adds or widens columns
merges its evolution into the newest schema at every (re)build of its commit, so it lands in
the same log version as its data, next to a concurrent evolution if the two fit together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.types import StructType

from txntable.errors import SchemaMismatchError
from txntable.protocol.actions import CommitPlan
from txntable.protocol.schema import (
    TIMESTAMP_COLUMN,
    TypedLayout,
    castable,
    layout_of,
    merge_schemas,
    schema_to_json,
)
from txntable.protocol.snapshot import TableSnapshot

from .schema import spark_to_arrow
from .session import task_property
from .timeconv import conform_timestamps, session_time_zone

__all__ = ["TYPED_IGNORED", "TypedWrite", "plan_typed_write", "resolve_columns"]

T = TypeVar("T")

#: How errors of a Spark write name it (not ``send_batch``, which the user never called).
WRITE_LABEL = "txntable write"

#: Columns of a typed table's read that a write ignores (``partition`` routes the row,
#: ``timestamp`` is its timestamp; ``offset`` is assigned at commit).
TYPED_IGNORED = ("partition", "offset")


@dataclass(frozen=True)
class TypedWrite:
    """How one Spark write conforms a DataFrame to a typed table."""

    #: The layout the segments are written with: the table's, or its ``mergeSchema``
    #: evolution holding the DataFrame's columns.
    layout: TypedLayout
    #: The table's schema when the write started.
    start_schema: pa.Schema
    #: DataFrame column -> the column it writes, where the names differ (case, or a system
    #: column: ``timestamp``, or ``partition`` / ``offset``, which are dropped).
    renames: tuple[tuple[str, str], ...] = ()

    @property
    def evolves(self) -> bool:
        """Whether the write adds or widens columns (``mergeSchema``)."""
        return not self.layout.schema.equals(self.start_schema)

    def conform(self, data: pa.Table, now: int) -> pa.Table:
        """A task's rows as segment rows (see :meth:`TypedLayout.conform`).

        Raises:
            SchemaMismatchError: ``spark.sql.caseSensitive`` is true and a column matched
                only in another case.
        """
        renames = dict(self.renames)
        if _case_sensitive():
            for df_name, column in self.renames:
                if column not in (*TYPED_IGNORED, TIMESTAMP_COLUMN) and column != df_name:
                    raise SchemaMismatchError(
                        f"column {df_name!r} is not a column of the table (spark.sql."
                        f"caseSensitive is true; the table has {column!r})"
                    )
        given = data.schema  # Spark's labels: converted columns carry the table's zones
        zone = _once(lambda: session_time_zone(given))
        data = data.rename_columns([renames.get(n, n) for n in data.column_names])
        data = data.drop_columns([c for c in TYPED_IGNORED if c in data.column_names])
        schema = self.layout.segment_schema
        for i, name in enumerate(data.column_names):
            if name in schema.names:
                column = conform_timestamps(data.column(i), schema.field(name).type, zone, name)
                data = data.set_column(i, name, column)
        return self.layout.conform(data, now, WRITE_LABEL)

    def commit_build(
        self, build: Callable[[TableSnapshot], CommitPlan[T]]
    ) -> Callable[[TableSnapshot], CommitPlan[T]]:
        """``build``, plus the write's schema evolution when it has one: merged into the
        newest snapshot's schema (a ``metadata`` action unless that already holds it).
        Pure, so the commit re-decides against every snapshot it rebases onto.

        Raises:
            SchemaMismatchError: A concurrent evolution the write's does not fit with
                (e.g. the same new column with another type).
        """
        if not self.evolves:
            return build  # segments of a schema the table had: committed as they are
        target = self.layout.schema

        def wrapped(s: TableSnapshot) -> CommitPlan[T]:
            plan = build(s)
            layout = layout_of(s.metadata)
            assert s.metadata is not None and layout is not None
            if not plan.actions:
                return plan
            merged = merge_schemas(layout.schema, target)
            if merged.equals(layout.schema):
                return plan
            metadata = replace(s.metadata, schema=schema_to_json(merged))
            return CommitPlan([metadata, *plan.actions], plan.result, plan.operation)

        return wrapped


def plan_typed_write(layout: TypedLayout, schema: StructType, merge: bool) -> TypedWrite:
    """How a DataFrame of ``schema`` is written into a table of ``layout``: with the table's
    schema, or with ``mergeSchema`` its evolution holding the DataFrame's columns; names
    matched case-insensitively (:func:`resolve_columns`).

    Raises:
        SchemaMismatchError: A column the table does not have (without ``mergeSchema``), a
            column whose type does not fit, an ambiguous name, or an evolution that is not
            allowed.
    """
    arrow = spark_to_arrow(schema)
    renames = resolve_columns(layout.schema, arrow.names)
    system = {*TYPED_IGNORED, TIMESTAMP_COLUMN}
    data = pa.schema(
        [
            f.with_name(renames[f.name])
            for f in arrow
            if renames[f.name] not in system or renames[f.name] in layout.schema.names
        ]
    )
    unknown = [n for n in data.names if n not in layout.schema.names]
    target = layout.schema
    if unknown and not merge:
        raise SchemaMismatchError(
            f"column {unknown[0]!r} is not a column of the table ({layout.schema.names}); "
            "write with option mergeSchema=true to add it"
        )
    if merge:
        target = merge_schemas(layout.schema, data)
    for f in data:
        want = target.field(f.name).type
        if not castable(f.type, want):
            raise SchemaMismatchError(
                f"column {f.name!r} of type {f.type} cannot be stored as {want}"
            )
    changed = tuple((k, v) for k, v in renames.items() if k != v)
    return TypedWrite(TypedLayout(target, layout.key_columns), layout.schema, changed)


def resolve_columns(table: pa.Schema, columns: list[str]) -> dict[str, str]:
    """The column each DataFrame column writes, as Spark resolves names by default: the
    table column of that exact name, else a system column (``partition``, ``offset``,
    ``timestamp``) in any case, else the one table column equal but for case; a name
    matching nothing keeps its own (a new column for ``mergeSchema``).

    Raises:
        SchemaMismatchError: A name equal but for case to several table columns, or two
            DataFrame columns writing the same column.
    """
    system = (*TYPED_IGNORED, TIMESTAMP_COLUMN)
    by_lower: dict[str, list[str]] = {}
    for name in table.names:
        by_lower.setdefault(name.lower(), []).append(name)
    out: dict[str, str] = {}
    for name in columns:
        lower = name.lower()
        matches = by_lower.get(lower, [])
        if name in table.names:
            out[name] = name
        elif lower in system:
            out[name] = lower
        elif len(matches) > 1:
            raise SchemaMismatchError(
                f"column {name!r} is ambiguous: the table has {matches} (Spark matches "
                "column names case-insensitively)"
            )
        else:
            out[name] = matches[0] if matches else name
    written: dict[str, str] = {}
    for name, column in out.items():
        # New columns must differ in more than case too: they become columns of the table.
        known = column in table.names or column in system
        other = written.setdefault(column if known else column.lower(), name)
        if other != name:
            what = f"both write column {column!r}" if known else "differ only by case"
            raise SchemaMismatchError(
                f"columns {other!r} and {name!r} {what} (Spark matches column names "
                "case-insensitively)"
            )
    return out


def _once(compute: Callable[[], str]) -> Callable[[], str]:
    """``compute``, called at most once (the session time zone, only if a value needs it)."""
    cache: list[str] = []

    def get() -> str:
        if not cache:
            cache.append(compute())
        return cache[0]

    return get


def _case_sensitive() -> bool:
    """Whether the Spark session resolves column names case-sensitively (a task sees the
    session's explicitly set SQL confs as local properties; the default is false)."""
    value = task_property("spark.sql.caseSensitive")
    return (value or "false").strip().lower() == "true"
