"""How the command line prints its results: one :class:`Output` per invocation.

:class:`TextOutput` prints coloured, boxed tables on a terminal and plain aligned columns
(for grep and awk) when piped; :class:`JsonOutput` prints JSON for scripts (``--json``).
Commands hand their results to the output object chosen at startup and never ask which one
it is (pyiceberg's ``Output``). Messages and progress go to stderr either way.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    from txntable.groups.describe import GroupDescription
    from txntable.maintenance.maintain import MaintenanceReport
    from txntable.maintenance.merge import RewriteReport
    from txntable.maintenance.retention import RetentionReport
    from txntable.maintenance.vacuum import VacuumReport
    from txntable.maintenance.verify import VerifyReport, Violation
    from txntable.mirror.publisher import PublishReport
    from txntable.protocol.schema import Field
    from txntable.table import TableDescription
    from txntable.txn.recovery import RecoveryReport

#: ``(phase, done, total)``: the progress callback the library's long operations take.
ProgressCallback = Callable[[str, int, int], None]

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


# --- formatting -----------------------------------------------------------------------------


def human_bytes(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``3.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def age(ms: int) -> str:
    """A duration, briefly: ``850ms``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    if ms < 0:
        return "-" + age(-ms)
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


def when(ms: int) -> str:
    """A time in ms since the epoch as ISO-8601 UTC with milliseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def field_json(f: Field) -> dict[str, Any]:
    """A schema field as ``create --schema`` reads it."""
    out: dict[str, Any] = {"name": f.name, "type": f.type, "nullable": f.nullable}
    if f.children:
        out["children"] = [field_json(c) for c in f.children]
    return out


def type_text(f: Field) -> str:
    """A field's type as one line: ``list<int32>``, ``struct<a: string not null>``."""
    if f.type == "list":
        return f"list<{type_text(f.children[0])}>"
    if f.type == "map":
        return f"map<{type_text(f.children[0])}, {type_text(f.children[1])}>"
    if f.type == "struct":
        inner = ", ".join(f"{c.name}: {type_text(c)}" for c in f.children)
        return f"struct<{inner}>"
    return f.type + ("" if f.nullable else " not null")


