"""Long commands draw progress on stderr when it is a terminal (forced here with --color
always), with units; piped, they draw nothing."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from cliutil import invoke

from txntable import Producer, Warehouse

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def bars(*args: str) -> str:
    """stderr of a command run as on a terminal, without the escape codes."""
    result = invoke("--color", "always", *args)
    assert result.exit_code == 0, result.stderr
    return ANSI.sub("", result.stderr)


@pytest.fixture
def lake(tmp_path: Path) -> str:
    url = str(tmp_path / "lake")
    wh = Warehouse(url)
    wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact"})
    p = Producer(wh, linger_ms=600_000, batch_size=1 << 30)
    for _ in range(3):
        for k in range(5):
            p.send("t", key=b"k%d" % k, value=b"v" * 100, partition=0)
        p.flush()
    p.close()
    wh.store.put_data_file(f"t/data/0/{1000:013d}-{uuid.uuid4().hex}.parquet", b"x")
    return url


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["optimize"], r"optimize t: rewrite .* \d+\.\d KiB/\d+\.\d KiB"),
        (["compact"], r"compact t: keys .* KiB/.* KiB"),
        (["checkpoint"], r"checkpoint of t: write .* 3/3 entries"),  # 3 batches
        (["vacuum", "--retention-hours", "1"], r"vacuum of t: delete .* 1/1 files"),
        (["maintain"], r"maintain t: steps .* 7/7 steps"),
        (["consume"], r"consume t: read .* \d+/15 offsets"),
        (["drop", "--yes"], r"dropping t: delete .* \d+/\d+ objects"),
    ],
)
def test_long_commands_show_progress_with_units(
    lake: str, args: list[str], shown: str
) -> None:
    command, *rest = args
    assert re.search(shown, bars(command, lake, "t", *rest)), bars(command, lake, "t", *rest)


def test_piped_there_is_no_progress(lake: str) -> None:
    result = invoke("optimize", lake, "t")
    assert result.exit_code == 0 and result.stderr == ""
