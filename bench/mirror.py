"""The mirrors: publish cost per commit, and a reader's cold start at many versions.

One writer commits ``--versions`` small batches to a table (``--partitions`` partitions),
publishing the mirror after every commit (the worst case: the background publisher
coalesces to one per ``mirror.interval.ms``). Reported:

* publish cost per commit: storage requests (GET/PUT/LIST/HEAD) and bytes the publisher
  writes (commits, checkpoints, hints), next to what the txntable commit itself cost;
* cold start of a reader of the mirror (delta-rs ``DeltaTable`` + ``to_pyarrow_table``,
  Polars ``scan_delta``, DuckDB ``delta_scan``) against a plain delta-rs table holding the
  same rows written in the same number of commits (``write_deltalake`` appends): the ratio
  mirror / plain is what publishing through txntable costs a reader;
* with ``--iceberg`` (the default), the same for the Iceberg mirror published beside it
  after every commit: requests and bytes per commit (metadata file, manifest list,
  manifests), and the cold start of pyiceberg (``StaticTable`` scan), Polars
  ``scan_iceberg`` and DuckDB ``iceberg_scan`` on it against the Delta mirror's readers.

Local disk (a tmpfs if ``--dir`` is one): request counts are what S3 would see; times
measure the protocol and the readers, not network latency.

    python bench/mirror.py --versions 10000
    python bench/mirror.py --versions 2000 --no-iceberg
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter

import pyarrow as pa

from txntable import Warehouse
from txntable.layout import new_segment_name
from txntable.mirror.publisher import MirrorPublisher
from txntable.protocol.append import PendingBatch
from txntable.protocol.records import encode_segment
from txntable.storage import CountingStore
from txntable.storage.local import LocalStore
from txntable.structs import ProducerRecord


class ByteCounting(CountingStore):
    """Counts requests and the bytes put."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.bytes_put = 0

    def put(self, key: str, data: bytes) -> str:
        self.bytes_put += len(data)
        return super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self.bytes_put += len(data)
        return super().put_if_absent(key, data)


