"""The producer's time budgets for transient storage errors, shared by its parts.

``delivery_timeout_ms`` bounds what a batch or a transaction's end may spend retrying;
``max_block_ms`` what a blocking call (a table's first load, ``send_offsets_to_transaction``)
may. At interpreter exit :meth:`Retries.stop` ends every retry after its current attempt
(the sender's, and the transaction manager's on the sender thread alike).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from txntable.util import deadline_after, retry_transient, within_timeout

T = TypeVar("T")


class Retries:
    """Retry loops with the producer's budgets and one switch that ends them all."""

    def __init__(self, delivery_timeout_ms: int, max_block_ms: int) -> None:
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_block_ms = max_block_ms
        self.stopped = False

    def stop(self) -> None:
        """No more retries: the interpreter is exiting."""
        self.stopped = True

    def _give_up(self) -> bool:
        return self.stopped

    def delivery_deadline(self) -> float:
        """The ``time.monotonic()`` at which ``delivery_timeout_ms`` from now has passed."""
        return deadline_after(self.delivery_timeout_ms)

    def delivery(self, fn: Callable[[], T], timeout_ms: int | None = None) -> T:
        """Run ``fn``, retrying transient storage errors for ``timeout_ms`` (default
        ``delivery_timeout_ms``).

        A retried append carries the same producer id, epoch and sequences, so if an earlier
        attempt did land the log recognises the duplicate and returns the original offsets.

        Raises:
            TransientStorageError | OSError: The last error, once the time is up.
        """
        timeout = self.delivery_timeout_ms if timeout_ms is None else timeout_ms
        return retry_transient(fn, timeout, give_up=self._give_up)

    def blocking(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying transient storage errors for up to ``max_block_ms``.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``max_block_ms`` (Kafka's
                ``TimeoutException`` of a blocking producer call).
        """
        return within_timeout(fn, self.max_block_ms, what, "max_block_ms", give_up=self._give_up)
