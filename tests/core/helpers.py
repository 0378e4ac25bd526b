"""Helpers shared by the core tests (import as ``from core.helpers import ...``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

from txntable import Consumer, TopicPartition
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
from txntable.storage import StoreWrapper
from txntable.storage.base import Store
from txntable.structs import ConsumerRecord, ProducerRecord
from txntable.table import Table


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
