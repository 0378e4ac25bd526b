"""Test helpers: build tables through the real commit path and model what readers must see.

:class:`TableWriter` writes each producer batch as a segment (``encode_segment`` +
``store.put``) and commits it with :meth:`Table.append`, exactly as the producer does, while
keeping an independent model of the log: which offsets hold which records, which
transactions committed, aborted or are still open. :meth:`TableWriter.expected` answers what
a read_committed / read_uncommitted reader must return, without using ``txntable.protocol.aborted``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.records import encode_segment
from txntable.structs import ProducerRecord
from txntable.table import Table
from txntable.warehouse import Warehouse

#: (partition, offset, key, value, headers, timestamp_ms)
Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@dataclass
class _Written:
    partition: int
    offset: int
    record: ProducerRecord
    pid: int
    txn: bool
    status: str = "open"  # for txn records: open / committed / aborted


@dataclass
class TableWriter:
    """Writes batches and markers to one table and remembers what it wrote."""

    warehouse: Warehouse
    name: str
    partitions: int = 1
    table: Table = field(init=False)
    written: list[_Written] = field(default_factory=list)
    _seq: dict[tuple[int, int], int] = field(default_factory=dict)
    _open: dict[int, set[int]] = field(default_factory=dict)
    _epoch: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.table = self.warehouse.create_table(self.name, partitions=self.partitions)

    def batch(
        self, partition: int, records: list[ProducerRecord], pid: int = -1, txn: bool = False
    ) -> int:
        """Write one batch; return its base offset."""
        path = self.table.segment_key(partition, f"{uuid.uuid4().hex}.parquet")
        data = encode_segment(records)
        self.table.store.put(path, data)
        seq = -1
        epoch = self._epoch.get(pid, 0) if pid >= 0 else -1
        if pid >= 0:
            seq = self._seq.get((pid, partition), 0)
            self._seq[(pid, partition)] = seq + len(records)
        stamps = [r.timestamp for r in records]
        pb = PendingBatch(
            partition=partition,
            path=path,
            count=len(records),
            size=len(data),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=txn,
            min_timestamp=min(stamps),
            max_timestamp=max(stamps),
        )
        result, _ = self.table.append([pb])
        base = result.base_offsets[0]
        for i, r in enumerate(records):
            self.written.append(_Written(partition, base + i, r, pid, txn))
        if txn:
            self._open.setdefault(pid, set()).add(partition)
        return base

    def end_txn(self, pid: int, commit: bool) -> None:
        """Write COMMIT or ABORT markers on every partition the transaction touched."""
        parts = sorted(self._open.pop(pid, set()))
        kind = "COMMIT" if commit else "ABORT"
        epoch = self._epoch.get(pid, 0)
        self.table.append([], [PendingMarker(p, pid, epoch, kind) for p in parts])
        # As a producer since KIP-890: the next transaction uses a new epoch, and a new
        # epoch starts its sequences at 0.
        self._epoch[pid] = epoch + 1
        self._seq = {k: v for k, v in self._seq.items() if k[0] != pid}
        for w in self.written:
            if w.pid == pid and w.txn and w.status == "open":
                w.status = "committed" if commit else "aborted"

    def lso(self, partition: int) -> int:
        """Model LSO: first offset of an open transaction, else the log end."""
        snap = self.table.snapshot()
        firsts = [
            w.offset
            for w in self.written
            if w.partition == partition and w.status == "open" and w.txn
        ]
        return min(firsts, default=snap.partition(partition).high_watermark)

    def expected(
        self,
        read_committed: bool = True,
        start: dict[int, int] | None = None,
        end: dict[int, int] | None = None,
    ) -> list[Row]:
        """Rows a reader must return, ordered by (partition, offset)."""
        out = []
        for w in self.written:
            p = w.partition
            upper = self.lso(p) if read_committed else 1 << 62
            if end is not None and p in end:
                upper = min(upper, end[p])
            if w.offset >= upper or w.offset < (start or {}).get(p, 0):
                continue
            if read_committed and w.txn and w.status != "committed":
                continue
            r = w.record
            out.append((p, w.offset, r.key, r.value, tuple(r.headers), r.timestamp))
        return sorted(out, key=lambda x: (x[0], x[1]))


def rec(i: int, key: bytes | None = None, headers: int = 0) -> ProducerRecord:
    """A distinctive record number ``i``."""
    hdrs = tuple((f"h{j}", None if j == 1 else f"{i}-{j}".encode()) for j in range(headers))
    return ProducerRecord(key, f"v{i}".encode(), hdrs, 1_700_000_000_000 + i)


def spark_rows(df: object) -> list[Row]:
    """Collect a txntable DataFrame as model rows (timestamps back to epoch ms)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    assert isinstance(df, DataFrame)
    got = df.select(
        "partition",
        "offset",
        "key",
        "value",
        "headers",
        (F.unix_micros("timestamp") / 1000).cast("long").alias("ts"),
    ).collect()
    rows = [
        (
            r["partition"],
            r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            None if r["value"] is None else bytes(r["value"]),
            tuple(
                (h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"]
            ),
            r["ts"],
        )
        for r in got
    ]
    return sorted(rows, key=lambda x: (x[0], x[1]))


def arrow_rows(table: object) -> list[Row]:
    """A table in the read schema (``Table.scan``, the Arrow poll) as model rows."""
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    columns = ("partition", "offset", "key", "value", "headers", "timestamp")
    rows = []
    for p, o, k, v, h, ts in zip(*(table[c].to_pylist() for c in columns), strict=True):
        headers = tuple((x["key"], x["value"]) for x in h)
        rows.append((p, o, k, v, headers, int(ts.timestamp() * 1000)))
    return rows


@contextmanager
def raises_in_spark(error: type[BaseException], match: str = "") -> Iterator[Any]:
    """Expect ``error`` raised by txntable under Spark.

    Spark re-raises what a data source raises as its own exception (``AnalysisException``
    while planning, ``PythonException`` from a task, ``StreamingQueryException`` from a
    query), carrying the original as ``<module>.<class>: <message>`` in its text. This
    asserts a Spark-captured exception carrying exactly ``error`` (by qualified name, so a
    subclass or a namesake does not pass), with ``match`` in its message.
    """
    from pyspark.errors.exceptions.captured import CapturedException

    with pytest.raises(CapturedException) as info:
        yield info
    name = error.__qualname__
    if error.__module__ != "builtins":
        name = f"{error.__module__}.{name}"
    pattern = rf"(?<![\w.]){re.escape(name)}: [^\n]*?{match}"
    assert re.search(pattern, str(info.value)), str(info.value)[:3000]


def run_to_end(query: Any, timeout_s: float = 120) -> None:
    """Wait for a query with ``trigger(availableNow=True)`` to finish: it must, in time and
    without an exception (``awaitTermination`` re-raises a failure). Stopped in any case, so
    a hung query never outlives its test."""
    try:
        assert query.awaitTermination(timeout_s), f"query still running after {timeout_s} s"
        assert query.exception() is None
    finally:
        query.stop()
