"""Vacuum deletes only unreferenced segment files older than the retention period."""

from __future__ import annotations

import pathlib

import pytest
from tableutil import decide_like_an_earlier_client

from txntable import Producer, Warehouse
from txntable.errors import InvalidConfigurationError
from txntable.layout import (
    new_segment_name,
    segment_created_ms,
)
from txntable.maintenance.vacuum import (
    RETENTION_MS_MIN,
    vacuum,
)
from txntable.protocol.actions import Batch
from txntable.storage import ClockAheadStore
from txntable.txn.coordinator import TransactionCoordinator, TxnState
from txntable.util import now_ms

HOUR = 3600 * 1000


def test_segment_names_carry_their_creation_time() -> None:
    before = now_ms()
    name = new_segment_name("job1-")
    assert name.startswith("job1-") and name.endswith(".parquet")
    created = segment_created_ms(f"t/data/0/{name}")
    assert created is not None and before <= created <= now_ms()
    assert segment_created_ms("t/data/0/0123456789abcdef0123456789abcdef.parquet") is None
    assert segment_created_ms("t/data/0/notes.txt") is None


def test_vacuum_deletes_only_old_unreferenced_files(tmp_path: pathlib.Path) -> None:
    wh = Warehouse(tmp_path.as_uri())
    table = wh.create_table("t", partitions=1)
    with Producer(wh) as p:
        p.send("t", value=b"kept", partition=0).result()
    (committed,) = [e.path for e in table.snapshot().partition(0).entries]
    old = now_ms() - 10 * HOUR
    orphan = f"t/data/0/{old:013d}-{'a' * 32}.parquet"
    young = table.segment_key(0, new_segment_name())
    undated = "t/data/0/legacy.parquet"
    for key in (orphan, young, undated):
        wh.store.put_data_file(key, b"not committed")

    with pytest.raises(InvalidConfigurationError):
        vacuum(table, retention_ms=RETENTION_MS_MIN - 1)
    dry = vacuum(table, retention_ms=2 * HOUR, dry_run=True)
    assert dry.deleted == [orphan] and dry.undated == [undated]
    assert wh.store.exists(orphan)

    # Vacuum refuses a clock far ahead of the store's: the young file is still in flight.
    with pytest.raises(InvalidConfigurationError, match="ahead of the store's"):
        vacuum(table, retention_ms=2 * HOUR, now=now_ms() + 1000 * HOUR)
    assert wh.store.exists(young)
    # A dry run may look ahead; and once the store's clock is there too, the young file is
    # old. Even then a committed segment is never deleted.
    ahead = vacuum(table, retention_ms=2 * HOUR, dry_run=True, now=now_ms() + 1000 * HOUR)
    assert sorted(ahead.deleted) == sorted([orphan, young])
    later = Warehouse(store=ClockAheadStore(wh.store, 1000 * HOUR)).table("t")
    report = vacuum(later, retention_ms=2 * HOUR, now=now_ms() + 1000 * HOUR)
    assert sorted(report.deleted) == sorted([orphan, young])
    assert not wh.store.exists(orphan) and not wh.store.exists(young)
    assert wh.store.exists(committed) and wh.store.exists(undated)
    assert table.vacuum(retention_ms=2 * HOUR, dry_run=False).deleted == []


def test_table_vacuum_is_a_dry_run_unless_told(tmp_path: pathlib.Path) -> None:
    # As delta-rs's DeltaTable.vacuum(dry_run=True): listing is the default, deleting asked.
    wh = Warehouse(tmp_path.as_uri())
    table = wh.create_table("t", partitions=1)
    orphan = f"t/data/0/{now_ms() - 10 * HOUR:013d}-{'b' * 32}.parquet"
    wh.store.put_data_file(orphan, b"not committed")
    assert table.vacuum(retention_ms=2 * HOUR).deleted == [orphan]
    assert wh.store.exists(orphan)
    assert table.vacuum(retention_ms=2 * HOUR, dry_run=False).deleted == [orphan]
    assert not wh.store.exists(orphan)


def test_vacuum_keeps_segments_a_prepared_transaction_will_commit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = Warehouse(tmp_path.as_uri())
    table = wh.create_table("t", partitions=1)
    p = Producer(wh, transactional_id="tx", linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"prepared", partition=0)
    # The producer (an earlier client's short path) dies right after its PrepareCommit
    # (intent in the object).
    decide_like_an_earlier_client(p)
    meta, _ = TransactionCoordinator(wh.store).load("tx")  # type: ignore[misc]
    assert meta.state is TxnState.PREPARE_COMMIT
    (pending,) = meta.intent["t"]
    later = Warehouse(store=ClockAheadStore(wh.store, 1000 * HOUR)).table("t")
    report = vacuum(later, retention_ms=2 * HOUR, now=now_ms() + 1000 * HOUR)
    assert report.deleted == [] and wh.store.exists(pending.path)
    assert wh.recover().committed == ["tx"]
    first = table.snapshot().partition(0).entries[0]
    assert isinstance(first, Batch) and first.path == pending.path
