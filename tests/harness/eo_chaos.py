"""A store that fails at random, the way object stores and networks do (harness workers).

Every request may, with the configured probabilities: raise before reaching storage, reach
storage and then raise (the ambiguous write), be slow, or be a *late write*: the caller sees
an error at once while the write lands up to ``late_max_s`` later, after the client gave up
and moved on. Writes of the keys that decide commits (log versions, group-commit intents,
lease and outcome record) can be made ambiguous more often than others (``after_hot``).
While the shared outage file names a time in the future, every request raises (storage down
for seconds). Each injected fault is reported through ``on_fault``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from txntable.errors import TransientStorageError
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    StoreWrapper,
)


@dataclass(frozen=True)
class ChaosConfig:
    """Probabilities per request (0 turns a fault off)."""

    before: float = 0.01
    after: float = 0.01
    late: float = 0.005
    slow: float = 0.02
    slow_max_s: float = 0.3
    late_max_s: float = 1.5
    #: File holding a UNIX time until which storage is down (written by the driver).
    outage_file: str | None = None
    #: Written-then-failed probability of writes whose key contains one of ``hot_keys``
    #: (on top of ``after``).
    after_hot: float = 0.0
    hot_keys: tuple[str, ...] = ("/_log/", "/_commit/")

    def scaled(self, factor: float) -> ChaosConfig:
        """The same faults, ``factor`` times as likely."""
        return replace(
            self,
            before=self.before * factor,
            after=self.after * factor,
            late=self.late * factor,
            slow=self.slow * factor,
            after_hot=self.after_hot * factor,
        )


class ChaosStore(StoreWrapper):
    """Random faults around an inner store (thread-safe)."""

    def __init__(
        self,
        inner: Store,
        cfg: ChaosConfig,
        on_fault: Callable[[str, str, str], None] = lambda kind, op, key: None,
        seed: int | None = None,
    ) -> None:
        super().__init__(inner)
        self.cfg = cfg
        self.on_fault = on_fault
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._outage_until = 0.0
        self._outage_checked = 0.0
        self._outage_reported = 0.0
        #: Set to False to stop injecting (a worker's final reads).
        self.enabled = True

    def _roll(self) -> float:
        with self._lock:
            return self._rng.random()

    def _down(self) -> bool:
        path = self.cfg.outage_file
        if path is None:
            return False
        now = time.time()
        if now - self._outage_checked > 0.1:
            self._outage_checked = now
            try:
                with open(path) as f:
                    self._outage_until = float(f.read().strip() or 0)
            except (OSError, ValueError):
                self._outage_until = 0.0
        return now < self._outage_until

    def _call(self, op: str, key: str, write: bool, fn: Callable[[], Any]) -> Any:
        if not self.enabled:
            return fn()
        if self._down():
            if self._outage_until != self._outage_reported:
                self._outage_reported = self._outage_until  # one report per outage
                self.on_fault("outage", op, key)
            raise TransientStorageError(f"chaos: storage down ({op} {key})")
        cfg = self.cfg
        r = self._roll()
        if r < cfg.slow:
            self.on_fault("slow", op, key)
            time.sleep(self._roll() * cfg.slow_max_s)
        r = self._roll()
        if r < cfg.before:
            self.on_fault("before", op, key)
            raise TransientStorageError(f"chaos: failed before {op} {key}")
        r -= cfg.before
        if write and r < cfg.after:
            fn()
            self.on_fault("after", op, key)
            raise TransientStorageError(f"chaos: failed after {op} {key}")
        r -= cfg.after
        if write and cfg.after_hot and any(part in key for part in cfg.hot_keys):
            if self._roll() < cfg.after_hot:
                fn()
                self.on_fault("after", op, key)
                raise TransientStorageError(f"chaos: failed after {op} {key}")
        if write and r < cfg.late:
            delay = self._roll() * cfg.late_max_s
            self.on_fault("late", op, key)

            def land() -> None:
                time.sleep(delay)
                try:
                    fn()
                except Exception:  # the late write lost its race: that is an outcome too
                    pass

            threading.Thread(target=land, daemon=True).start()
            raise TransientStorageError(f"chaos: timed out on {op} {key} (lands later)")
        return fn()

    def get(self, key: str) -> StoredObject:
        return self._call("get", key, False, lambda: self.inner.get(key))  # type: ignore[no-any-return]

    def head(self, key: str) -> ObjectInfo | None:
        return self._call("head", key, False, lambda: self.inner.head(key))  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, True, lambda: self.inner.put(key, data))  # type: ignore[no-any-return]

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._call(  # type: ignore[no-any-return]
            "put_if_absent", key, True, lambda: self.inner.put_if_absent(key, data)
        )

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._call(  # type: ignore[no-any-return]
            "put_if_match", key, True, lambda: self.inner.put_if_match(key, data, etag)
        )

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        keys = self._call("list", prefix, False, lambda: list(self.inner.list(prefix, start_after)))
        return iter(keys)

    def put_data_file(self, key: str, data: bytes) -> None:
        self._call("put_data_file", key, True, lambda: self.inner.put_data_file(key, data))

    def get_data_file(self, key: str) -> bytes:
        return self._call("get_data_file", key, False, lambda: self.inner.get_data_file(key))  # type: ignore[no-any-return]


def set_outage(path: str, seconds: float) -> None:
    """Take storage down for ``seconds`` for every :class:`ChaosStore` watching ``path``."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(time.time() + seconds))
    os.replace(tmp, path)
