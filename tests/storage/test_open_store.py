"""open_store URL dispatch and the fsspec fallback store."""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from txntable.errors import (
    ConditionalWriteUnsupportedError,
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from txntable.storage import (
    LocalStore,
    MemoryStore,
    S3Store,
    open_store,
)
from txntable.storage.arrowfs import arrow_filesystem
from txntable.storage.fsspec_store import FsspecStore


class TxnMemFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem under a scheme open_store does not handle itself."""

    protocol = ("txnmem",)


class NoExclusiveFileSystem(MemoryFileSystem):
    """A filesystem without exclusive create."""

    protocol = ("noexcl",)

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "x" in mode:
            raise ValueError(f"unsupported mode {mode!r}")
        return super()._open(path, mode, *args, **kwargs)


fsspec.register_implementation("txnmem", TxnMemFileSystem, clobber=True)
fsspec.register_implementation("noexcl", NoExclusiveFileSystem, clobber=True)


def test_local_urls(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"file://{tmp_path}/a")
    assert isinstance(store, LocalStore) and store.root == str(tmp_path / "a")
    assert isinstance(open_store(str(tmp_path / "b")), LocalStore)
    monkeypatch.chdir(tmp_path)
    rel = open_store("rel/wh")
    assert isinstance(rel, LocalStore) and rel.root == os.path.join(str(tmp_path), "rel", "wh")
    reopened = open_store(rel.url)  # url reopens the same store
    assert isinstance(reopened, LocalStore) and reopened.root == rel.root


def test_memory_urls_share_by_name() -> None:
    name = f"open-{uuid.uuid4().hex}"
    a, b = open_store(f"memory://{name}"), open_store(f"memory://{name}/")
    assert isinstance(a, MemoryStore)
    a.put("k", b"v")
    assert b.get("k").data == b"v"
    MemoryStore.drop(name)


def test_s3_urls(mock_s3: None) -> None:
    store = open_store("s3a://bkt/wh/", {"s3.region": "us-east-1"})
    assert isinstance(store, S3Store)
    assert store.url == "s3://bkt/wh"
    assert store.storage_options() == {"s3.region": "us-east-1"}


@pytest.mark.parametrize(
    "url",
    ["", "   ", "file://otherhost/x", "file://relative", "nosuchproto://x/y", "s3://", "s3:bkt/x"],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidPathError):
        open_store(url)


def test_fsspec_store_via_open_store() -> None:
    root = f"txnmem://bucket-{uuid.uuid4().hex[:8]}/wh"
    store = open_store(root)
    assert isinstance(store, FsspecStore)
    with pytest.raises(ObjectNotFoundError):
        store.get("missing")
    etag = store.put_if_absent("_log/2.json", b"two")
    store.put("_log/1.json", b"one")
    store.put("data/x", b"x")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("_log/2.json", b"again")
    assert store.get("_log/2.json").data == b"two"
    info = store.head("_log/2.json")
    assert info is not None and info.etag == etag == store.get("_log/2.json").etag
    assert list(store.list("_log/")) == ["_log/1.json", "_log/2.json"]
    assert list(store.list("", start_after="_log/1.json")) == ["_log/2.json", "data/x"]
    with pytest.raises(ConditionalWriteUnsupportedError):
        store.put_if_match("_log/2.json", b"x", etag)
    store.delete("data/x")
    store.delete("data/x")
    assert store.head("data/x") is None
    with pytest.raises(InvalidPathError):
        store.get("../escape")
    result = arrow_filesystem(store)
    assert result is not None
    fs, base = result
    with fs.open_input_stream(f"{base}/_log/1.json") as f:
        assert f.read() == b"one"


def test_fsspec_store_without_exclusive_create() -> None:
    store = open_store(f"noexcl://b-{uuid.uuid4().hex[:8]}/wh")
    store.put("k", b"plain writes work")
    with pytest.raises(ConditionalWriteUnsupportedError):
        store.put_if_absent("k2", b"x")


def test_opening_a_local_warehouse_creates_nothing_until_a_write(tmp_path: pathlib.Path) -> None:
    from txntable import Consumer, Warehouse
    from txntable.errors import TableNotFoundError

    root = tmp_path / "not" / "yet" / "lake"
    wh = Warehouse(root.as_uri())
    assert wh.list_tables() == []
    with pytest.raises(TableNotFoundError):
        wh.table("t")
    Consumer(wh).close()
    wh.recover()
    assert not (tmp_path / "not").exists()  # reading created no directory
    wh.create_table("t")
    assert (root / "t" / "_log").is_dir()
    assert Warehouse(root.as_uri()).list_tables() == ["t"]


@pytest.mark.parametrize("below", [False, True], ids=["the-file", "below-a-file"])
def test_a_local_warehouse_on_a_file_is_a_typed_error(tmp_path: pathlib.Path, below: bool) -> None:
    from txntable import Warehouse

    file = tmp_path / "data.txt"
    file.write_text("not a warehouse")
    path = file / "lake" if below else file
    with pytest.raises(InvalidPathError, match="is a file, not a directory"):
        Warehouse(path.as_uri())
    with pytest.raises(InvalidPathError, match="is a file, not a directory"):
        open_store(str(path))
    assert file.read_text() == "not a warehouse"
