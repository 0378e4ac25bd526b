"""put_cas: the compare-and-swap envelope of coordinator objects, the producer-id block and
group objects, including the read-back of a write whose outcome is unknown."""

from __future__ import annotations

import uuid

import pytest

from txntable.errors import PreconditionFailedError, TransientStorageError
from txntable.storage import FaultInjectingStore, MemoryStore
from txntable.storage.cas import load_object, put_cas

KEY = "_coordinator/txn/t.json"


def fresh() -> MemoryStore:
    """A memory store of its own (stores of the same name share their objects)."""
    return MemoryStore(f"cas-{uuid.uuid4().hex}")


def test_create_then_swap_on_the_etag_read() -> None:
    store = fresh()
    assert load_object(store, KEY) is None
    etag = put_cas(store, KEY, b"one", None)
    obj = load_object(store, KEY)
    assert obj is not None and (obj.data, obj.etag) == (b"one", etag)
    new = put_cas(store, KEY, b"two", etag)
    assert load_object(store, KEY) == type(obj)(b"two", new)


def test_a_stale_etag_or_an_existing_object_loses() -> None:
    store = fresh()
    etag = put_cas(store, KEY, b"one", None)
    put_cas(store, KEY, b"two", etag)
    with pytest.raises(PreconditionFailedError):
        put_cas(store, KEY, b"three", etag)
    with pytest.raises(PreconditionFailedError):
        put_cas(store, KEY, b"three", None)
    obj = load_object(store, KEY)
    assert obj is not None and obj.data == b"two"


def test_an_ambiguous_write_that_landed_is_recognised_by_its_bytes() -> None:
    store = FaultInjectingStore(fresh())
    etag = put_cas(store, KEY, b"one", None)
    fault = store.fail_after_write(lambda k: k == KEY, exc_factory=TransientStorageError("x"))
    new = put_cas(store, KEY, b"two", etag)
    assert fault.fired == 1
    obj = load_object(store, KEY)
    assert obj is not None and (obj.data, obj.etag) == (b"two", new)


def test_an_ambiguous_write_that_did_not_land_raises_for_a_retry() -> None:
    store = FaultInjectingStore(fresh())
    etag = put_cas(store, KEY, b"one", None)
    store.fail_before_write(lambda k: k == KEY, exc=TransientStorageError("x"))
    with pytest.raises(TransientStorageError):
        put_cas(store, KEY, b"two", etag)
    obj = load_object(store, KEY)
    assert obj is not None and (obj.data, obj.etag) == (b"one", etag)
