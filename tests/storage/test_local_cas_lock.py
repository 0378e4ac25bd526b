"""The local store's compare-and-swap with its lock held by a stopped process.

``put_if_match`` on local disk holds an ``flock`` on the object's sidecar lock file. A
process stopped while holding it (the harness SIGSTOPs zombies; a VM can pause) keeps the
lock: writers of that object then wait ``lock_timeout_s`` and get ``TransientStorageError``
with nothing written (they used to wait forever), other objects are unaffected, and the lock
is released when the holder resumes or dies.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txntable.errors import TransientStorageError
from txntable.storage import LocalStore

HOLDER = """
import sys, time
from txntable.storage import LocalStore
store = LocalStore(sys.argv[1])
with store._locked(store._path(sys.argv[2])):
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], LocalStore]]:
    """A process holding the lock of object ``k`` (as inside a put_if_match), then stopped."""
    store = LocalStore(str(tmp_path / "wh"), lock_timeout_s=1.0)
    store.put("k", b"v0")
    store.put("other", b"o0")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, store.root, "k"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        proc.send_signal(signal.SIGSTOP)
        yield proc, store
    finally:
        proc.kill()  # a stopped process dies of SIGKILL too
        proc.wait(timeout=30)


def _cas_in_thread(store: LocalStore, key: str, data: bytes, etag: str) -> list[object]:
    """put_if_match in a thread, joined with a bound, so a hang fails instead of blocking."""
    result: list[object] = []

    def cas() -> None:
        try:
            result.append(store.put_if_match(key, data, etag))
        except Exception as e:
            result.append(e)

    worker = threading.Thread(target=cas, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "put_if_match still waiting for a stopped process's lock"
    return result


def test_a_stopped_holder_costs_a_bounded_wait_and_a_retriable_error(
    holder: tuple[subprocess.Popen[str], LocalStore],
) -> None:
    proc, store = holder
    etag = store.get("k").etag
    started = time.monotonic()
    [outcome] = _cas_in_thread(store, "k", b"v1", etag)
    waited = time.monotonic() - started
    assert isinstance(outcome, TransientStorageError), outcome
    assert "held for 1 s by another process" in str(outcome)
    assert 1.0 <= waited < 15.0
    assert store.get("k").data == b"v0"  # nothing written
    # Only that object waits: another object's compare-and-swap goes through at once.
    assert store.put_if_match("other", b"o1", store.get("other").etag)
    assert store.get("other").data == b"o1"
    # Resumed, the holder leaves its critical section (here: it is killed; the kernel
    # releases an flock with its last descriptor), and the retry succeeds.
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(timeout=30)
    [retried] = _cas_in_thread(store, "k", b"v1", etag)
    assert retried == store.get("k").etag and store.get("k").data == b"v1"


def test_a_waiter_gets_the_lock_when_the_holder_resumes_within_the_bound(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "wh"), lock_timeout_s=30.0)
    store.put("k", b"v0")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.replace("time.sleep(120)", "time.sleep(1.5)"),
         store.root, "k"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        [outcome] = _cas_in_thread(store, "k", b"v1", store.get("k").etag)
        assert outcome == store.get("k").etag and store.get("k").data == b"v1"
    finally:
        proc.kill()
        proc.wait(timeout=30)
