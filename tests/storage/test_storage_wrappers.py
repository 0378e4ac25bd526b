"""CountingStore, LatencyStore and FaultInjectingStore."""

from __future__ import annotations

import threading
import time

import pytest

from txntable.errors import (
    InvalidConfigurationError,
    ObjectExistsError,
    TransientStorageError,
)
from txntable.storage import (
    CountingStore,
    FaultInjectingStore,
    LatencyStore,
    MemoryStore,
    Store,
)


def test_counting_store_counts_exactly(any_store: Store) -> None:
    store = CountingStore(any_store)
    etag = store.put("a", b"1")
    store.put_if_absent("b", b"2")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("b", b"3")
    store.put_if_match("a", b"4", etag)
    store.get("a")
    store.head("a")
    store.exists("missing")  # a HEAD
    assert list(store.list("")) == ["a", "b"]
    store.delete("b")
    assert store.snapshot() == {
        "GET": 1,
        "HEAD": 2,
        "LIST": 1,
        "PUT": 1,
        "CONDITIONAL_PUT": 3,
        "DELETE": 1,
    }
    assert store.counts["CONDITIONAL_PUT"] == 3
    assert store.url == any_store.url
    store.reset()
    assert sum(store.snapshot().values()) == 0


def test_counting_store_is_thread_safe() -> None:
    store = CountingStore(MemoryStore("counting-threads"))
    store.put("k", b"v")
    store.reset()

    def work() -> None:
        for _ in range(500):
            store.get("k")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert store.snapshot()["GET"] == 4000
    MemoryStore.drop("counting-threads")


def test_fail_after_write_writes_then_raises(any_store: Store) -> None:
    store = FaultInjectingStore(any_store)
    fault = store.fail_after_write(lambda key: key.startswith("_log/"))
    with pytest.raises(TransientStorageError, match="after"):
        store.put_if_absent("_log/1.json", b"mine")
    assert any_store.get("_log/1.json").data == b"mine"  # the write happened
    assert fault.fired == 1
    # Fired once only; the caller's read-back / retry now sees the truth.
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("_log/1.json", b"mine")
    store.put_if_absent("_log/2.json", b"ok")
    store.put("data/x", b"unaffected")  # predicate does not match


def test_fail_before_write_does_not_write(any_store: Store) -> None:
    store = FaultInjectingStore(any_store)
    boom = OSError("boom")
    fault = store.fail_before_write(lambda key: key == "k", times=2, exc=boom)
    for _ in range(2):
        with pytest.raises(OSError, match="boom"):
            store.put("k", b"x")
    assert any_store.head("k") is None
    assert fault.fired == 2 and fault.remaining == 0
    store.put("k", b"x")
    assert any_store.get("k").data == b"x"


def test_fault_ops_filter_factory_and_clear() -> None:
    store = FaultInjectingStore(MemoryStore("faults-ops"))
    etag = store.put("coord", b"v1")
    store.fail_after_write(
        lambda key: True, exc_factory=lambda key: TimeoutError(key), ops={"put_if_match"}
    )
    store.put("other", b"not affected")
    with pytest.raises(TimeoutError, match="coord"):
        store.put_if_match("coord", b"v2", etag)
    assert store.get("coord").data == b"v2"
    store.fail_before_write(lambda key: True, times=100)
    store.clear()
    store.put("after-clear", b"ok")
    with pytest.raises(InvalidConfigurationError, match=r"unknown write ops \['get'\]"):
        store.fail_before_write(lambda key: True, ops={"get"})
    MemoryStore.drop("faults-ops")


def test_latency_store_delays_every_request_including_data_files() -> None:
    inner = MemoryStore("latency-wrapper")
    try:
        store = LatencyStore(CountingStore(inner), latency_ms=30)
        calls = [
            lambda: store.put("a", b"1"),
            lambda: store.get("a"),
            lambda: store.head("a"),
            lambda: store.put_data_file("d", b"2"),
            lambda: store.get_data_file("d"),
            lambda: list(store.list("")),
            lambda: store.delete("a"),
        ]
        for call in calls:
            t0 = time.monotonic()
            call()
            assert time.monotonic() - t0 >= 0.03
        assert store.get_data_file("d") == b"2"
        # Requests from several threads wait concurrently, not one after another: 8 of
        # 500 ms take well under the 4 s they would take in turn, even on a loaded machine.
        slow = LatencyStore(inner, latency_ms=500)
        threads = [threading.Thread(target=slow.get_data_file, args=("d",)) for _ in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert 0.5 <= time.monotonic() - t0 < 2.0
    finally:
        MemoryStore.drop("latency-wrapper")
