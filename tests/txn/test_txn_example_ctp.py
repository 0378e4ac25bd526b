"""The consume-transform-produce example, with its worker SIGKILLed and restarted."""

from __future__ import annotations

from pathlib import Path

import pytest
from txnutil import REPO, run_python


@pytest.mark.slow
def test_consume_transform_produce_survives_kills(tmp_path: Path) -> None:
    proc = run_python(
        [
            str(REPO / "examples" / "consume_transform_produce.py"),
            "--records",
            "300",
            "--batch",
            "10",
            "--seed",
            "7",
            "--max-kills",
            "3",
            "--min-delay",
            "0.2",
            "--max-delay",
            "0.8",
            "--warehouse",
            str(tmp_path / "lake"),
        ],
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: every one of the 300 input records appears exactly once" in proc.stdout
    kills = proc.stdout.count("with SIGKILL")
    # Up to 3 kills: a worker that finishes before its kill time is not killed.
    assert 1 <= kills <= 3, proc.stdout
