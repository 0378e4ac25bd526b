"""The ``txntable`` command line: create, inspect, produce to, consume from, check and
maintain the tables of a warehouse.

Built on click (parsing, help) and rich (tables, colour, progress bars). On a terminal the
output is coloured tables and long work shows a progress bar on stderr; piped, it is plain
aligned text without colour or progress; ``--json`` prints JSON for scripts. The library
does the work: this module parses, calls it and prints.

Exit codes: 0 success; 1 an error (a :class:`~txntable.errors.TxnTableError`, its name and
message on stderr) or a recovery that failed for some transactional id; 2 bad usage;
3 ``verify`` found a violation.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import IO, Any, NoReturn, TypeVar

import click
import pyarrow as pa
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.table import Table as RichTable
from rich.text import Text

from txntable import __version__
from txntable.consumer import Consumer
from txntable.errors import SerializationError, TxnTableError
from txntable.groups.describe import GroupDescription
from txntable.groups.subscription import ConsumerRebalanceListener
from txntable.maintenance.merge import RewriteReport
from txntable.maintenance.vacuum import RETENTION_MS_DEFAULT, VacuumReport
from txntable.maintenance.verify import RULES, VerifyReport, Violation
from txntable.producer.futures import FutureRecordMetadata
from txntable.producer.producer import Producer
from txntable.protocol.schema import (
    Field,
    TypedLayout,
    record_from_json,
    record_to_json,
    schema_to_json,
)
from txntable.structs import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from txntable.table import TableDescription
from txntable.util import now_ms
from txntable.warehouse import Warehouse

#: Exit status of ``verify`` when it finds a violation (1 is any other error, 2 bad usage).
EXIT_VIOLATIONS = 3
F = TypeVar("F", bound=Callable[..., Any])

STATE_STYLES = {
    "Ongoing": "yellow",
    "PrepareCommit": "magenta",
    "PrepareAbort": "magenta",
    "PrepareEpochFence": "magenta",
    "CompleteCommit": "green",
    "CompleteAbort": "red",
    "Empty": "dim",
    "Dead": "dim",
}


# --- output ---------------------------------------------------------------------------------


@dataclass
class Cli:
    """What every command gets: storage options of the group and where to print."""

    options: dict[str, str] = field(default_factory=dict)
    color: str = "auto"
    #: Never write on a reader's behalf (no completing of stuck transactions).
    read_only: bool = False
    _out: Console | None = None
    _err: Console | None = None

    def _console(self, stderr: bool) -> Console:
        force = {"always": True, "never": False}.get(self.color)
        probe = Console(stderr=stderr, force_terminal=force)
        return Console(
            stderr=stderr,
            force_terminal=force,
            no_color=self.color == "never",
            highlight=False,
            soft_wrap=True,
            # Piped output is for grep and awk: never wrap a table to 80 columns.
            width=None if probe.is_terminal else 1_000_000,
        )

    @property
    def out(self) -> Console:
        """stdout."""
        if self._out is None:
            self._out = self._console(stderr=False)
        return self._out

    @property
    def err(self) -> Console:
        """stderr (messages, progress)."""
        if self._err is None:
            self._err = self._console(stderr=True)
        return self._err

    def table(self, *columns: str, title: str | None = None) -> RichTable:
        """A table that is boxed on a terminal and plain aligned columns otherwise."""
        tty = self.out.is_terminal
        t = RichTable(
            *(Column(c, no_wrap=True) for c in columns),
            title=title,
            box=box.SIMPLE_HEAD if tty else None,
            header_style="bold" if tty else "",
            title_style="bold" if tty else "",
            title_justify="left",
            show_edge=tty,
            pad_edge=False,
        )
        return t

    def print_table(self, table: RichTable) -> None:
        """Print a table; piped, without the padding rich leaves at the end of lines."""
        if self.out.is_terminal:
            self.out.print(table)
            return
        with self.out.capture() as captured:
            self.out.print(table)
        click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))

    def progress(self) -> Progress | None:
        """A progress display on stderr, only when stderr is a terminal."""
        if not self.err.is_terminal:
            return None
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        )


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2))


def _text(value: object, style: str = "") -> Text:
    """A table cell; user data is never read as rich markup."""
    return Text("" if value is None else str(value), style=style)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _age(ms: int) -> str:
    """A duration, briefly: ``850ms``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    if ms < 0:
        return "-" + _age(-ms)
    if ms < 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class CliError(click.ClickException):
    """A failure the CLI itself detects (bad input lines, a group that does not exist)."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"txntable: {self.format_message()}", err=True)


def _fail(message: str) -> NoReturn:
    raise CliError(message)


# --- options shared by commands -----------------------------------------------------------


def _parse_pairs(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", ctx, param)
        out[key] = value
    return out


def _storage_option(f: F) -> F:
    return click.option(
        "-o",
        "--option",
        "options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse_pairs,
        help="Storage option (repeatable), e.g. -o s3.endpoint=http://127.0.0.1:9000.",
    )(f)


def _warehouse(f: F) -> F:
    """``WAREHOUSE`` and ``-o KEY=VALUE`` (also accepted before the command)."""
    return click.argument("warehouse", metavar="WAREHOUSE")(_storage_option(f))


def _json_flag(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def _open(warehouse: str, options: dict[str, str]) -> Warehouse:
    # Options go to the library unfiltered: it validates them (and names unknown keys).
    state = _cli()
    return Warehouse(
        warehouse,
        storage_options={**state.options, **options},
        finish_stuck_transactions=not state.read_only,
    )


def _cli() -> Cli:
    return click.get_current_context().find_object(Cli) or Cli()


class _Group(click.Group):
    """Turns library errors into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TxnTableError as e:
            click.echo(f"txntable: {type(e).__name__}: {e}", err=True)
            ctx.exit(1)
        except OSError as e:  # local disk: permissions, a file where a directory belongs
            click.echo(f"txntable: {type(e).__name__}: {e}", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="txntable")
