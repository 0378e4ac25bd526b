"""End to end over S3 (moto server over HTTP): transactions, both isolation levels, HW/LSO."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from s3util import drain

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.table import OpenTransaction
from txntable.txn.coordinator import TransactionCoordinator

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def offsets_and_values(records: list) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in records]


def hw_lso(wh: Warehouse, topic: str) -> list[tuple[int, int, int]]:
    return [
        (p.log_start_offset, p.high_watermark, p.last_stable_offset)
        for p in wh.table(topic).describe().partitions
    ]


def test_transactions_end_to_end(s3_wh: Warehouse, make_producer: Callable[..., Producer]) -> None:
    wh = s3_wh
    wh.create_table("orders", partitions=2)
    assert wh.list_tables() == ["orders"]
    txn = make_producer(wh, transactional_id="etl-1")
    txn.init_transactions()

    # 1. Committed transaction, all buffered at commit (the short path): p0 offsets 0-2,
    #    COMMIT marker at 3.
    txn.begin_transaction()
    futures = [
        txn.send(
            "orders",
            key=b"k%d" % i,
            value=b"committed-%d" % i,
            partition=0,
            headers=[("h", b"%d" % i)],
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(3)
    ]
    txn.commit_transaction()
    assert [(m.topic, m.partition, m.offset) for m in (f.result() for f in futures)] == [
        ("orders", 0, 0),
        ("orders", 0, 1),
        ("orders", 0, 2),
    ]
    assert futures[2].result().timestamp == 1_700_000_000_002

    # 2. Aborted transaction, flushed to the log first: p0 offsets 4-5 + ABORT at 6,
    #    p1 offset 0 + ABORT at 1.
    txn.begin_transaction()
    aborted = [txn.send("orders", value=b"aborted-%d" % i, partition=0) for i in range(2)]
    aborted.append(txn.send("orders", value=b"aborted-2", partition=1))
    txn.flush()
    assert [(f.result().partition, f.result().offset) for f in aborted] == [(0, 4), (0, 5), (1, 0)]
    assert hw_lso(wh, "orders") == [(0, 6, 4), (0, 1, 0)]
    txn.abort_transaction()
    assert hw_lso(wh, "orders") == [(0, 7, 7), (0, 2, 2)]

    # 3. Idempotent, non-transactional records on p1: offsets 2, 3.
    plain = make_producer(wh)
    idem = [plain.send("orders", value=b"idempotent-%d" % i, partition=1) for i in range(2)]
    plain.flush()
    assert [f.result().offset for f in idem] == [2, 3]

    # 4. An open transaction on p1 (offset 4) holds the LSO back; a later idempotent
    #    record (offset 5) is above the LSO.
    txn.begin_transaction()
    open_meta = txn.send("orders", value=b"open", partition=1).result()
    assert (open_meta.partition, open_meta.offset) == (1, 4)
    assert plain.send("orders", value=b"after-open", partition=1).result().offset == 5

    desc = wh.table("orders").describe()
    assert desc.name == "orders"
    p0, p1 = desc.partitions
    assert (p0.log_start_offset, p0.high_watermark, p0.last_stable_offset) == (0, 7, 7)
    assert p0.open_transactions == ()
    assert (p1.log_start_offset, p1.high_watermark, p1.last_stable_offset) == (0, 6, 4)
    began = TransactionCoordinator(wh.store).load("etl-1")[0].txn_start_timestamp  # type: ignore[index]
    assert p1.open_transactions == (
        OpenTransaction(txn.producer_id, 4, "etl-1", open_meta.timestamp, began),
    )

    # read_committed: committed data only, nothing at or above the LSO.
    committed, positions = drain(wh, "orders", 2, "read_committed")
    assert offsets_and_values(committed[0]) == [
        (0, b"committed-0"),
        (1, b"committed-1"),
        (2, b"committed-2"),
    ]
    assert [(r.key, r.headers, r.timestamp) for r in committed[0]] == [
        (b"k%d" % i, [("h", b"%d" % i)], 1_700_000_000_000 + i) for i in range(3)
    ]
    assert offsets_and_values(committed[1]) == [(2, b"idempotent-0"), (3, b"idempotent-1")]
    assert positions == {0: 7, 1: 4}

    # read_uncommitted: everything below the HW, aborted data included, markers skipped.
    uncommitted, positions = drain(wh, "orders", 2, "read_uncommitted")
    assert offsets_and_values(uncommitted[0]) == [
        (0, b"committed-0"),
        (1, b"committed-1"),
        (2, b"committed-2"),
        (4, b"aborted-0"),
        (5, b"aborted-1"),
    ]
    assert offsets_and_values(uncommitted[1]) == [
        (0, b"aborted-2"),
        (2, b"idempotent-0"),
        (3, b"idempotent-1"),
        (4, b"open"),
        (5, b"after-open"),
    ]
    assert positions == {0: 7, 1: 6}

    tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
    rc = Consumer(wh, isolation_level="read_committed")
    rc.assign(tps)
    rc.seek_to_beginning()
    assert rc.end_offsets(tps) == {tps[0]: 7, tps[1]: 4}
    ru = Consumer(wh, isolation_level="read_uncommitted")
    ru.assign(tps)
    assert ru.end_offsets(tps) == {tps[0]: 7, tps[1]: 6}

    # A read_committed consumer parked at the LSO continues once the transaction commits.
    rc.seek_to_end()  # the LSO under read_committed
    assert [rc.position(tp) for tp in tps] == [7, 4]
    assert rc.poll(timeout_ms=0) == {}
    txn.commit_transaction()
    assert hw_lso(wh, "orders") == [(0, 7, 7), (0, 7, 7)]
    assert wh.table("orders").describe().partitions[1].open_transactions == ()
    got = rc.poll(timeout_ms=1000)
    assert offsets_and_values(got[tps[1]]) == [(4, b"open"), (5, b"after-open")]
    assert rc.position(tps[1]) == 7
    rc.close()
    ru.close()

    # A second, independently opened warehouse handle sees the same state.
    other = Warehouse(wh.url, storage_options=wh.storage_options)
    committed, positions = drain(other, "orders", 2, "read_committed")
    assert [r.offset for r in committed[1]] == [2, 3, 4, 5]
    assert positions == {0: 7, 1: 7}
    other.store.close()
