"""Helpers to build fresh stores in tests (used by ``tests/conftest.py`` fixtures).

Import as ``from storeutil import make_store`` (``tests/`` is on ``sys.path`` via conftest).
"""

from __future__ import annotations

import functools
import os
import pathlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

from txntable.storage import (
    LocalStore,
    MemoryStore,
    S3Store,
    Store,
)
from txntable.storage.s3 import (
    S3_ACCESS_KEY_ID,
    S3_ALLOW_HTTP,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
)

#: Fake credentials moto accepts; also exported to the environment by the moto fixtures.
TEST_ACCESS_KEY_ID = "testing"
TEST_SECRET_ACCESS_KEY = "testing-secret-key-value"
TEST_REGION = "us-east-1"

_MOTO_PUT_LOCK = threading.Lock()
#: Set to "1" to leave moto's check-then-write conditional puts unpatched (to show the
#: race tests then fail).
NONATOMIC_ENV = "TXNTABLE_TEST_MOTO_NONATOMIC"


def make_moto_conditional_puts_atomic() -> None:
    """Serialise moto's PutObject handler so If-None-Match / If-Match are atomic.

    moto (5.2) checks the condition and then writes, in ``S3Response.put_object``, with
    no lock: two racing conditional PUTs can both succeed. Real S3 is atomic, so the
    racing-writer tests need this. Idempotent; applies to the in-process ``mock_aws``
    backend and to ``ThreadedMotoServer`` alike (both run in this process).
    """
    if os.environ.get(NONATOMIC_ENV) == "1":
        return
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    if getattr(original, "_txntable_atomic", False):
        return

    @functools.wraps(original)
    def put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _MOTO_PUT_LOCK:
            return original(self, *args, **kwargs)

    put_object._txntable_atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


def s3_options(endpoint: str) -> dict[str, str]:
    """Storage options for an S3Store talking to the moto server at ``endpoint``."""
    return {
        S3_ENDPOINT: endpoint,
        S3_REGION: TEST_REGION,
        S3_ACCESS_KEY_ID: TEST_ACCESS_KEY_ID,
        S3_SECRET_ACCESS_KEY: TEST_SECRET_ACCESS_KEY,
        S3_ALLOW_HTTP: "true",
    }


def create_bucket(endpoint: str | None = None) -> str:
    """Create a bucket with a fresh random name and return the name."""
    import boto3

    name = f"txntable-{uuid.uuid4().hex[:20]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=TEST_REGION,
        aws_access_key_id=TEST_ACCESS_KEY_ID,
        aws_secret_access_key=TEST_SECRET_ACCESS_KEY,
    )
    client.create_bucket(Bucket=name)
    client.close()
    return name


def make_store(kind: str, tmp_path: pathlib.Path, *, s3_endpoint: str | None = None) -> Store:
    """Build a fresh, empty store of ``kind``: ``"memory"``, ``"local"`` or ``"s3"``.

    Args:
        kind: Backend kind.
        tmp_path: Directory for the local store.
        s3_endpoint: moto server URL, required for ``"s3"``.
    """
    if kind == "memory":
        return MemoryStore(f"test-{uuid.uuid4().hex}")
    if kind == "local":
        return LocalStore(str(tmp_path / f"store-{uuid.uuid4().hex[:8]}"))
    if kind == "s3":
        if s3_endpoint is None:
            raise ValueError("make_store('s3', ...) needs s3_endpoint (the moto_server fixture)")
        return S3Store(f"s3://{create_bucket(s3_endpoint)}/wh", s3_options(s3_endpoint))
    raise ValueError(f"unknown store kind {kind!r}")


def race(n: int, attempt: Callable[[int], str]) -> tuple[dict[int, str], dict[int, Exception]]:
    """Run ``attempt(i)`` on ``n`` threads released together by a barrier.

    Returns:
        ``(wins, losses)``: results and exceptions by thread index.
    """
    barrier = threading.Barrier(n)
    wins: dict[int, str] = {}
    losses: dict[int, Exception] = {}

    def run(i: int) -> None:
        barrier.wait()
        try:
            wins[i] = attempt(i)
        except Exception as exc:  # collected for the caller's assertions
            losses[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "racing threads hung"
    return wins, losses
