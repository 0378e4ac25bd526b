"""A log listing that misses a version created while it ran is not a deleted version.

Found by the exactly-once harness (tests/harness): on local disk a listing reads the log
directory in pieces, so one taken while writers commit can hold version N+1 but not N. The
gap check took that for a deleted version and raised ``CorruptLogError`` (a transactional
producer's ``init_transactions`` then failed for good), although N was there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tableutil import write_batch

from txntable import Warehouse
from txntable.errors import CorruptLogError, ObjectNotFoundError
from txntable.storage import MemoryStore, StoreWrapper
from txntable.storage.base import StoredObject


class ListingMisses(StoreWrapper):
    """Replays the race: ``hidden`` is not there for the next read (not written yet), then
    is left out of the next listing that would hold it (written, but the listing read that
    part of the directory before)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.hidden: str | None = None
        self.not_yet: str | None = None
        self.missed = 0

    def get(self, key: str) -> StoredObject:
        if key == self.not_yet:
            self.not_yet = None
            raise ObjectNotFoundError(key)
        return self.inner.get(key)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        keys = list(self.inner.list(prefix, start_after))
        if self.hidden in keys:
            keys.remove(self.hidden)
            self.hidden = None
            self.missed += 1
        return iter(keys)


def test_a_version_missing_only_from_a_listing_is_read(memory_store: MemoryStore) -> None:
    table = Warehouse(store=memory_store).create_table("t")
    for i in range(4):
        write_batch(table, 0, [f"r{i}".encode()])
    store = ListingMisses(memory_store)
    store.hidden = store.not_yet = "t/_log/00000000000000000002.json"
    # The load reads versions 1, 2 (not there yet): its tip is 1. The listing that checks
    # the tip holds versions 3 and 4 but not 2.
    desc = Warehouse(store=store).table("t").describe()
    assert store.missed == 1
    assert desc.version == 4
    assert desc.partitions[0].high_watermark == 4


def test_a_version_really_missing_is_still_corruption(memory_store: MemoryStore) -> None:
    table = Warehouse(store=memory_store).create_table("t")
    for i in range(4):
        write_batch(table, 0, [f"r{i}".encode()])
    memory_store.delete("t/_log/00000000000000000002.json")
    with pytest.raises(CorruptLogError, match="version 2 is missing"):
        Warehouse(store=memory_store).table("t").describe()
