"""``groups``: consumer groups, their members, committed offsets and lag."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from txntable.cli.context import fail, json_option, open_warehouse, output, warehouse_argument

if TYPE_CHECKING:
    from txntable.groups.describe import GroupDescription


@click.command()
@warehouse_argument
@click.argument("group_ids", metavar="[GROUP]...", nargs=-1)
@json_option
def groups(warehouse: str, options: dict[str, str], group_ids: tuple[str, ...]) -> None:
    """Committed offsets and lag per partition of every consumer group (or of GROUP)."""
    wh = open_warehouse(warehouse, options)
    found: list[GroupDescription] = []
    for gid in group_ids or tuple(wh.list_groups()):
        d = wh.describe_group(gid)
        if d is None:
            fail(f"no consumer group {gid!r} in {warehouse}")
        found.append(d)
    output().groups(found)


COMMANDS = [groups]
