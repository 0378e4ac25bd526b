"""Fixtures of the transaction tests: local-disk warehouses in ``tmp_path``."""

from __future__ import annotations

import pathlib

import pytest

from txntable import Warehouse


@pytest.fixture
def wh(tmp_path: pathlib.Path) -> Warehouse:
    """An empty local-disk warehouse."""
    return Warehouse((tmp_path / "wh").as_uri())


@pytest.fixture
def wh2(wh: Warehouse) -> Warehouse:
    """A second, independent client of the same warehouse (its own store and handles)."""
    return Warehouse(wh.url)
