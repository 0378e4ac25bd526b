"""``verify``: replay logs and check every invariant of the spec."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from txntable.cli.context import json_option, open_warehouse, output, warehouse_argument

if TYPE_CHECKING:
    from txntable.maintenance.verify import VerifyReport

#: Exit status of ``verify`` when it finds a violation (1 is any other error, 2 bad usage).
EXIT_VIOLATIONS = 3
#: The unit of each phase of a log's verification.
UNITS = {"log": "versions", "segments": "segments"}


@click.command()
@warehouse_argument
@click.argument("table_names", metavar="[TABLE]...", nargs=-1)
@click.option(
    "--segments/--no-segments",
    default=True,
    show_default=True,
    help="Also read every referenced segment and check it against its batch.",
)
@click.option("--groups", "with_groups", is_flag=True, help="Also check every consumer group log.")
@json_option
def verify(
    warehouse: str,
    options: dict[str, str],
    table_names: tuple[str, ...],
    segments: bool,
    with_groups: bool,
) -> None:
    """Replay the log of TABLE (default: every table) and check every invariant of the spec,
    and that every referenced segment exists and matches its batch.

    Exits 3 if any error-level violation is found (warnings alone exit 0).

    \b
    Examples:
      txntable verify lake --groups
      txntable verify lake orders --no-segments
    """
    wh = open_warehouse(warehouse, options)
    out = output()
    reports: list[VerifyReport] = []
    # A table whose version 0 was deleted is not listed as a table: verify reports it.
    for name in list(table_names) or sorted({*wh.list_tables(), *wh.orphaned_logs()}):
        with out.progress(name, UNITS) as step:
            reports.append(wh.verify_table(name, segments=segments, progress=step))
    for group in wh.list_groups() if with_groups else []:
        with out.progress(f"group {group}", UNITS) as step:
            reports.append(wh.verify_group(group, progress=step))
    out.verified(reports)
    if not all(r.ok for r in reports):
        sys.exit(EXIT_VIOLATIONS)


COMMANDS = [verify]
