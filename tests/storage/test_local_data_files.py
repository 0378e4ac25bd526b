"""Local disk writes a batch of segment files durably: every file is fsynced before any is
renamed into place, and each directory once after its renames (issue 20; spec: Storage
requirements, local disk)."""

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

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    keys = ["t/data/partition=0/a", "t/data/partition=0/b", "t/data/partition=1/c"]
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

    monkeypatch.setattr(os, "fsync", fsync)
    store.put_data_file("t/data/partition=0/a", b"x")
    assert len(synced) == 2 and synced[1] == str(tmp_path / "t/data/partition=0")


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
