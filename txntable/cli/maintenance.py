"""Maintenance commands: ``checkpoint``, ``vacuum``, ``optimize``, ``compact``,
``retention`` and ``maintain`` (all of them, as the table's configuration says)."""

from __future__ import annotations

import sys

import click

from txntable import config
from txntable.cli.context import json_option, open_warehouse, output, warehouse_argument

#: The unit of each phase the maintenance operations report (see txntable.util.Progress).
UNITS = {
    "steps": "steps",
    "keys": "bytes",
    "rewrite": "bytes",
    "write": "entries",
    "list": "files",
    "delete": "files",
}


@click.command()
@warehouse_argument
@click.argument("table")
@json_option
def checkpoint(warehouse: str, options: dict[str, str], table: str) -> None:
    """Write a checkpoint of TABLE at its latest version.

    \b
    Example:
      txntable checkpoint lake orders
    """
    handle = open_warehouse(warehouse, options).table(table)
    with output().progress(f"checkpoint of {table}", {"write": "entries"}) as progress:
        version = handle.checkpoint(progress).version
    output().checkpointed(table, version)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "--retention-hours",
    type=click.FloatRange(min=1),
    default=None,
    help="Delete only files older than this [default: the table's version.retention.ms, "
    f"{config.VERSION_RETENTION_MS_DEFAULT / 3_600_000:g} h unless configured].",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@json_option
def vacuum(
    warehouse: str,
    options: dict[str, str],
    table: str,
    retention_hours: float | None,
    dry_run: bool,
) -> None:
    """Delete segment files of TABLE that no version of the retention window references,
    once they are old enough.

    \b
    Example:
      txntable vacuum lake orders --dry-run
    """
    retention_ms = None if retention_hours is None else int(retention_hours * 3_600_000)
    handle = open_warehouse(warehouse, options).table(table)
    with output().progress(f"vacuum of {table}", UNITS) as progress:
        report = handle.vacuum(retention_ms, dry_run=dry_run, progress=progress)
    output().vacuumed(table, report, dry_run)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "--target-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Size of the merged segments [default: the table's segment.bytes].",
)
@json_option
def optimize(warehouse: str, options: dict[str, str], table: str, target_bytes: int | None) -> None:
    """Merge TABLE's small segments below the LSO (offsets never change).

    \b
    Example:
      txntable optimize lake orders --target-bytes 268435456
    """
    handle = open_warehouse(warehouse, options).table(table)
    with output().progress(f"optimize {table}", UNITS) as progress:
        report = handle.optimize(target_bytes, progress=progress)
    output().rewritten("Optimized", table, report)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "--if-dirty",
    is_flag=True,
    help="Only partitions whose dirty ratio reaches min.cleanable.dirty.ratio.",
)
@click.option(
    "--ignore-cleanup-policy",
    is_flag=True,
    help="Compact even a table whose cleanup.policy lacks compact (drops older records of "
    "every key).",
)
@json_option
def compact(
    warehouse: str,
    options: dict[str, str],
    table: str,
    if_dirty: bool,
    ignore_cleanup_policy: bool,
) -> None:
    """Key-compact TABLE below the LSO: keep the latest record per key (Kafka's cleaner).
    Refused unless the table's cleanup.policy includes compact.

    \b
    Example:
      txntable compact lake prices --if-dirty
    """
    handle = open_warehouse(warehouse, options).table(table)
    with output().progress(f"compact {table}", UNITS) as progress:
        report = handle.compact(
            force=not if_dirty,
            progress=progress,
            ignore_cleanup_policy=ignore_cleanup_policy,
        )
    output().rewritten("Compacted", table, report)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "--format",
    "formats",
    type=click.Choice(["delta", "iceberg"]),
    multiple=True,
    help="Mirror format to publish (repeatable). Default: Delta, and Iceberg if the table's "
    "mirror.iceberg is on.",
)
@json_option
def publish(warehouse: str, options: dict[str, str], table: str, formats: tuple[str, ...]) -> None:
    """Publish TABLE's mirrors of read_committed now: Delta Lake (<table>/_delta_log/) and
    Iceberg (<table>/metadata/; needs txntable[iceberg]).

    \b
    Example:
      txntable publish lake orders
      txntable publish lake orders --format iceberg
    """
    report = open_warehouse(warehouse, options).table(table).publish(formats or None)
    output().published(table, report)


@click.command()
@warehouse_argument
@click.argument("table")
@json_option
def retention(warehouse: str, options: dict[str, str], table: str) -> None:
    """Apply TABLE's retention.ms / retention.bytes: move log start offsets forward.

    \b
    Example:
      txntable retention lake orders
    """
    report = open_warehouse(warehouse, options).table(table).apply_retention()
    output().retained(table, report)


@click.command()
@warehouse_argument
@click.argument("table")
@click.option("--no-vacuum", is_flag=True, help="Skip deleting old unreferenced files.")
@json_option
def maintain(warehouse: str, options: dict[str, str], table: str, no_vacuum: bool) -> None:
    """Run every maintenance step TABLE's configuration calls for: retention, producer
    expiry, compaction or merge, checkpoint, log cleanup and vacuum.

    Exits 1 if a step failed (the others still ran).

    \b
    Example:
      txntable maintain lake orders --no-vacuum
    """
    handle = open_warehouse(warehouse, options).table(table)
    with output().progress(f"maintain {table}", UNITS) as progress:
        report = handle.maintain(vacuum=not no_vacuum, progress=progress)
    output().maintained(table, report)
    if report.errors:
        sys.exit(1)


COMMANDS = [checkpoint, vacuum, optimize, compact, retention, maintain, publish]
