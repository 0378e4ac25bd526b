"""Store wrappers for tests, benchmarks and diagnostics: counting, latency, fault injection,
a store clock moved ahead."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from txntable.errors import InvalidConfigurationError, TransientStorageError
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    StoreWrapper,
)

#: Request kinds counted by :class:`CountingStore`.
REQUEST_KINDS = ("GET", "HEAD", "LIST", "PUT", "CONDITIONAL_PUT", "DELETE")

#: Write operations :class:`FaultInjectingStore` can fail.
WRITE_OPS = frozenset({"put", "put_if_absent", "put_if_match"})

KeyPredicate = Callable[[str], bool]
#: An exception to raise, or a factory called with the key.
ExcSpec = BaseException | Callable[[str], BaseException]


class CountingStore(StoreWrapper):
    """Counts requests by kind, and by what they were for when given ``classify``;
    thread-safe.

    One call is one request: a ``list`` is counted once however many pages the backend
    fetches, and ``exists`` counts as a ``HEAD``.

    Args:
        inner: The store counted.
        classify: Names what a key (or a listed prefix; ``""`` for the store's clock) is
            for: each request is counted under that name too (:attr:`by_object`).

    Attributes:
        counts: Requests per kind (see :data:`REQUEST_KINDS`).
        by_object: Requests per ``classify`` name (empty without ``classify``).
    """

    def __init__(self, inner: Store, classify: Callable[[str], str] | None = None) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()
        self.by_object: Counter[str] = Counter()
        self._classify = classify
        self._lock = threading.Lock()

    def _count(self, kind: str, key: str) -> None:
        name = self._classify(key) if self._classify is not None else None
        with self._lock:
            self.counts[kind] += 1
            if name is not None:
                self.by_object[name] += 1

    def reset(self) -> None:
        """Zero every counter."""
        with self._lock:
            self.counts.clear()
            self.by_object.clear()

    def objects(self) -> dict[str, int]:
        """Return a copy of the counters by ``classify`` name."""
        with self._lock:
            return dict(self.by_object)

    def snapshot(self) -> dict[str, int]:
        """Return a copy of the counters with every kind present (zero if unused)."""
        with self._lock:
            return {kind: self.counts.get(kind, 0) for kind in REQUEST_KINDS}

    def modified_ms(self, key: str) -> int | None:
        self._count("HEAD", key)
        return self.inner.modified_ms(key)

    def clock_ms(self) -> int:
        self._count("HEAD", "")
        return self.inner.clock_ms()

    def get(self, key: str) -> StoredObject:
        self._count("GET", key)
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._count("HEAD", key)
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        self._count("PUT", key)
        return self.inner.put(key, data)

    def put_data_file(self, key: str, data: bytes) -> None:
        self._count("PUT", key)
        self.inner.put_data_file(key, data)

    def put_data_files(self, items: Sequence[tuple[str, bytes]]) -> None:
        for key, _ in items:
            self._count("PUT", key)
        self.inner.put_data_files(items)

    def get_data_file(self, key: str) -> bytes:
        self._count("GET", key)
        return self.inner.get_data_file(key)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._count("CONDITIONAL_PUT", key)
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        self._count("CONDITIONAL_PUT", key)
        return self.inner.put_if_match(key, data, etag)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        self._count("LIST", prefix)
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self._count("DELETE", key)
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        # One request per thousand keys, as S3's DeleteObjects.
        for at in range(0, len(keys), 1000):
            self._count("DELETE", keys[at])
        self.inner.delete_many(keys)


class LatencyStore(StoreWrapper):
    """Adds a fixed delay to every request, as an object store's round trip would.

    Models S3 on a fast local backend (the moto server): every call sleeps ``latency_ms``
    first, segment reads and writes (``get_data_file`` / ``put_data_file``, pyarrow's file
    system on S3) included. Readers never bypass a wrapped store's data path (see
    :class:`txntable.read.reader.SegmentReader`), so the delay applies to every segment read.
    A ``list`` is delayed once, however many pages it has. Sleeping releases the GIL, so
    requests made from several threads overlap as they would against a real store.
    """

    def __init__(self, inner: Store, latency_ms: float) -> None:
        super().__init__(inner)
        self.latency_ms = latency_ms

    def _wait(self) -> None:
        time.sleep(self.latency_ms / 1000)

    def get(self, key: str) -> StoredObject:
        self._wait()
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._wait()
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        self._wait()
        return self.inner.put(key, data)

    def put_data_file(self, key: str, data: bytes) -> None:
        self._wait()
        self.inner.put_data_file(key, data)

    def put_data_files(self, items: Sequence[tuple[str, bytes]]) -> None:
        self._wait()  # the puts overlap (S3: in parallel; local disk: one request)
        self.inner.put_data_files(items)

    def get_data_file(self, key: str) -> bytes:
        self._wait()
        return self.inner.get_data_file(key)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._wait()
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        self._wait()
        return self.inner.put_if_match(key, data, etag)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        self._wait()
        return self.inner.list(prefix, start_after)

    def modified_ms(self, key: str) -> int | None:
        self._wait()
        return self.inner.modified_ms(key)

    def clock_ms(self) -> int:
        self._wait()
        return self.inner.clock_ms()

    def list_children(self, prefix: str = "") -> Iterator[str]:
        self._wait()
        return self.inner.list_children(prefix)

    def delete(self, key: str) -> None:
        self._wait()
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        for _ in range(0, len(keys), 1000):
            self._wait()
        self.inner.delete_many(keys)


class ClockAheadStore(StoreWrapper):
    """A store whose clock (:meth:`Store.clock_ms`) reads ``ahead_ms`` later: pretends that
    time has passed on the store, which is what log cleanup and vacuum measure ages on."""

    def __init__(self, inner: Store, ahead_ms: int) -> None:
        super().__init__(inner)
        self.ahead_ms = ahead_ms

    def clock_ms(self) -> int:
        return self.inner.clock_ms() + self.ahead_ms


@dataclass
class Fault:
    """A registered fault; ``fired`` counts how often it triggered."""

    predicate: KeyPredicate
    remaining: int
    after_write: bool
    exc: ExcSpec | None
    ops: frozenset[str]
    fired: int = 0

    def make_exception(self, key: str) -> BaseException:
        if self.exc is None:
            when = "after" if self.after_write else "before"
            return TransientStorageError(f"injected fault {when} writing {key!r}")
        if isinstance(self.exc, BaseException):
            return self.exc
        return self.exc(key)


class FaultInjectingStore(StoreWrapper):
    """Fails chosen writes, before or after they reach the inner store; thread-safe.

    ``fail_after_write`` models the ambiguous put: the write happened but the caller sees
    an error (default :class:`~txntable.errors.TransientStorageError`) and must resolve it
    by reading back. ``fail_before_write`` models a request that never reached storage.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def fail_after_write(
        self,
        predicate: KeyPredicate,
        times: int = 1,
        exc_factory: ExcSpec | None = None,
        ops: frozenset[str] | set[str] = WRITE_OPS,
    ) -> Fault:
        """Perform the next ``times`` matching writes, then raise.

        Args:
            predicate: Called with the key; the fault applies where it returns true.
            times: How many matching writes to fail.
            exc_factory: Exception instance, or callable from key to exception.
            ops: Which of ``put``, ``put_if_absent``, ``put_if_match`` to fail.

        Returns:
            The registered fault (inspect ``fired``).
        """
        return self._add(Fault(predicate, times, True, exc_factory, frozenset(ops)))

    def fail_before_write(
        self,
        predicate: KeyPredicate,
        times: int = 1,
        exc: ExcSpec | None = None,
        ops: frozenset[str] | set[str] = WRITE_OPS,
    ) -> Fault:
        """Raise instead of performing the next ``times`` matching writes.

        Args:
            predicate: Called with the key; the fault applies where it returns true.
            times: How many matching writes to fail.
            exc: Exception instance, or callable from key to exception.
            ops: Which of ``put``, ``put_if_absent``, ``put_if_match`` to fail.

        Returns:
            The registered fault (inspect ``fired``).
        """
        return self._add(Fault(predicate, times, False, exc, frozenset(ops)))

    def clear(self) -> None:
        """Remove every registered fault."""
        with self._lock:
            self._faults.clear()

    def _add(self, fault: Fault) -> Fault:
        unknown = fault.ops - WRITE_OPS
        if unknown:
            raise InvalidConfigurationError(f"unknown write ops {sorted(unknown)}")
        with self._lock:
            self._faults.append(fault)
        return fault

    def _take(self, op: str, key: str) -> Fault | None:
        # Claims the first armed matching fault atomically, so racing threads each get one.
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and op in fault.ops and fault.predicate(key):
                    fault.remaining -= 1
                    fault.fired += 1
                    return fault
        return None

    def _write(self, op: str, key: str, write: Callable[[], str]) -> str:
        fault = self._take(op, key)
        if fault is None:
            return write()
        if not fault.after_write:
            raise fault.make_exception(key)
        write()
        raise fault.make_exception(key)

    def put(self, key: str, data: bytes) -> str:
        return self._write("put", key, lambda: self.inner.put(key, data))

    def put_data_file(self, key: str, data: bytes) -> None:
        # A data file is a plain put as far as faults go.
        def write() -> str:
            self.inner.put_data_file(key, data)
            return ""

        self._write("put", key, write)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._write("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._write("put_if_match", key, lambda: self.inner.put_if_match(key, data, etag))
