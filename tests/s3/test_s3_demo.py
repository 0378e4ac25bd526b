"""``examples/s3_demo.py`` runs on a bare machine: its own moto server, no AWS setup."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.s3, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "s3_demo.py"

EXPECTED_LINES = [
    "committed a transaction of 3 records",
    "aborted a transaction of 1 record (flushed to the log first)",
    "wrote 2 idempotent records to partition 1",
    "left a transaction open on partition 1 (holds the LSO back)",
    "partition 0: log start 0, HW 6, LSO 6, open transactions: []",
    "partition 1: log start 0, HW 4, LSO 2, open transactions: [pid 0 from 2]",
    "read_committed:",
    "  orders[0] offset 2: b'order 2 (committed)'",
    "  orders[1] offset 1: b'idempotent 1'",
    "  positions: {0: 6, 1: 2} end offsets: {0: 6, 1: 2}",
    "read_uncommitted:",
    "  orders[0] offset 4: b'order 9 (aborted)'",
    "  orders[1] offset 3: b'after the open txn'",
    "  positions: {0: 6, 1: 4} end offsets: {0: 6, 1: 4}",
    "partition 1: log start 0, HW 5, LSO 5, open transactions: []",
    "stopped the moto S3 server",
]


@pytest.mark.timeout(180)
def test_s3_demo_runs_standalone(tmp_path: pathlib.Path) -> None:
    # No AWS configuration of the developer or of the test session: credentials, region
    # and endpoint all come from the demo's storage options.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    result = subprocess.run(
        [sys.executable, str(DEMO)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("started moto S3 server at http://127.0.0.1:")
    assert any(line.startswith("warehouse s3://txntable-demo-") for line in lines)
    for expected in EXPECTED_LINES:
        assert expected in lines, f"missing line {expected!r} in:\n{result.stdout}"
    # read_committed never shows aborted or open-transaction records.
    committed = result.stdout.split("read_committed:")[1].split("read_uncommitted:")[0]
    assert "aborted" not in committed and "still open" not in committed
    # The placeholder secret is masked in the printed store repr.
    assert "demo-secret-key" not in result.stdout + result.stderr
    assert "'s3.secret-access-key': '***'" in result.stdout
