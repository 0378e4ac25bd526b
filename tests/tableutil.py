"""Helpers shared by the table-level tests (``from tableutil import ...``; ``tests/`` is on
``sys.path`` via conftest): hand-built logs and batches, draining consumers, and the
recording and faulty stores behind the fixtures of ``tests/conftest.py``."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

from txntable import Consumer, Producer, TopicPartition, Warehouse
from txntable.errors import TransientStorageError
from txntable.log.log import Log
from txntable.protocol.actions import (
    Action,
    Batch,
    Metadata,
    Protocol,
)
from txntable.protocol.append import AppendResult, PendingBatch
from txntable.protocol.records import encode_segment
from txntable.protocol.snapshot import TableSnapshot, replay
from txntable.storage import CountingStore, FaultInjectingStore, StoreWrapper
from txntable.storage.base import Store, StoredObject
from txntable.structs import ConsumerRecord, ProducerRecord
from txntable.table import Table
from txntable.txn.coordinator import TxnMetadata, TxnState
from txntable.util import now_ms


def drain(
    consumer: Consumer,
    tps: Sequence[TopicPartition],
    max_polls: int = 200,
    max_records: int = 10_000,
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Poll until every partition's position reached its end offset; return all records."""
    out: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in tps}
    for _ in range(max_polls):
        ends = consumer.end_offsets(tps)
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            return out
        for tp, records in consumer.poll(timeout_ms=0, max_records=max_records).items():
            out[tp].extend(records)
    raise AssertionError(f"consumer did not reach the end offsets after {max_polls} polls")


