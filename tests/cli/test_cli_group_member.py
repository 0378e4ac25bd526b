"""``txntable consume --group`` joins the group as kafka-console-consumer does: it reads the
partitions the group assigns it and commits as a member of a generation, never over the
offsets of another live member."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cliutil import invoke

from txntable import Consumer, OffsetAndMetadata, Producer, TopicPartition, Warehouse


def committed(url: str) -> dict[int, tuple[int, int]]:
    """Partition → (committed offset, generation) of group ``g`` on table ``t``."""
    result = invoke("groups", url, "g", "--json")
    assert result.exit_code == 0, result.stderr
    (group,) = json.loads(result.stdout)
    return {o["partition"]: (o["offset"], o["generation"]) for o in group["offsets"]}


@pytest.fixture
def lake(tmp_path: Path) -> str:
    """Table ``t``: 2 partitions of 5 records each, ``p<partition>-<offset>``."""
    url = str(tmp_path / "lake")
    wh = Warehouse(url)
    wh.create_table("t", partitions=2)
    with Producer(wh) as p:
        for i in range(5):
            for partition in (0, 1):
                p.send("t", value=f"p{partition}-{i}".encode(), partition=partition)
    return url


def test_consume_with_a_group_commits_as_a_member_and_leaves(lake: str) -> None:
    result = invoke("consume", lake, "t", "--group", "g", "--format", "value", "-n", "3")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    offsets = committed(lake)
    assert sum(offset for offset, _ in offsets.values()) == 3
    # Committed in generation 1 of the group it joined (assign() would commit as -1) ...
    assert {generation for _, generation in offsets.values()} == {1}
    (group,) = json.loads(invoke("groups", lake, "g", "--json").stdout)
    assert group["members"] == []  # ... and it left when done
    rest = invoke("consume", lake, "t", "--group", "g", "--format", "value").stdout.splitlines()
    assert len(rest) == 7 and committed(lake) == {0: (5, 3), 1: (5, 3)}


@pytest.fixture
def live_member(lake: str) -> Iterator[Consumer]:
    """A subscribed member of ``g`` that committed offset 3 on both partitions and keeps
    polling (heartbeating, following rebalances) without reading more."""
    member = Consumer(
        Warehouse(lake),
        group_id="g",
        auto_offset_reset="earliest",
        heartbeat_interval_ms=100,
        session_timeout_ms=10_000,
        enable_auto_commit=False,
    )
    member.subscribe(["t"])
    member.poll(0)
    assert len(member.assignment()) == 2
    member.commit({TopicPartition("t", p): OffsetAndMetadata(3) for p in (0, 1)})
    stop = threading.Event()

    def keep_polling() -> None:
        while not stop.is_set():
            member.pause(member.assignment())
            member.poll(50)

    thread = threading.Thread(target=keep_polling)
    thread.start()
    yield member
    stop.set()
    thread.join()
    member.close()


def test_consume_with_a_group_reads_only_what_the_group_assigns_it(
    lake: str, live_member: Consumer
) -> None:
    result = invoke("consume", lake, "t", "--group", "g", "--format", "value")
    assert result.exit_code == 0, result.stderr
    printed = result.stdout.splitlines()
    # One partition was handed over, read from the member's committed offset to the end.
    (mine,) = {line.split("-")[0] for line in printed}
    assert printed == [f"{mine}-3", f"{mine}-4"]
    other = 1 - int(mine[1])
    offsets = committed(lake)
    assert offsets[int(mine[1])][0] == 5
    assert offsets[other][0] == 3  # the live member's offset stands
