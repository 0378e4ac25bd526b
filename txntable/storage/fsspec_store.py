"""Fallback store over any fsspec filesystem (``gs://``, ``abfs://``, ``hdfs://``, ...).

Reads, plain writes, lists and deletes work on every fsspec backend. Conditional writes
do not have a portable fsspec API:

* ``put_if_absent`` opens the file with mode ``"xb"``. Backends that do not implement
  exclusive create raise :class:`~txntable.errors.ConditionalWriteUnsupportedError`.
  Whether ``"xb"`` is *atomic* is up to the backend (fsspec's in-memory filesystem, for
  one, checks then writes), so this store is not safe for concurrent log writers unless
  the backend's exclusive create is.
* ``put_if_match`` always raises :class:`~txntable.errors.ConditionalWriteUnsupportedError`.

Etags are the MD5 of the content, so ``head`` reads the whole object.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from txntable.errors import (
    ConditionalWriteUnsupportedError,
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
)
from txntable.storage.base import (
    Store,
    StoredObject,
    refuse_unknown_options,
    validate_key,
)

#: Options every fsspec filesystem takes (``AbstractFileSystem``, its instance cache and
#: listings cache, async implementations).
FSSPEC_COMMON_OPTIONS = frozenset(
    {
        "asynchronous",
        "listings_expiry_time",
        "loop",
        "max_paths",
        "skip_instance_cache",
        "use_listings_cache",
    }
)


def _etag(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fsspec_option_names(url: str) -> frozenset[str] | None:
    """The keyword arguments the fsspec filesystem of ``url`` names in its constructors.

    Returns:
        Those names plus :data:`FSSPEC_COMMON_OPTIONS`; ``None`` for a chained URL
        (``a::b://``, whose options are nested per protocol) or a protocol fsspec cannot
        load (opening the store reports that).
    """
    from fsspec import get_filesystem_class

    if "::" in url:
        return None
    try:
        cls = get_filesystem_class(url.split("://", 1)[0])
    except (ValueError, ImportError):
        return None
    names = set(FSSPEC_COMMON_OPTIONS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for param in inspect.signature(init).parameters.values():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                names.add(param.name)
    names.discard("self")
    return frozenset(names)


class FsspecStore(Store):
    """A store rooted at an fsspec URL.

    Args:
        url: Any URL fsspec understands, e.g. ``gs://bucket/prefix``.
        storage_options: Passed to the fsspec filesystem constructor; only the keyword
            arguments it names (see :func:`fsspec_option_names`).

    Raises:
        InvalidPathError: If fsspec does not know the protocol.
        InvalidConfigurationError: If an option is not one the filesystem names.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        from fsspec.core import url_to_fs

        self._options = dict(storage_options or {})
        accepted = fsspec_option_names(url)
        if accepted is not None:
            refuse_unknown_options(f"fsspec {url.split('://', 1)[0]}://", self._options, accepted)
        try:
            fs, root = url_to_fs(url, **self._options)
        except (ValueError, ImportError) as exc:
            # ImportError: fsspec knows the protocol but its package is not installed.
            raise InvalidPathError(f"cannot open {url!r} with fsspec: {exc}") from None
        self.fs: Any = fs
        self.root: str = str(root).rstrip("/")
        self.url = url.rstrip("/")

    def storage_options(self) -> dict[str, str]:
        return {k: str(v) for k, v in self._options.items()}

    def __repr__(self) -> str:
        # Option values may be credentials; show only the names.
        return f"FsspecStore(url={self.url!r}, storage_options={sorted(self._options)!r})"

    def _path(self, key: str) -> str:
        validate_key(key)
        return f"{self.root}/{key}" if self.root else key

    def get(self, key: str) -> StoredObject:
        try:
            data = bytes(self.fs.cat_file(self._path(key)))
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(key) from None
        return StoredObject(data, _etag(data))

    def _makedirs(self, path: str) -> None:
        parent = path.rpartition("/")[0]
        if parent:
            self.fs.makedirs(parent, exist_ok=True)

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        self._makedirs(path)
        self.fs.pipe_file(path, bytes(data))
        return _etag(data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        path = self._path(key)
        self._makedirs(path)
        try:
            with self.fs.open(path, "xb") as f:
                f.write(bytes(data))
        except FileExistsError:
            raise ObjectExistsError(key) from None
        except (ValueError, NotImplementedError) as exc:
            raise ConditionalWriteUnsupportedError(
                f"{type(self.fs).__name__} does not support exclusive create: {exc}"
            ) from None
        return _etag(data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        raise ConditionalWriteUnsupportedError(
            f"{type(self.fs).__name__} via fsspec has no compare-and-swap write"
        )

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        directory = prefix.rpartition("/")[0]
        base = f"{self.root}/{directory}" if directory else self.root
        root_prefix = f"{self.root}/" if self.root else ""
        try:
            paths = self.fs.find(base or "/", withdirs=False)
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            raise StorageError(f"LIST {self.url}/{prefix}: {exc}") from None
        keys = []
        for path in map(str, paths):
            if root_prefix and not path.startswith(root_prefix):
                continue
            key = path[len(root_prefix) :] if root_prefix else path.lstrip("/")
            if key.startswith(prefix) and (start_after is None or key > start_after):
                keys.append(key)
        return iter(sorted(keys))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass
