"""Storage backends behind the one :class:`Store` interface, and :func:`open_store`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from txntable.errors import InvalidPathError
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    StoreWrapper,
    refuse_unknown_options,
)
from txntable.storage.local import LocalStore
from txntable.storage.memory import MemoryStore
from txntable.storage.wrappers import (
    ClockAheadStore,
    CountingStore,
    FaultInjectingStore,
    LatencyStore,
)

if TYPE_CHECKING:
    from txntable.storage.s3 import S3Store

__all__ = [
    "ClockAheadStore",
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
    "check_storage_options",
    "open_store",
    "storage_option_names",
]


def __getattr__(name: str) -> object:
    # boto3 costs ~0.15 s to import: only a process that opens S3 pays it.
    if name == "S3Store":
        from txntable.storage.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend(url: str) -> str:
    """Which backend serves ``url``: ``local``, ``memory``, ``s3``, or an fsspec scheme.

    Raises:
        InvalidPathError: If the URL is empty or malformed.
    """
    if not isinstance(url, str) or not url.strip() or "\x00" in url:
        raise InvalidPathError(f"invalid store URL {url!r}")
    if "://" not in url:
        if ":" in url.split("/", 1)[0] and not os.path.exists(url):
            # "scheme:rest" without "//" is almost certainly a typo, not a directory name.
            raise InvalidPathError(f"invalid store URL {url!r}")
        return "local"
    scheme = url.split("://", 1)[0].lower()
    if scheme == "file":
        return "local"
    if scheme == "memory":
        return "memory"
    if scheme in ("s3", "s3a"):
        return "s3"
    if not scheme.replace("+", "").replace("-", "").isalnum() or not scheme[0].isalpha():
        raise InvalidPathError(f"invalid store URL {url!r}")
    return scheme


def storage_option_names(url: str) -> frozenset[str] | None:
    """The storage options the backend of ``url`` accepts; ``None`` if it cannot tell.

    Local disk and memory stores take none; S3 takes the ``s3.*`` options of
    :mod:`txntable.storage.s3`; another fsspec backend takes its filesystem's keyword
    arguments (``None`` for a chained URL or a backend fsspec cannot load).

    Raises:
        InvalidPathError: If the URL is empty or malformed.
    """
    backend = _backend(url)
    if backend in ("local", "memory"):
        return frozenset()
    if backend == "s3":
        from txntable.storage.s3 import S3_OPTIONS

        return S3_OPTIONS
    from txntable.storage.fsspec_store import fsspec_option_names

    return fsspec_option_names(url)


def check_storage_options(url: str, storage_options: Mapping[str, object] | None) -> None:
    """Refuse storage options the backend of ``url`` does not know (never ignore them).

    Raises:
        InvalidConfigurationError: Naming the unknown keys and the accepted ones.
        InvalidPathError: If the URL is empty or malformed.
    """
    accepted = storage_option_names(url)
    if accepted is not None and storage_options:
        backend = _backend(url)
        where = {"local": "local disk", "memory": "the memory store", "s3": "S3"}
        refuse_unknown_options(
            where.get(backend, f"fsspec {backend}://"), storage_options, accepted
        )


def open_store(url: str, storage_options: Mapping[str, str] | None = None) -> Store:
    """Open the store for a warehouse URL.

    * ``file:///abs/path``, ``/abs/path`` or ``relative/path`` -> :class:`LocalStore`
    * ``memory://name`` -> :class:`MemoryStore` (shared per name within the process)
    * ``s3://bucket/prefix`` (``s3a://`` is an alias) -> :class:`S3Store`
    * any other scheme fsspec knows -> :class:`~txntable.storage.fsspec_store.FsspecStore`

    Args:
        url: The warehouse URL.
        storage_options: Backend options (see :func:`storage_option_names`).

    Returns:
        The store.

    Raises:
        InvalidPathError: If the URL is empty, malformed, or its scheme is unknown.
        InvalidConfigurationError: If an option is unknown to the backend or malformed.
    """
    backend = _backend(url)
    check_storage_options(url, storage_options)
    if backend == "local":
        if "://" not in url:
            return LocalStore(url)
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidPathError(f"file URL must be file:///absolute/path: {url!r}")
        if parts.query or parts.fragment:
            raise InvalidPathError(f"file URL must not have a query or fragment: {url!r}")
        return LocalStore(unquote(parts.path))
    if backend == "memory":
        name = url.split("://", 1)[1].strip("/")
        return MemoryStore(name or "default")
    if backend == "s3":
        from txntable.storage.s3 import S3Store

        return S3Store(url, storage_options)
    from txntable.storage.fsspec_store import FsspecStore

    return FsspecStore(url, storage_options)
