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


class _WithSchemaTypes(click.Command):
    """A command whose help ends with the schema type names (read when help is shown, so
    that starting the command line never loads the schema module)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from txntable.protocol.schema import TYPE_NAMES

        formatter.write_paragraph()
        formatter.write_text(
            f"Schema types: {', '.join(TYPE_NAMES)} (UNIT: s, ms, us or ns; TZ: an IANA "
            "zone or an offset). A list has one child (its element), a map two (key, not "
            "nullable, and value), a struct one or more (its fields)."
        )
        super().format_epilog(ctx, formatter)


@click.command(cls=_WithSchemaTypes)
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
    """Create TABLE with N partitions (Kafka's record, or with --schema a typed table).

    \b
    Examples:
      txntable create lake orders --partitions 3 -c retention.ms=86400000
      txntable create lake prices --key sku --schema @prices.json
    \b
    with prices.json:
      [{"name": "sku", "type": "string", "nullable": false},
       {"name": "price", "type": "decimal(10,2)"},
       {"name": "tags", "type": "list", "children": [{"name": "element", "type": "string"}]}]
    """
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
    """List the tables of WAREHOUSE.

    \b
    Example:
      txntable tables s3://bucket/lake -o s3.endpoint=http://127.0.0.1:9000
    """
    output().table_names(open_warehouse(warehouse, options).list_tables())


@click.command()
@warehouse_argument
@click.argument("table")
@click.option("--producers", is_flag=True, help="Also list every producer's state.")
@json_option
def describe(warehouse: str, options: dict[str, str], table: str, producers: bool) -> None:
    """Per partition of TABLE: log start, LSO, high watermark, open transactions, producers,
    segments; its schema (typed tables) and the configuration keys it sets.

    \b
    Example:
      txntable describe lake orders --producers
    """
    handle = open_warehouse(warehouse, options).table(table)
    description = handle.describe()
    output().table_description(description, producers, handle.configuration)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "--set",
    "updates",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_pairs,
    help="Set a configuration key (repeatable).",
)
@click.option(
    "--unset", "removals", multiple=True, metavar="KEY", help="Unset a key: back to its default."
)
@json_option
def config(
    warehouse: str,
    options: dict[str, str],
    table: str,
    updates: dict[str, str],
    removals: tuple[str, ...],
) -> None:
    """Show TABLE's configuration: every key, its value, whether the table sets it or it has
    its default; with --set / --unset, change it first (in one log version).

    \b
    Examples:
      txntable config lake orders
      txntable config lake orders --set cleanup.policy=compact --unset retention.ms
    """
    from txntable.config import TABLE_CONFIG

    handle = open_warehouse(warehouse, options).table(table)
    if updates or removals:
        current = handle.alter_configuration(updates, removals)
    else:
        current = handle.configuration
    rows = [
        {
            "name": key.name,
            "value": current.get(key.name, key.default),
            "default": key.default,
            "is_set": key.name in current,
            "doc": key.doc,
        }
        for key in TABLE_CONFIG.values()
        if key.implemented or key.name in current
    ]
    rows += [  # written by another client: shown, not acted on
        {"name": k, "value": v, "default": None, "is_set": True, "doc": None}
        for k, v in sorted(current.items())
        if k not in TABLE_CONFIG
    ]
    output().configuration(table, rows)


@click.command(cls=_WithSchemaTypes)
@warehouse_argument
@click.argument("table")
@click.option(
    "--schema",
    "schema_json",
    required=True,
    metavar="JSON|@FILE",
    help="The whole new schema, as for create --schema.",
)
@json_option
def evolve(warehouse: str, options: dict[str, str], table: str, schema_json: str) -> None:
    """Evolve a typed TABLE's schema: add nullable columns (at the end, also inside structs)
    or widen types (int8 to int16 to int32 to int64, float32 to float64). Records written
    before read the new columns as null.

    \b
    Example:
      txntable evolve lake orders --schema @orders-v2.json
    """
    handle = open_warehouse(warehouse, options).table(table)
    schema = handle.evolve_schema(parse_schema_option(schema_json))
    layout = handle.layout
    output().evolved(table, schema, layout.key_columns if layout else ())


@click.command()
@warehouse_argument
@click.argument("table")
@click.option("--if-exists", is_flag=True, help="Succeed if there is no such table.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def drop(warehouse: str, options: dict[str, str], table: str, if_exists: bool, yes: bool) -> None:
    """Drop TABLE: delete its log and every segment. Refused while a transaction is open on
    it. Consumer groups keep their offsets for it.

    \b
    Example:
      txntable drop lake scratch --yes
    """
    from txntable.errors import TableNotFoundError

    wh = open_warehouse(warehouse, options)
    if not yes:
        click.confirm(f"Drop table {table} of {warehouse} and delete all its data?", abort=True)
    try:
        with output().progress(f"dropping {table}", {"delete": "objects"}) as progress:
            deleted: int | None = wh.drop_table(table, progress=progress)
    except TableNotFoundError:
        if not if_exists:
            raise
        deleted = None
    output().dropped(table, deleted)


def _offset_option(value: str) -> int:
    if value == "latest":
        return -1
    try:
        offset = int(value)
    except ValueError:
        offset = -2
    if offset < 0:
        raise click.BadParameter(
            f"expected an offset or latest, got {value!r}", param_hint="--before"
        )
    return offset


@click.command("delete-records")
@warehouse_argument
@click.argument("table")
@click.option(
    "--before",
    required=True,
    metavar="OFFSET|latest",
    help="Delete the records below this offset (latest: the high watermark).",
)
@click.option(
    "-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
    help="Partition (repeatable; default: all).",
)  # fmt: skip
@json_option
def delete_records(
    warehouse: str,
    options: dict[str, str],
    table: str,
    before: str,
    partitions: tuple[int, ...],
) -> None:
    """Delete TABLE's records below an offset: move the log start offsets forward (Kafka's
    kafka-delete-records). Readers no longer see them; vacuum deletes their files later.

    \b
    Example:
      txntable delete-records lake orders --before 1000 -p 0
    """
    offset = _offset_option(before)
    handle = open_warehouse(warehouse, options).table(table)
    targets = partitions or tuple(range(handle.num_partitions))
    starts = handle.delete_records({p: offset for p in targets})
    output().records_deleted(table, starts)


COMMANDS = [create, list_tables, describe, config, evolve, drop, delete_records]
