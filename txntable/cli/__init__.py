"""The ``txntable`` command line: create, inspect, produce to, consume from, check and
maintain the tables of a warehouse.

Built on click (parsing, help) and rich (tables, colour, progress bars). On a terminal the
output is coloured tables and long work shows a progress bar on stderr; piped, it is plain
aligned text without colour or progress; ``--json`` prints JSON for scripts (one
:class:`~txntable.cli.output.Output` object, chosen at startup). The library does the work:
each command module parses, calls it and hands the result to the output object.

Exit codes: 0 success; 1 an error (a :class:`~txntable.errors.TxnTableError`, its name and
message on stderr) or a recovery that failed for some transactional id; 2 bad usage;
3 ``verify`` found a violation.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import click

from txntable import __version__
from txntable.cli import consume, groups, maintenance, produce, tables, transactions, verify
from txntable.cli.context import CliContext, storage_option
from txntable.errors import TxnTableError

__all__ = ["cli", "main"]


#: Exit status when the reader of stdout went away (``consume | head``): a shell's status
#: for a command killed by SIGPIPE, which is how Unix tools stop there.
EXIT_BROKEN_PIPE = 128 + 13


def _stdout_gone() -> None:
    """Point stdout at /dev/null, so that flushing it at exit fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a file descriptor (a test's captured stdout): nothing left to flush


class _Group(click.Group):
    """Turns library errors into one line on stderr and exit status 1, and a closed stdout
    into a quiet stop."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            ctx.exit(EXIT_BROKEN_PIPE)
        except TxnTableError as e:
            click.echo(f"txntable: {type(e).__name__}: {e}", err=True)
            ctx.exit(1)
        except OSError as e:  # local disk: permissions, a file where a directory belongs
            click.echo(f"txntable: {type(e).__name__}: {e}", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="txntable")
@storage_option
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
    Exit status: 0 success, 1 error, 2 bad usage, 3 verify found violations, 141 stdout
    closed early. `txntable COMMAND --help` shows a command's options and examples.

    \b
    Examples:
      txntable create lake orders --partitions 3
      printf 'k1:hello\\nk2:world\\n' | txntable produce lake orders -k :
      txntable consume lake orders --group billing
      txntable describe lake orders
      txntable -o s3.endpoint=http://127.0.0.1:9000 verify s3://bucket/lake
    """
    ctx.obj = CliContext(options=options, color=color, read_only=read_only)


for _module in (tables, produce, consume, maintenance, verify, groups, transactions):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI (the ``txntable`` console script); return its exit status."""
    try:
        cli.main(args=argv, prog_name="txntable")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