def partitions_json(tps: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    """``(table, partition)`` pairs as ``{table: [partition, ...]}``."""
    out: dict[str, list[int]] = {}
    for table, p in tps:
        out.setdefault(table, []).append(p)
    return out


def partitions_text(tps: tuple[tuple[str, int], ...]) -> str:
    """``(table, partition)`` pairs as ``orders[0,1] users[2]``."""
    return " ".join(
        f"{table}[{','.join(map(str, ps))}]" for table, ps in partitions_json(tps).items()
    )


def _text(value: object, style: str = "") -> Text:
    """A table cell; user data is never read as rich markup."""
    from rich.text import Text

    return Text("" if value is None else str(value), style=style)


# --- the output object ----------------------------------------------------------------------


class Output(ABC):
    """Where a command's results go. Chosen once, at startup, by ``--json``."""

    def __init__(self, color: str = "auto") -> None:
        self.color = color
        self._out: Console | None = None
        self._err: Console | None = None

    def _console(self, stderr: bool) -> Console:
        from rich.console import Console

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

    # --- stderr, whatever the output --------------------------------------------------------

    def error(self, message: str) -> None:
        """A problem, as one ``txntable: ...`` line on stderr."""
        from rich.text import Text

        self.err.print(Text(f"txntable: {message}", style="red"))

    def note(self, message: str) -> None:
        """A remark for the user (not a result) on stderr."""
        click.echo(message, err=True)

    @contextmanager
    def progress(self, name: str, units: Mapping[str, str]) -> Iterator[ProgressCallback]:
        """A ``(phase, done, total)`` callback (:data:`txntable.util.Progress`) drawing one
        bar per phase on stderr when it is a terminal (and doing nothing otherwise).
        ``units`` names each phase's unit (``"bytes"`` is shown as KiB/MiB); a total of 0 is
        not known yet."""
        if not self.err.is_terminal:
            yield no_progress
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[amount]}"),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        )
        tasks: dict[str, Any] = {}

        def step(phase: str, done: int, total: int) -> None:
            unit = units.get(phase, "")
            show = human_bytes if unit == "bytes" else str
            amount = show(done) if total <= 0 else f"{show(done)}/{show(total)}"
            if unit != "bytes":
                amount = f"{amount} {unit}".rstrip()
            known = total if total > 0 else None  # unknown: a pulsing bar
            if phase not in tasks:
                tasks[phase] = bars.add_task(f"{name}: {phase}", total=known, amount=amount)
            bars.update(tasks[phase], completed=done, total=known, amount=amount)

        with bars:
            yield step

    # --- results ----------------------------------------------------------------------------

    @abstractmethod
    def created(self, name: str, table_id: str, partitions: int, created: bool) -> None:
        """``create``: the table made (or found, with ``--if-not-exists``)."""

    @abstractmethod
    def table_names(self, names: list[str]) -> None:
        """``tables``."""

    @abstractmethod
    def table_description(
        self, d: TableDescription, producers: bool, configuration: Mapping[str, str]
    ) -> None:
        """``describe`` (``configuration``: the keys the table sets)."""

    @abstractmethod
    def configuration(self, table: str, rows: list[dict[str, Any]]) -> None:
        """``config``: every key with its value, default and whether the table sets it."""

    @abstractmethod
    def evolved(self, table: str, schema: pa.Schema, key_columns: tuple[str, ...]) -> None:
        """``evolve``: the schema now in force."""

    @abstractmethod
    def dropped(self, table: str, objects: int | None) -> None:
        """``drop``: objects deleted (``None``: no such table, with ``--if-exists``)."""

    @abstractmethod
    def records_deleted(self, table: str, log_start_offsets: dict[int, int]) -> None:
        """``delete-records``: each partition's log start offset now."""

    @abstractmethod
    def produced(self, summary: dict[str, Any]) -> None:
        """``produce``: records written per partition."""

    @abstractmethod
    def transactions(self, rows: list[dict[str, Any]]) -> None:
        """``txns``: one row per transactional id."""

    @abstractmethod
    def groups(self, found: list[GroupDescription], errors: Mapping[str, str]) -> None:
        """``groups``: the groups described, and why the others could not be read."""

    @abstractmethod
    def recovered(self, report: RecoveryReport) -> None:
        """``recover``."""

    @abstractmethod
    def checkpointed(self, table: str, version: int) -> None:
        """``checkpoint``."""

    @abstractmethod
    def vacuumed(self, table: str, report: VacuumReport, dry_run: bool) -> None:
        """``vacuum``."""

    @abstractmethod
    def rewritten(self, verb: str, table: str, report: RewriteReport) -> None:
        """``optimize`` (verb ``Optimized``) and ``compact`` (``Compacted``)."""

    @abstractmethod
    def retained(self, table: str, report: RetentionReport) -> None:
        """``retention``."""

    @abstractmethod
    def published(self, table: str, report: PublishReport) -> None:
        """``publish``."""

    @abstractmethod
    def maintained(self, table: str, report: MaintenanceReport) -> None:
        """``maintain``."""

    @abstractmethod
    def verified(self, reports: list[VerifyReport]) -> None:
        """``verify``."""


def no_progress(phase: str, done: int, total: int) -> None:
    """A progress callback that shows nothing."""


