"""CLI ``groups`` with members: generation, assignor, each member's assignment, owners, lag."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.cli import cli


def test_groups_shows_members_assignment_and_lag(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/lake"
    wh = Warehouse(url)
    wh.create_table("orders", partitions=2)
    with Producer(wh) as p:
        for i in range(10):
            p.send("orders", value=b"x", partition=i % 2)
    c = Consumer(
        wh,
        group_id="g",
        auto_offset_reset="earliest",
        group_instance_id="host-a",
        partition_assignment_strategy="cooperative-sticky",
        session_timeout_ms=60_000,
    )
    c.subscribe(["orders"])
    try:
        for _ in range(5):
            c.poll(0, max_records=3)
        c.commit()
        result = CliRunner().invoke(cli, ["groups", url, "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (group,) = json.loads(result.output)
        assert group["generation"] == c.group_metadata().generation_id >= 1
        assert group["assignor"] == "cooperative-sticky"
        (member,) = group["members"]
        assert member["member_id"] == c.group_metadata().member_id
        assert member["group_instance_id"] == "host-a"
        assert member["assignment"] == member["owned"] == {"orders": [0, 1]}
        assert member["acked_generation"] == group["generation"]
        positions = {o["partition"]: o for o in group["offsets"]}
        assert set(positions) == {0, 1}  # the generation fence is not listed as a position
        for p in (0, 1):
            want = c.position(TopicPartition("orders", p))
            assert positions[p]["offset"] == want and positions[p]["lag"] == 5 - want
        text = CliRunner().invoke(cli, ["groups", url], catch_exceptions=False).output
        assert "cooperative-sticky" in text and "host-a" in text and "orders[0,1]" in text
        assert "MEMBER" in text
    finally:
        c.close()
