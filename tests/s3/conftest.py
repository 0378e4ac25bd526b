"""Fixtures for the end-to-end S3 tests: a fresh bucket per test on the session moto server.

The moto server (``moto_server`` in ``tests/conftest.py``) runs in this process with atomic
conditional puts; every test gets its own bucket and warehouse ``s3://<bucket>/wh``.
Helpers live in ``s3util.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import storeutil
from s3util import S3Location

from txntable import Producer, Warehouse
from txntable.errors import ProducerFencedError


@pytest.fixture
def s3_location(moto_server: str) -> S3Location:
    """A fresh bucket; the warehouse URL is ``s3://<bucket>/wh``."""
    bucket = storeutil.create_bucket(moto_server)
    return S3Location(moto_server, bucket, f"s3://{bucket}/wh", storeutil.s3_options(moto_server))


@pytest.fixture
def s3_wh(s3_location: S3Location) -> Iterator[Warehouse]:
    """A warehouse opened by URL + storage options, as a user would."""
    wh = Warehouse(s3_location.url, storage_options=s3_location.options)
    yield wh
    wh.store.close()


@pytest.fixture
def make_producer() -> Iterator[Callable[..., Producer]]:
    """Build producers that are closed after the test (fenced ones included)."""
    producers: list[Producer] = []

    def make(warehouse: Warehouse, **kwargs: Any) -> Producer:
        producer = Producer(warehouse, **kwargs)
        producers.append(producer)
        return producer

    yield make
    for producer in producers:
        try:
            producer.close(timeout=10)
        except ProducerFencedError:
            pass  # a fenced producer's buffered records cannot be flushed; nothing to clean
