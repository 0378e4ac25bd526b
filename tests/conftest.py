"""Shared pytest fixtures. Each section is owned by one area; append yours at the end."""

from __future__ import annotations

# --- S3 / moto fixtures ---------------------------------------------------------------------
# moto_server (session): ThreadedMotoServer URL with atomic conditional puts.
# mock_s3: in-process moto (mock_aws) with fake env credentials; for fast S3 unit tests.
# s3_store: S3Store on a fresh bucket of moto_server.
# any_store: a fresh store, parametrized over memory / local / s3 (s3 marked s3 + slow).
import collections.abc as _abc
import logging as _logging
import os as _os
import pathlib as _pathlib
import uuid as _uuid
from typing import Any as _Any

import pytest
import storeutil as _storeutil
import tableutil as _tableutil

from txntable import Producer as _Producer
from txntable import Warehouse as _Warehouse
from txntable.storage import MemoryStore as _MemoryStore
from txntable.storage import S3Store as _S3Store
from txntable.storage import Store as _Store

_AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": _storeutil.TEST_ACCESS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": _storeutil.TEST_SECRET_ACCESS_KEY,
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": _storeutil.TEST_REGION,
    # Keep the developer's ~/.aws out of the tests.
    "AWS_CONFIG_FILE": _os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": _os.devnull,
}


@pytest.fixture(scope="session")
def moto_server() -> _abc.Iterator[str]:
    """Start an in-process moto S3 server on a free port; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    _storeutil.make_moto_conditional_puts_atomic()
    # The server thread logs every request (412s in red) to stderr; keep test output clean.
    _logging.getLogger("werkzeug").setLevel(_logging.ERROR)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _AWS_TEST_ENV.items():
            mp.setenv(name, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def mock_s3(monkeypatch: pytest.MonkeyPatch) -> _abc.Iterator[None]:
    """In-process moto (no HTTP server); create S3 clients/stores inside the test."""
    from moto import mock_aws

    _storeutil.make_moto_conditional_puts_atomic()
    for name, value in _AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield


@pytest.fixture
def s3_store(moto_server: str) -> _abc.Iterator[_S3Store]:
    """An S3Store at ``s3://<fresh bucket>/wh`` on the moto server."""
    store = _S3Store(
        f"s3://{_storeutil.create_bucket(moto_server)}/wh", _storeutil.s3_options(moto_server)
    )
    yield store
    store.close()


@pytest.fixture(
    params=[
        "memory",
        "local",
        pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow]),
    ]
)
def any_store(request: pytest.FixtureRequest, tmp_path: _pathlib.Path) -> _abc.Iterator[_Store]:
    """A fresh, empty store of each backend kind."""
    kind: str = request.param
    endpoint = request.getfixturevalue("moto_server") if kind == "s3" else None
    store = _storeutil.make_store(kind, tmp_path, s3_endpoint=endpoint)
    yield store
    store.close()
    if isinstance(store, _MemoryStore):
        _MemoryStore.drop(store.url.removeprefix("memory://"))


# --- table fixtures -------------------------------------------------------------------------
# memory_store, wh (a warehouse on it), local_wh, recording_store, fault_store, make_producer.
@pytest.fixture
def memory_store() -> _abc.Iterator[_MemoryStore]:
    """A fresh, uniquely named memory store, dropped afterwards."""
    name = f"core-{_uuid.uuid4().hex}"
    store = _MemoryStore(name)
    yield store
    _MemoryStore.drop(name)

@pytest.fixture
def wh(memory_store: _MemoryStore) -> _Warehouse:
    """A warehouse on a fresh memory store."""
    return _Warehouse(store=memory_store)

@pytest.fixture
def local_wh(tmp_path: _pathlib.Path) -> _Warehouse:
    """A warehouse on local disk, opened by URL."""
    return _Warehouse(f"file://{tmp_path}/lake")

@pytest.fixture
def recording_store(memory_store: _MemoryStore) -> _tableutil.RecordingStore:
    """A GET-recording, request-counting wrapper of a fresh memory store."""
    return _tableutil.RecordingStore(memory_store)

@pytest.fixture
def fault_store(memory_store: _MemoryStore) -> _tableutil.ReadFaultStore:
    """A fault-injecting wrapper (writes and GETs) of a fresh memory store."""
    return _tableutil.ReadFaultStore(memory_store)

@pytest.fixture
def make_producer() -> _abc.Iterator[_abc.Callable[..., _Producer]]:
    """Build producers (manual flush by default) that are closed after the test."""
    producers: list[_Producer] = []

    def make(warehouse: _Warehouse, **kwargs: _Any) -> _Producer:
        options = {**_tableutil.MANUAL_FLUSH, **kwargs}
        producer = _Producer(warehouse, **options)
        producers.append(producer)
        return producer

    yield make
    for producer in producers:
        producer.close(timeout=10)
