"""Administering tables: ``Table.alter_configuration`` (a new ``metadata`` version) and
``Warehouse.drop_table`` (version 0 first, then everything under the table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from txntable import Producer, Warehouse
from txntable.errors import InvalidConfigurationError, TableInUseError, TableNotFoundError
from txntable.layout import version_key


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    w = Warehouse(str(tmp_path / "lake"))
    w.create_table("t", partitions=2, configuration={"retention.ms": "3600000"})
    with Producer(w) as p:
        for i in range(4):
            p.send("t", value=b"v%d" % i, partition=i % 2)
    return w


def test_alter_configuration_sets_and_unsets_in_one_version(wh: Warehouse) -> None:
    table = wh.table("t")
    before = table.snapshot().version
    now = table.alter_configuration({"cleanup.policy": "compact", "checkpoint.interval": 5},
                                    ["retention.ms"])  # fmt: skip
    assert now == {"cleanup.policy": "compact", "checkpoint.interval": "5"}
    assert table.snapshot().version == before + 1
    assert table.log.checkpoint_interval == 5  # this handle follows at once
    fresh = wh.table("t")
    assert fresh.configuration == now
    assert fresh.snapshot().metadata.tableId == table.snapshot().metadata.tableId  # type: ignore[union-attr]
    # Nothing to change: nothing written.
    assert table.alter_configuration({"cleanup.policy": "compact"}) == now
    assert table.snapshot().version == before + 1
    assert wh.table("t").verify().ok


@pytest.mark.parametrize(
    ("updates", "removals", "message"),
    [
        ({"retention.mss": "1"}, [], "unknown table configuration key 'retention.mss' "
                                     "(did you mean retention.ms?)"),
        ({"retention.ms": "soon"}, [], "retention.ms must be an integer >= -1, got 'soon'"),
        ({}, ["nope"], "unknown table configuration key 'nope'"),
        ({"retention.ms": "1"}, ["retention.ms"], "'retention.ms' is both set and unset"),
    ],
)
def test_alter_configuration_refuses_bad_changes(
    wh: Warehouse, updates: dict[str, str], removals: list[str], message: str
) -> None:
    table = wh.table("t")
    before = table.snapshot().version
    with pytest.raises(InvalidConfigurationError) as info:
        table.alter_configuration(updates, removals)
    assert message in str(info.value)
    assert table.snapshot().version == before
    assert table.configuration == {"retention.ms": "3600000"}


def test_drop_table_deletes_everything_under_it(wh: Warehouse, tmp_path: Path) -> None:
    wh.create_table("other")
    stored = list(wh.store.list("t/"))
    assert sum(key.endswith(".parquet") for key in stored) == 2
    steps: list[tuple[str, int, int]] = []
    assert wh.drop_table("t", progress=lambda *step: steps.append(step)) == len(stored)
    rest = len(stored) - 1  # version 0 goes first, alone
    assert steps == [("delete", rest, rest)]
    assert wh.list_tables() == ["other"]
    assert list(wh.store.list("t/")) == []
    assert not (tmp_path / "lake/t").exists()  # no empty directories left behind
    with pytest.raises(TableNotFoundError):
        wh.table("t")
    with pytest.raises(TableNotFoundError):
        wh.drop_table("t")
    # The name is free again.
    wh.create_table("t", partitions=1)
    assert wh.table("t").snapshot().partition(0).high_watermark == 0


def test_a_drop_that_stopped_part_way_is_finished_by_dropping_again(wh: Warehouse) -> None:
    wh.store.delete(version_key("t", 0))  # a drop that crashed after its first delete
    assert wh.list_tables() == []
    assert wh.drop_table("t") > 0
    assert list(wh.store.list("t/")) == []


def test_drop_table_refuses_a_table_with_an_open_transaction(wh: Warehouse) -> None:
    p = Producer(wh, transactional_id="open")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"pending", partition=0).result()
    try:
        with pytest.raises(TableInUseError, match=r"table 't' has open transactions \(open\)"):
            wh.drop_table("t")
        assert wh.list_tables() == ["t"]
        p.commit_transaction()
        wh.drop_table("t")
        assert wh.list_tables() == []
    finally:
        p.close()
