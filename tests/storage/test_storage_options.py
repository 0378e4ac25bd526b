"""Unknown storage options are refused, never ignored (issue 9, item 4).

A typo like ``s3.endpont`` or a boto3/s3fs spelling like ``endpoint_url`` used to fall back
to the defaults silently (a request to AWS, ``NoCredentialsError``). Each entry point —
``Warehouse``/``open_store``, the CLI's ``-o`` and Spark's ``storage.*`` options — raises
``InvalidConfigurationError`` naming the unknown key and the accepted ones.
"""

from __future__ import annotations

import pathlib
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from txntable import Warehouse
from txntable.cli import main
from txntable.errors import InvalidConfigurationError, InvalidPathError
from txntable.storage import (
    MemoryStore,
    S3Store,
    check_storage_options,
    open_store,
    storage_option_names,
)
from txntable.storage.fsspec_store import FsspecStore, fsspec_option_names
from txntable.storage.s3 import S3_OPTIONS


class OptionsMemFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem under a scheme open_store leaves to fsspec."""

    protocol = "txnopts"
    root_marker = ""


fsspec.register_implementation("txnopts", OptionsMemFileSystem, clobber=True)

S3_ACCEPTED = ", ".join(sorted(S3_OPTIONS))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"endpoint_url": "http://127.0.0.1:9000"}, "'endpoint_url'"),
        ({"s3.endpont": "http://127.0.0.1:9000", "s3.region": "us-east-1"}, "'s3.endpont'"),
        ({"s3.region": "us-east-1", "region": "x", "s3.key": "k"}, "'region', 's3.key'"),
    ],
)
def test_s3_refuses_unknown_options(options: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        Warehouse("s3://bucket/wh", storage_options=options)
    message = str(info.value)
    assert f"option{'s' if ',' in named else ''} {named} for S3; accepted: {S3_ACCEPTED}" in (
        message
    )
    assert "s3.endpoint" in message and "http://127.0.0.1:9000" not in message
    with pytest.raises(InvalidConfigurationError, match=named):
        S3Store("s3://bucket/wh", options)


def test_s3_accepts_every_documented_option() -> None:
    options = {name: "1" for name in S3_OPTIONS} | {
        "s3.allow-http": "true",
        "s3.addressing-style": "path",
        "s3.endpoint": "http://127.0.0.1:9",
        "s3.region": "us-east-1",
    }
    store = open_store("s3://bucket/wh", options)
    assert isinstance(store, S3Store) and store.storage_options() == options
    store.close()


def test_local_and_memory_stores_take_no_options(tmp_path: pathlib.Path) -> None:
    for url in (f"file://{tmp_path}/a", str(tmp_path / "b"), f"memory://{uuid.uuid4().hex}"):
        with pytest.raises(
            InvalidConfigurationError, match=r"option 's3\.endpoint' for .*; accepted: none"
        ):
            Warehouse(url, storage_options={"s3.endpoint": "http://127.0.0.1:9000"})
        assert storage_option_names(url) == frozenset()
    assert not (tmp_path / "a").exists()  # refused before anything was created
    Warehouse(f"file://{tmp_path}/c", storage_options={})  # no options is fine


def test_options_with_a_store_are_refused() -> None:
    store = MemoryStore(uuid.uuid4().hex)
    with pytest.raises(InvalidConfigurationError, match="given store is used as it is"):
        Warehouse(store=store, storage_options={"s3.region": "x"})
    assert Warehouse(store=store, storage_options={}).store is store


def test_fsspec_options_are_the_filesystem_keywords() -> None:
    url = f"txnopts://b-{uuid.uuid4().hex[:8]}/wh"
    accepted = storage_option_names(url)
    assert accepted is not None and {"skip_instance_cache", "global_store"} <= accepted
    store = open_store(url, {"skip_instance_cache": True})  # type: ignore[dict-item]
    assert isinstance(store, FsspecStore)
    with pytest.raises(InvalidConfigurationError, match=r"'endpoint' for fsspec txnopts://"):
        open_store(url, {"endpoint": "x"})
    with pytest.raises(InvalidConfigurationError, match="'endpoint'"):
        FsspecStore(url, {"endpoint": "x"})
    assert fsspec_option_names("simplecache::txnopts://b/wh") is None  # nested per protocol


def test_a_malformed_url_is_reported_before_the_options() -> None:
    with pytest.raises(InvalidPathError):
        check_storage_options("s3:bucket/wh", {"nonsense": "1"})


def test_cli_option_typo(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-o", "s3.endpont=http://127.0.0.1:9", "tables", "s3://bucket/wh"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "txntable: InvalidConfigurationError: unknown storage option 's3.endpont' for S3; "
        f"accepted: {S3_ACCEPTED}"
    )
    assert main(["-o", "s3.region=us-east-1", "tables", str(tmp_path)]) == 1
    assert "option 's3.region' for local disk; accepted: none" in capsys.readouterr().err


def test_spark_storage_options_are_checked_when_parsed() -> None:
    options_mod = pytest.importorskip("txntable_spark.options")
    with pytest.raises(InvalidConfigurationError, match="'s3.endpont' for S3"):
        options_mod.parse_read_options(
            {"path": "s3://bucket/wh/orders", "storage.s3.endpont": "http://127.0.0.1:9"}
        )
    with pytest.raises(InvalidConfigurationError, match="'endpoint_url' for S3"):
        options_mod.parse_write_options(
            {"path": "s3://bucket/wh/orders", "storage.endpoint_url": "http://127.0.0.1:9"}
        )
    opts = options_mod.parse_read_options(
        {"path": "s3://bucket/wh/orders", "storage.s3.endpoint": "http://127.0.0.1:9"}
    )
    assert opts.location.storage_options == {"s3.endpoint": "http://127.0.0.1:9"}
