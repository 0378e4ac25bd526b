"""README.md's examples run as written, so README cannot drift from the code.

The ```python blocks run in order, in one namespace, in a fresh directory (README says so);
the Spark block and the S3 block run in their own slow tests. Every ``$ txntable ...`` line
of the ```console blocks runs in a shell in a fresh directory, must exit 0 and must print
the output lines README shows under it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: The endpoint README's S3 example points at (a MinIO on the reader's machine); the test
#: points the same code at the suite's moto server instead.
README_S3_ENDPOINT = "http://127.0.0.1:9000"
README_S3_BUCKET = "my-bucket"


def code_blocks(language: str) -> list[str]:
    """The bodies of README's fenced blocks of ``language``, in order."""
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def is_spark(block: str) -> bool:
    return "txntable_spark" in block


def is_s3(block: str) -> bool:
    return 'Warehouse("s3://' in block


def core_blocks() -> list[str]:
    return [b for b in code_blocks("python") if not is_spark(b) and not is_s3(b)]


def run_blocks(blocks: list[str], namespace: dict[str, Any]) -> None:
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i}", "exec"), namespace)


def test_readme_has_the_examples_this_test_runs() -> None:
    python = code_blocks("python")
    assert len(core_blocks()) >= 4
    assert sum(map(is_spark, python)) == 1
    assert sum(map(is_s3, python)) == 1
    assert code_blocks("console")


def test_python_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_blocks(core_blocks(), namespace)
    assert (tmp_path / "lake" / "orders" / "_log").is_dir()


def records_by_partition(table: Any) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of every row of an Arrow table of records, sorted."""
    columns = (table[name].to_pylist() for name in ("partition", "key", "value"))
    return sorted(zip(*columns, strict=True))


@pytest.mark.slow
@pytest.mark.spark
def test_spark_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    # Spark's Python workers must run this interpreter (the venv's), as in tests/spark.
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_blocks(core_blocks(), namespace)
    wh = namespace["wh"]
    shouted_before = wh.table("shouted").scan().to_arrow().num_rows
    run_blocks([b for b in code_blocks("python") if is_spark(b)], namespace)
    orders = wh.table("orders").scan().to_arrow()
    # The batch write appended every committed record of orders to shouted; the stream
    # mirrored orders record for record, partition by partition.
    assert wh.table("shouted").scan().to_arrow().num_rows == shouted_before + orders.num_rows
    assert records_by_partition(wh.table("mirror").scan().to_arrow()) == records_by_partition(
        orders
    )


@pytest.mark.slow
@pytest.mark.s3
def test_s3_example_runs_against_an_s3_server(
    moto_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    (block,) = [b for b in code_blocks("python") if is_s3(b)]
    assert README_S3_ENDPOINT in block
    boto3.client(
        "s3",
        endpoint_url=moto_server,
        region_name="us-east-1",
        aws_access_key_id="minioadmin",
        aws_secret_access_key="minioadmin",
    ).create_bucket(Bucket=README_S3_BUCKET)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_blocks([block.replace(README_S3_ENDPOINT, moto_server)], namespace)
    assert namespace["wh"].list_tables() == ["events"]


def console_commands() -> list[tuple[str, list[str]]]:
    """Each ``$ command`` of README's console blocks with the output lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for block in code_blocks("console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands and line.strip():
                commands[-1][1].append(line.rstrip())
    return commands


@pytest.mark.slow
def test_cli_examples_run_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    commands = console_commands()
    assert all(c.lstrip().startswith(("txntable ", "printf ", "echo ")) for c, _ in commands)
    for command, shown in commands:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        printed = [line.rstrip() for line in done.stdout.splitlines()]
        for line in shown:
            assert line in printed, f"{command}: README shows {line!r}; it printed {printed}"
