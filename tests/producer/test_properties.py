"""Property: random interleavings of transactional and idempotent producers on one table.

A model tracks, from the offsets the send futures return, which records are committed,
aborted or still open, and which markers were written. After every step a fresh
read_committed consumer must return exactly the committed records below the LSO, in offset
order, and each partition's LSO must be the first offset of its earliest open transaction
(else the high watermark). ``Table.scan`` and the Arrow poll must return exactly what the
consumer returns, under both isolation levels, and at the end a scan of every earlier
version (time travel) must return what the consumer returned at that version.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tableutil import MANUAL_FLUSH, read_all, scan_all

from txntable import Producer, RecordMetadata, Warehouse
from txntable.storage import MemoryStore

TABLE = "prop"
Reads = dict[int, list[tuple[int, bytes | None]]]


@dataclass
class Sent:
    partition: int
    value: bytes
    future: Future[RecordMetadata]

    @property
    def landed(self) -> bool:
        """Whether the record is in the log (its batch was committed to a log version)."""
        return self.future.done() and self.future.exception() is None

    @property
    def offset(self) -> int:
        return self.future.result(timeout=0).offset


@dataclass
class Client:
    producer: Producer
    transactional: bool
    in_txn: bool = False
    current: list[Sent] = field(default_factory=list)  # sent in the open transaction


@dataclass
class Model:
    partitions: int
    committed: list[Sent] = field(default_factory=list)  # visible once below the LSO
    landed: list[Sent] = field(default_factory=list)  # everything in the log
    markers: list[int] = field(default_factory=list)  # per partition
    # version -> what read_committed and read_uncommitted consumers returned at it
    seen: dict[int, tuple[Reads, Reads]] = field(default_factory=dict)

    def end_transaction(self, client: Client, commit: bool) -> None:
        written = [s for s in client.current if s.landed]
        for p in {s.partition for s in written}:
            self.markers[p] += 1
        if commit:
            assert len(written) == len(client.current)
            self.committed.extend(written)
        self.landed.extend(written)
        client.current = []
        client.in_txn = False

    def open_first_offsets(self, clients: list[Client], p: int) -> dict[int, int]:
        out = {}
        for c in clients:
            if not c.transactional:
                continue
            offsets = [s.offset for s in c.current if s.partition == p and s.landed]
            if offsets:
                out[c.producer.producer_id] = min(offsets)
        return out


def check(wh: Warehouse, model: Model, clients: list[Client]) -> None:
    parts = range(model.partitions)
    desc = wh.table(TABLE).describe()
    in_log = model.landed + [s for c in clients for s in c.current if s.landed]
    lso = {}
    for p in parts:
        open_txns = model.open_first_offsets(clients, p)
        hw = sum(1 for s in in_log if s.partition == p) + model.markers[p]
        lso[p] = min(open_txns.values(), default=hw)
        d = desc.partitions[p]
        assert (d.high_watermark, d.last_stable_offset) == (hw, lso[p])
        assert {(t.producer_id, t.first_offset) for t in d.open_transactions} == set(
            open_txns.items()
        )
    committed = read_all(wh, TABLE, parts, "read_committed")
    uncommitted = read_all(wh, TABLE, parts, "read_uncommitted")
    # One record per poll: positions must step over markers and aborted batches exactly.
    assert read_all(wh, TABLE, parts, "read_committed", max_records=1) == committed
    assert read_all(wh, TABLE, parts, "read_committed", max_records=1, arrow=True) == committed
    assert read_all(wh, TABLE, parts, "read_uncommitted", arrow=True) == uncommitted
    table = wh.table(TABLE)
    assert scan_all(table, "read_committed") == committed
    assert scan_all(table, "read_uncommitted") == uncommitted
    model.seen[desc.version] = (committed, uncommitted)
    for p in parts:
        want = sorted(
            (s.offset, s.value) for s in model.committed if s.partition == p and s.offset < lso[p]
        )
        assert committed[p] == want
        assert uncommitted[p] == sorted((s.offset, s.value) for s in in_log if s.partition == p)


OPS = st.sampled_from(["send", "send", "send", "flush", "commit", "abort"])


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, int, int]], list[bool]]:
    n_txn = draw(st.integers(2, 4))
    partitions = draw(st.integers(1, 2))
    ops = draw(
        st.lists(
            st.tuples(OPS, st.integers(0, n_txn), st.integers(0, partitions - 1)),
            min_size=1,
            max_size=25,
        )
    )
    finish = draw(st.lists(st.booleans(), min_size=n_txn, max_size=n_txn))
    return n_txn, partitions, ops, finish


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(scenarios())
def test_random_interleavings(scenario: tuple[int, int, list[tuple[str, int, int]], list[bool]]):
    n_txn, partitions, ops, finish = scenario
    name = f"prop-{uuid.uuid4().hex}"
    wh = Warehouse(f"memory://{name}")
    wh.create_table(TABLE, partitions=partitions)
    clients = [
        Client(Producer(wh, transactional_id=f"tx{i}", **MANUAL_FLUSH), True) for i in range(n_txn)
    ]
    clients.append(Client(Producer(wh, enable_idempotence=True, **MANUAL_FLUSH), False))
    model = Model(partitions, markers=[0] * partitions)
    counter = 0
    try:
        for c in clients[:n_txn]:
            c.producer.init_transactions()
        for op, i, p in ops:
            c = clients[i]
            if op == "send":
                if c.transactional and not c.in_txn:
                    c.producer.begin_transaction()
                    c.in_txn = True
                counter += 1
                value = f"{i}-{counter}".encode()
                c.current.append(Sent(p, value, c.producer.send(TABLE, value=value, partition=p)))
            elif not c.transactional or op == "flush":
                c.producer.flush()
                if not c.transactional:
                    assert all(s.landed for s in c.current)
                    model.committed.extend(c.current)
                    model.landed.extend(c.current)
                    c.current = []
            elif c.in_txn:
                if op == "commit":
                    c.producer.commit_transaction()
                else:
                    c.producer.abort_transaction()
                model.end_transaction(c, commit=op == "commit")
            check(wh, model, clients)
        for c, commit in zip(clients, finish, strict=False):
            if c.in_txn:
                if commit:
                    c.producer.commit_transaction()
                else:
                    c.producer.abort_transaction()
                model.end_transaction(c, commit)
        clients[-1].producer.flush()
        model.committed.extend(clients[-1].current)
        model.landed.extend(clients[-1].current)
        clients[-1].current = []
        check(wh, model, clients)
        desc = wh.table(TABLE).describe()
        assert all(d.last_stable_offset == d.high_watermark for d in desc.partitions)
        table = wh.table(TABLE)
        for version, (committed, uncommitted) in model.seen.items():
            assert scan_all(table, "read_committed", version) == committed
            assert scan_all(table, "read_uncommitted", version) == uncommitted
        assert len(model.committed) == sum(
            1 for c in [*model.committed] if c.landed
        )  # every committed record was acknowledged with an offset
    finally:
        for c in clients:
            c.producer.close(timeout=10)
        MemoryStore.drop(name)
