"""Local disk writes durably: a batch of segment files has every file fsynced before any is
renamed into place, and each directory once after its renames (issue 20); a log version or a
coordinator object has its directory synced after the link or rename, before the write
returns; a new directory's parent is synced (spec: Storage requirements, local disk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txntable.errors import InvalidPathError
from txntable.storage import LocalStore


def test_every_file_is_synced_before_any_rename_and_each_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(str(tmp_path))
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("dir" if os.path.isdir(path) else "file", path))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("rename", dst))
        real_replace(src, dst)

    keys = ["t/data/partition=0/a", "t/data/partition=0/b", "t/data/partition=1/c"]
    for k in keys:  # the directories exist (their creation is synced: another test)
        os.makedirs(os.path.dirname(tmp_path / k), exist_ok=True)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.put_data_files([(k, k.encode()) for k in keys])

    kinds = [kind for kind, _ in events]
    assert kinds == ["file"] * 3 + ["rename"] * 3 + ["dir"] * 2
    assert [p for kind, p in events if kind == "rename"] == [str(tmp_path / k) for k in keys]
    assert [p for kind, p in events if kind == "dir"] == [
        str(tmp_path / "t/data/partition=0"),
        str(tmp_path / "t/data/partition=1"),
    ]
    assert all(store.get_data_file(k) == k.encode() for k in keys)


def test_a_single_data_file_is_synced_with_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(str(tmp_path))
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    os.makedirs(tmp_path / "t/data/partition=0")
    monkeypatch.setattr(os, "fsync", fsync)
    store.put_data_file("t/data/partition=0/a", b"x")
    assert len(synced) == 2 and synced[1] == str(tmp_path / "t/data/partition=0")


def _record_syncs(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, str]]) -> None:
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("dir" if os.path.isdir(path) else "file", path))
        real_fsync(fd)

    def link(src: str, dst: str) -> None:
        real_link(src, dst)
        events.append(("name", dst))

    def replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        events.append(("name", dst))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("write", ["put", "put_if_absent", "put_if_match"])
def test_a_log_or_coordinator_write_syncs_its_directory_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    # Without the directory sync a version acknowledged before a power loss may vanish:
    # its records were acknowledged to a producer and would be lost.
    store = LocalStore(str(tmp_path))
    key = "t/_txn_log/00000000000000000007.json"
    os.makedirs(tmp_path / "t/_txn_log")
    etag = store.put(key, b"old") if write == "put_if_match" else ""
    events: list[tuple[str, str]] = []
    _record_syncs(monkeypatch, events)
    if write == "put_if_match":
        store.put_if_match(key, b"new", etag)
    else:
        getattr(store, write)(key, b"new")
    directory = str(tmp_path / "t/_txn_log")
    assert events == [("file", events[0][1]), ("name", str(tmp_path / key)), ("dir", directory)]
    assert store.get(key).data == b"new"


def test_new_directories_are_synced_into_their_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(str(tmp_path))
    os.makedirs(tmp_path / "t")
    events: list[tuple[str, str]] = []
    _record_syncs(monkeypatch, events)
    store.put_if_absent("t/_txn_log/sub/00000000000000000000.json", b"v0")
    dirs = [p for kind, p in events if kind == "dir"]
    # each new directory's parent (t, then _txn_log) before anything is written into it,
    # then the directory holding the new name
    assert dirs == [
        str(tmp_path / "t"),
        str(tmp_path / "t/_txn_log"),
        str(tmp_path / "t/_txn_log/sub"),
    ]
    assert [kind for kind, _ in events][:2] == ["dir", "dir"]


def test_a_failed_batch_leaves_no_file_behind(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "blocked").write_bytes(b"a file where a directory belongs")
    with pytest.raises(FileExistsError):  # as any local put there
        store.put_data_files([("t/ok/a", b"1"), ("t/blocked/b", b"2")])
    assert sorted(os.listdir(tmp_path / "t" / "ok")) == []  # no temporary, no final name
    with pytest.raises(InvalidPathError):
        store.put_data_files([("t/ok/a", b"1"), ("../escape", b"2")])
    assert sorted(os.listdir(tmp_path / "t" / "ok")) == []
