"""A moto S3 server in a process of its own, for harness runs on S3.

One Python process serves every worker's requests; in the driver's process it would share
the driver's interpreter lock, so a long or many-writer run starts ``bench/moto_server.py``
(which serialises moto's conditional puts, as the tests' in-process server does) instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "bench" / "moto_server.py"


def moto_env() -> dict[str, str]:
    """The fake credentials of the tests, and no developer's ``~/.aws``."""
    from storeutil import TEST_ACCESS_KEY_ID, TEST_REGION, TEST_SECRET_ACCESS_KEY

    return {
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": TEST_REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


@contextmanager
def moto_process() -> Iterator[str]:
    """Start the server; yield its endpoint URL; stop it (closing its standard input)."""
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **moto_env()},
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        endpoint = proc.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            raise RuntimeError(f"moto server did not start (it said {endpoint!r})")
        yield endpoint
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
