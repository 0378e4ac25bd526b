"""Small helpers every layer shares: the wall clock (:func:`now_ms`), retrying transient
storage errors within a time limit (:func:`retry_transient`, the clients' one backoff loop)
and the shape of a progress callback (:data:`Progress`).

Only requests that are safe to repeat go through here: reads, idempotent appends (the log
recognises a retried batch by its sequences), coordinator calls that resume their own
prepared decision, and procedures that restart from a fresh load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from txntable.errors import KafkaTimeoutError, TransientStorageError

T = TypeVar("T")
#: What long operations report their progress to: ``(phase, done, total)``, in the phase's
#: unit (``total`` 0: not known yet). Called from the operation's thread.
Progress = Callable[[str, int, int], None]

#: Errors worth retrying: a request whose outcome is unknown or that may succeed later.
RETRIABLE: tuple[type[Exception], ...] = (TransientStorageError, OSError)
#: Exponential backoff between attempts, in seconds.
BACKOFF_INITIAL_S = 0.01
BACKOFF_MAX_S = 1.0


def retry_transient(
    fn: Callable[[], T], timeout_ms: int, give_up: Callable[[], bool] | None = None
) -> T:
    """Run ``fn``, retrying :data:`RETRIABLE` errors until ``timeout_ms`` has passed.

    Args:
        fn: The operation; called again after each retriable error.
        timeout_ms: Time after which the last error is raised instead of retried.
        give_up: Checked before each retry; when it returns true the error is raised at
            once (a producer stopping at interpreter exit).

    Raises:
        TransientStorageError | OSError: The last error, once the time is up.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = BACKOFF_INITIAL_S
    while True:
        try:
            return fn()
        except RETRIABLE:
            if time.monotonic() + backoff > deadline or (give_up is not None and give_up()):
                raise
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)


def within_timeout(
    fn: Callable[[], T],
    timeout_ms: int,
    what: str,
    limit: str = "request_timeout_ms",
    give_up: Callable[[], bool] | None = None,
) -> T:
    """:func:`retry_transient`, and once ``timeout_ms`` is spent a timeout: Kafka's clients
    retry a request within their timeout and then raise ``TimeoutException``.

    Raises:
        KafkaTimeoutError: Storage kept failing for ``timeout_ms``; names ``what``, the
            option that set the limit (``limit``) and the last error (its ``__cause__``).
    """
    try:
        return retry_transient(fn, timeout_ms, give_up)
    except RETRIABLE as e:
        raise KafkaTimeoutError(
            f"{what} did not finish within {limit}={timeout_ms} ({e})"
        ) from e


def deadline_after(timeout_ms: int) -> float:
    """The ``time.monotonic()`` at which ``timeout_ms`` from now will have passed."""
    return time.monotonic() + timeout_ms / 1000


def remaining_ms(deadline: float) -> int:
    """Milliseconds left until ``deadline`` (``time.monotonic()``); 0 once it has passed
    (one last attempt, no retry)."""
    return max(0, int((deadline - time.monotonic()) * 1000))


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(time.time() * 1000)


_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The process's pool ``name`` of ``threads`` threads, created on first use: shared by
    every handle of the process (short waits on storage: reads ahead, markers, lease
    looks), so that a client of many tables does not hold threads per table."""
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(threads, thread_name_prefix=f"txntable-{name}")
        return pool
