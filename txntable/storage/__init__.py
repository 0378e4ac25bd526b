"""Storage backends behind the one :class:`Store` interface, and :func:`open_store`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from txntable.errors import InvalidPathError
from txntable.storage.base import ObjectInfo, Store, StoredObject, StoreWrapper
from txntable.storage.local import LocalStore
from txntable.storage.memory import MemoryStore
from txntable.storage.s3 import S3Store
from txntable.storage.wrappers import CountingStore, FaultInjectingStore, LatencyStore

__all__ = [
    "CountingStore",
    "FaultInjectingStore",
    "LatencyStore",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "S3Store",
    "Store",
    "StoreWrapper",
    "StoredObject",
    "open_store",
]


def open_store(url: str, storage_options: Mapping[str, str] | None = None) -> Store:
    """Open the store for a warehouse URL.

    * ``file:///abs/path``, ``/abs/path`` or ``relative/path`` -> :class:`LocalStore`
    * ``memory://name`` -> :class:`MemoryStore` (shared per name within the process)
    * ``s3://bucket/prefix`` (``s3a://`` is an alias) -> :class:`S3Store`
    * any other scheme fsspec knows -> :class:`~txntable.storage.fsspec_store.FsspecStore`

    Args:
        url: The warehouse URL.
        storage_options: Backend options (see :mod:`txntable.storage.s3`); ignored by the
            local and memory stores.

    Returns:
        The store.

    Raises:
        InvalidPathError: If the URL is empty, malformed, or its scheme is unknown.
    """
    if not isinstance(url, str) or not url.strip() or "\x00" in url:
        raise InvalidPathError(f"invalid store URL {url!r}")
    if "://" not in url:
        if ":" in url.split("/", 1)[0] and not os.path.exists(url):
            # "scheme:rest" without "//" is almost certainly a typo, not a directory name.
            raise InvalidPathError(f"invalid store URL {url!r}")
        return LocalStore(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidPathError(f"file URL must be file:///absolute/path: {url!r}")
        if parts.query or parts.fragment:
            raise InvalidPathError(f"file URL must not have a query or fragment: {url!r}")
        return LocalStore(unquote(parts.path))
    if scheme == "memory":
        name = url.split("://", 1)[1].strip("/")
        return MemoryStore(name or "default")
    if scheme in ("s3", "s3a"):
        return S3Store(url, storage_options)
    if not scheme.replace("+", "").replace("-", "").isalnum() or not scheme[0].isalpha():
        raise InvalidPathError(f"invalid store URL {url!r}")
    from txntable.storage.fsspec_store import FsspecStore

    return FsspecStore(url, storage_options)
