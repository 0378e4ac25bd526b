"""Fixtures for the core tests: warehouses on memory/local stores, recording and faulty stores."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txntable import Producer, Warehouse
from txntable.errors import TransientStorageError
from txntable.storage import CountingStore, FaultInjectingStore, MemoryStore
from txntable.storage.base import Store, StoredObject

#: Producer settings under which only ``flush``/``commit_transaction`` send anything, so a
#: test decides exactly which records share a batch and in which order batches land.
MANUAL_FLUSH = {"linger_ms": 600_000, "batch_size": 1 << 30}


class RecordingStore(CountingStore):
    """A counting store that also records the key of every GET."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gets: list[str] = []

    def reset(self) -> None:
        super().reset()
        self.gets.clear()

    def get(self, key: str) -> StoredObject:
        self.gets.append(key)
        return super().get(key)

    def log_gets(self, table: str) -> list[str]:
        """Keys of GETs of ``table``'s log directory since the last reset."""
        return [k for k in self.gets if k.startswith(f"{table}/_log/")]


class ReadFaultStore(FaultInjectingStore):
    """A fault-injecting store that can also fail GETs of chosen keys."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.get_faults: dict[str, int] = {}
        self.get_faults_fired = 0

    def fail_next_get(self, key: str, times: int = 1) -> None:
        """Raise ``TransientStorageError`` on the next ``times`` GETs of ``key``."""
        self.get_faults[key] = self.get_faults.get(key, 0) + times

    def get(self, key: str) -> StoredObject:
        if self.get_faults.get(key, 0) > 0:
            self.get_faults[key] -= 1
            self.get_faults_fired += 1
            raise TransientStorageError(f"injected read failure of {key!r}")
        return super().get(key)


@pytest.fixture
def memory_store() -> Iterator[MemoryStore]:
    """A fresh, uniquely named memory store, dropped afterwards."""
    name = f"core-{uuid.uuid4().hex}"
    store = MemoryStore(name)
    yield store
    MemoryStore.drop(name)


@pytest.fixture
def wh(memory_store: MemoryStore) -> Warehouse:
    """A warehouse on a fresh memory store."""
    return Warehouse(store=memory_store)


@pytest.fixture
def local_wh(tmp_path: pathlib.Path) -> Warehouse:
    """A warehouse on local disk, opened by URL."""
    return Warehouse(f"file://{tmp_path}/lake")


@pytest.fixture
def recording_store(memory_store: MemoryStore) -> RecordingStore:
    """A GET-recording, request-counting wrapper of a fresh memory store."""
    return RecordingStore(memory_store)


@pytest.fixture
def fault_store(memory_store: MemoryStore) -> ReadFaultStore:
    """A fault-injecting wrapper (writes and GETs) of a fresh memory store."""
    return ReadFaultStore(memory_store)


@pytest.fixture
def make_producer() -> Iterator[Callable[..., Producer]]:
    """Build producers (manual flush by default) that are closed after the test."""
    producers: list[Producer] = []

    def make(warehouse: Warehouse, **kwargs: Any) -> Producer:
        options = {**MANUAL_FLUSH, **kwargs}
        producer = Producer(warehouse, **options)
        producers.append(producer)
        return producer

    yield make
    for producer in producers:
        producer.close(timeout=10)
