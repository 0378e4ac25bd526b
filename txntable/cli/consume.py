"""``consume``: print the records of a table, a range of them or new ones as they come."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from txntable.cli.context import fail, open_warehouse, output, warehouse_argument
from txntable.cli.output import no_progress
from txntable.cli.records import ENCODINGS, encode_bytes, value_to_json
from txntable.structs import READ_COMMITTED, READ_UNCOMMITTED

if TYPE_CHECKING:
    from txntable.consumer import Consumer
    from txntable.protocol.schema import TypedLayout
    from txntable.structs import ConsumerRecord, TopicPartition
    from txntable.util import Progress


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


class _Reader:
    """Polls and prints until every partition it reads reached its stop offset,
    ``max_records`` were printed, the idle timeout passed (``follow``) or Ctrl-C.

    A partition that reached its stop is paused, its position set back to the stop if a
    poll went past it: positions are always what was printed, so a group commits exactly
    that. In a group, the end is reached only once the group is stable (every member has
    its partitions), or a rebalance could still hand this consumer more.
    """

    def __init__(
        self,
        consumer: Consumer,
        stop: dict[TopicPartition, int | None],
        printer: Callable[[ConsumerRecord], None],
        max_records: int | None,
        follow: bool,
        idle_timeout_ms: int | None,
        progress: Progress = no_progress,
    ) -> None:
        self.consumer = consumer
        self.progress = progress
        #: Where each partition read started (what the progress counts from).
        self.started: dict[TopicPartition, int] = {}
        self.stop = stop
        self.printer = printer
        self.max_records = max_records
        self.follow = follow
        self.idle_timeout_ms = idle_timeout_ms
        self.count = 0

    def _finished(self, tp: TopicPartition) -> bool:
        bound = self.stop.get(tp)
        return bound is not None and self.consumer.position(tp) >= bound

    def _group_settled(self) -> bool:
        """Whether this member holds the partitions of the group's stable generation."""
        from txntable.groups.member import load_group
        from txntable.groups.state import stable

        c = self.consumer
        assert c.group_id is not None
        state, _ = load_group(c.warehouse.store, c.group_id)
        return stable(state) and state.generation == c.group_metadata().generation_id

    def run(self) -> None:
        c = self.consumer
        idle_since = time.monotonic()
        stalled = 0
        subscribed = bool(c.subscription())
        # Without a stop offset (--follow without --until), only Ctrl-C or the idle timeout
        # end it, also while the group gives this member nothing.
        bounded = all(bound is not None for bound in self.stop.values())
        try:
            while self.max_records is None or self.count < self.max_records:
                assigned = c.assignment()
                done = {tp for tp in assigned if self._finished(tp)}
                if done - c.paused():
                    c.pause(done)  # fetched no more
                active = assigned - done
                if not active and bounded and (not subscribed or self._group_settled()):
                    break
                before = {tp: c.position(tp) for tp in active}
                for tp, position in before.items():
                    self.started.setdefault(tp, position)
                self._report()
                limit = None if self.max_records is None else self.max_records - self.count
                polled = c.poll(timeout_ms=200 if self.follow else 100, max_records=limit)
                for tp, records in polled.items():
                    bound = self.stop.get(tp)
                    for r in records:
                        if bound is not None and r.offset >= bound:
                            c.seek(tp, bound)  # what was not printed is not consumed
                            break
                        self.printer(r)
                        self.count += 1
                if polled:
                    idle_since = time.monotonic()
                    stalled = 0
                if self.follow:
                    if self.idle_timeout_ms is not None and not polled:
                        if (time.monotonic() - idle_since) * 1000 >= self.idle_timeout_ms:
                            break
                elif active and not polled and all(c.position(tp) == before[tp] for tp in active):
                    stalled += 1  # the end offsets were taken at the start: this never lasts
                    if stalled >= 50:
                        click.echo(
                            "txntable: no progress towards the end offsets; stopping", err=True
                        )
                        break
        except KeyboardInterrupt:
            pass
        sys.stdout.flush()

    def _report(self) -> None:
        """Offsets read of those to read, on the partitions read so far (a group may
        assign more later)."""
        bounds = {tp: self.stop.get(tp) for tp in self.started}
        if any(bound is None for bound in bounds.values()):
            return  # following: no end to measure against
        c = self.consumer
        assigned = c.assignment()
        total = done = 0
        for tp, start in self.started.items():
            bound = bounds[tp]
            assert bound is not None
            total += max(bound - start, 0)
            reached = c.position(tp) if tp in assigned else bound
            done += max(min(reached, bound) - start, 0)
        self.progress("read", done, total)


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
    help="Where to start on every partition [default: earliest]. With --group: where to start "
    "on a partition the group has no committed offset for.",
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
@click.option(
    "-g",
    "--group",
    help="Join this consumer group (as kafka-console-consumer): read the partitions the group "
    "assigns, from its committed offsets.",
)
@click.option(
    "--commit/--no-commit",
    default=True,
    show_default=True,
    help="With --group: commit what was printed (every 5 s, when partitions move to another "
    "member, and at the end).",
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
    or, with --follow, new records as they are committed.

    \b
    Examples:
      txntable consume lake orders -p 0 --from 100 --until 200
      txntable consume lake orders --group billing --follow --format json
      txntable consume lake prices --encoding base64 | txntable produce lake copy --encoding base64
    """
    from txntable.consumer import Consumer
    from txntable.structs import TopicPartition

    ctx = click.get_current_context()
    if idle_timeout_ms is not None and not follow:
        raise click.UsageError("--idle-timeout-ms applies to --follow")
    if ctx.get_parameter_source("commit") is ParameterSource.COMMANDLINE and group is None:
        raise click.UsageError("--commit/--no-commit apply to --group")
    begin = _start_option(start)
    if group is not None and partitions:
        raise click.UsageError(
            "--group joins the group, which assigns the partitions: --partition does not apply"
        )
    if group is not None and isinstance(begin, int):
        raise click.UsageError(
            "--from OFFSET applies without --group (a group member starts from the group's "
            "committed offsets, or with --from earliest|latest where there is none)"
        )
    if as_json:
        fmt = "json"
    wh = open_warehouse(warehouse, options)
    handle = wh.table(table)
    layout = handle.layout
    if layout is not None and fmt != "json" and (
        ctx.get_parameter_source("fmt") is ParameterSource.COMMANDLINE
    ):
        raise click.UsageError(
            f"a typed table prints JSON lines of its columns: --format {fmt} does not apply"
        )
    printer = _typed_printer(layout, encoding) if layout else _record_printer(fmt, encoding)
    tps = [TopicPartition(table, p) for p in (partitions or range(handle.num_partitions))]
    consumer = Consumer(
        wh,
        isolation_level=isolation_level,
        group_id=group,
        auto_offset_reset=begin if isinstance(begin, str) else "earliest",
        # Positions are always what was printed (see _Reader): committing them at each
        # interval, at a revocation and when leaving is what --commit means.
        enable_auto_commit=group is not None and commit,
    )
    try:
        if group is None:
            consumer.assign(tps)
            if isinstance(begin, int):
                for tp in tps:
                    consumer.seek(tp, begin)
            elif begin == "latest":
                consumer.seek_to_end()
            else:
                consumer.seek_to_beginning()
        else:
            consumer.subscribe([table])  # as kafka-console-consumer: a member of the group
        stop: dict[TopicPartition, int | None] = {tp: until for tp in tps}
        if not follow:
            for tp, end in consumer.end_offsets(tps).items():
                stop[tp] = end if until is None else min(until, end)
        # Bars on stderr only when the records go elsewhere: a terminal shows the records.
        showing = nullcontext(no_progress) if sys.stdout.isatty() else (
            output().progress(f"consume {table}", {"read": "offsets"})
        )
        with showing as progress:
            reader = _Reader(
                consumer, stop, printer, max_records, follow, idle_timeout_ms, progress
            )
            try:
                reader.run()
            except BrokenPipeError:
                # The reader of stdout went away: what it read is unknown, so nothing is
                # committed (the group reads those records again).
                consumer.enable_auto_commit = False
                raise
    finally:
        consumer.close()
    click.echo(f"Processed {reader.count} record(s)", err=True)


COMMANDS = [consume]
