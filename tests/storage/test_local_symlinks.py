"""A local warehouse never reads or writes through a symlink that leads out of its root
(ObjectNotFoundError, as for a missing object), and follows one that stays inside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txntable.errors import ObjectNotFoundError
from txntable.storage import LocalStore


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    (out / "_log").mkdir(parents=True)
    (out / "_log" / "secret.json").write_bytes(b"secret\n")
    return out


def test_a_directory_symlink_out_of_the_root_is_neither_read_nor_written(
    tmp_path: Path, outside: Path
) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    os.symlink(outside, root / "t")
    store = LocalStore(str(root))

    with pytest.raises(ObjectNotFoundError):
        store.get("t/_log/secret.json")
    assert not store.exists("t/_log/secret.json")
    assert store.modified_ms("t/_log/secret.json") is None
    with pytest.raises(ObjectNotFoundError):
        store.put("t/_log/new.json", b"x\n")
    assert not (outside / "_log" / "new.json").exists()


def test_a_file_symlink_out_of_the_root_is_not_read(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "lake"
    (root / "t" / "_log").mkdir(parents=True)
    os.symlink(outside / "_log" / "secret.json", root / "t" / "_log" / "0.json")
    store = LocalStore(str(root))

    with pytest.raises(ObjectNotFoundError):
        store.get("t/_log/0.json")
    assert not store.exists("t/_log/0.json")


def test_a_symlink_that_stays_inside_the_root_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    (root / "real" / "_log").mkdir(parents=True)
    (root / "real" / "_log" / "0.json").write_bytes(b"zero\n")
    os.symlink(root / "real", root / "t")
    store = LocalStore(str(root))

    assert store.get("t/_log/0.json").data == b"zero\n"
    assert store.exists("t/_log/0.json")
    store.put("t/_log/1.json", b"one\n")
    assert (root / "real" / "_log" / "1.json").read_bytes() == b"one\n"


def test_a_root_reached_through_a_symlink_works(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    os.symlink(tmp_path / "disk", tmp_path / "lake")
    store = LocalStore(str(tmp_path / "lake"))

    store.put("t/_log/0.json", b"zero\n")
    assert store.get("t/_log/0.json").data == b"zero\n"
    with pytest.raises(ObjectNotFoundError):
        store.get("t/_log/1.json")
