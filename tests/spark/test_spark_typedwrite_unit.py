"""How Spark writes conform a DataFrame to a typed table, driven without Spark: column
resolution, schema merging at commit."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from txntable.errors import SchemaMismatchError
from txntable.protocol.actions import AppTxn, CommitPlan, Metadata
from txntable.protocol.schema import TypedLayout, merge_schemas, schema_to_json
from txntable.warehouse import Warehouse
from txntable_spark.typedwrite import plan_typed_write, resolve_columns


def test_names_resolve_case_insensitively_exact_first() -> None:
    table = pa.schema([("customer", pa.string()), ("Offset", pa.int64()), ("id", pa.int64())])
    got = resolve_columns(
        table, ["CUSTOMER", "Offset", "OFFSET", "Partition", "TimeStamp", "ID", "new"]
    )
    assert got == {
        "CUSTOMER": "customer",
        "Offset": "Offset",  # the table's own column of that exact name
        "OFFSET": "offset",  # otherwise a system column, in any case
        "Partition": "partition",
        "TimeStamp": "timestamp",
        "ID": "id",
        "new": "new",  # no match: a new column for mergeSchema
    }
    with pytest.raises(SchemaMismatchError, match="both write column 'customer'"):
        resolve_columns(table, ["customer", "Customer"])
    with pytest.raises(SchemaMismatchError, match="'Qty' and 'qty' differ only by case"):
        resolve_columns(table, ["Qty", "qty"])
    twins = pa.schema([("ab", pa.int32()), ("AB", pa.int32())])
    assert resolve_columns(twins, ["AB"]) == {"AB": "AB"}
    with pytest.raises(SchemaMismatchError, match="'Ab' is ambiguous"):
        resolve_columns(twins, ["Ab"])


def test_merge_never_adds_a_column_differing_only_by_case() -> None:
    table = pa.schema([("customer", pa.string())])
    with pytest.raises(SchemaMismatchError, match="'Customer' differs from column 'customer'"):
        merge_schemas(table, pa.schema([("Customer", pa.string())]))
    layout = TypedLayout(table, ("customer",))
    df = StructType([StructField("Customer", StringType()), StructField("Qty", IntegerType())])
    typed = plan_typed_write(layout, df, merge=True)
    assert typed.layout.schema == table.append(pa.field("Qty", pa.int32()))
    assert dict(typed.renames) == {"Customer": "customer"}
    rows = pa.table({"Customer": ["a"], "Qty": pa.array([1], pa.int32())})
    assert typed.conform(rows, 0).column_names == ["customer", "Qty", "timestamp"]


def test_a_merge_is_re_decided_against_a_concurrent_evolution() -> None:
    v1 = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    df = StructType([StructField("id", LongType(), False), StructField("Qty", IntegerType())])
    typed = plan_typed_write(TypedLayout(v1), df, merge=True)
    build = typed.commit_build(lambda s: CommitPlan([AppTxn("app", 1, 0)], None, "WRITE"))

    def evolved_by_another_writer(column: pa.Field) -> Any:
        table = Warehouse(f"memory://typedwrite-{uuid.uuid4().hex}").create_table("t", 1, schema=v1)
        table.evolve_schema(v1.append(column))
        return table.snapshot()

    # Another writer added 'note': both land, the newest columns first.
    plan = build(evolved_by_another_writer(pa.field("note", pa.string())))
    merged = pa.schema([*v1, ("note", pa.string()), ("Qty", pa.int32())])
    assert isinstance(plan.actions[0], Metadata)
    assert plan.actions[0].schema == schema_to_json(merged)
    # Another writer added 'qty': Qty could never be told apart from it.
    with pytest.raises(SchemaMismatchError, match="'Qty' differs from column 'qty'"):
        build(evolved_by_another_writer(pa.field("qty", pa.int64())))


def test_the_session_zone_is_read_from_the_batch_as_spark_labelled_it() -> None:
    """A converted column takes the table's zone label; the session zone still comes from
    the columns as Spark sent them."""
    ny = "America/New_York"
    table = pa.schema([("wall", pa.timestamp("us")), ("at", pa.timestamp("us", tz="UTC"))])
    df = StructType([StructField("wall", TimestampType()), StructField("at", TimestampNTZType())])
    typed = plan_typed_write(TypedLayout(table), df, merge=False)
    rows = pa.table(
        {
            # Converted first: afterwards no column of the batch carries New York.
            "wall": pa.array(
                [dt.datetime(2024, 1, 1, 5, 0, tzinfo=dt.UTC)], pa.timestamp("us", tz=ny)
            ),
            "at": pa.array([dt.datetime(2024, 1, 1, 0, 0)], pa.timestamp("us")),
        }
    )
    got = typed.conform(rows, 0).to_pylist()[0]
    assert got["at"] == dt.datetime(2024, 1, 1, 5, 0, tzinfo=dt.UTC)  # read in New York
    assert got["wall"] == dt.datetime(2024, 1, 1, 0, 0)
