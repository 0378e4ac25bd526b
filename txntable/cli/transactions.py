"""Commands on transactions: ``txns`` (the coordinator's state) and ``recover``."""

from __future__ import annotations

import sys
from typing import Any

import click

from txntable.cli.context import json_option, open_warehouse, output, warehouse_argument
from txntable.cli.output import STATE_STYLES


@click.command()
@warehouse_argument
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(list(STATE_STYLES)),
    help="Only transactional ids in this state (repeatable).",
)
@json_option
def txns(warehouse: str, options: dict[str, str], states: tuple[str, ...]) -> None:
    """Coordinator state of every transactional id.

    \b
    Example:
      txntable txns lake --state Ongoing --state PrepareCommit
    """
    listings = open_warehouse(warehouse, options).describe_transactions()
    rows: list[dict[str, Any]] = []
    for item in listings:
        m = item.metadata
        if states and (m is None or m.state.value not in states):
            continue
        rows.append(
            {
                "transactional_id": item.transactional_id,
                "state": m.state.value if m else None,
                "producer_id": m.producer_id if m else None,
                "producer_epoch": m.producer_epoch if m else None,
                "last_producer_id": m.last_producer_id if m else None,
                "last_producer_epoch": m.last_producer_epoch if m else None,
                "timeout_ms": m.timeout_ms if m else None,
                "partitions": {t: list(ps) for t, ps in m.partitions.items()} if m else None,
                "txn_start_timestamp": m.txn_start_timestamp if m else None,
                "last_update_timestamp": m.last_update_timestamp if m else None,
                "intent_segments": {t: len(bs) for t, bs in m.intent.items()} if m else None,
                "error": item.error,
            }
        )
    output().transactions(rows)


@click.command()
@warehouse_argument
@json_option
def recover(warehouse: str, options: dict[str, str]) -> None:
    """Finish prepared transactions and abort timed-out ones (exit 1 if one failed).

    \b
    Example:
      txntable recover lake
    """
    report = open_warehouse(warehouse, options).recover()
    output().recovered(report)
    if report.failed:
        sys.exit(1)


COMMANDS = [txns, recover]
