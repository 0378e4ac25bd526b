"""The one interface through which txntable reaches storage.

Keys are ``/``-separated paths relative to the warehouse root. Every store offers plain and
conditional writes; the log and the coordinator are built only on these primitives:

* ``put_if_absent`` is ``If-None-Match: *``: the winner of a race creates the object, every
  loser gets :class:`~txntable.errors.ObjectExistsError`.
* ``put_if_match`` is ``If-Match: <etag>``: compare-and-swap on a whole object.

A request whose outcome is unknown raises :class:`~txntable.errors.TransientStorageError`;
callers resolve it by reading back, never by blindly writing again.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from txntable.errors import InvalidConfigurationError, InvalidPathError, ObjectNotFoundError
from txntable.util import now_ms


@dataclass(frozen=True)
class ObjectInfo:
    """Metadata of a stored object."""

    key: str
    etag: str
    size: int


@dataclass(frozen=True)
class StoredObject:
    """An object's bytes together with the etag they were read at."""

    data: bytes
    etag: str


def refuse_unknown_options(
    backend: str, names: Iterable[object], accepted: Collection[str]
) -> None:
    """Raise if any option name is not one the backend accepts (options are never ignored).

    Raises:
        InvalidConfigurationError: Naming the unknown keys and the accepted ones.
    """
    unknown = sorted(str(n) for n in names if n not in accepted)
    if unknown:
        raise InvalidConfigurationError(
            f"unknown storage option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} for {backend}; accepted: "
            f"{', '.join(sorted(accepted)) or 'none'}"
        )


def validate_key(key: str) -> str:
    """Reject keys that are empty, absolute, or would escape the root through ``..``.

    Args:
        key: A store-relative key.

    Returns:
        The key unchanged.

    Raises:
        InvalidPathError: If the key is not a clean relative path.
    """
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidPathError(f"invalid storage key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidPathError(f"invalid storage key {key!r}")
    return key


class Store(abc.ABC):
    """Object storage with conditional writes, rooted at one warehouse location."""

    #: URL of the warehouse root this store serves (used to reopen it in another process).
    url: str = ""

    #: Whether ``list(prefix, start_after)`` costs O(keys after ``start_after``) (S3's
    #: ``StartAfter``, a sorted index) rather than O(keys under the prefix) (a directory
    #: read). The log lists a healthy tail only where this is cheap (see ``Log.load``).
    ordered_listing: bool = False

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject:
        """Read an object.

        Raises:
            ObjectNotFoundError: If the key does not exist.
        """

    def head(self, key: str) -> ObjectInfo | None:
        """Return the object's metadata, or ``None`` if it does not exist.

        The default reads the object (stores whose etag is a hash of the bytes have nothing
        cheaper); backends with a metadata request override it.
        """
        try:
            obj = self.get(key)
        except ObjectNotFoundError:
            return None
        return ObjectInfo(key, obj.etag, len(obj.data))

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> str:
        """Write an object unconditionally and return its new etag."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create an object only if the key does not exist; return its etag.

        Raises:
            ObjectExistsError: If the key already exists.
        """

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace an object only if its current etag equals ``etag``; return the new etag.

        Raises:
            PreconditionFailedError: If the object changed since ``etag`` was read.
            ObjectNotFoundError: If the object does not exist.
        """

    @abc.abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        """Yield keys starting with ``prefix`` in lexicographic order, after ``start_after``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete objects (missing ones are no error); object stores do it in one request
        per thousand keys, others one by one."""
        for key in keys:
            self.delete(key)

    def put_data_file(self, key: str, data: bytes) -> None:
        """Write an immutable data file (a Parquet segment); a plain put by default.

        Object stores override this with their bulk-data path (S3: ``pyarrow.fs``).
        """
        self.put(key, data)

    def put_data_files(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Write several immutable data files (a round's segments), every one of them
        durable when this returns; on an error, any of them may have been written.

        The default puts them one after the other; local disk writes them all, then
        fsyncs them all and their directories; S3 puts them in parallel.
        """
        for key, data in items:
            self.put_data_file(key, data)

    def get_data_file(self, key: str) -> bytes:
        """Read an immutable data file; a plain get by default.

        Raises:
            ObjectNotFoundError: If it does not exist.
        """
        return self.get(key).data

    def prune(self, prefix: str) -> None:  # noqa: B027 - optional hook
        """Remove what the backend keeps of a folder whose objects were all deleted (local
        disk: its empty directories); object stores keep nothing."""

    def list_children(self, prefix: str = "") -> Iterator[str]:
        """Names one level below ``prefix`` (a ``/``-terminated folder or ``""``), sorted.

        Both objects and "folders" are named. The default lists everything below the prefix;
        backends override it with a delimited listing.
        """
        seen: set[str] = set()
        for key in self.list(prefix):
            name = key[len(prefix) :].split("/", 1)[0]
            if name not in seen:
                seen.add(name)
        return iter(sorted(seen))

    def exists(self, key: str) -> bool:
        """Return whether the key exists."""
        return self.head(key) is not None

    def modified_ms(self, key: str) -> int | None:
        """When the object was last written, by the store's clock (ms since the epoch);
        ``None`` if it does not exist or the store does not say.

        With :meth:`clock_ms` this measures an object's age on one clock, the store's,
        whatever the clients' clocks say (log cleanup relies on it).
        """
        return None

    def clock_ms(self) -> int:
        """The store's current time (ms since the epoch): the clock :meth:`modified_ms`
        reads. The default is this machine's clock, which is the store's for local disk and
        memory; a remote store overrides it with its own."""
        return now_ms()

    def storage_options(self) -> dict[str, str]:
        """Options that, with :attr:`url`, reopen this store in another process."""
        return {}

    def check_root(self) -> None:  # noqa: B027 - optional hook
        """Raise if the warehouse root itself is missing (not merely empty).

        Called when an object was not found, to tell "no such table" from "no such
        bucket". The default finds nothing wrong: a local or memory root is created by
        the first write.

        Raises:
            BucketNotFoundError: The bucket of the warehouse does not exist.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources held by the store."""


class StoreWrapper(Store):
    """A store that forwards every request to an inner store; subclass to observe or inject."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.ordered_listing = inner.ordered_listing

    def get(self, key: str) -> StoredObject:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self.inner.put_if_match(key, data, etag)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def list_children(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list_children(prefix)

    def prune(self, prefix: str) -> None:
        self.inner.prune(prefix)

    def put_data_file(self, key: str, data: bytes) -> None:
        self.inner.put_data_file(key, data)

    def get_data_file(self, key: str) -> bytes:
        return self.inner.get_data_file(key)

    def storage_options(self) -> dict[str, str]:
        return self.inner.storage_options()

    def modified_ms(self, key: str) -> int | None:
        return self.inner.modified_ms(key)

    def clock_ms(self) -> int:
        return self.inner.clock_ms()

    def check_root(self) -> None:
        self.inner.check_root()

    def close(self) -> None:
        self.inner.close()
