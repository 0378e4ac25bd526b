"""``consume``: print the records of a table, a range of them or new ones as they come."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from txntable.cli.context import fail, open_warehouse, warehouse_argument
from txntable.cli.records import ENCODINGS, encode_bytes, value_to_json
from txntable.structs import READ_COMMITTED, READ_UNCOMMITTED

if TYPE_CHECKING:
    from txntable.consumer import Consumer
    from txntable.protocol.schema import TypedLayout
    from txntable.structs import ConsumerRecord, TopicPartition


def _start_option(value: str | None) -> str | int | None:
    if value is None or value in ("earliest", "latest"):
        return value
    try:
        offset = int(value)
    except ValueError:
        raise click.BadParameter(
            f"expected earliest, latest or an offset, got {value!r}", param_hint="--from"
        ) from None
    if offset < 0:
        raise click.BadParameter("an offset is not negative", param_hint="--from")
    return offset


def _encoded(data: bytes | None, encoding: str, where: str) -> str | None:
    try:
        return encode_bytes(data, encoding, where)
    except ValueError as e:
        fail(str(e))


def _binary_text(encoding: str, where: str, data: bytes) -> str:
    return encode_bytes(data, encoding, where) or ""


def _typed_printer(layout: TypedLayout, encoding: str) -> Callable[[ConsumerRecord], None]:
    """A typed table's record as one JSON line: its columns (binary values in ``encoding``),
    then partition, offset and timestamp — what ``produce --encoding`` reads back."""
    types = {f.name: f.type for f in layout.schema}

    def show(r: ConsumerRecord) -> None:
        assert isinstance(r.value, dict)
        row = {}
        for name, v in r.value.items():
            where = f"column {name!r} of {r.topic}-{r.partition}@{r.offset}"
            try:
                row[name] = value_to_json(v, types[name], partial(_binary_text, encoding, where))
            except ValueError as e:
                fail(str(e))
        row.update(partition=r.partition, offset=r.offset, timestamp=r.timestamp)
        click.echo(json.dumps(row, ensure_ascii=False, allow_nan=False))

    return show


def _record_printer(fmt: str, encoding: str) -> Callable[[ConsumerRecord], None]:
    def where(r: ConsumerRecord, what: str) -> str:
        return f"{what} of {r.topic}-{r.partition}@{r.offset}"

    if fmt == "json":

        def show_json(r: ConsumerRecord) -> None:
            click.echo(
                json.dumps(
                    {
                        "table": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": _encoded(r.key, encoding, where(r, "key")),
                        "value": _encoded(r.value, encoding, where(r, "value")),
                        "headers": [
                            [k, _encoded(v, encoding, where(r, f"header {k}"))]
                            for k, v in r.headers
                        ],
                    },
                    separators=(",", ":"),
                )
            )

        return show_json

    def text(data: bytes | None, what: str, r: ConsumerRecord) -> str:
        if data is None:
            return "null"
        if encoding == "utf-8":
            return data.decode(errors="backslashreplace")
        return _encoded(data, encoding, where(r, what)) or ""

    if fmt == "value":
        return lambda r: click.echo(text(r.value, "value", r))

    def show_text(r: ConsumerRecord) -> None:
        click.echo(
            click.style(f"{r.partition}\t{r.offset}", dim=True)
            + f"\t{text(r.key, 'key', r)}\t{text(r.value, 'value', r)}",
            color=None,
        )

    return show_text


def _done(position: int, stop: int | None) -> bool:
    return stop is not None and position >= stop


def _print_records(
    consumer: Consumer,
    tps: list[TopicPartition],
    stop: dict[TopicPartition, int | None],
    printer: Callable[[ConsumerRecord], None],
    max_records: int | None,
    follow: bool,
    idle_timeout_ms: int | None,
) -> tuple[int, dict[TopicPartition, int]]:
    """Poll and print until every partition reached its stop offset, ``max_records`` were
    printed, the idle timeout passed (``follow``) or Ctrl-C; return the count and the
    position reached on each partition (what a group commits)."""
    count = 0
    reached: dict[TopicPartition, int] = {}
    idle_since = time.monotonic()
    stalled = 0
    active = list(tps)
    try:
        while max_records is None or count < max_records:
            active = [tp for tp in active if not _done(consumer.position(tp), stop[tp])]
            if not active:
                break
            if set(active) != consumer.assignment():
                consumer.assign(active)  # keeps positions; finished partitions are not fetched
            before = {tp: consumer.position(tp) for tp in active}
            limit = None if max_records is None else max_records - count
            polled = consumer.poll(timeout_ms=200 if follow else 100, max_records=limit)
            for tp in active:
                records = polled.get(tp, [])
                bound = stop[tp]
                shown = [r for r in records if bound is None or r.offset < bound]
                for r in shown:
                    printer(r)
                count += len(shown)
                # What to commit: the position (past markers and aborted data too), or the
                # stop offset when records at or past it were held back.
                reached[tp] = consumer.position(tp) if len(shown) == len(records) else bound or 0
            if polled:
                idle_since = time.monotonic()
            if follow:
                if idle_timeout_ms is not None and not polled:
                    if (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms:
                        break
            elif not polled and all(consumer.position(tp) == before[tp] for tp in active):
                stalled += 1  # the end offsets were taken at the start: this never lasts
                if stalled >= 50:
                    click.echo("txntable: no progress towards the end offsets; stopping", err=True)
                    break
            else:
                stalled = 0
    except KeyboardInterrupt:
        pass
    sys.stdout.flush()
    return count, reached


@click.command()
@warehouse_argument
@click.argument("table")
@click.option(
    "-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
    help="Partition to read (repeatable; default: all).",
)  # fmt: skip
@click.option(
    "--from",
    "start",
    metavar="earliest|latest|OFFSET",
    help="Where to start on every partition. Default: the group's committed offset with "
    "--group, else earliest.",
)
@click.option(
    "--until",
    type=click.IntRange(min=0),
    metavar="OFFSET",
    help="Stop before this offset on every partition.",
)
@click.option("-n", "--max-records", type=click.IntRange(min=1), help="Stop after N records.")
@click.option(
    "-f", "--follow", is_flag=True,
    help="Keep waiting for new records (Ctrl-C to stop) instead of stopping at the end.",
)  # fmt: skip
@click.option(
    "--idle-timeout-ms",
    type=click.IntRange(min=0),
    help="With --follow: stop after this long without a record.",
)
@click.option(
    "--isolation-level",
    type=click.Choice([READ_COMMITTED, READ_UNCOMMITTED]),
    default=READ_COMMITTED,
    show_default=True,
)
@click.option("-g", "--group", help="Consumer group: start from its committed offsets.")
@click.option(
    "--commit/--no-commit",
    default=True,
    show_default=True,
    help="With --group: commit the position reached when done.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "value", "json"]),
    default="text",
    show_default=True,
    help="text: partition, offset, key and value, tab-separated; value: values only; "
    "json: one object per line. A typed table prints JSON lines of its columns.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--encoding",
    type=click.Choice(ENCODINGS),
    default="utf-8",
    show_default=True,
    help="How keys and values (a typed table's binary values) are printed; produce reads "
    "them back with the same --encoding.",
)
def consume(
    warehouse: str,
    options: dict[str, str],
    table: str,
    partitions: tuple[int, ...],
    start: str | None,
    until: int | None,
    max_records: int | None,
    follow: bool,
    idle_timeout_ms: int | None,
    isolation_level: str,
    group: str | None,
    commit: bool,
    fmt: str,
    as_json: bool,
    encoding: str,
) -> None:
    """Print the records of TABLE: a range (to the end offsets as of the start, by default)
    or, with --follow, new records as they are committed."""
    from txntable.consumer import Consumer
    from txntable.structs import OffsetAndMetadata, TopicPartition

    ctx = click.get_current_context()
    if idle_timeout_ms is not None and not follow:
        raise click.UsageError("--idle-timeout-ms applies to --follow")
    if ctx.get_parameter_source("commit") is ParameterSource.COMMANDLINE and group is None:
        raise click.UsageError("--commit/--no-commit apply to --group")
    begin = _start_option(start)
    if as_json:
        fmt = "json"
    wh = open_warehouse(warehouse, options)
    handle = wh.table(table)
    tps = [TopicPartition(table, p) for p in (partitions or range(handle.num_partitions))]
    consumer = Consumer(
        wh, isolation_level=isolation_level, group_id=group, auto_offset_reset="earliest"
    )
    consumer.assign(tps)
    if begin == "earliest" or (begin is None and group is None):
        consumer.seek_to_beginning()
    elif begin == "latest":
        consumer.seek_to_end()
    elif isinstance(begin, int):
        for tp in tps:
            consumer.seek(tp, begin)
    stop: dict[TopicPartition, int | None] = {tp: until for tp in tps}
    if not follow:
        for tp, end in consumer.end_offsets(tps).items():
            stop[tp] = end if until is None else min(until, end)
    layout = handle.layout
    if layout is not None and fmt != "json" and (
        ctx.get_parameter_source("fmt") is ParameterSource.COMMANDLINE
    ):
        raise click.UsageError(
            f"a typed table prints JSON lines of its columns: --format {fmt} does not apply"
        )
    printer = _typed_printer(layout, encoding) if layout else _record_printer(fmt, encoding)
    try:
        count, reached = _print_records(consumer, tps, stop, printer, max_records, follow,
                                        idle_timeout_ms)  # fmt: skip
        if group is not None and commit and reached:
            consumer.commit({tp: OffsetAndMetadata(pos) for tp, pos in sorted(reached.items())})
    finally:
        # Also when stdout closed (``| head``): leave without committing what the reader
        # may not have read.
        consumer.close()
    click.echo(f"Processed {count} record(s)", err=True)


COMMANDS = [consume]
