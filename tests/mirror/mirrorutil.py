"""Reading a table's Delta mirror back with three independent engines (delta-rs, Polars,
DuckDB's delta extension, loaded from its wheel: no download), and what read_committed
returns, as comparable multisets."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import duckdb
import duckdb_extension_delta
import pyarrow as pa
from deltalake import DeltaTable

from txntable.table import Table

#: A row as compared: partition, offset (``None`` where the file stores none), value.
Row = tuple[int, int | None, bytes | None]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the delta extension of the installed wheel (offline)."""
    path = os.path.join(
        os.path.dirname(duckdb_extension_delta.__file__),
        "extensions",
        f"v{duckdb.__version__}",
        "delta.duckdb_extension",
    )
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute(f"LOAD '{path}'")
    return con


def rows_of(t: pa.Table, value: str = "value") -> Counter[Row]:
    """The rows of an Arrow table as a multiset of (partition, offset, value)."""
    cols = [t[name].to_pylist() for name in ("partition", "offset", value)]
    return Counter(zip(*cols, strict=True))


def committed(table: Table, version: int, value: str = "value") -> Counter[Row]:
    """read_committed at ``version`` (offsets replaced by ``None`` outside merged files is
    done by :func:`comparable`)."""
    return rows_of(table.scan(version=version).to_arrow(), value)


def comparable(mirror: Counter[Row], expected: Counter[Row]) -> tuple[Counter[Any], Counter[Any]]:
    """Both multisets without offsets, after checking every offset the mirror does carry
    (a merged segment's) is the record's offset in read_committed."""
    by_value = {(p, v): o for (p, o, v) in expected}
    for p, o, v in mirror:
        if o is not None:
            assert by_value.get((p, v)) == o, (p, o, v)
    strip = Counter[Any]()
    for (p, _o, v), n in mirror.items():
        strip[(p, v)] += n
    want = Counter[Any]()
    for (p, _o, v), n in expected.items():
        want[(p, v)] += n
    return strip, want


def read_deltalake(path: str, version: int | None = None, value: str = "value") -> Counter[Row]:
    """The mirror through delta-rs (at a Delta version: time travel)."""
    dt = DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    return rows_of(dt.to_pyarrow_table(), value)


def read_polars(path: str, version: int | None = None, value: str = "value") -> Counter[Row]:
    """The mirror through Polars' ``scan_delta``."""
    import polars as pl

    frame = pl.scan_delta(path, version=version).collect()
    return rows_of(frame.to_arrow(), value)


def read_duckdb(
    con: duckdb.DuckDBPyConnection, path: str, value: str = "value"
) -> Counter[Row]:
    """The mirror through DuckDB's ``delta_scan``."""
    t = con.execute(
        f'SELECT "partition", "offset", "{value}" FROM delta_scan(\'{path}\')'
    ).to_arrow_table()
    return rows_of(t, value)


def write_batch(table: Table, partition: int, values: list[bytes]) -> int:
    """Commit one plain batch of ``values`` in a segment named as writers name them (dated,
    so vacuum can age it); returns the version."""
    from txntable.layout import new_segment_name
    from txntable.protocol.append import PendingBatch
    from txntable.protocol.records import encode_segment
    from txntable.structs import ProducerRecord

    records = [ProducerRecord(None, v, (), 1_000 + i) for i, v in enumerate(values)]
    data = encode_segment(records)
    path = table.segment_key(partition, new_segment_name())
    table.store.put_data_file(path, data)
    batch = PendingBatch(partition, path, len(values), len(data), min_timestamp=1_000,
                         max_timestamp=1_000 + len(values) - 1)
    return table.append([batch])[1]


# --- the Iceberg mirror ---------------------------------------------------------------------


def iceberg_metadata(path: str, version: int | None = None) -> str:
    """The newest (or ``version``'s) metadata file of the Iceberg mirror at ``path``."""
    if version is None:
        with open(f"{path}/metadata/version-hint.text") as f:
            version = int(f.read())
        while os.path.exists(f"{path}/metadata/v{version + 1}.metadata.json"):
            version += 1  # the hint may lag the commit
    return f"{path}/metadata/v{version}.metadata.json"


def read_pyiceberg(path: str, version: int | None = None, value: str = "value") -> Counter[Row]:
    """The Iceberg mirror through pyiceberg's ``StaticTable`` (a metadata version: time
    travel to an older snapshot)."""
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(iceberg_metadata(path, version))
    return rows_of(table.scan().to_arrow(), value)


def read_pyiceberg_snapshot(path: str, snapshot_id: int, value: str = "value") -> Counter[Row]:
    """An older snapshot of the newest metadata (Iceberg's own time travel)."""
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(iceberg_metadata(path))
    return rows_of(table.scan(snapshot_id=snapshot_id).to_arrow(), value)


def read_polars_iceberg(path: str, value: str = "value") -> Counter[Row]:
    """The Iceberg mirror through Polars' ``scan_iceberg`` (planned by pyiceberg)."""
    import polars as pl

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    frame = pl.scan_iceberg(iceberg_metadata(path)).collect()
    return rows_of(frame.to_arrow(), value)


def duckdb_iceberg_connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the iceberg extension and the avro extension it needs, both
    from their wheels (offline: it would download avro otherwise)."""
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        ext = os.path.join(
            os.path.dirname(module.__file__ or ""),
            "extensions",
            f"v{duckdb.__version__}",
            f"{name}.duckdb_extension",
        )
        con.execute(f"LOAD '{ext}'")
    return con


def read_duckdb_iceberg(
    con: duckdb.DuckDBPyConnection, path: str, value: str = "value"
) -> Counter[Row]:
    """The Iceberg mirror through DuckDB's ``iceberg_scan`` of the table directory (it
    follows ``version-hint.text``)."""
    t = con.execute(
        f'SELECT "partition", "offset", "{value}" FROM iceberg_scan(\'{path}\')'
    ).to_arrow_table()
    return rows_of(t, value)
