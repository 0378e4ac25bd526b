"""Running the ``txntable`` command line in a subprocess (``tests/cli`` is on ``sys.path``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