def timed(fn: object, repeat: int = 3) -> float:
    """Median seconds of ``repeat`` calls (each a cold start: nothing cached between)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=10, help="records per commit")
    default_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    ap.add_argument("--dir", default=default_dir)
    ap.add_argument("--iceberg", action=argparse.BooleanOptionalAction, default=True,
                    help="also publish and read the Iceberg mirror")
    args = ap.parse_args()

    root = tempfile.mkdtemp(dir=args.dir)
    local = LocalStore(f"{root}/lake")
    commit_store = ByteCounting(local)
    publish_store = ByteCounting(local)
    wh = Warehouse(store=commit_store, group_commit=False)
    table = wh.create_table("t", partitions=args.partitions)
    publisher = MirrorPublisher(publish_store, "t")
    iceberg_store = ByteCounting(local)
    iceberg = None
    if args.iceberg:
        from txntable.mirror.iceberg import IcebergPublisher

        iceberg = IcebergPublisher(iceberg_store, "t")
    iceberg_s = 0.0
    plain_dir = f"{root}/plain"
    commit_s = publish_s = 0.0
    per_publish: Counter[str] = Counter()
    for v in range(args.versions):
        p = v % args.partitions
        records = [
            ProducerRecord(f"k{i}".encode(), uuid.uuid4().bytes * 4, (), 1_000 + v)
            for i in range(args.records)
        ]
        data = encode_segment(records)
        path = table.segment_key(p, new_segment_name())
        commit_store.put_data_file(path, data)
        t0 = time.perf_counter()
        table.append([PendingBatch(p, path, len(records), len(data), min_timestamp=1_000 + v,
                                   max_timestamp=1_000 + v)])
        t1 = time.perf_counter()
        publisher.publish()
        t2 = time.perf_counter()
        if iceberg is not None:
            iceberg.publish()
        iceberg_s += time.perf_counter() - t2
        commit_s += t1 - t0
        publish_s += t2 - t1
    per_publish.update(publish_store.counts)
    n = args.versions
    print(f"{n} versions, {args.partitions} partitions, {args.records} records per commit")
    print(
        "commit : "
        + ", ".join(f"{k} {c / n:.2f}" for k, c in sorted(commit_store.counts.items()))
        + f" per commit; {commit_store.bytes_put / n:,.0f} B put (log; segments not counted); "
        f"{commit_s / n * 1e3:.2f} ms"
    )
    print(
        "publish: "
        + ", ".join(f"{k} {c / n:.2f}" for k, c in sorted(per_publish.items()))
        + f" per commit; {publish_store.bytes_put / n:,.0f} B put (Delta commit, "
        f"checkpoints); {publish_s / n * 1e3:.2f} ms"
    )
    if iceberg is not None:
        print(
            "iceberg: "
            + ", ".join(f"{k} {c / n:.2f}" for k, c in sorted(iceberg_store.counts.items()))
            + f" per commit; {iceberg_store.bytes_put / n:,.0f} B put (metadata, manifest "
            f"list, manifests); {iceberg_s / n * 1e3:.2f} ms"
        )

    # The same rows as a plain delta-rs table, one append per commit.
    from deltalake import DeltaTable, write_deltalake

    mirror = f"{root}/lake/t"
    rows = DeltaTable(mirror).to_pyarrow_table()
    t0 = time.perf_counter()
    stamps = rows["timestamp"].to_pylist()
    order = sorted(range(rows.num_rows), key=lambda i: stamps[i])
    rows = rows.take(order)
    for start in range(0, rows.num_rows, args.records):
        chunk = rows.slice(start, args.records)
        write_deltalake(plain_dir, chunk, mode="append", partition_by=["partition"])
    print(f"plain delta-rs table written in {time.perf_counter() - t0:.1f} s ({n} commits)")

    import duckdb
    import duckdb_extension_delta
    import polars as pl

    ext = os.path.join(
        os.path.dirname(duckdb_extension_delta.__file__),
        "extensions",
        f"v{duckdb.__version__}",
        "delta.duckdb_extension",
    )

    def duck(path: str) -> None:
        con = duckdb.connect()
        con.execute(f"LOAD '{ext}'")
        con.execute(f"SELECT count(*) FROM delta_scan('{path}')").fetchall()

    readers = {
        "delta-rs": lambda path: DeltaTable(path).to_pyarrow_table(),
        "polars": lambda path: pl.scan_delta(path).select(pl.len()).collect(),
        "duckdb": duck,
    }
    expected = rows.num_rows
    assert DeltaTable(plain_dir).to_pyarrow_table().num_rows == expected
    assert pa.Table.from_batches(
        DeltaTable(mirror).to_pyarrow_dataset().to_batches()
    ).num_rows == expected
    for name, read in readers.items():
        m = timed(lambda r=read: r(mirror))
        p = timed(lambda r=read: r(plain_dir))
        print(f"cold start {name:8}: mirror {m * 1e3:8.1f} ms, plain delta-rs table "
              f"{p * 1e3:8.1f} ms, ratio {m / p:.2f}")
    if iceberg is not None:
        cold_iceberg(mirror, expected, readers)


def cold_iceberg(mirror: str, expected: int, delta_readers: dict) -> None:  # type: ignore[type-arg]
    """Cold start of three Iceberg readers on the Iceberg mirror, next to the Delta mirror's."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg
    import polars as pl
    from pyiceberg.table import StaticTable

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    with open(f"{mirror}/metadata/version-hint.text") as f:
        version = int(f.read())
    metadata = f"{mirror}/metadata/v{version}.metadata.json"
    exts = [
        os.path.join(os.path.dirname(m.__file__ or ""), "extensions", f"v{duckdb.__version__}",
                     f"{name}.duckdb_extension")
        for m, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg"))
    ]

    def duck(_path: str) -> None:
        con = duckdb.connect()
        for ext in exts:
            con.execute(f"LOAD '{ext}'")
        con.execute(f"SELECT count(*) FROM iceberg_scan('{metadata}')").fetchall()

    assert StaticTable.from_metadata(metadata).scan().to_arrow().num_rows == expected
    readers = {
        "pyiceberg": lambda _p: StaticTable.from_metadata(metadata).scan().to_arrow(),
        "polars": lambda _p: pl.scan_iceberg(metadata).select(pl.len()).collect(),
        "duckdb": duck,
    }
    delta = {"pyiceberg": "delta-rs", "polars": "polars", "duckdb": "duckdb"}
    for name, read in readers.items():
        i = timed(lambda r=read: r(mirror))
        d = timed(lambda r=delta_readers[delta[name]]: r(mirror))
        print(f"cold start {name:9}: iceberg mirror {i * 1e3:8.1f} ms, delta mirror "
              f"({delta[name]}) {d * 1e3:8.1f} ms, ratio {i / d:.2f}")


if __name__ == "__main__":
    main()
