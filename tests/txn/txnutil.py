"""Helpers shared by the transaction tests (``tests/txn`` is on ``sys.path``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from txntable import Consumer, Producer, TopicPartition, Warehouse
from txntable.groups.offsets import open_group_table
from txntable.log.log import Log
from txntable.protocol.actions import Action, Marker
from txntable.storage.base import Store
from txntable.table import Table

HELPERS = Path(__file__).parent / "helpers"
REPO = Path(__file__).resolve().parents[2]


def all_tps(wh: Warehouse, tables: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``tables``."""
    return [TopicPartition(t, p) for t in tables for p in range(wh.table(t).num_partitions)]


def read_all(
    wh: Warehouse, tables: Iterable[str], isolation_level: str = "read_committed"
) -> list[bytes | None]:
    """Values of every record of ``tables`` a fresh consumer returns from the beginning."""
    tps = all_tps(wh, tables)
    consumer = Consumer(wh, isolation_level=isolation_level, auto_offset_reset="earliest")
    consumer.assign(tps)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(tps)
    out: list[bytes | None] = []
    while True:
        got = consumer.poll(max_records=1_000_000)
        for records in got.values():
            out.extend(r.value for r in records)
        if not got and all(consumer.position(tp) >= ends[tp] for tp in tps):
            return out


def exactly_once(values: Iterable[bytes | None]) -> Counter[bytes | None]:
    """Counter of the values; callers compare it with ``Counter(expected)``."""
    return Counter(values)


def log_versions(log: Log) -> Iterator[tuple[int, list[Action]]]:
    """Every version of a log, read one by one with ``read_version``."""
    v = 0
    while True:
        actions = log.read_version(v)
        if actions is None:
            return
        yield v, actions
        v += 1


def markers_by_partition(log: Log) -> dict[int, list[Marker]]:
    """Marker actions of a log in log order, per partition."""
    out: dict[int, list[Marker]] = {}
    for _, actions in log_versions(log):
        for a in actions:
            if isinstance(a, Marker):
                out.setdefault(a.partition, []).append(a)
    return out


def group_log(wh: Warehouse, group: str) -> Log:
    """The offset log of ``group``."""
    return open_group_table(wh.store, group).log


def assert_no_open_transactions(table: Table) -> None:
    """No open transaction anywhere; LSO == HW on every partition."""
    for p in table.describe().partitions:
        assert p.open_transactions == (), (table.name, p)
        assert p.last_stable_offset == p.high_watermark, (table.name, p)


def run_python(
    args: list[str], timeout: float = 60, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``sys.executable args`` from the repository root, capturing text output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def one_partition_tables(
    store: Store,
    make_producer: Callable[..., Producer],
    group_commit: bool,
    tables: int = 1,
    **producer_options: object,
) -> tuple[Warehouse, Producer]:
    """One-partition tables ``t0``, ``t1``, … on ``store`` and an initialised producer ``tx``."""
    wh = Warehouse(store=store, group_commit=group_commit)
    for i in range(tables):
        wh.create_table(f"t{i}", partitions=1)
    p = make_producer(wh, transactional_id="tx", **producer_options)
    p.init_transactions()
    return wh, p


def committed_values(wh: Warehouse, table: str = "t0") -> list[bytes | None]:
    """Values a read_committed consumer returns from partition 0 of ``table``, in order."""
    consumer = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        tp = TopicPartition(table, 0)
        consumer.assign([tp])
        out: list[bytes | None] = []
        while consumer.position(tp) < consumer.end_offsets([tp])[tp]:
            out.extend(r.value for r in consumer.poll(timeout_ms=0).get(tp, []))
        return out
    finally:
        consumer.close()