class JsonOutput(Output):
    """JSON on stdout, one document per command (``--json``)."""

    def _print(self, obj: Any) -> None:
        click.echo(json.dumps(obj, indent=2))

    def created(self, name: str, table_id: str, partitions: int, created: bool) -> None:
        self._print({"name": name, "table_id": table_id, "partitions": partitions,
                     "created": created})  # fmt: skip

    def table_names(self, names: list[str]) -> None:
        self._print(names)

    def table_description(
        self, d: TableDescription, producers: bool, configuration: Mapping[str, str]
    ) -> None:
        from txntable.protocol.schema import schema_to_json

        out = asdict(replace(d, schema=None))
        del out["schema"], out["key_columns"]
        if d.schema is not None:  # a typed table (untyped ones print what they printed)
            out["schema"] = [field_json(f) for f in schema_to_json(d.schema)]
            out["key_columns"] = list(d.key_columns)
        out["configuration"] = dict(configuration)
        self._print(out)

    def configuration(self, table: str, rows: list[dict[str, Any]]) -> None:
        self._print({"table": table, "configuration": rows})

    def evolved(self, table: str, schema: pa.Schema, key_columns: tuple[str, ...]) -> None:
        from txntable.protocol.schema import schema_to_json

        fields = [field_json(f) for f in schema_to_json(schema)]
        self._print({"table": table, "schema": fields, "key_columns": list(key_columns)})

    def dropped(self, table: str, objects: int | None) -> None:
        self._print(
            {"table": table, "dropped": objects is not None, "objects_deleted": objects or 0}
        )

    def records_deleted(self, table: str, log_start_offsets: dict[int, int]) -> None:
        self._print({"table": table, "log_start_offsets": log_start_offsets})

    def produced(self, summary: dict[str, Any]) -> None:
        self._print(summary)

    def transactions(self, rows: list[dict[str, Any]]) -> None:
        self._print(rows)

    def groups(self, found: list[GroupDescription], errors: Mapping[str, str]) -> None:
        rows: list[dict[str, Any]] = [{"group_id": g, "error": e} for g, e in errors.items()]
        for d in found:
            rows.append(
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
                            "assignment": partitions_json(m.assignment),
                            "owned": partitions_json(m.owned),
                        }
                        for m in d.members
                    ],
                }
            )
        self._print(sorted(rows, key=lambda row: row["group_id"]))

    def recovered(self, report: RecoveryReport) -> None:
        self._print(asdict(report))

    def checkpointed(self, table: str, version: int) -> None:
        self._print({"table": table, "version": version})

    def vacuumed(self, table: str, report: VacuumReport, dry_run: bool) -> None:
        self._print({**asdict(report), "dry_run": dry_run})

    def rewritten(self, verb: str, table: str, report: RewriteReport) -> None:
        self._print(asdict(report))

    def retained(self, table: str, report: RetentionReport) -> None:
        self._print(asdict(report))

    def published(self, table: str, report: PublishReport) -> None:
        self._print(asdict(report))

    def maintained(self, table: str, report: MaintenanceReport) -> None:
        self._print(asdict(report))

    def verified(self, reports: list[VerifyReport]) -> None:
        self._print(
            {
                "ok": all(r.ok for r in reports),
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


def _violation_json(v: Violation) -> dict[str, Any]:
    from txntable.maintenance.verify import RULES

    return {**asdict(v), "severity": v.severity, "requirement": RULES[v.rule][1]}


class TextOutput(Output):
    """Tables and sentences: boxed and coloured on a terminal, plain aligned text piped."""

    def line(self, text: str | Text) -> None:
        """One line on stdout; a ``str`` is never read as rich markup."""
        self.out.print(_text(text) if isinstance(text, str) else text)

    def table(self, *columns: str, title: str | None = None) -> RichTable:
        """A table that is boxed on a terminal and plain aligned columns otherwise."""
        from rich import box
        from rich.table import Column
        from rich.table import Table as RichTable

        tty = self.out.is_terminal
        return RichTable(
            *(Column(c, no_wrap=True) for c in columns),
            title=title,
            box=box.SIMPLE_HEAD if tty else None,
            header_style="bold" if tty else "",
            title_style="bold" if tty else "",
            title_justify="left",
            show_edge=tty,
            pad_edge=False,
        )

    def print_table(self, table: RichTable) -> None:
        """Print a table; piped, without the padding rich leaves at the end of lines."""
        if self.out.is_terminal:
            self.out.print(table)
            return
        with self.out.capture() as captured:
            self.out.print(table)
        click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))

    def created(self, name: str, table_id: str, partitions: int, created: bool) -> None:
        if created:
            self.line(f"Created table {name} with {partitions} partition(s) (id {table_id})")
        else:
            self.line(f"Table {name} exists, with {partitions} partition(s) (id {table_id})")

    def table_names(self, names: list[str]) -> None:
        for name in names:
            click.echo(name)

    def table_description(
        self, d: TableDescription, producers: bool, configuration: Mapping[str, str]
    ) -> None:
        from txntable.util import now_ms

        now = now_ms()
        self.line(
            f"Table {d.name}: version {d.version}, {len(d.partitions)} partition(s), "
            f"id {d.table_id}"
        )
        t = self.table("PARTITION", "LOG START", "LSO", "HW", "OPEN TXNS", "PRODUCERS",
                       "SEGMENTS", "BYTES")  # fmt: skip
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
                _text(human_bytes(p.segment_bytes)),
            )
        self.print_table(t)
        if d.schema is not None:
            self._schema(d.schema, d.key_columns)
        opened = [(p.partition, o) for p in d.partitions for o in p.open_transactions]
        if opened:
            t = self.table(
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
                        "-" if o.txn_start_timestamp is None else age(now - o.txn_start_timestamp),
                        "yellow",
                    ),
                )
            self.print_table(t)
        if producers:
            t = self.table(
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
                        _text(when(pr.last_timestamp) if pr.last_timestamp else "-"),
                        _text("-" if pr.current_txn_first_offset is None
                              else pr.current_txn_first_offset),
                    )  # fmt: skip
            self.print_table(t)
        if configuration:
            t = self.table("KEY", "VALUE", title="Configuration")
            for key, value in sorted(configuration.items()):
                t.add_row(_text(key), _text(value))
            self.print_table(t)
        else:
            self.line("Configuration: every key at its default")

    def _schema(self, schema: pa.Schema, key_columns: tuple[str, ...] = ()) -> None:
        from txntable.protocol.schema import schema_to_json

        t = self.table("COLUMN", "TYPE", "NULLABLE", "KEY", title="Schema")
        for f in schema_to_json(schema):
            text = type_text(f).removesuffix(" not null")
            key = "yes" if f.name in key_columns else ""
            t.add_row(_text(f.name), _text(text), _text("yes" if f.nullable else "no"), _text(key))
        self.print_table(t)

    def configuration(self, table: str, rows: list[dict[str, Any]]) -> None:
        t = self.table(
            "KEY", "VALUE", "SOURCE", "DEFAULT", "MEANING", title=f"Configuration of {table}"
        )
        for r in rows:
            t.add_row(
                _text(r["name"], "bold" if r["is_set"] else ""),
                _text(r["value"]),
                _text("table" if r["is_set"] else "default", "" if r["is_set"] else "dim"),
                _text("-" if r["default"] is None else r["default"]),
                _text(r["doc"] or "-"),
            )
        self.print_table(t)

    def evolved(self, table: str, schema: pa.Schema, key_columns: tuple[str, ...]) -> None:
        self.line(f"Schema of {table} is now:")
        self._schema(schema, key_columns)

    def dropped(self, table: str, objects: int | None) -> None:
        if objects is None:
            self.line(f"Table {table} does not exist")
        else:
            self.line(f"Dropped table {table} ({objects} object(s) deleted)")

    def records_deleted(self, table: str, log_start_offsets: dict[int, int]) -> None:
        self.line(f"Records of {table} deleted below the log start offsets:")
        t = self.table("PARTITION", "LOG START")
        for p, offset in sorted(log_start_offsets.items()):
            t.add_row(_text(p), _text(offset))
        self.print_table(t)

    def produced(self, summary: dict[str, Any]) -> None:
        tid = summary["transactional_id"]
        how = f"in transaction {tid}" if tid else "idempotently"
        self.line(f"Produced {summary['records']} record(s) to {summary['table']} {how}")
        if summary["records"]:
            t = self.table("PARTITION", "RECORDS", "FIRST OFFSET", "LAST OFFSET")
            for p in summary["partitions"]:
                t.add_row(*(_text(p[k]) for k in ("partition", "records", "first_offset",
                                                   "last_offset")))  # fmt: skip
            self.print_table(t)

    def transactions(self, rows: list[dict[str, Any]]) -> None:
        from txntable.util import now_ms

        now = now_ms()
        t = self.table(
            "TRANSACTIONAL ID", "STATE", "PRODUCER", "EPOCH", "TIMEOUT", "OPEN FOR",
            "PARTICIPANTS", "UPDATED",
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
                _text(age(r["timeout_ms"])),
                _text(age(now - start) if start >= 0 else "-"),
                _text(
                    " ".join(
                        f"{name}[{','.join(map(str, ps))}]" for name, ps in r["partitions"].items()
                    )
                    or "-"
                ),
                _text(age(now - r["last_update_timestamp"]) + " ago"),
            )
        self.print_table(t)

    def groups(self, found: list[GroupDescription], errors: Mapping[str, str]) -> None:
        from txntable.util import now_ms

        now = now_ms()
        owners = {
            (d.group_id, t, p): m.member_id
            for d in found
            for m in d.members
            for t, p in m.assignment
        }
        # The MEMBER column only for groups with members (subscribe); assign-only groups
        # have none.
        with_members = any(d.members for d in found)
        if with_members:
            mt = self.table(
                "GROUP", "GENERATION", "ASSIGNOR", "MEMBER", "INSTANCE", "ASSIGNMENT", "ACKED",
                "HEARTBEAT",
            )
            for d in found:
                for m in d.members:
                    acked = m.acked_generation == d.generation
                    mt.add_row(
                        _text(d.group_id),
                        _text(d.generation),
                        _text(d.assignor or "-"),
                        _text(m.member_id),
                        _text(m.group_instance_id or "-"),
                        _text(partitions_text(m.assignment) or "-"),
                        _text("yes" if acked else f"{m.acked_generation}",
                              "" if acked else "yellow"),  # fmt: skip
                        _text(age(max(now - m.last_heartbeat, 0)) + " ago"),
                    )
            self.print_table(mt)
        columns = ["GROUP", "TABLE", "PARTITION", "OFFSET", "LSO", "HW", "LAG", "PENDING"]
        t = self.table(*columns, *(["MEMBER"] if with_members else []))
        for group_id, error in errors.items():
            t.add_row(_text(group_id), _text(error, "red"))
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
                    ),  # fmt: skip
                    *(
                        [_text(owners.get((d.group_id, o.table, o.partition), "-"))]
                        if with_members
                        else []
                    ),
                )
        self.print_table(t)

    def recovered(self, report: RecoveryReport) -> None:
        from rich.text import Text

        lines = [
            ("Committed (rolled forward)", report.committed, "green"),
            ("Aborted", report.aborted, "red"),
            ("Timed out and aborted", report.timed_out, "yellow"),
            ("Finished by another client", report.lost_race, "dim"),
        ]
        for label, tids, style in lines:
            if tids:
                self.line(Text.assemble((f"{label}: ", style), ", ".join(tids)))
        for tid, error in report.failed.items():
            self.line(Text.assemble(("Failed: ", "bold red"), f"{tid}: {error}"))
        if not any(tids for _, tids, _ in lines) and not report.failed:
            self.line("Nothing to recover.")

    def checkpointed(self, table: str, version: int) -> None:
        self.line(f"Checkpoint of {table} written at version {version}")

    def vacuumed(self, table: str, report: VacuumReport, dry_run: bool) -> None:
        verb = "Would delete" if dry_run else "Deleted"
        self.line(
            f"{verb} {len(report.deleted)} unreferenced file(s) of {table}; "
            f"{report.referenced} referenced, {len(report.undated)} undated (kept)"
        )
        for key in report.deleted:
            self.line(f"  {key}")

    def rewritten(self, verb: str, table: str, report: RewriteReport) -> None:
        r = report
        where = f"version {r.version}" if r.version is not None else "nothing to do"
        self.line(
            f"{verb} {table}: {r.entries_replaced} entries into {r.segments_written} segment(s) "
            f"({human_bytes(r.bytes_read)} read, {human_bytes(r.bytes_written)} written; "
            f"{r.records_kept} records kept, {r.records_dropped} dropped) — {where}"
        )

    def published(self, table: str, report: PublishReport) -> None:
        ice = report.iceberg
        if report.delta_version is None and (ice is None or ice.metadata_version is None):
            self.line(f"Mirror of {table} is up to date with version {report.txntable_version}")
            return
        if report.delta_version is not None:
            self.line(
                f"Published {table} version {report.txntable_version} as Delta version "
                f"{report.delta_version} (+{report.added} -{report.removed} files)"
            )
        if ice is not None and ice.metadata_version is not None:
            self.line(
                f"Published {table} version {ice.txntable_version} as Iceberg metadata "
                f"v{ice.metadata_version} (+{ice.added} -{ice.removed} files)"
            )

    def retained(self, table: str, report: RetentionReport) -> None:
        if not report.log_start_offsets:
            self.line(f"Retention of {table}: nothing to delete")
            return
        moved = ", ".join(f"{p}: {o}" for p, o in sorted(report.log_start_offsets.items()))
        self.line(
            f"Retention of {table}: log start offsets {moved} (version {report.version}, "
            f"{human_bytes(report.bytes_released)} released)"
        )

    def maintained(self, table: str, report: MaintenanceReport) -> None:
        if report.retention is not None:
            starts = report.retention.log_start_offsets
            self.line(f"retention: {len(starts)} partition(s) moved their log start")
        if report.expiry is not None:
            self.line(f"expiry: {len(report.expiry.producer_ids)} producer(s) expired")
        if report.rewrite is not None:
            self.rewritten("merge/compaction", table, report.rewrite)
        if report.checkpoint is not None:
            self.line(f"checkpoint: version {report.checkpoint.version}")
        if report.log_cleanup is not None:
            lc = report.log_cleanup
            self.line(f"log cleanup: {lc.versions_deleted} version(s), "
                      f"{lc.checkpoints_deleted} checkpoint(s) deleted")  # fmt: skip
        if report.vacuum is not None:
            self.vacuumed(table, report.vacuum, dry_run=False)
        for error in report.errors:
            self.error(error)

    def verified(self, reports: list[VerifyReport]) -> None:
        from rich.text import Text

        for r in reports:
            self._verify_report(r)
        bad = [r for r in reports if not r.ok]
        self.line(
            Text(
                f"{len(bad)} of {len(reports)} log(s) have violations"
                if bad
                else f"{len(reports)} log(s) verified: no violation",
                style="bold red" if bad else "bold green",
            )
        )

    def _verify_report(self, r: VerifyReport) -> None:
        from rich.text import Text

        since = f" from checkpoint {r.start_version}" if r.start_version else ""
        head = (
            f"{r.name}: version {r.version}; {r.versions_checked} version(s){since}, "
            f"{r.checkpoints_checked} checkpoint(s), {r.segments_checked} segment(s) checked"
        )
        status = ("OK", "green") if r.ok else (f"{len(r.errors)} error(s)", "bold red")
        if r.warnings:
            status = (status[0] + f", {len(r.warnings)} warning(s)", status[1])
        self.line(Text.assemble(head + ": ", (status[0], status[1])))
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
            self.line(
                Text.assemble(
                    (f"  {v.severity.upper():7} ", "red" if v.severity == "error" else "yellow"),
                    (v.rule, "bold"),
                    f"  {where}: " if where else "  ",
                    v.message,
                )
            )
