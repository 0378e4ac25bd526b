"""``--help`` teaches: every command shows examples, and the commands that take a schema
list the type names it may use."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from txntable.cli import cli
from txntable.protocol.schema import TYPE_NAMES


def help_of(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_command_line_shows_examples() -> None:
    text = help_of()
    assert "Examples:\n    txntable create lake orders --partitions 3\n" in text


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_shows_an_example(command: str) -> None:
    text = help_of(command)
    assert "Example" in text
    examples = text.split("Example", 1)[1]
    assert f"txntable {command} " in examples


@pytest.mark.parametrize("command", ["create", "evolve"])
def test_schema_commands_list_the_type_names(command: str) -> None:
    text = " ".join(help_of(command).split())  # unwrapped
    assert f"Schema types: {', '.join(TYPE_NAMES)} " in text
    assert "timestamp(UNIT,TZ)" in TYPE_NAMES and "decimal(P,S)" in TYPE_NAMES
