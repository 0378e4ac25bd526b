"""In-memory store, shared per name within one process (``memory://name``)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import threading
from collections.abc import Iterator

from txntable.errors import ObjectExistsError, ObjectNotFoundError, PreconditionFailedError
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    validate_key,
)

_REGISTRY: dict[
    str, tuple[dict[str, StoredObject], list[str], threading.Lock, dict[str, int]]
] = {}
_REGISTRY_LOCK = threading.Lock()
# One counter for every instance: two handles on the same name must never mint equal etags.
_GENERATIONS = itertools.count(1)


def _etag(data: bytes, generation: int) -> str:
    return f"{hashlib.md5(data).hexdigest()}-{generation}"


class MemoryStore(Store):
    """A store in process memory; two stores with the same name see the same objects."""

    ordered_listing = True

    def __init__(self, name: str = "default") -> None:
        self.url = f"memory://{name}"
        with _REGISTRY_LOCK:
            if name not in _REGISTRY:
                _REGISTRY[name] = ({}, [], threading.Lock(), {})
            self._objects, self._keys, self._lock, self._written = _REGISTRY[name]

    @staticmethod
    def drop(name: str) -> None:
        """Forget every object of the named memory store."""
        with _REGISTRY_LOCK:
            _REGISTRY.pop(name, None)

    def _write(self, key: str, data: bytes) -> str:
        etag = _etag(data, next(_GENERATIONS))
        if key not in self._objects:
            bisect.insort(self._keys, key)
        self._objects[key] = StoredObject(bytes(data), etag)
        self._written[key] = self.clock_ms()
        return etag

    def get(self, key: str) -> StoredObject:
        validate_key(key)
        with self._lock:
            try:
                return self._objects[key]
            except KeyError:
                raise ObjectNotFoundError(key) from None

    def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        with self._lock:
            obj = self._objects.get(key)
            return None if obj is None else ObjectInfo(key, obj.etag, len(obj.data))

    def modified_ms(self, key: str) -> int | None:
        validate_key(key)
        with self._lock:
            return self._written.get(key)

    def put(self, key: str, data: bytes) -> str:
        validate_key(key)
        with self._lock:
            return self._write(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        validate_key(key)
        with self._lock:
            if key in self._objects:
                raise ObjectExistsError(key)
            return self._write(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        validate_key(key)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise ObjectNotFoundError(key)
            if obj.etag != etag:
                raise PreconditionFailedError(f"{key}: etag changed")
            return self._write(key, data)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        with self._lock:
            lo = bisect.bisect_left(self._keys, prefix)
            if start_after is not None and start_after >= prefix:
                lo = bisect.bisect_right(self._keys, start_after)
            out = []
            for key in self._keys[lo:]:
                if not key.startswith(prefix):
                    break
                out.append(key)
        return iter(out)

    def delete(self, key: str) -> None:
        validate_key(key)
        with self._lock:
            if self._objects.pop(key, None) is not None:
                self._keys.remove(key)
                del self._written[key]
