"""What every command shares: the global options, the output object and opening the
warehouse; the options several commands take; the CLI's own error."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from txntable.cli.output import JsonOutput, Output, TextOutput

if TYPE_CHECKING:
    from txntable.warehouse import Warehouse

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    """The state of one invocation: storage options given before the command, colour,
    read-only, and the output object (JSON or text, chosen once)."""

    options: dict[str, str] = field(default_factory=dict)
    color: str = "auto"
    #: Never write on a reader's behalf (no completing of stuck transactions).
    read_only: bool = False
    as_json: bool = False
    _output: Output | None = None

    @property
    def output(self) -> Output:
        """The output object; fixed at its first use."""
        if self._output is None:
            self._output = JsonOutput(self.color) if self.as_json else TextOutput(self.color)
        return self._output


def current() -> CliContext:
    """The running invocation's state (a default one outside click)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(CliContext) if ctx is not None else None
    if found is None:
        found = CliContext()
        if ctx is not None:
            ctx.obj = found
    return found


def output() -> Output:
    """The output object of this invocation."""
    return current().output


def open_warehouse(url: str, options: dict[str, str], must_exist: bool = True) -> Warehouse:
    """The warehouse at ``url`` with the storage options given before and after the command.

    Args:
        must_exist: Stop if the warehouse's directory (or bucket) does not exist: a
            command that only reads would otherwise find nothing and report success.
    """
    from txntable.storage.local import LocalStore
    from txntable.storage.memory import MemoryStore
    from txntable.warehouse import Warehouse

    state = current()
    # Options go to the library unfiltered: it validates them (and names unknown keys).
    wh = Warehouse(
        url,
        storage_options={**state.options, **options},
        finish_stuck_transactions=not state.read_only,
    )
    if isinstance(wh.store, MemoryStore):
        raise click.BadParameter(
            "a memory:// warehouse lives inside one process and is gone when the command "
            "ends; use a directory or s3://",
            param_hint="WAREHOUSE",
        )
    if must_exist:
        if isinstance(wh.store, LocalStore):
            if not os.path.isdir(wh.store.root):
                fail(f"no warehouse at {url}: directory {wh.store.root} does not exist")
        else:
            wh.store.check_root()  # a missing bucket
    return wh


class CliError(click.ClickException):
    """A failure the CLI itself detects (bad input lines, a group that does not exist)."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"txntable: {self.format_message()}", err=True)


def fail(message: str) -> NoReturn:
    """Stop the command with exit status 1 and ``txntable: message`` on stderr."""
    raise CliError(message)


# --- options shared by commands -------------------------------------------------------------


def parse_pairs(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict."""
    out: dict[str, str] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", ctx, param)
        out[key] = value
    return out


def storage_option(f: F) -> F:
    """``-o KEY=VALUE`` (repeatable)."""
    return click.option(
        "-o",
        "--option",
        "options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=parse_pairs,
        help="Storage option (repeatable), e.g. -o s3.endpoint=http://127.0.0.1:9000.",
    )(f)


def warehouse_argument(f: F) -> F:
    """``WAREHOUSE`` and ``-o KEY=VALUE`` (also accepted before the command)."""
    return click.argument("warehouse", metavar="WAREHOUSE")(storage_option(f))


def _choose_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        current().as_json = True


def json_option(f: F) -> F:
    """``--json``: the command's result as JSON (chooses the output object)."""
    return click.option(
        "--json", is_flag=True, expose_value=False, callback=_choose_json, help="Print JSON."
    )(f)
