"""The Spark source retries transient storage errors within the request timeout (issue 19.13).

No SparkSession: the driver's snapshot loads (batch and streaming) and the executors' segment
reads are called directly, on a memory store wrapped to fail chosen GETs.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from tableutil import ReadFaultStore

from txntable import Producer
from txntable.table import Table
from txntable.warehouse import Warehouse
from txntable_spark import scan as spark_scan
from txntable_spark import source, stream
from txntable_spark.options import TableLocation, parse_read_options
from txntable_spark.planning import plan_scan


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> tuple[Warehouse, ReadFaultStore]:
    wh = Warehouse(f"memory://spark-retry-{uuid.uuid4().hex}")
    wh.create_table("t", partitions=1)
    with Producer(wh) as p:
        for v in (b"a", b"b", b"c"):
            p.send("t", value=v, partition=0)
    store = ReadFaultStore(wh.store)

    def open_table(location: TableLocation, finish_stuck_transactions: bool = True) -> Table:
        return Warehouse(store=store).table(location.table)

    monkeypatch.setattr(source, "open_table", open_table)
    monkeypatch.setattr(stream, "open_table", open_table)
    monkeypatch.setattr(spark_scan, "cached_store", lambda url, options: store)
    return wh, store


def test_batch_read_retries_the_snapshot_and_the_segments(
    faulty: tuple[Warehouse, ReadFaultStore],
) -> None:
    wh, store = faulty
    opts = parse_read_options({"path": f"{wh.url}/t"})
    store.fail_next_get("t/_log/00000000000000000001.json", times=2)
    _, snap = source.load_table_snapshot(opts)
    slices = [s for group in plan_scan(snap, opts) for s in group]
    store.fail_next_get(slices[0].path, times=2)
    batches = list(spark_scan.read_slices(wh.url, {}, "t", slices))
    assert pa.Table.from_batches(batches)["value"].to_pylist() == [b"a", b"b", b"c"]
    assert store.get_faults_fired == 4


def test_stream_reader_retries_its_snapshot(faulty: tuple[Warehouse, ReadFaultStore]) -> None:
    wh, store = faulty
    reader = stream.TxnTableStreamReader(
        parse_read_options({"path": f"{wh.url}/t", "startingOffsets": "earliest"}, True)
    )
    store.fail_next_get("t/_log/00000000000000000001.json", times=2)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 3}
    assert store.get_faults_fired == 2
