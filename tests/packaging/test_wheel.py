"""The built wheel, installed into a fresh venv as a user would, works without the checkout.

Every other test runs against an editable install, which cannot see a package missing from the
wheel (a wheel once lacked ``txntable/storage``). Here the wheel is built from a copy of the
source tree, installed with its dependencies (``[spark]``, ~20 s from pip's cache) into a new
venv, and run from a directory outside the checkout with no PYTHONPATH: the README demo, the
console script, and a Spark read on ``local-cluster`` (separate executor processes that import
the installed wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# alone: the fixture builds and installs a wheel, the last test starts three JVMs.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Installed:
    """A fresh venv holding the installed wheel."""

    wheel: Path
    python: Path
    bin: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str | Path, timeout: float = 300) -> str:
        """Run a command in the venv's clean environment; return stdout, fail with stderr."""
        proc = subprocess.run(
            [str(a) for a in args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout


def clean_env(venv_bin: Path) -> dict[str, str]:
    """The environment minus anything that would point Python at the checkout or test venv."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYSPARK_")}
    test_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != test_bin]
    env["PATH"] = os.pathsep.join([str(venv_bin), *path])
    env["PYTHONNOUSERSITE"] = "1"
    env["PYSPARK_PYTHON"] = str(venv_bin / "python")
    env["PYSPARK_DRIVER_PYTHON"] = str(venv_bin / "python")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools reuses build/ in the source tree, and a stale build/lib
    # would put modules into the wheel that the tree no longer has.
    src = root / "src"
    src.mkdir()
    shutil.copy2(REPO / "pyproject.toml", src)
    shutil.copy2(REPO / "README.md", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "txntable", src / "txntable", ignore=ignore)
    shutil.copytree(REPO / "spark", src / "spark", ignore=ignore)
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("txntable-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    cwd = root / "cwd"
    cwd.mkdir()
    inst = Installed(wheel, venv / "bin" / "python", venv / "bin", clean_env(venv / "bin"), cwd)
    inst.run(inst.python, "-m", "pip", "install", "-q", f"{wheel}[spark]", timeout=600)
    yield inst


def test_wheel_holds_every_package_of_the_tree(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        shipped = {n for n in zf.namelist() if n.endswith(".py")}
    expected = {p.relative_to(REPO).as_posix() for p in (REPO / "txntable").rglob("*.py")} | {
        "txntable_spark/" + p.relative_to(REPO / "spark").as_posix()
        for p in (REPO / "spark").rglob("*.py")
    }
    expected = {e for e in expected if "__pycache__" not in e}
    assert shipped == expected


def test_installed_package_imports_from_the_venv_not_the_checkout(installed: Installed) -> None:
    out = installed.run(
        installed.python,
        "-c",
        textwrap.dedent(
            """
            import json, sys
            import txntable
            from txntable import Consumer, Producer, Warehouse
            from txntable.storage import LocalStore
            pyspark_loaded = "pyspark" in sys.modules
            import txntable_spark
            print(json.dumps([txntable.__file__, txntable_spark.__file__, pyspark_loaded]))
            """
        ),
    )
    txn_file, spark_file, pyspark_loaded = json.loads(out)
    venv = installed.python.parent.parent
    assert Path(txn_file).is_relative_to(venv)
    assert Path(spark_file).is_relative_to(venv)
    assert pyspark_loaded is False  # the core library never needs Spark
    assert "Usage" in installed.run(installed.bin / "txntable", "--help")


def test_readme_demo_runs_from_the_installed_wheel(installed: Installed) -> None:
    lake = installed.cwd / "demo-lake"
    out = installed.run(installed.python, REPO / "examples" / "demo.py", lake)
    committed = out.split("read_committed:\n")[1].split("\n\n")[0].splitlines()
    assert committed[:5] == [
        "  orders[0] offset 0: b'order 0 (committed)'",
        "  orders[0] offset 1: b'order 1 (committed)'",
        "  orders[0] offset 2: b'order 2 (committed)'",
        "  orders[1] offset 0: b'idempotent 0'",
        "  orders[1] offset 1: b'idempotent 1'",
    ]
    assert out.rstrip().endswith("partition 1: log start 0, HW 5, LSO 5, open transactions: []")


SPARK_READ = """
import json, os, sys
from txntable import Producer, Warehouse

lake = sys.argv[1]
wh = Warehouse(lake)
wh.create_table("orders", partitions=2)
producer = Producer(wh, transactional_id="etl")
producer.init_transactions()
producer.begin_transaction()
for i in range(4):
    producer.send("orders", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
producer.commit_transaction()
producer.begin_transaction()
producer.send("orders", value=b"aborted", partition=0)
producer.flush()
producer.abort_transaction()
producer.close()

from pyspark.sql import SparkSession
import txntable_spark

spark = (
    SparkSession.builder.master("local-cluster[2,1,1024]")
    .appName("txntable-wheel")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
txntable_spark.register(spark)
try:
    committed = spark.read.format("txntable").load(f"{lake}/orders").collect()
    everything = (
        spark.read.format("txntable").option("isolation.level", "read_uncommitted")
        .load(f"{lake}/orders").collect()
    )
    where = spark.sparkContext.parallelize(range(2), 2).map(
        lambda _: (__import__("txntable").__file__, __import__("os").getpid())
    ).collect()
finally:
    spark.stop()
print(json.dumps({
    "committed": sorted([r["partition"], r["offset"], r["key"].decode(), r["value"].decode()]
                        for r in committed),
    "uncommitted": sorted([r["partition"], r["offset"], r["value"].decode()]
                          for r in everything),
    "executor_files": sorted({f for f, _ in where}),
    "executor_pids": sorted({p for _, p in where}),
    "driver_pid": os.getpid(),
}))
"""


@pytest.mark.spark
def test_spark_on_local_cluster_reads_a_table_written_by_the_install(
    installed: Installed,
) -> None:
    script = installed.cwd / "spark_read.py"
    script.write_text(SPARK_READ)
    out = installed.run(installed.python, script, installed.cwd / "spark-lake", timeout=600)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["committed"] == [
        [0, 0, "k0", "v0"],
        [0, 1, "k2", "v2"],
        [1, 0, "k1", "v1"],
        [1, 1, "k3", "v3"],
    ]
    assert got["uncommitted"] == [
        [0, 0, "v0"],
        [0, 1, "v2"],
        [0, 3, "aborted"],
        [1, 0, "v1"],
        [1, 1, "v3"],
    ]
    # Executors are separate processes importing the installed wheel, not the checkout.
    venv = installed.python.parent.parent
    assert [Path(f).is_relative_to(venv) for f in got["executor_files"]] == [True]
    assert got["driver_pid"] not in got["executor_pids"]
