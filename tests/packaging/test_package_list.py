"""pyproject.toml lists every package directory: a list does not recurse, so a new
sub-package missing from it would be missing from the wheel (fast guard; test_wheel.py
checks the built wheel itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_directory() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "txntable").rglob("__init__.py")
    } | {
        ".".join(("txntable_spark", *p.parent.relative_to(REPO / "spark").parts))
        for p in (REPO / "spark").rglob("__init__.py")
    }
    assert listed == on_disk
    assert config["package-dir"] == {"txntable_spark": "spark"}
