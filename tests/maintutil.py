"""Building randomized histories and comparing what readers return, for maintenance tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st
from tableutil import read_all

from txntable import Producer, TopicPartition, Warehouse
from txntable.protocol.actions import Segment
from txntable.protocol.snapshot import TableSnapshot

MANUAL = {"linger_ms": 600_000, "batch_size": 1 << 30}


@dataclass(frozen=True)
class Op:
    """One step of a history: an idempotent batch, or a transaction committed or aborted.

    ``sizes`` maps partition -> record count; ``tombstone`` sends null values.
    """

    kind: str  # "idem" | "commit" | "abort"
    sizes: tuple[tuple[int, int], ...]
    tombstone: bool = False


def run_history(wh: Warehouse, table: str, ops: Sequence[Op], keys: int = 4) -> int:
    """Produce ``ops`` with real producers (one segment per partition and op)."""
    idem = Producer(wh, **MANUAL)
    txn = Producer(wh, transactional_id=f"{table}-tid", **MANUAL)
    txn.init_transactions()
    n = 0
    for op in ops:
        producer = idem if op.kind == "idem" else txn
        if op.kind != "idem":
            txn.begin_transaction()
        for partition, count in op.sizes:
            for _ in range(count):
                key = f"k{n % keys}".encode()
                value = None if op.tombstone else f"v{n}".encode()
                producer.send(table, key=key, value=value, partition=partition)
                n += 1
        producer.flush()
        if op.kind == "commit":
            txn.commit_transaction()
        elif op.kind == "abort":
            txn.abort_transaction()
    idem.close()
    txn.close()
    return n


def open_transaction(wh: Warehouse, table: str, partition: int, count: int) -> Producer:
    """Leave a transaction open on ``partition`` (pins the LSO); returns its producer."""
    p = Producer(wh, transactional_id=f"{table}-open", **MANUAL)
    p.init_transactions()
    p.begin_transaction()
    for i in range(count):
        p.send(table, key=b"open", value=f"open{i}".encode(), partition=partition)
    p.flush()
    return p


def read(wh: Warehouse, table: str, level: str) -> dict[int, list[tuple[int, bytes | None]]]:
    """(offset, value) of everything a fresh consumer returns, per partition."""
    parts = wh.table(table).num_partitions
    return read_all(wh, table, range(parts), level)


def read_keys(
    wh: Warehouse, table: str
) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    """(offset, key, value) of everything read_committed returns, per partition."""
    from tableutil import drain

    from txntable import Consumer

    parts = wh.table(table).num_partitions
    tps = [TopicPartition(table, p) for p in range(parts)]
    c = Consumer(wh, isolation_level="read_committed")
    try:
        c.assign(tps)
        c.seek_to_beginning()
        got = drain(c, tps)
        return {tp.partition: [(r.offset, r.key, r.value) for r in got[tp]] for tp in tps}
    finally:
        c.close()


def comparable(snap: TableSnapshot) -> object:
    """Everything a snapshot holds that readers and writers use, in comparable form."""
    return (
        snap.version,
        snap.protocol,
        snap.metadata,
        [
            (
                p.log_start_offset,
                p.log_end_offset,
                p.entries,
                p.entry_offsets,
                p.aborted,
                p.ongoing,
                {
                    pid: (e.epoch, list(e.batches), e.current_txn_first_offset, e.coordinator_epoch)
                    for pid, e in p.producers.items()
                },
                p.size_bytes,
            )
            for p in snap.partitions
        ],
        snap.producer_epochs,
        snap.app_txns,
        snap.offsets,
        snap.pending_offsets,
    )


HISTORY_FOR_CRASH = [
    Op("idem", ((0, 3), (1, 2))),
    Op("commit", ((0, 2), (1, 1))),
    Op("abort", ((0, 2), (1, 3))),
    Op("idem", ((0, 1), (1, 1))),
]


def op_lists(max_size: int) -> st.SearchStrategy[list[Op]]:
    """Hypothesis: histories of up to ``max_size`` ops over partitions 0 and 1."""
    sizes = st.lists(
        st.tuples(st.integers(0, 1), st.integers(1, 3)),
        min_size=1,
        max_size=2,
        unique_by=lambda t: t[0],
    ).map(tuple)
    kinds = st.sampled_from(["idem", "commit", "abort"])
    return st.lists(st.builds(Op, kinds, sizes, st.booleans()), min_size=1, max_size=max_size)


def sparse_history(wh: Warehouse, table: str, partitions: int = 1) -> None:
    """Every partition of a new table ``table`` (``cleanup.policy=compact``) holds::

        idempotent  k0 k1 k2 k3   [0-3]
        committed   k0 k1         [4-5]   COMMIT [6]
        aborted     k2 k3         [7-8]   ABORT  [9]
        idempotent  k2            [10]
        committed   k3            [11]    COMMIT [12]
    """
    wh.create_table(table, partitions=partitions, configuration={"cleanup.policy": "compact"})
    idem = Producer(wh, **MANUAL)
    tx = Producer(wh, transactional_id="tx", **MANUAL)
    tx.init_transactions()

    def send(p: Producer, *keys: int) -> None:
        for partition in range(partitions):
            for k in keys:
                value = b"p%d-k%d-%d" % (partition, k, len(keys))
                headers = [("h", value)]
                p.send(table, key=b"k%d" % k, value=value, partition=partition, headers=headers)
        p.flush()

    send(idem, 0, 1, 2, 3)
    for keys, commit in (((0, 1), True), ((2, 3), False)):
        tx.begin_transaction()
        send(tx, *keys)
        if commit:
            tx.commit_transaction()
        else:
            tx.abort_transaction()
    send(idem, 2)
    tx.begin_transaction()
    send(tx, 3)
    tx.commit_transaction()
    idem.close()
    tx.close()


#: The offsets :func:`compacted_table` keeps on every partition.
SPARSE = [4, 5, 10, 11]


def compacted_table(wh: Warehouse, table: str, partitions: int = 1) -> Segment:
    """:func:`sparse_history`, merged and key-compacted: one merged segment ``[0, 13)`` per
    partition holding the latest record of each key (offsets :data:`SPARSE`); returns
    partition 0's."""
    sparse_history(wh, table, partitions)
    t = wh.table(table)
    t.optimize()
    t.compact(now=0)
    seg = t.snapshot().partition(0).entries[0]
    assert isinstance(seg, Segment)
    assert (seg.baseOffset, seg.endOffset, seg.count, seg.compacted) == (0, 13, 4, True)
    return seg
