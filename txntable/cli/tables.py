"""Commands on tables as a whole: ``create``, ``tables`` (list) and ``describe``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from txntable.cli.context import (
    json_option,
    open_warehouse,
    output,
    parse_pairs,
    warehouse_argument,
)

if TYPE_CHECKING:
    import pyarrow as pa


@click.command()
@warehouse_argument
@click.argument("table")
@click.option("-p", "--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "-c",
    "--config",
    "configuration",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_pairs,
    help="Table configuration (repeatable), e.g. -c checkpoint.interval=100.",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed if the table exists already.")
@click.option(
    "--schema",
    "schema_json",
    metavar="JSON|@FILE",
    help="Make a typed table: its columns as the JSON of metadata.schema (a list of "
    '{"name", "type", "nullable", "children"}), inline or @path of a file.',
)
@click.option(
    "-k",
    "--key",
    "key_columns",
    multiple=True,
    metavar="COLUMN",
    help="Key column of a typed table (repeatable): the partitioner hashes it.",
)
@json_option
def create(
    warehouse: str,
    options: dict[str, str],
    table: str,
    partitions: int,
    configuration: dict[str, str],
    if_not_exists: bool,
    schema_json: str | None,
    key_columns: tuple[str, ...],
) -> None:
    """Create TABLE with N partitions (Kafka's record, or with --schema a typed table)."""
    from txntable.errors import TableExistsError

    schema = parse_schema_option(schema_json) if schema_json is not None else None
    wh = open_warehouse(warehouse, options, must_exist=False)  # the first table makes it
    try:
        created = wh.create_table(
            table,
            partitions=partitions,
            configuration=configuration,
            schema=schema,
            key=list(key_columns),
        )
    except TableExistsError:
        if not if_not_exists:
            raise
        snap = wh.table(table).snapshot()
        assert snap.metadata is not None
        output().created(table, snap.metadata.tableId, snap.num_partitions, False)
        return
    snap = created.snapshot()
    assert snap.metadata is not None
    output().created(table, snap.metadata.tableId, partitions, True)


def parse_schema_option(text: str) -> pa.Schema:
    """The ``--schema`` option: JSON fields, inline or ``@file``."""
    from txntable.errors import CorruptLogError
    from txntable.protocol.actions import Metadata, action_from_dict
    from txntable.protocol.schema import schema_from_json

    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise click.BadParameter(str(e), param_hint="--schema") from None
    try:
        fields = json.loads(text)
        meta = action_from_dict(
            {"metadata": {"tableId": "-", "name": "-", "partitions": 1, "schema": fields}}
        )
    except (json.JSONDecodeError, CorruptLogError) as e:
        raise click.BadParameter(f"not a JSON list of fields: {e}", param_hint="--schema") from None
    assert isinstance(meta, Metadata)
    return schema_from_json(meta.schema)


@click.command("tables")
@warehouse_argument
@json_option
def list_tables(warehouse: str, options: dict[str, str]) -> None:
    """List the tables of WAREHOUSE."""
    output().table_names(open_warehouse(warehouse, options).list_tables())


@click.command()
@warehouse_argument
@click.argument("table")
@click.option("--producers", is_flag=True, help="Also list every producer's state.")
@json_option
def describe(warehouse: str, options: dict[str, str], table: str, producers: bool) -> None:
    """Per partition of TABLE: log start, LSO, high watermark, open transactions, producers,
    segments."""
    description = open_warehouse(warehouse, options).table(table).describe()
    output().table_description(description, producers)


COMMANDS = [create, list_tables, describe]
