"""Start-up cost (issue 20): what a fresh process loads for ``import txntable``, for
``txntable --help`` and for a local warehouse. Checked by the modules loaded, not by time
(speed claims live in bench/startup.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pyarrow", "numpy", "boto3", "botocore", "rich", "pandas", "pyspark")


def loaded_after(code: str) -> set[str]:
    """The heavy top-level packages a fresh interpreter has loaded after running ``code``."""
    script = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_txntable_loads_no_heavy_package() -> None:
    assert loaded_after("import txntable") == set()


def test_help_loads_no_heavy_package() -> None:
    code = (
        "import contextlib, io\nfrom txntable.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0"
    )
    assert loaded_after(code) == set()


def test_public_names_load_on_first_use() -> None:
    import txntable
    from txntable.producer.producer import Producer

    assert txntable.Producer is Producer
    assert "Warehouse" in dir(txntable)
    assert set(txntable.__all__) <= set(dir(txntable))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = txntable.Nope  # type: ignore[attr-defined]


def test_a_local_warehouse_loads_no_s3_client(tmp_path: Path) -> None:
    code = (
        "from txntable import Warehouse, Producer, Consumer\n"
        f"wh = Warehouse({str(tmp_path / 'lake')!r})\n"
        "wh.create_table('t', partitions=1)\n"
        "wh.table('t').scan().to_arrow()"
    )
    assert loaded_after(code) == {"pyarrow", "numpy"}


def test_every_public_name_resolves() -> None:
    import txntable

    assert sorted(txntable._MODULES) == sorted(txntable.__all__)
    for name in txntable.__all__:
        assert getattr(txntable, name) is not None
