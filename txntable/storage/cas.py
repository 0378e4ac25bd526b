"""Compare-and-swap of one small JSON object: the envelope the transaction coordinator's
objects, the producer-id block and a group's ``members.json`` share.

A client loads the object with its etag, computes the new bytes (made unique by a fresh
``writeId``) and writes them only if the etag is unchanged. A write whose outcome is
unknown (:class:`TransientStorageError`) is read back: the object holding exactly our bytes
means it landed; anything else means it did not (the store contract).
"""

from __future__ import annotations

from txntable.errors import ObjectNotFoundError, TransientStorageError
from txntable.storage.base import Store, StoredObject


def load_object(store: Store, key: str) -> StoredObject | None:
    """The object at ``key`` with its etag, or ``None`` if there is none."""
    try:
        return store.get(key)
    except ObjectNotFoundError:
        return None


def put_cas(store: Store, key: str, data: bytes, etag: str | None) -> str:
    """Write ``data`` if the object still has ``etag`` (``None``: if there is no object);
    return the new etag.

    Raises:
        PreconditionFailedError: Another client changed the object first.
        TransientStorageError: The outcome was unknown and the read-back did not find our
            bytes (the write did not land, or the store cannot tell yet): retry.
    """
    try:
        if etag is None:
            return store.put_if_absent(key, data)
        return store.put_if_match(key, data, etag)
    except TransientStorageError:
        try:
            current = load_object(store, key)
        except TransientStorageError:
            current = None
        if current is None or current.data != data:
            raise
        return current.etag
