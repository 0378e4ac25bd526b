"""``groups``: consumer groups, their members, committed offsets and lag."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from txntable.cli.context import fail, json_option, open_warehouse, output, warehouse_argument
from txntable.errors import TxnTableError

if TYPE_CHECKING:
    from txntable.groups.describe import GroupDescription


@click.command()
@warehouse_argument
@click.argument("group_ids", metavar="[GROUP]...", nargs=-1)
@json_option
def groups(warehouse: str, options: dict[str, str], group_ids: tuple[str, ...]) -> None:
    """Committed offsets and lag per partition of every consumer group (or of GROUP).

    A group that cannot be read is listed with its error (and the exit status is 1).

    \b
    Example:
      txntable groups lake billing --json
    """
    wh = open_warehouse(warehouse, options)
    found: list[GroupDescription] = []
    errors: dict[str, str] = {}
    for gid in group_ids or tuple(wh.list_groups()):
        try:
            d = wh.describe_group(gid)
        except TxnTableError as e:  # one damaged group must not hide the others
            errors[gid] = f"{type(e).__name__}: {e}"
            continue
        if d is None:
            fail(f"no consumer group {gid!r} in {warehouse}")
        found.append(d)
    output().groups(found, errors)
    if errors:
        sys.exit(1)


COMMANDS = [groups]
