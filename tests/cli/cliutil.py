"""Running the ``txntable`` command line: in a subprocess, or in-process through click's
runner (fast) — ``tests/cli`` is on ``sys.path``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, stdin: bytes | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``python -m txntable.cli ARGS`` from the repository root, output captured."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [full_env.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [sys.executable, "-m", "txntable.cli", *args],
        input=stdin,
        cwd=REPO,
        env=full_env,
        capture_output=True,
        timeout=timeout,
    )


def ok_json(*args: str, stdin: bytes | None = None) -> Any:
    """Run a command that must succeed and print JSON; return the parsed JSON."""
    proc = run_cli(*args, stdin=stdin)
    assert proc.returncode == 0, (args, proc.returncode, proc.stderr.decode())
    return json.loads(proc.stdout)


def invoke(*args: str, stdin: bytes | str | None = None) -> Result:
    """``txntable ARGS`` in this process, output captured (stdout and stderr apart)."""
    from txntable.cli import cli

    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def ok(*args: str, stdin: bytes | str | None = None) -> str:
    """Run a command in this process that must succeed; return its stdout."""
    result = invoke(*args, stdin=stdin)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout
