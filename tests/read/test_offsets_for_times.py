"""offsets_for_times agrees with a scan on random histories (timestamps out of order,
transactions committed, aborted and open, delete_records), and skips segments it need not read."""

from __future__ import annotations

import uuid

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.read.timestamps import offset_for_time, timestamps_ms
from txntable.storage import MemoryStore

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["plain", "commit", "abort", "open"]),
        st.lists(st.integers(0, 50), min_size=1, max_size=4),
        st.integers(0, 1),
    ),
    min_size=1,
    max_size=8,
)


def _expected(wh: Warehouse, level: str, p: int, ts: int) -> int | None:
    rows = wh.table("t").scan(level, partitions=[p]).to_arrow()
    stamps = timestamps_ms(rows.column("timestamp")).to_pylist()
    hits = [o for o, t in zip(rows.column("offset").to_pylist(), stamps, strict=True) if t >= ts]
    return min(hits) if hits else None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS, st.lists(st.integers(0, 55), min_size=1, max_size=5), st.booleans())
def test_offsets_for_times_matches_scan(
    steps: list[tuple[str, list[int], int]], queries: list[int], trim: bool
) -> None:
    name = f"oft-{uuid.uuid4().hex}"
    wh = Warehouse(store=MemoryStore(name))
    try:
        wh.create_table("t", partitions=2)
        plain = Producer(wh)
        open_producers: list[Producer] = []
        for i, (kind, stamps, p) in enumerate(steps):
            if kind == "plain":
                for ts in stamps:
                    plain.send("t", value=b"v", partition=p, timestamp=1000 + ts)
                plain.flush()
                continue
            prod = Producer(wh, transactional_id=f"tx{i}")
            prod.init_transactions()
            prod.begin_transaction()
            for ts in stamps:
                prod.send("t", value=b"v", partition=p, timestamp=1000 + ts)
            prod.flush()
            if kind == "commit":
                prod.commit_transaction()
            elif kind == "abort":
                prod.abort_transaction()
            else:
                open_producers.append(prod)
                continue
            prod.close()
        plain.close()
        if trim:
            snap = wh.table("t").snapshot()
            hw = snap.partition(0).high_watermark
            if hw > 1:
                wh.table("t").delete_records({0: hw // 2})
        for level in ("read_committed", "read_uncommitted"):
            c = Consumer(wh, isolation_level=level)
            asked = {TopicPartition("t", p): 1000 + q for p in (0, 1) for q in queries}
            got = c.offsets_for_times(asked)
            for tp, ts in asked.items():
                want = _expected(wh, level, tp.partition, ts)
                found = got[tp]
                assert (found.offset if found else None) == want, (tp, ts, level)
                if found is not None:
                    assert found.timestamp >= ts
            c.close()
        for prod in open_producers:
            prod.abort_transaction()
            prod.close()
    finally:
        MemoryStore.drop(name)


def test_batches_below_the_time_are_never_read() -> None:
    name = f"oft-{uuid.uuid4().hex}"
    store = MemoryStore(name)
    wh = Warehouse(store=store)
    try:
        wh.create_table("t", partitions=1)
        with Producer(wh) as p:
            for ts in range(10):
                p.send("t", value=b"v", partition=0, timestamp=1000 + ts)
                p.flush()  # one batch (segment) per record
        table = wh.table("t")
        snap = table.snapshot()
        reads: list[str] = []
        original = store.get_data_file

        def counting(key: str) -> bytes:
            reads.append(key)
            return original(key)

        store.get_data_file = counting  # type: ignore[method-assign]
        found = offset_for_time(table, snap, 0, 1007, "read_uncommitted")
        assert found is not None and (found.offset, found.timestamp) == (7, 1007)
        assert reads == []  # answered from the log's min/max timestamps alone
        assert offset_for_time(table, snap, 0, 2000) is None
    finally:
        MemoryStore.drop(name)


def test_a_typed_table_is_read_with_its_own_schema() -> None:
    # Issue 21.3: a transactional batch under read_committed must be read to be answered;
    # reading a typed segment with the untyped record schema raised SchemaMismatchError.
    name = f"oft-{uuid.uuid4().hex}"
    wh = Warehouse(store=MemoryStore(name))
    try:
        wh.create_table("t", 1, schema=pa.schema([("n", pa.int32())]))
        with Producer(wh, transactional_id="tx") as prod:
            prod.init_transactions()
            prod.begin_transaction()
            for i, ts in enumerate((1000, 1005, 1002)):
                prod.send("t", {"n": i}, partition=0, timestamp=ts)
            prod.commit_transaction()  # offsets 0..2, the marker at 3
        tp = TopicPartition("t", 0)
        for level in ("read_committed", "read_uncommitted"):
            with Consumer(wh, isolation_level=level) as c:
                got = c.offsets_for_times({tp: 1003})[tp]
                assert got is not None and (got.offset, got.timestamp) == (1, 1005), level
                assert c.offsets_for_times({tp: 1006})[tp] is None
    finally:
        MemoryStore.drop(name)
