"""The Store contract, checked on every backend through the ``any_store`` fixture."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from storeutil import race

from txntable.errors import (
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from txntable.storage import Store

RACERS = 12


def test_get_missing_raises_not_found(any_store: Store) -> None:
    with pytest.raises(ObjectNotFoundError):
        any_store.get("nope/missing.json")
    assert any_store.head("nope/missing.json") is None
    assert not any_store.exists("nope/missing.json")


@pytest.mark.parametrize("data", [b"hello", b"", bytes(range(256)) * 3])
def test_put_get_round_trip_and_etag_matches_head(any_store: Store, data: bytes) -> None:
    etag = any_store.put("dir/obj.bin", data)
    obj = any_store.get("dir/obj.bin")
    info = any_store.head("dir/obj.bin")
    assert obj.data == data
    assert obj.etag == etag
    assert info is not None
    assert (info.key, info.etag, info.size) == ("dir/obj.bin", etag, len(data))
    assert '"' not in etag
    assert any_store.exists("dir/obj.bin")


def test_put_overwrites(any_store: Store) -> None:
    first = any_store.put("k", b"one")
    second = any_store.put("k", b"two")
    assert first != second
    assert any_store.get("k").data == b"two"
    assert any_store.get("k").etag == second


def test_put_if_absent_twice_raises_and_keeps_content(any_store: Store) -> None:
    etag = any_store.put_if_absent("_log/00000.json", b"first")
    with pytest.raises(ObjectExistsError):
        any_store.put_if_absent("_log/00000.json", b"second")
    obj = any_store.get("_log/00000.json")
    assert (obj.data, obj.etag) == (b"first", etag)


def test_object_exists_error_is_a_precondition_failure(any_store: Store) -> None:
    any_store.put("a", b"x")
    with pytest.raises(PreconditionFailedError):
        any_store.put_if_absent("a", b"y")


def test_put_if_match(any_store: Store) -> None:
    stale = any_store.put("coord", b"v1")
    current = any_store.put_if_match("coord", b"v2", stale)
    assert current != stale
    assert any_store.get("coord") == any_store.get("coord")
    assert any_store.get("coord").data == b"v2"
    assert any_store.get("coord").etag == current

    with pytest.raises(PreconditionFailedError) as info:
        any_store.put_if_match("coord", b"v3-stale", stale)
    assert not isinstance(info.value, ObjectExistsError)
    assert any_store.get("coord").data == b"v2"

    newest = any_store.put_if_match("coord", b"v3", current)
    assert newest not in (current, stale)
    assert any_store.get("coord").data == b"v3"


def test_put_if_match_missing_key_raises_not_found(any_store: Store) -> None:
    etag = any_store.put("other", b"x")
    with pytest.raises(ObjectNotFoundError):
        any_store.put_if_match("missing", b"y", etag)
    assert any_store.head("missing") is None


KEYS = [
    "_log/00000000000000000001.json",
    "_log/00000000000000000002.json",
    "_log/00000000000000000010.json",
    "_log/_checkpoint/last.json",
    "_logx",
    "a",
    "data/p0/seg-1.parquet",
]


def test_list_prefix_and_start_after_ordering(any_store: Store) -> None:
    for key in reversed(KEYS):
        any_store.put(key, key.encode())
    assert list(any_store.list("")) == KEYS
    assert list(any_store.list("_log/")) == KEYS[:4]
    assert list(any_store.list("_log")) == KEYS[:5]
    assert list(any_store.list("_log/0")) == KEYS[:3]
    assert list(any_store.list("_log/", start_after=KEYS[1])) == KEYS[2:4]
    assert list(any_store.list("_log/", start_after=KEYS[0][:-3])) == KEYS[:4]
    # start_after below the prefix does not matter; above every key yields nothing.
    assert list(any_store.list("_log/", start_after="0")) == KEYS[:4]
    assert list(any_store.list("_log/", start_after="_log/zzz")) == []
    assert list(any_store.list("", start_after="_logx")) == KEYS[5:]
    assert list(any_store.list("data/p1/")) == []
    assert list(any_store.list("nothing-here")) == []


def test_delete_is_idempotent(any_store: Store) -> None:
    any_store.put("gone/x", b"1")
    any_store.delete("gone/x")
    any_store.delete("gone/x")
    any_store.delete("never/existed")
    assert any_store.head("gone/x") is None
    assert list(any_store.list("gone/")) == []


@pytest.mark.parametrize("key", ["", "/abs", "../escape", "a/../b", "a//b", "./a", "a/", "a\\b"])
def test_invalid_keys_rejected(any_store: Store, key: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: any_store.get(key),
        lambda: any_store.head(key),
        lambda: any_store.put(key, b"x"),
        lambda: any_store.put_if_absent(key, b"x"),
        lambda: any_store.put_if_match(key, b"x", "etag"),
        lambda: any_store.delete(key),
    ]
    for call in calls:
        with pytest.raises(InvalidPathError):
            call()


def test_racing_put_if_absent_has_exactly_one_winner(any_store: Store) -> None:
    wins, losses = race(RACERS, lambda i: any_store.put_if_absent("_log/race.json", b"w%d" % i))
    assert len(wins) == 1, (wins, losses)
    assert len(losses) == RACERS - 1
    assert all(isinstance(e, ObjectExistsError) for e in losses.values()), losses
    [(winner, etag)] = wins.items()
    assert any_store.get("_log/race.json") == any_store.get("_log/race.json")
    assert any_store.get("_log/race.json").data == b"w%d" % winner
    assert any_store.get("_log/race.json").etag == etag


def test_racing_put_if_match_has_exactly_one_winner(any_store: Store) -> None:
    base = any_store.put("coordinator.json", b"epoch-0")
    wins, losses = race(
        RACERS, lambda i: any_store.put_if_match("coordinator.json", b"epoch-1-%d" % i, base)
    )
    assert len(wins) == 1, (wins, losses)
    assert all(
        isinstance(e, PreconditionFailedError) and not isinstance(e, ObjectExistsError)
        for e in losses.values()
    ), losses
    [(winner, etag)] = wins.items()
    obj = any_store.get("coordinator.json")
    assert (obj.data, obj.etag) == (b"epoch-1-%d" % winner, etag)


def test_list_children_names_one_level(any_store: Store) -> None:
    for key in KEYS:
        any_store.put(key, key.encode())
    top = sorted({k.split("/", 1)[0] for k in KEYS})
    assert list(any_store.list_children("")) == top
    assert list(any_store.list_children("_log/")) == [k.split("/")[1] for k in KEYS[:4]]
    assert list(any_store.list_children("nothing-here/")) == []


def test_objects_are_dated_by_the_stores_own_clock(any_store: Store) -> None:
    # Log cleanup measures a version's age as clock_ms() - modified_ms(key): one clock, the
    # store's, whatever the clients' clocks say. S3 dates objects in whole seconds.
    before = any_store.clock_ms()
    any_store.put_if_absent("dated/a.json", b"a")
    after = any_store.clock_ms()
    written = any_store.modified_ms("dated/a.json")
    assert written is not None
    assert before - 1000 <= written <= after + 1000
    assert any_store.modified_ms("dated/missing.json") is None
    any_store.delete("dated/a.json")
    assert any_store.modified_ms("dated/a.json") is None


def test_put_data_files_writes_every_file(any_store: Store) -> None:
    items = [(f"t/data/partition={p}/seg-{i}.parquet", bytes([p, i]) * 1000) for p in range(3)
             for i in range(2)]  # fmt: skip
    any_store.put_data_files(items)
    assert {key: any_store.get_data_file(key) for key, _ in items} == dict(items)
    assert list(any_store.list("t/data/")) == sorted(key for key, _ in items)
    assert list(any_store.list_children("t/data/")) == [f"partition={p}" for p in range(3)]
    any_store.put_data_files([])  # nothing to write is no error