@_storage_option
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour and progress bars: on a terminal (auto), always or never.",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="Never write on a reader's behalf: leave transactions that dead producers left "
    "prepared to recover (for read-only credentials).",
)
@click.pass_context
def cli(ctx: click.Context, options: dict[str, str], color: str, read_only: bool) -> None:
    """Kafka's exactly-once machinery as a table format: manage a warehouse of tables.

    WAREHOUSE is a path or URL: /data/lake, file:///data/lake, s3://bucket/prefix.
    Exit status: 0 success, 1 error, 2 bad usage, 3 verify found violations.
    """
    ctx.obj = Cli(options=options, color=color, read_only=read_only)


# --- tables ---------------------------------------------------------------------------------


@cli.command()
@_warehouse
@click.argument("table")
@click.option("-p", "--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "-c",
    "--config",
    "configuration",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_pairs,
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
@_json_flag
def create(
    warehouse: str,
    options: dict[str, str],
    table: str,
    partitions: int,
    configuration: dict[str, str],
    if_not_exists: bool,
    schema_json: str | None,
    key_columns: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create TABLE with N partitions (Kafka's record, or with --schema a typed table)."""
    from txntable.errors import TableExistsError

    schema = _parse_schema_option(schema_json) if schema_json is not None else None
    wh = _open(warehouse, options)
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
        existing = wh.table(table)
        snap = existing.snapshot()
        assert snap.metadata is not None
        _print_created(snap.metadata.tableId, table, snap.num_partitions, False, as_json)
        return
    snap = created.snapshot()
    assert snap.metadata is not None
    _print_created(snap.metadata.tableId, table, partitions, True, as_json)


def _parse_schema_option(text: str) -> pa.Schema:
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


def _print_created(table_id: str, name: str, partitions: int, created: bool, as_json: bool) -> None:
    if as_json:
        _print_json(
            {"name": name, "table_id": table_id, "partitions": partitions, "created": created}
        )
    elif created:
        _cli().out.print(f"Created table {name} with {partitions} partition(s) (id {table_id})")
    else:
        _cli().out.print(f"Table {name} exists, with {partitions} partition(s) (id {table_id})")


@cli.command()
@_warehouse
@_json_flag
def tables(warehouse: str, options: dict[str, str], as_json: bool) -> None:
    """List the tables of WAREHOUSE."""
    names = _open(warehouse, options).list_tables()
    if as_json:
        _print_json(names)
    else:
        for name in names:
            click.echo(name)


@cli.command()
@_warehouse
@click.argument("table")
@click.option("--producers", is_flag=True, help="Also list every producer's state.")
@_json_flag
def describe(
    warehouse: str, options: dict[str, str], table: str, producers: bool, as_json: bool
) -> None:
    """Per partition of TABLE: log start, LSO, high watermark, open transactions, producers,
    segments."""
    d = _open(warehouse, options).table(table).describe()
    if as_json:
        out = asdict(replace(d, schema=None))
        del out["schema"], out["key_columns"]
        if d.schema is not None:  # a typed table (untyped ones print what they printed)
            out["schema"] = [_field_json(f) for f in schema_to_json(d.schema)]
            out["key_columns"] = list(d.key_columns)
        _print_json(out)
        return
    _print_description(d, producers)


def _field_json(f: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "type": f.type, "nullable": f.nullable}
    if f.children:
        out["children"] = [_field_json(c) for c in f.children]
    return out


def _type_text(f: Field) -> str:
    """A field's type as one line: ``list<int32>``, ``struct<a: string not null>``."""
    if f.type == "list":
        return f"list<{_type_text(f.children[0])}>"
    if f.type == "map":
        return f"map<{_type_text(f.children[0])}, {_type_text(f.children[1])}>"
    if f.type == "struct":
        inner = ", ".join(f"{c.name}: {_type_text(c)}" for c in f.children)
        return f"struct<{inner}>"
    return f.type + ("" if f.nullable else " not null")


def _print_description(d: TableDescription, producers: bool) -> None:
    cli = _cli()
    now = now_ms()
    cli.out.print(
        _text(
            f"Table {d.name}: version {d.version}, {len(d.partitions)} partition(s), "
            f"id {d.table_id}"
        )
    )
    t = cli.table("PARTITION", "LOG START", "LSO", "HW", "OPEN TXNS", "PRODUCERS", "SEGMENTS",
                  "BYTES")
    for c in t.columns:
        c.justify = "right"
    for p in d.partitions:
        pinned = p.last_stable_offset < p.high_watermark
        t.add_row(
            _text(p.partition),
            _text(p.log_start_offset),
            _text(p.last_stable_offset, "yellow" if pinned else ""),
            _text(p.high_watermark),
            _text(len(p.open_transactions), "yellow" if p.open_transactions else ""),
            _text(len(p.producers)),
            _text(p.segments),
            _text(_bytes(p.segment_bytes)),
        )
    cli.print_table(t)
    if d.schema is not None:
        t = cli.table("COLUMN", "TYPE", "NULLABLE", "KEY", title="Schema")
        for f in schema_to_json(d.schema):
            text = _type_text(f).removesuffix(" not null")
            key = "yes" if f.name in d.key_columns else ""
            t.add_row(_text(f.name), _text(text), _text("yes" if f.nullable else "no"), _text(key))
        cli.print_table(t)
    opened = [(p.partition, o) for p in d.partitions for o in p.open_transactions]
    if opened:
        t = cli.table(
            "PARTITION", "PRODUCER", "TRANSACTIONAL ID", "FIRST OFFSET", "AGE",
            title="Open transactions",
        )
        for partition, o in opened:
            t.add_row(
                _text(partition),
                _text(o.producer_id),
                _text(o.transactional_id or "-"),
                _text(o.first_offset),
                _text(
                    "-" if o.txn_start_timestamp is None else _age(now - o.txn_start_timestamp),
                    "yellow",
                ),
            )
        cli.print_table(t)
    if producers:
        t = cli.table(
            "PARTITION", "PRODUCER", "EPOCH", "LAST SEQUENCE", "LAST WRITE", "TXN FROM",
            title="Producers",
        )
        for p in d.partitions:
            for pr in p.producers:
                t.add_row(
                    _text(p.partition),
                    _text(pr.producer_id),
                    _text(pr.producer_epoch),
                    _text(pr.last_sequence),
                    _text(_when(pr.last_timestamp) if pr.last_timestamp else "-"),
                    _text("-" if pr.current_txn_first_offset is None
                          else pr.current_txn_first_offset),
                )
        cli.print_table(t)


# --- produce --------------------------------------------------------------------------------


ENCODINGS = ("utf-8", "base64", "hex")


def _decode_text(text: str, encoding: str, what: str) -> bytes:
    """Bytes from a key or value written as text in ``encoding``."""
    try:
        if encoding == "base64":
            return base64.b64decode(text, validate=True)
        if encoding == "hex":
            return bytes.fromhex(text)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{what} is not valid {encoding}: {e}") from None
    return text.encode()


def _json_bytes(value: Any, encoding: str, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _decode_text(value, encoding, what)
    if encoding != "utf-8":
        raise ValueError(f"{what} must be a string in {encoding}")
    # Any other JSON value is stored as its compact JSON text.
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass
class _Input:
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp: int | None = None


_JSON_FIELDS = {"key", "value", "partition", "headers", "timestamp"}


def _parse_json_record(line: bytes, encoding: str) -> _Input | None:
    text = line.decode()
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError("a JSON record must be an object")
    unknown = set(obj) - _JSON_FIELDS
    if unknown:
        raise ValueError(
            f"unknown field(s) {sorted(unknown)}; a record has {sorted(_JSON_FIELDS)}"
        )
    partition = obj.get("partition")
    timestamp = obj.get("timestamp")
    for name, v in (("partition", partition), ("timestamp", timestamp)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer")
    raw_headers = obj.get("headers") or []
    pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
    headers: list[tuple[str, bytes | None]] = []
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError("headers must be an object or a list of [key, value] pairs")
        headers.append((pair[0], _json_bytes(pair[1], encoding, f"header {pair[0]}")))
    return _Input(
        _json_bytes(obj.get("key"), encoding, "key"),
        _json_bytes(obj.get("value"), encoding, "value"),
        partition,
        headers,
        timestamp,
    )


def _parse_line(line: bytes, separator: bytes | None, encoding: str) -> _Input:
    if separator is None:
        key_raw, value_raw = None, line
    else:
        key_raw, sep, value_raw = line.partition(separator)
        if not sep:
            raise ValueError(f"no key separator {separator.decode()!r}")
    if encoding == "utf-8":
        return _Input(key_raw, value_raw)  # bytes as they are: any encoding passes through
    return _Input(
        None if key_raw is None else _decode_text(key_raw.decode(), encoding, "key"),
        _decode_text(value_raw.decode(), encoding, "value"),
    )


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, line without its end, bytes read)``."""
    for n, raw in enumerate(stream, 1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield n, line[:-1] if line.endswith(b"\r") else line, len(raw)


@cli.command()
@_warehouse
@click.argument("table")
@click.argument("input_file", metavar="[FILE]", type=click.File("rb"), default="-")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lines", "json"]),
    default="lines",
    show_default=True,
    help="lines: one value per line; json: one object per line with key, value, "
    "partition, headers, timestamp.",
)
@click.option(
    "-k",
    "--key-separator",
    metavar="SEP",
    help="lines: split each line at the first SEP into key and value.",
)
@click.option("-p", "--partition", type=click.IntRange(min=0), help="Write every record here.")
@click.option(
    "-H",
    "--header",
    "headers",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_pairs,
    help="Header added to every record (repeatable).",
)
@click.option(
    "-t",
    "--transactional-id",
    metavar="ID",
    help="Write everything in one transaction under ID: all records or none become visible. "
    "Without it the producer is idempotent.",
)
@click.option(
    "--encoding",
    type=click.Choice(ENCODINGS),
    default="utf-8",
    show_default=True,
    help="How keys and values are written in the input.",
)
@_json_flag
def produce(
    warehouse: str,
    options: dict[str, str],
    table: str,
    input_file: IO[bytes],
    fmt: str,
    key_separator: str | None,
    partition: int | None,
    headers: dict[str, str],
    transactional_id: str | None,
    encoding: str,
    as_json: bool,
) -> None:
    """Write records to TABLE from FILE (default: stdin), one per line.

    Records are written idempotently (a retried write never duplicates), or with
    --transactional-id as one transaction, committed at the end of the input and aborted
    if any line is bad.
    """
    if key_separator is not None and fmt != "lines":
        raise click.UsageError("--key-separator applies to --format lines")
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    cli = _cli()
    wh = _open(warehouse, options)
    layout = wh.table(table).layout  # fail fast, before reading any input
    if layout is not None and (key_separator is not None or headers):
        raise click.UsageError(
            "a typed table reads JSON objects of its columns: --key-separator and --header "
            "do not apply"
        )
    common = [(k, v.encode()) for k, v in headers.items()]
    sep = key_separator.encode() if key_separator is not None else None
    producer = Producer(wh, transactional_id=transactional_id)
    futures: list[FutureRecordMetadata] = []
    progress = cli.progress()
    size = _size(input_file)
    try:
        if transactional_id is not None:
            producer.init_transactions()
            producer.begin_transaction()
        with progress or nullcontext():
            task = progress.add_task("producing", total=size) if progress else None
            for n, line, read in _lines(input_file):
                if layout is not None:
                    try:
                        typed = _parse_typed_record(line, layout, encoding)
                        if typed is not None:
                            value, at, to = typed
                            futures.append(
                                producer.send(
                                    table,
                                    value,  # type: ignore[arg-type]
                                    partition=to if to is not None else partition,
                                    timestamp=at,
                                )
                            )
                    except (ValueError, UnicodeDecodeError, SerializationError) as e:
                        _abandon(producer, transactional_id, futures, f"line {n}: {e}")
                    if progress is not None and task is not None:
                        progress.update(task, advance=read)
                    continue
                try:
                    rec = (
                        _parse_json_record(line, encoding)
                        if fmt == "json"
                        else _parse_line(line, sep, encoding)
                    )
                except (ValueError, UnicodeDecodeError) as e:
                    _abandon(producer, transactional_id, futures, f"line {n}: {e}")
                if rec is None:
                    continue
                futures.append(
                    producer.send(
                        table,
                        value=rec.value,
                        key=rec.key,
                        partition=rec.partition if rec.partition is not None else partition,
                        headers=[*common, *rec.headers],
                        timestamp=rec.timestamp,
                    )
                )
                if progress is not None and task is not None:
                    progress.update(task, advance=read)
            if transactional_id is not None:
                producer.commit_transaction()
            else:
                producer.flush()
    except TxnTableError:
        _close_quietly(producer)
        raise
    producer.close()
    results = [f.result() for f in futures]
    summary = _produce_summary(table, transactional_id, results)
    if as_json:
        _print_json(summary)
        return
    how = f"in transaction {transactional_id}" if transactional_id else "idempotently"
    cli.out.print(_text(f"Produced {len(results)} record(s) to {table} {how}"))
    if results:
        t = cli.table("PARTITION", "RECORDS", "FIRST OFFSET", "LAST OFFSET")
        for p in summary["partitions"]:
            t.add_row(*(_text(p[k]) for k in ("partition", "records", "first_offset",
                                               "last_offset")))
        cli.print_table(t)


def _parse_typed_record(
    line: bytes, layout: TypedLayout, encoding: str
) -> tuple[dict[str, Any], int | None, int | None] | None:
    """A typed table's input line: a JSON object of its columns, with optional system
    fields ``timestamp`` (int ms) and ``partition``; ``None`` for a blank line.

    Raises:
        ValueError: Not a JSON object, or a value not readable as its column's type.
    """
    text = line.decode()
    if not text.strip():
        return None
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("a typed table's input line must be a JSON object of its columns")
    at = obj.pop("timestamp", None)
    to = obj.pop("partition", None)
    obj.pop("offset", None)  # a consumed line written back
    for name, v in (("timestamp", at), ("partition", to)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer, not {v!r}")
    value = record_from_json(obj, layout, lambda t: _decode_text(t, encoding, "binary value"))
    return value, at, to


def _size(stream: IO[bytes]) -> int | None:
    """Bytes in a regular file (a progress bar's total); None for a pipe or terminal."""
    try:
        return os.fstat(stream.fileno()).st_size or None
    except (OSError, ValueError, AttributeError):
        return None


def _close_quietly(producer: Producer) -> None:
    try:
        producer.close()  # aborts an open transaction
    except TxnTableError as e:  # the first error is the one to report
        click.echo(f"txntable: while closing the producer: {type(e).__name__}: {e}", err=True)


def _abandon(
    producer: Producer,
    transactional_id: str | None,
    futures: list[FutureRecordMetadata],
    reason: str,
) -> NoReturn:
    """Stop at a bad input line: abort the transaction, or say what was written before it."""
    if transactional_id is not None:
        _close_quietly(producer)
        _fail(f"{reason}; transaction {transactional_id} aborted, nothing was written")
    producer.flush()
    producer.close()
    written = sum(1 for f in futures if f.exception() is None)
    _fail(f"{reason}; the {written} record(s) before it were written")


def _produce_summary(
    table: str, transactional_id: str | None, results: list[RecordMetadata]
) -> dict[str, Any]:
    by_partition: dict[int, list[int]] = {}
    for r in results:
        by_partition.setdefault(r.partition, []).append(r.offset)
    return {
        "table": table,
        "transactional_id": transactional_id,
        "records": len(results),
        "partitions": [
            {
                "partition": p,
                "records": len(offs),
                "first_offset": min(offs),
                "last_offset": max(offs),
            }
            for p, offs in sorted(by_partition.items())
        ],
    }


# --- consume --------------------------------------------------------------------------------


def _encode_bytes(data: bytes | None, encoding: str, where: str) -> str | None:
    if data is None:
        return None
    if encoding == "base64":
        return base64.b64encode(data).decode()
    if encoding == "hex":
        return data.hex()
    try:
        return data.decode()
    except UnicodeDecodeError:
        _fail(f"{where} is not UTF-8; use --encoding base64 or hex")


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


@cli.command()
@_warehouse
@click.argument("table")
@click.option(
    "-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
    help="Partition to read (repeatable; default: all).",
)
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
)
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
    help="text (default): partition, offset, key and value, tab-separated; value: values "
    "only; json: one object per line. A typed table's records are always JSON lines.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--encoding",
    type=click.Choice(ENCODINGS),
    default="utf-8",
    show_default=True,
    help="How keys and values are printed (a typed table's binary columns: as produce "
    "reads them with the same --encoding).",
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
    fmt: str | None,
    as_json: bool,
    encoding: str,
) -> None:
    """Print the records of TABLE: a range (to the end offsets as of the start, by default)
    or, with --follow, new records as they are committed.

    With --group and no --partition it joins the group (as kafka-console-consumer does):
    it reads the partitions the group assigns it and commits as a member."""
    begin = _start_option(start)
    if as_json:
        fmt = "json"
    wh = _open(warehouse, options)
    handle = wh.table(table)
    layout = handle.layout
    if layout is not None and fmt in ("text", "value"):
        raise click.UsageError(
            f"--format {fmt} does not apply to a typed table: its records print as JSON lines"
        )
    tps = [TopicPartition(table, p) for p in (partitions or range(handle.num_partitions))]
    consumer = Consumer(
        wh,
        isolation_level=isolation_level,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,  # --commit / --no-commit decide
    )
    stop: dict[TopicPartition, int | None] = {tp: until for tp in tps}
    if not follow:
        for tp, end in consumer.end_offsets(tps).items():
            stop[tp] = end if until is None else min(until, end)
    joined = group is not None and not partitions
    if joined:
        consumer.subscribe([table], listener=_StartAt(consumer, begin))
    else:
        consumer.assign(tps)
        _seek(consumer, tps, begin if begin is not None or group is not None else "earliest")
    printer = (
        _record_printer(fmt or "text", encoding)
        if layout is None
        else _typed_printer(layout, encoding)
    )
    count = 0
    reached: dict[TopicPartition, int] = {}
    idle_since = time.monotonic()
    stalled = 0
    try:
        while max_records is None or count < max_records:
            assigned = consumer.assignment()
            active = [tp for tp in sorted(assigned) if not _done(consumer.position(tp), stop[tp])]
            if not follow and not active and (assigned or not joined):
                break
            # Finished partitions are paused: positions stay, nothing more is fetched.
            consumer.pause([tp for tp in assigned if tp not in active])
            before = {tp: consumer.position(tp) for tp in active}
            limit = None if max_records is None else max_records - count
            polled = consumer.poll(timeout_ms=200 if follow else 100, max_records=limit)
            for tp, records in sorted(polled.items()):
                bound = stop[tp]
                shown = [r for r in records if bound is None or r.offset < bound]
                for r in shown:
                    printer(r)
                count += len(shown)
                # What to commit: the position (past markers and aborted data too), or the
                # stop offset when records at or past it were held back.
                reached[tp] = consumer.position(tp) if len(shown) == len(records) else bound or 0
            for tp in active:
                if tp not in polled and tp in consumer.assignment():
                    reached[tp] = consumer.position(tp)  # moved past markers only
            if polled:
                idle_since = time.monotonic()
            if follow:
                if idle_timeout_ms is not None and not polled:
                    if (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms:
                        break
            elif not polled and all(
                tp in before and consumer.position(tp) == before[tp] for tp in consumer.assignment()
            ):
                stalled += 1  # the end offsets were taken at the start: this never lasts
                if stalled >= 50:
                    click.echo("txntable: no progress towards the end offsets; stopping", err=True)
                    break
            else:
                stalled = 0
    except KeyboardInterrupt:
        pass
    finally:
        sys.stdout.flush()
    owned = consumer.assignment()  # a member commits only what the group still gives it
    done = {tp: pos for tp, pos in sorted(reached.items()) if tp in owned}
    if group is not None and commit and done:
        consumer.commit({tp: OffsetAndMetadata(pos) for tp, pos in done.items()})
    consumer.close()
    click.echo(f"Processed {count} record(s)", err=True)


def _seek(consumer: Consumer, tps: list[TopicPartition], begin: str | int | None) -> None:
    """Position ``tps`` at ``begin`` (``None``: the group's committed offset, else earliest)."""
    if begin == "earliest":
        consumer.seek_to_beginning(tps)
    elif begin == "latest":
        consumer.seek_to_end(tps)
    elif isinstance(begin, int):
        for tp in tps:
            consumer.seek(tp, begin)


class _StartAt(ConsumerRebalanceListener):
    """Positions the partitions the group assigns at --from (none: the committed offset)."""

    def __init__(self, consumer: Consumer, begin: str | int | None) -> None:
        self.consumer = consumer
        self.begin = begin

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        _seek(self.consumer, sorted(assigned), self.begin)


def _done(position: int, stop: int | None) -> bool:
    return stop is not None and position >= stop


def _typed_printer(layout: TypedLayout, encoding: str) -> Callable[[ConsumerRecord], None]:
    """A typed table's record as one JSON line: its columns (binary in ``encoding``), then
    partition, offset and timestamp — what ``produce`` with that encoding reads back."""

    def show_typed(r: ConsumerRecord) -> None:
        assert isinstance(r.value, dict)
        where = f"a binary value of {r.topic}-{r.partition}@{r.offset}"
        row = record_to_json(r.value, layout, lambda b: _encode_bytes(b, encoding, where) or "")
        row.update(partition=r.partition, offset=r.offset, timestamp=r.timestamp)
        click.echo(json.dumps(row, ensure_ascii=False))

    return show_typed


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
                        "key": _encode_bytes(r.key, encoding, where(r, "key")),
                        "value": _encode_bytes(r.value, encoding, where(r, "value")),
                        "headers": [
                            [k, _encode_bytes(v, encoding, where(r, f"header {k}"))]
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
        return _encode_bytes(data, encoding, where(r, what)) or ""

    if fmt == "value":
        return lambda r: click.echo(text(r.value, "value", r))

    def show_text(r: ConsumerRecord) -> None:
        click.echo(
            click.style(f"{r.partition}\t{r.offset}", dim=True)
            + f"\t{text(r.key, 'key', r)}\t{text(r.value, 'value', r)}",
            color=None,
        )

    return show_text


# --- transactions and groups ---------------------------------------------------------------


@cli.command()
@_warehouse
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(list(STATE_STYLES)),
    help="Only transactional ids in this state (repeatable).",
)
@_json_flag
def txns(warehouse: str, options: dict[str, str], states: tuple[str, ...], as_json: bool) -> None:
    """Coordinator state of every transactional id."""
    listings = _open(warehouse, options).describe_transactions()
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
    if as_json:
        _print_json(rows)
        return
    cli = _cli()
    now = now_ms()
    t = cli.table(
        "TRANSACTIONAL ID", "STATE", "PRODUCER", "EPOCH", "TIMEOUT", "OPEN FOR", "PARTICIPANTS",
        "UPDATED",
    )
    for r in rows:
        if r["error"]:
            t.add_row(_text(r["transactional_id"]), _text(r["error"], "red"))
            continue
        start = r["txn_start_timestamp"]
        t.add_row(
            _text(r["transactional_id"]),
            _text(r["state"], STATE_STYLES.get(r["state"], "")),
            _text(r["producer_id"]),
            _text(r["producer_epoch"]),
            _text(_age(r["timeout_ms"])),
            _text(_age(now - start) if start >= 0 else "-"),
            _text(
                " ".join(
                    f"{name}[{','.join(map(str, ps))}]" for name, ps in r["partitions"].items()
                )
                or "-"
            ),
            _text(_age(now - r["last_update_timestamp"]) + " ago"),
        )
    cli.print_table(t)


@cli.command()
@_warehouse
@click.argument("group_ids", metavar="[GROUP]...", nargs=-1)
@_json_flag
def groups(
    warehouse: str, options: dict[str, str], group_ids: tuple[str, ...], as_json: bool
) -> None:
    """Committed offsets and lag per partition of every consumer group (or of GROUP)."""
    wh = _open(warehouse, options)
    found: list[GroupDescription] = []
    for gid in group_ids or tuple(wh.list_groups()):
        d = wh.describe_group(gid)
        if d is None:
            _fail(f"no consumer group {gid!r} in {warehouse}")
        found.append(d)
    if as_json:
        _print_json(
            [
                {
                    "group_id": d.group_id,
                    "version": d.version,
                    "offsets": [{**asdict(o), "lag": o.lag} for o in d.offsets],
                    "generation": d.generation,
                    "assignor": d.assignor,
                    "members": [
                        {
                            **asdict(m),
                            "subscription": list(m.subscription),
                            "assignment": _partitions_json(m.assignment),
                            "owned": _partitions_json(m.owned),
                        }
                        for m in d.members
                    ],
                }
                for d in found
            ]
        )
        return
    cli = _cli()
    now = now_ms()
    owners = {
        (d.group_id, t, p): m.member_id for d in found for m in d.members for t, p in m.assignment
    }
    if any(d.members for d in found):
        mt = cli.table(
            "GROUP", "GENERATION", "ASSIGNOR", "MEMBER", "INSTANCE", "ASSIGNMENT", "ACKED",
            "HEARTBEAT",
        )
        for d in found:
            for m in d.members:
                mt.add_row(
                    _text(d.group_id),
                    _text(d.generation),
                    _text(d.assignor or "-"),
                    _text(m.member_id),
                    _text(m.group_instance_id or "-"),
                    _text(_partitions_text(m.assignment) or "-"),
                    _text(
                        "yes" if m.acked_generation == d.generation else f"{m.acked_generation}",
                        "" if m.acked_generation == d.generation else "yellow",
                    ),
                    _text(_age(max(now - m.last_heartbeat, 0)) + " ago"),
                )
        cli.print_table(mt)
    # The MEMBER column only for groups with members (subscribe); assign-only groups have none.
    with_members = any(d.members for d in found)
    columns = ["GROUP", "TABLE", "PARTITION", "OFFSET", "LSO", "HW", "LAG", "PENDING"]
    t = cli.table(*columns, *(["MEMBER"] if with_members else []))
    for d in found:
        for o in d.offsets:
            t.add_row(
                _text(d.group_id),
                _text(o.table),
                _text(o.partition),
                _text("-" if o.offset is None else o.offset),
                _text("-" if o.last_stable_offset is None else o.last_stable_offset),
                _text("-" if o.high_watermark is None else o.high_watermark),
                _text("-" if o.lag is None else o.lag, "yellow" if o.lag else ""),
                _text(
                    "-" if o.pending_producer_id is None
                    else f"producer {o.pending_producer_id}",
                    "magenta",
                ),
                *(
                    [_text(owners.get((d.group_id, o.table, o.partition), "-"))]
                    if with_members
                    else []
                ),
            )
    cli.print_table(t)


def _partitions_json(tps: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for table, p in tps:
        out.setdefault(table, []).append(p)
    return out


def _partitions_text(tps: tuple[tuple[str, int], ...]) -> str:
    return " ".join(
        f"{table}[{','.join(map(str, ps))}]" for table, ps in _partitions_json(tps).items()
    )


# --- maintenance ----------------------------------------------------------------------------


@cli.command()
@_warehouse
@_json_flag
def recover(warehouse: str, options: dict[str, str], as_json: bool) -> None:
    """Finish prepared transactions and abort timed-out ones (exit 1 if one failed)."""
    report = _open(warehouse, options).recover()
    if as_json:
        _print_json(asdict(report))
    else:
        cli = _cli()
        lines = [
            ("Committed (rolled forward)", report.committed, "green"),
            ("Aborted", report.aborted, "red"),
            ("Timed out and aborted", report.timed_out, "yellow"),
            ("Finished by another client", report.lost_race, "dim"),
        ]
        for label, tids, style in lines:
            if tids:
                cli.out.print(Text.assemble((f"{label}: ", style), ", ".join(tids)))
        for tid, error in report.failed.items():
            cli.out.print(Text.assemble(("Failed: ", "bold red"), f"{tid}: {error}"))
        if not any(tids for _, tids, _ in lines) and not report.failed:
            cli.out.print("Nothing to recover.")
    if report.failed:
        sys.exit(1)


@cli.command()
@_warehouse
@click.argument("table")
@_json_flag
def checkpoint(warehouse: str, options: dict[str, str], table: str, as_json: bool) -> None:
    """Write a checkpoint of TABLE at its latest version."""
    version = _open(warehouse, options).table(table).checkpoint().version
    if as_json:
        _print_json({"table": table, "version": version})
    else:
        _cli().out.print(_text(f"Checkpoint of {table} written at version {version}"))


@cli.command()
@_warehouse
@click.argument("table")
@click.option(
    "--retention-hours",
    type=click.FloatRange(min=1),
    default=None,
    help="Delete only files older than this [default: the table's version.retention.ms, "
    f"{RETENTION_MS_DEFAULT / 3_600_000:g} h unless configured].",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@_json_flag
def vacuum(
    warehouse: str,
    options: dict[str, str],
    table: str,
    retention_hours: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete segment files of TABLE that no version of the retention window references,
    once they are old enough."""
    retention_ms = None if retention_hours is None else int(retention_hours * 3_600_000)
    report = _open(warehouse, options).table(table).vacuum(retention_ms, dry_run=dry_run)
    if as_json:
        _print_json({**asdict(report), "dry_run": dry_run})
        return
    _print_vacuum(table, report, dry_run)


def _print_vacuum(table: str, report: VacuumReport, dry_run: bool) -> None:
    cli = _cli()
    verb = "Would delete" if dry_run else "Deleted"
    cli.out.print(
        _text(f"{verb} {len(report.deleted)} unreferenced file(s) of {table}; "
              f"{report.referenced} referenced, {len(report.undated)} undated (kept)")
    )
    for key in report.deleted:
        cli.out.print(_text(f"  {key}"))


def _print_rewrite(verb: str, table: str, r: RewriteReport) -> None:
    where = f"version {r.version}" if r.version is not None else "nothing to do"
    _cli().out.print(
        _text(
            f"{verb} {table}: {r.entries_replaced} entries into {r.segments_written} segment(s) "
            f"({_bytes(r.bytes_read)} read, {_bytes(r.bytes_written)} written; "
            f"{r.records_kept} records kept, {r.records_dropped} dropped) — {where}"
        )
    )


@cli.command()
@_warehouse
@click.argument("table")
@click.option(
    "--target-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Size of the merged segments [default: the table's segment.bytes].",
)
@_json_flag
def optimize(
    warehouse: str, options: dict[str, str], table: str, target_bytes: int | None, as_json: bool
) -> None:
    """Merge TABLE's small segments below the LSO (offsets never change)."""
    report = _open(warehouse, options).table(table).optimize(target_bytes)
    if as_json:
        _print_json(asdict(report))
    else:
        _print_rewrite("Optimized", table, report)


@cli.command()
@_warehouse
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
@_json_flag
def compact(
    warehouse: str,
    options: dict[str, str],
    table: str,
    if_dirty: bool,
    ignore_cleanup_policy: bool,
    as_json: bool,
) -> None:
    """Key-compact TABLE below the LSO: keep the latest record per key (Kafka's cleaner).

    Refused unless the table's cleanup.policy includes compact."""
    report = (
        _open(warehouse, options)
        .table(table)
        .compact(force=not if_dirty, ignore_cleanup_policy=ignore_cleanup_policy)
    )
    if as_json:
        _print_json(asdict(report))
    else:
        _print_rewrite("Compacted", table, report)


@cli.command()
@_warehouse
@click.argument("table")
@_json_flag
def publish(warehouse: str, options: dict[str, str], table: str, as_json: bool) -> None:
    """Publish TABLE's Delta Lake mirror of read_committed (<table>/_delta_log/) now."""
    report = _open(warehouse, options).table(table).publish()
    if as_json:
        _print_json(asdict(report))
    elif report.delta_version is None:
        _cli().out.print(
            _text(f"Mirror of {table} is up to date with version {report.txntable_version}")
        )
    else:
        _cli().out.print(
            _text(
                f"Published {table} version {report.txntable_version} as Delta version "
                f"{report.delta_version} (+{report.added} -{report.removed} files)"
            )
        )


@cli.command()
@_warehouse
@click.argument("table")
@_json_flag
def retention(warehouse: str, options: dict[str, str], table: str, as_json: bool) -> None:
    """Apply TABLE's retention.ms / retention.bytes: move log start offsets forward."""
    report = _open(warehouse, options).table(table).apply_retention()
    if as_json:
        _print_json(asdict(report))
        return
    if not report.log_start_offsets:
        _cli().out.print(_text(f"Retention of {table}: nothing to delete"))
        return
    moved = ", ".join(f"{p}: {o}" for p, o in sorted(report.log_start_offsets.items()))
    _cli().out.print(
        _text(f"Retention of {table}: log start offsets {moved} (version {report.version}, "
              f"{_bytes(report.bytes_released)} released)")
    )


@cli.command()
@_warehouse
@click.argument("table")
@click.option("--no-vacuum", is_flag=True, help="Skip deleting old unreferenced files.")
@_json_flag
def maintain(
    warehouse: str, options: dict[str, str], table: str, no_vacuum: bool, as_json: bool
) -> None:
    """Run every maintenance step TABLE's configuration calls for: retention, producer
    expiry, compaction or merge, checkpoint, log cleanup and vacuum.

    Exits 1 if a step failed (the others still ran).
    """
    report = _open(warehouse, options).table(table).maintain(vacuum=not no_vacuum)
    if as_json:
        _print_json(asdict(report))
    else:
        out = _cli().out
        if report.retention is not None:
            starts = report.retention.log_start_offsets
            out.print(_text(f"retention: {len(starts)} partition(s) moved their log start"))
        if report.expiry is not None:
            out.print(_text(f"expiry: {len(report.expiry.producer_ids)} producer(s) expired"))
        if report.rewrite is not None:
            _print_rewrite("merge/compaction", table, report.rewrite)
        if report.checkpoint is not None:
            out.print(_text(f"checkpoint: version {report.checkpoint.version}"))
        if report.log_cleanup is not None:
            lc = report.log_cleanup
            out.print(_text(f"log cleanup: {lc.versions_deleted} version(s), "
                            f"{lc.checkpoints_deleted} checkpoint(s) deleted"))
        if report.vacuum is not None:
            _print_vacuum(table, report.vacuum, dry_run=False)
        for error in report.errors:
            _cli().err.print(_text(f"txntable: {error}", "red"))
    if report.errors:
        sys.exit(1)


@cli.command()
@_warehouse
@click.argument("table_names", metavar="[TABLE]...", nargs=-1)
@click.option(
    "--segments/--no-segments",
    default=True,
    show_default=True,
    help="Also read every referenced segment and check it against its batch.",
)
@click.option("--groups", "with_groups", is_flag=True, help="Also check every consumer group log.")
@_json_flag
def verify(
    warehouse: str,
    options: dict[str, str],
    table_names: tuple[str, ...],
    segments: bool,
    with_groups: bool,
    as_json: bool,
) -> None:
    """Replay the log of TABLE (default: every table) and check every invariant of the spec,
    and that every referenced segment exists and matches its batch.

    Exits 3 if any error-level violation is found (warnings alone exit 0).
    """
    wh = _open(warehouse, options)
    # A table whose version 0 was deleted is not listed as a table: verify reports it.
    names = list(table_names) or sorted({*wh.list_tables(), *wh.orphaned_logs()})
    cli = _cli()
    reports: list[VerifyReport] = []
    progress = cli.progress()
    with progress or nullcontext():
        for name in names:
            step, finish = _phases(progress, name)
            reports.append(wh.verify_table(name, segments=segments, progress=step))
            finish()
        for group in wh.list_groups() if with_groups else []:
            step, finish = _phases(progress, f"group {group}")
            reports.append(wh.verify_group(group, progress=step))
            finish()
    ok = all(r.ok for r in reports)
    if as_json:
        _print_json(
            {
                "ok": ok,
                "tables": [
                    {
                        **{k: v for k, v in asdict(r).items() if k not in ("errors", "warnings")},
                        "ok": r.ok,
                        "errors": [_violation_json(v) for v in r.errors],
                        "warnings": [_violation_json(v) for v in r.warnings],
                    }
                    for r in reports
                ],
            }
        )
    else:
        for r in reports:
            _print_verify(r)
        bad = [r for r in reports if not r.ok]
        cli.out.print(
            _text(
                f"{len(bad)} of {len(reports)} log(s) have violations"
                if bad
                else f"{len(reports)} log(s) verified: no violation",
                "bold red" if bad else "bold green",
            )
        )
    if not ok:
        sys.exit(EXIT_VIOLATIONS)


def _phases(
    progress: Progress | None, name: str
) -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    """A progress callback showing one bar per phase, and a function removing the bars."""
    tasks: dict[str, Any] = {}

    def step(phase: str, done: int, total: int) -> None:
        if progress is not None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(f"{name}: {phase}", total=total)
            progress.update(tasks[phase], completed=done, total=total)

    def finish() -> None:
        for task in tasks.values():
            assert progress is not None
            progress.remove_task(task)

    return step, finish


def _violation_json(v: Violation) -> dict[str, Any]:
    return {**asdict(v), "severity": v.severity, "requirement": RULES[v.rule][1]}


def _print_verify(r: VerifyReport) -> None:
    cli = _cli()
    since = f" from checkpoint {r.start_version}" if r.start_version else ""
    head = (
        f"{r.name}: version {r.version}; {r.versions_checked} version(s){since}, "
        f"{r.checkpoints_checked} checkpoint(s), {r.segments_checked} segment(s) checked"
    )
    status = ("OK", "green") if r.ok else (f"{len(r.errors)} error(s)", "bold red")
    if r.warnings:
        status = (status[0] + f", {len(r.warnings)} warning(s)", status[1])
    cli.out.print(Text.assemble(head + ": ", (status[0], status[1])))
    for v in [*r.errors, *r.warnings]:
        where = " ".join(
            s
            for s in (
                f"version {v.version}" if v.version is not None else "",
                f"partition {v.partition}" if v.partition is not None else "",
                f"offset {v.offset}" if v.offset is not None else "",
            )
            if s
        )
        cli.out.print(
            Text.assemble(
                (f"  {v.severity.upper():7} ", "red" if v.severity == "error" else "yellow"),
                (v.rule, "bold"),
                f"  {where}: " if where else "  ",
                v.message,
            )
        )


def main(argv: list[str] | None = None) -> int:
    """Run the CLI (the ``txntable`` console script); return its exit status."""
    try:
        cli.main(args=argv, prog_name="txntable")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
