"""``produce``: write records to a table from lines of text."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
from click.core import ParameterSource

from txntable.cli.context import (
    fail,
    json_option,
    open_warehouse,
    output,
    parse_pairs,
    warehouse_argument,
)
from txntable.cli.records import ENCODINGS, decode_text, record_from_json
from txntable.errors import TxnTableError

if TYPE_CHECKING:
    from txntable.producer.futures import FutureRecordMetadata
    from txntable.producer.producer import Producer
    from txntable.protocol.schema import TypedLayout
    from txntable.structs import RecordMetadata


def _json_bytes(value: Any, encoding: str, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return decode_text(value, encoding, what)
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


def _json_object(line: bytes, not_object: str) -> dict[str, Any] | None:
    """A line's JSON object; ``None`` for a blank line.

    Raises:
        ValueError: Not JSON, or not an object (then ``not_object`` is the message).
    """
    text = line.decode()
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(not_object)
    return obj


def _parse_json_record(line: bytes, encoding: str) -> _Input | None:
    obj = _json_object(line, "a JSON record must be an object")
    if obj is None:
        return None
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
        None if key_raw is None else decode_text(key_raw.decode(), encoding, "key"),
        decode_text(value_raw.decode(), encoding, "value"),
    )


def _parse_typed_record(
    line: bytes, layout: TypedLayout, encoding: str
) -> tuple[dict[str, Any], int | None, int | None] | None:
    """A typed table's input line: a JSON object of its columns, with optional system
    fields ``timestamp`` (int ms) and ``partition``; ``None`` for a blank line.

    Raises:
        ValueError: Not a JSON object, or a value not readable as its column's type.
    """
    obj = _json_object(line, "a typed table's input line must be a JSON object of its columns")
    if obj is None:
        return None
    at = obj.pop("timestamp", None)
    to = obj.pop("partition", None)
    obj.pop("offset", None)  # a consumed line written back
    for name, v in (("timestamp", at), ("partition", to)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer, not {v!r}")
    value = record_from_json(obj, layout, lambda t: decode_text(t, encoding, "binary value"))
    return value, at, to


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, line without its end, bytes read)``."""
    for n, raw in enumerate(stream, 1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield n, line[:-1] if line.endswith(b"\r") else line, len(raw)


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
        fail(f"{reason}; transaction {transactional_id} aborted, nothing was written")
    try:
        producer.flush()
    except TxnTableError:
        pass  # each failed record's future holds its error; what succeeded is counted below
    _close_quietly(producer)
    written = sum(1 for f in futures if f.done() and f.exception() is None)
    fail(f"{reason}; the {written} record(s) before it were written")


def _summary(
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


@click.command()
@warehouse_argument
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
    callback=parse_pairs,
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
    help="How keys and values (a typed table's binary values) are written in the input.",
)
@json_option
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
) -> None:
    """Write records to TABLE from FILE (default: stdin), one per line.

    Records are written idempotently (a retried write never duplicates), or with
    --transactional-id as one transaction, committed at the end of the input and aborted
    if any line is bad. A typed table reads one JSON object of its columns per line.

    \b
    Examples:
      printf 'k1:hello\\nk2:world\\n' | txntable produce lake orders -k :
      txntable produce lake orders events.jsonl --format json -t loader-1
      echo '{"sku": "a-1", "price": "9.90"}' | txntable produce lake prices
    """
    from txntable.producer.producer import Producer

    if key_separator is not None and fmt != "lines":
        raise click.UsageError("--key-separator applies to --format lines")
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    wh = open_warehouse(warehouse, options)
    layout = wh.table(table).layout  # fail fast, before reading any input
    explicit_lines = (
        fmt == "lines"
        and click.get_current_context().get_parameter_source("fmt") is ParameterSource.COMMANDLINE
    )
    if layout is not None and (key_separator is not None or headers or explicit_lines):
        raise click.UsageError(
            "a typed table reads JSON objects of its columns: --format lines, "
            "--key-separator and --header do not apply"
        )
    common = [(k, v.encode()) for k, v in headers.items()]
    sep = key_separator.encode() if key_separator is not None else None
    producer = Producer(wh, transactional_id=transactional_id)

    def send(line: bytes) -> FutureRecordMetadata | None:
        """Parse one line and send it (``None``: a blank line that is no record)."""
        if layout is not None:
            typed = _parse_typed_record(line, layout, encoding)
            if typed is None:
                return None
            value, at, to = typed
            return producer.send(
                table,
                value,  # type: ignore[arg-type]
                partition=to if to is not None else partition,
                timestamp=at,
            )
        if fmt == "json":
            rec = _parse_json_record(line, encoding)
        else:
            rec = _parse_line(line, sep, encoding)
        if rec is None:
            return None
        return producer.send(
            table,
            value=rec.value,
            key=rec.key,
            partition=rec.partition if rec.partition is not None else partition,
            headers=[*common, *rec.headers],
            timestamp=rec.timestamp,
        )

    futures: list[FutureRecordMetadata] = []
    size = _size(input_file)
    try:
        if transactional_id is not None:
            producer.init_transactions()
            producer.begin_transaction()
        with output().progress(table, {"producing": "bytes"}) as progress:
            done = 0
            for n, line, read in _lines(input_file):
                try:
                    future = send(line)
                except (ValueError, UnicodeDecodeError) as e:  # not readable as a record
                    _abandon(producer, transactional_id, futures, f"line {n}: {e}")
                except TxnTableError as e:  # a record the library refuses
                    reason = f"line {n}: {type(e).__name__}: {e}"
                    _abandon(producer, transactional_id, futures, reason)
                if future is not None:
                    futures.append(future)
                done += read
                if size:
                    progress("producing", done, size)
            if transactional_id is not None:
                producer.commit_transaction()
            else:
                producer.flush()
    except TxnTableError:
        _close_quietly(producer)
        raise
    producer.close()
    results = [f.result() for f in futures]
    output().produced(_summary(table, transactional_id, results))


COMMANDS = [produce]