def offsets_values(records: Iterable[ConsumerRecord]) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` of each record, in the order given."""
    return [(r.offset, r.value) for r in records]


def read_all(
    warehouse: object,
    table: str,
    partitions: Iterable[int],
    isolation_level: str,
    max_records: int = 10_000,
    arrow: bool = False,
) -> dict[int, list[tuple[int, bytes | None]]]:
    """Everything a fresh consumer returns from the beginning, as ``(offset, value)``.

    With ``arrow`` the consumer polls with ``poll_arrow`` instead of ``poll``.
    """
    tps = [TopicPartition(table, p) for p in partitions]
    consumer = Consumer(warehouse, isolation_level=isolation_level)  # type: ignore[arg-type]
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        if not arrow:
            got = drain(consumer, tps, max_records=max_records)
            return {tp.partition: offsets_values(got[tp]) for tp in tps}
        out: dict[int, list[tuple[int, bytes | None]]] = {tp.partition: [] for tp in tps}
        for _ in range(200):
            ends = consumer.end_offsets(tps)
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                return out
            for tp, t in consumer.poll_arrow(timeout_ms=0, max_records=max_records).items():
                pairs = zip(t["offset"].to_pylist(), t["value"].to_pylist(), strict=True)
                out[tp.partition].extend(pairs)
        raise AssertionError("consumer did not reach the end offsets after 200 polls")
    finally:
        consumer.close()


def scan_all(
    table: Table, isolation_level: str, version: int | None = None
) -> dict[int, list[tuple[int, bytes | None]]]:
    """What ``Table.scan`` returns, per partition, as ``(offset, value)``."""
    scan = table.scan(isolation_level=isolation_level, version=version)
    out: dict[int, list[tuple[int, bytes | None]]] = {
        p: [] for p in range(scan.snapshot.num_partitions)
    }
    got = scan.to_arrow()
    columns = (got[name].to_pylist() for name in ("partition", "offset", "value"))
    for p, offset, value in zip(*columns, strict=True):
        out[p].append((offset, value))
    return out


def write_batch(
    table: Table,
    partition: int,
    values: Sequence[bytes],
    **pending: object,
) -> tuple[AppendResult, int]:
    """Write a real segment holding ``values`` and commit it as one batch."""
    records = [ProducerRecord(None, v, (), 1_000 + i) for i, v in enumerate(values)]
    data = encode_segment(records)
    path = table.segment_key(partition, f"{uuid.uuid4().hex}.parquet")
    table.store.put(path, data)
    batch = PendingBatch(
        partition=partition,
        path=path,
        count=len(values),
        size=len(data),
        min_timestamp=1_000,
        max_timestamp=1_000 + len(values) - 1,
        **pending,  # type: ignore[arg-type]
    )
    return table.append([batch])


def log_versions(log: Log) -> list[tuple[int, list[Action]]]:
    """Every version of ``log`` from 0 up to the first missing one, decoded."""
    out = []
    version = 0
    while True:
        actions = log.read_version(version)
        if actions is None:
            return out
        out.append((version, actions))
        version += 1


# --- pure builders ----------------------------------------------------------------------------


def version0(partitions: int = 2, name: str = "t") -> list[Action]:
    """The actions of a table's version 0."""
    return [Protocol(1, 1), Metadata(tableId="id-" + name, name=name, partitions=partitions)]


def snapshot_of(*versions: list[Action], partitions: int = 2) -> TableSnapshot:
    """Replay version 0 of a ``partitions``-partition table, then ``versions`` as 1, 2, …"""
    return replay(enumerate([version0(partitions), *versions]))


def batch(
    partition: int,
    base: int,
    count: int = 1,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    txn: bool = False,
) -> Batch:
    """A batch action with a made-up segment path."""
    return Batch(
        partition=partition,
        baseOffset=base,
        count=count,
        path=f"t/data/{partition}/{base}.parquet",
        size=100,
        producerId=pid,
        producerEpoch=epoch,
        baseSequence=seq,
        transactional=txn,
    )


class SegmentLog(StoreWrapper):
    """Records every segment read, in order."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads: list[str] = []
        self._lock = threading.Lock()

    def get_data_file(self, key: str) -> bytes:
        with self._lock:
            self.reads.append(key)
        return self.inner.get_data_file(key)


#: Producer settings under which only ``flush``/``commit_transaction`` send anything, so a
#: test decides exactly which records share a batch and in which order batches land.
MANUAL_FLUSH = {"linger_ms": 600_000, "batch_size": 1 << 30}


class RecordingStore(CountingStore):
    """A counting store that also records the key of every GET."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gets: list[str] = []

    def reset(self) -> None:
        super().reset()
        self.gets.clear()

    def get(self, key: str) -> StoredObject:
        self.gets.append(key)
        return super().get(key)

    def log_gets(self, table: str) -> list[str]:
        """Keys of GETs of ``table``'s log directory since the last reset."""
        return [k for k in self.gets if k.startswith(f"{table}/_log/")]


class ReadFaultStore(FaultInjectingStore):
    """A fault-injecting store that can also fail GETs of chosen keys."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.get_faults: dict[str, int] = {}
        self.get_faults_fired = 0

    def fail_next_get(self, key: str, times: int = 1) -> None:
        """Raise ``TransientStorageError`` on the next ``times`` GETs of ``key``."""
        self.get_faults[key] = self.get_faults.get(key, 0) + times

    def _check_get(self, key: str) -> None:
        if self.get_faults.get(key, 0) > 0:
            self.get_faults[key] -= 1
            self.get_faults_fired += 1
            raise TransientStorageError(f"injected read failure of {key!r}")

    def get(self, key: str) -> StoredObject:
        self._check_get(key)
        return super().get(key)

    def get_data_file(self, key: str) -> bytes:
        self._check_get(key)
        return super().get_data_file(key)


def build_table(store_wh: Warehouse, versions: int, interval: int = 5) -> Table:
    """A 2-partition table with ``versions`` versions after version 0, checkpointing often."""
    table = store_wh.create_table(
        "cp", partitions=2, configuration={"checkpoint.interval": str(interval)}
    )
    pid = 11
    seq = [0, 0]
    for i in range(versions):
        p = i % 2
        if i % 3 == 2:
            write_batch(table, p, [f"plain-{i}".encode()])
        else:
            write_batch(
                table,
                p,
                [f"v{i}a".encode(), f"v{i}b".encode()],
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq[p],
            )
            seq[p] += 2
    assert table.snapshot().version == versions
    return table


def is_log_version(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return (
        "/_log/" in key and name[:20].isdigit() and name.endswith(".json") and name.count(".") == 1
    )


def batches_in_log(wh: Warehouse, table: str) -> list[tuple[int, Batch]]:
    return [
        (v, a)
        for v, actions in log_versions(wh.table(table).log)
        for a in actions
        if isinstance(a, Batch)
    ]


def decide_like_an_earlier_client(producer: Producer) -> TxnMetadata:
    """Decide ``producer``'s buffered one-table transaction as a client of the previous
    protocol version did (its short path): write the segments, then CAS the coordinator
    object to PrepareCommit carrying them as its ``intent`` — nothing in the table yet.
    Clients of this version never do so, but every client completes such an object."""
    txn = producer.transaction_manager
    whole = producer.accumulator.drain_whole(txn.short_path_allowed)
    assert whole is not None, "the transaction is not wholly buffered for one table"
    intent = producer.sender.write_transaction(whole)
    loaded = txn.coordinator.load(txn.transactional_id or "")
    assert loaded is not None
    meta, etag = loaded
    prepared = meta.transition(
        TxnState.PREPARE_COMMIT,
        partitions={t: tuple(sorted({b.partition for b in bs})) for t, bs in intent.items()},
        intent=intent,
        txn_start_timestamp=now_ms(),
    )
    txn.coordinator.cas(prepared, etag)
    return prepared
