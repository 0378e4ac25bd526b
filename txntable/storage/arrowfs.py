"""Map a :class:`~txntable.storage.base.Store` to a pyarrow filesystem for Parquet I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING

from txntable.storage.base import Store, StoreWrapper

if TYPE_CHECKING:
    import pyarrow.fs


def arrow_filesystem(store: Store) -> tuple[pyarrow.fs.FileSystem, str] | None:
    """Return a pyarrow filesystem and base path serving the same objects as ``store``.

    Wrappers are unwrapped (through ``.inner``), so requests made through the returned
    filesystem bypass any counting or fault injection of the wrapper.

    Args:
        store: Any store.

    Returns:
        ``(S3FileSystem, "bucket/prefix")`` for an S3 store, ``(LocalFileSystem, root)``
        for a local store, ``(PyFileSystem, root)`` for an fsspec store, else ``None``:
        the caller then falls back to ``store.get`` / ``store.put`` of whole objects.
        Join keys to the base path with ``/``.
    """
    from pyarrow import fs as pafs

    from txntable.storage.fsspec_store import FsspecStore
    from txntable.storage.local import LocalStore
    from txntable.storage.s3 import S3Store

    while isinstance(store, StoreWrapper):
        store = store.inner
    if isinstance(store, S3Store):
        return store.arrow_filesystem()
    if isinstance(store, LocalStore):
        return pafs.LocalFileSystem(), store.root
    if isinstance(store, FsspecStore):
        return pafs.PyFileSystem(pafs.FSSpecHandler(store.fs)), store.root
    return None
