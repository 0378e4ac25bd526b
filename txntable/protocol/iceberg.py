"""The Iceberg mirror of read_committed: what a publish writes, as a function of a snapshot.

The same published set as the Delta mirror (:func:`txntable.protocol.mirror.plan_files`),
written as an Iceberg format v2 table in the file layout of Iceberg's "Hadoop" tables:
``<table>/metadata/v<N>.metadata.json`` (the commit point, written with put-if-absent),
``version-hint.text`` (a hint only), and Avro manifest lists and manifests beside them. The
data files are the table's segments, named by absolute location (Iceberg v2 has no relative
paths). This module is pure: the schema and its name mapping (segments carry no field ids),
the statistics of a data file, the snapshot summary that names the txntable version, the
check of a mirror's history and snapshot expiry. :mod:`txntable.mirror.iceberg` does the
I/O (with pyiceberg, which writes the Avro files).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txntable.errors import MirrorConflictError, MirrorUnsupportedError
from txntable.protocol.actions import Metadata
from txntable.protocol.records import OFFSET_COLUMN
from txntable.protocol.schema import PARTITION_COLUMN, TIMESTAMP_COLUMN, schema_from_json

METADATA_DIR = "metadata"
VERSION_HINT = "version-hint.text"
#: Snapshot summary keys: the Iceberg analogue of the Delta mirror's ``txn`` action.
SUMMARY_TABLE_ID = "txntable.table-id"
SUMMARY_VERSION = "txntable.version"
#: Whether the snapshot changes data (false: a merge only rearranged records).
SUMMARY_DATA_CHANGE = "txntable.data-change"
#: Name of the identity partition field (the partition spec's, not the column's id).
PARTITION_FIELD_ID = 1000
#: Table properties the publisher sets: pyiceberg never retries a commit itself (the
#: publisher re-plans against the winner's metadata instead); appends merge small
#: manifests (every 100), so neither a publish nor a reader opens one per publish; the
#: metadata log (informational) names the last 10 metadata files, not 100.
FIXED_PROPERTIES = {
    "commit.retry.num-retries": "0",
    "commit.manifest-merge.enabled": "true",
    "write.metadata.previous-versions-max": "10",
}
NAME_MAPPING_PROPERTY = "schema.name-mapping.default"

_METADATA_NAME = re.compile(r"v(\d+)\.metadata\.json")


def metadata_file_name(version: int) -> str:
    """``v<N>.metadata.json`` (Iceberg's file-system tables number them from 1)."""
    return f"v{version}.metadata.json"


def metadata_version_of(name: str) -> int | None:
    """The ``N`` of a ``v<N>.metadata.json`` file name, ``None`` for other names."""
    m = _METADATA_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


# --- schema -------------------------------------------------------------------------------


class _Ids:
    """Field ids in depth-first order (what Iceberg assigns too)."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def _field(ids: _Ids, name: str, type_: Any, required: bool) -> dict[str, Any]:
    return {"id": ids.next(), "name": name, "required": required, "type": type_}


_PRIMITIVE: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "int",
    pa.int16(): "int",
    pa.int32(): "int",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.binary(): "binary",
    pa.date32(): "date",
}


def iceberg_type(t: pa.DataType, where: str, ids: _Ids) -> Any:
    """The Iceberg (v2 JSON) type of an allowed Arrow type of a typed table.

    Raises:
        MirrorUnsupportedError: A type format v2 cannot hold (nanosecond timestamps are v3).
    """
    if t in _PRIMITIVE:
        return _PRIMITIVE[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            raise MirrorUnsupportedError(
                f"column {where}: nanosecond timestamps need Iceberg format v3; the mirror "
                "writes v2"
            )
        return "timestamptz" if t.tz is not None else "timestamp"
    if pa.types.is_list(t):
        element_id = ids.next()
        return {
            "type": "list",
            "element-id": element_id,
            "element": iceberg_type(t.value_type, f"{where}.element", ids),
            "element-required": not t.value_field.nullable,
        }
    if pa.types.is_map(t):
        key_id, value_id = ids.next(), ids.next()
        return {
            "type": "map",
            "key-id": key_id,
            "key": iceberg_type(t.key_type, f"{where}.key", ids),
            "value-id": value_id,
            "value": iceberg_type(t.item_type, f"{where}.value", ids),
            "value-required": not t.item_field.nullable,
        }
    if pa.types.is_struct(t):
        return {"type": "struct", "fields": _struct_fields(t, where, ids)}
    raise MirrorUnsupportedError(f"column {where}: type {t} has no Iceberg equivalent")


def _struct_fields(t: pa.StructType, where: str, ids: _Ids) -> list[dict[str, Any]]:
    out = []
    for c in (t.field(i) for i in range(t.num_fields)):
        column_id = ids.next()
        name = f"{where}.{c.name}" if where else c.name
        out.append(
            {
                "id": column_id,
                "name": c.name,
                "required": not c.nullable,
                "type": iceberg_type(c.type, name, ids),
            }
        )
    return out


def iceberg_schema(metadata: Metadata) -> dict[str, Any]:
    """The mirror's schema (Iceberg v2 JSON, ids depth-first from 1): Spark's Kafka source
    columns (no ``topic``) or a typed table's columns, then ``partition`` (identity
    partitioned; optional because no segment stores it: readers take it from the partition
    tuple), ``offset`` (null except in merged segments) and ``timestamp`` (UTC).

    Raises:
        MirrorUnsupportedError: A column format v2 cannot hold.
    """
    ids = _Ids()
    if not metadata.typed:
        fields = [
            _field(ids, "key", "binary", False),
            _field(ids, "value", "binary", False),
            _field(ids, PARTITION_COLUMN, "int", False),
            _field(ids, OFFSET_COLUMN, "long", False),
            _field(ids, TIMESTAMP_COLUMN, "timestamptz", True),
        ]
        headers_id = ids.next()
        element_id, key_id, value_id = ids.next(), ids.next(), ids.next()
        headers = {
            "type": "list",
            "element-id": element_id,
            "element": {
                "type": "struct",
                "fields": [
                    {"id": key_id, "name": "key", "required": True, "type": "string"},
                    {"id": value_id, "name": "value", "required": False, "type": "binary"},
                ],
            },
            "element-required": True,
        }
        fields.append({"id": headers_id, "name": "headers", "required": False, "type": headers})
    else:
        schema = schema_from_json(metadata.schema)
        fields = _struct_fields(pa.struct(list(schema)), "", ids)
        fields += [
            _field(ids, PARTITION_COLUMN, "int", False),
            _field(ids, OFFSET_COLUMN, "long", False),
            _field(ids, TIMESTAMP_COLUMN, "timestamptz", True),
        ]
    return {"type": "struct", "schema-id": 0, "fields": fields}


def name_mapping(fields: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Iceberg's default name mapping of schema ``fields`` (JSON), so readers resolve the
    columns of segments, which carry no field ids. A list's element also answers to
    ``item``: the name Arrow gives it in the segments' Parquet."""
    out = []
    for f in fields:
        entry: dict[str, Any] = {"field-id": f["id"], "names": [f["name"]]}
        nested = _nested_mapping(f["type"])
        if nested:
            entry["fields"] = nested
        out.append(entry)
    return out


def _nested_mapping(t: Any) -> list[dict[str, Any]]:
    if not isinstance(t, dict):
        return []
    if t["type"] == "struct":
        return name_mapping(t["fields"])
    if t["type"] == "list":
        element: dict[str, Any] = {"field-id": t["element-id"], "names": ["element", "item"]}
        if nested := _nested_mapping(t["element"]):
            element["fields"] = nested
        return [element]
    if t["type"] == "map":
        key: dict[str, Any] = {"field-id": t["key-id"], "names": ["key"]}
        value: dict[str, Any] = {"field-id": t["value-id"], "names": ["value"]}
        if nested := _nested_mapping(t["key"]):
            key["fields"] = nested
        if nested := _nested_mapping(t["value"]):
            value["fields"] = nested
        return [key, value]
    return []


def name_mapping_json(fields: Sequence[dict[str, Any]]) -> str:
    """The ``schema.name-mapping.default`` table property of schema ``fields``."""
    return json.dumps(name_mapping(fields), separators=(",", ":"))


def field_id(fields: Iterable[dict[str, Any]], name: str) -> int:
    """The id of top-level field ``name``."""
    for f in fields:
        if f["name"] == name:
            return int(f["id"])
    raise KeyError(name)


# --- data files ---------------------------------------------------------------------------


def long_bound(value: int) -> bytes:
    """A ``long`` (or a timestamp in microseconds) as an Iceberg bound: 8 bytes, little
    endian (the spec's single-value serialization)."""
    return struct.pack("<q", value)


@dataclass(frozen=True)
class FileStats:
    """The statistics of a data file a publish writes (all exact, from the log): record
    count; timestamp bounds; the nulls of ``offset`` (every row of a batch's file: it has
    no such column; none in a merged segment, whose offsets lie in its range)."""

    null_value_counts: dict[int, int]
    lower_bounds: dict[int, bytes]
    upper_bounds: dict[int, bytes]


def file_stats(
    fields: Sequence[dict[str, Any]],
    records: int,
    min_timestamp_ms: int,
    max_timestamp_ms: int,
    merged: bool,
    base_offset: int,
    end_offset: int,
) -> FileStats:
    """Statistics of one data file keyed by the field ids of ``fields``."""
    ts = field_id(fields, TIMESTAMP_COLUMN)
    off = field_id(fields, OFFSET_COLUMN)
    lower = {ts: long_bound(min_timestamp_ms * 1000)}
    upper = {ts: long_bound(max_timestamp_ms * 1000)}
    if merged:
        # Bounds, not exact values: a merge may have dropped records inside the range.
        lower[off] = long_bound(base_offset)
        upper[off] = long_bound(end_offset - 1)
    return FileStats({ts: 0, off: 0 if merged else records}, lower, upper)


def absolute_location(table_location: str, relative: str) -> str:
    """A data file's location: the table's location and its table-relative path."""
    return f"{table_location}/{relative}"


def table_location(store_url: str, table: str) -> str:
    """The Iceberg ``location`` of a table in the warehouse at ``store_url``: a local
    directory as a plain absolute path (what every reader resolves), else the URL."""
    base = store_url[len("file://") :] if store_url.startswith("file://") else store_url
    return f"{base.rstrip('/')}/{table}"


# --- snapshots ----------------------------------------------------------------------------


def snapshot_properties(table_id: str, version: int, data_change: bool) -> dict[str, str]:
    """The summary properties of a publish of txntable version ``version``."""
    return {
        SUMMARY_TABLE_ID: table_id,
        SUMMARY_VERSION: str(version),
        SUMMARY_DATA_CHANGE: "true" if data_change else "false",
    }


@dataclass(frozen=True)
class SnapshotInfo:
    """What the publisher checks of one snapshot of the mirror."""

    snapshot_id: int
    sequence_number: int
    timestamp_ms: int
    summary: dict[str, str]


def check_history(
    table_id: str, snapshots: Sequence[SnapshotInfo], current_id: int | None, where: str
) -> int:
    """The txntable version the mirror's current snapshot publishes (-1: none yet), after
    checking every snapshot it keeps was a publish of this table, in increasing txntable
    versions, the current one last.

    Raises:
        MirrorConflictError: A snapshot without this table's summary (a foreign writer's),
            versions that go backwards, or a current snapshot that is not the newest.
    """
    last = -1
    ordered = sorted(snapshots, key=lambda s: s.sequence_number)
    for snap in ordered:
        if snap.summary.get(SUMMARY_TABLE_ID) != table_id or not (
            snap.summary.get(SUMMARY_VERSION, "").isdigit()
        ):
            raise MirrorConflictError(
                f"{where}: Iceberg snapshot {snap.snapshot_id} was not written by a txntable "
                f"publisher of table {table_id} (no {SUMMARY_TABLE_ID}/{SUMMARY_VERSION} in its "
                "summary); the mirror refuses to publish over a foreign writer's snapshot — "
                "remove the metadata directory to rebuild the mirror"
            )
        version = int(snap.summary[SUMMARY_VERSION])
        if version <= last:
            raise MirrorConflictError(
                f"{where}: Iceberg snapshot {snap.snapshot_id} publishes txntable version "
                f"{version}, not after {last}"
            )
        last = version
    if ordered and ordered[-1].snapshot_id != current_id:
        raise MirrorConflictError(
            f"{where}: the current Iceberg snapshot {current_id} is not the newest publish "
            f"({ordered[-1].snapshot_id}): another writer moved the table's main branch"
        )
    return last


def retained_snapshots(
    snapshots: Sequence[SnapshotInfo], current_id: int | None, since_ms: int
) -> list[int]:
    """Snapshots a reader may still be pinned to: the current one and every one replaced
    at or after ``since_ms`` (its successor is that recent). Vacuum keeps the files they
    list (Delta's tombstone rule, per snapshot)."""
    ordered = sorted(snapshots, key=lambda s: s.sequence_number)
    keep = []
    for snap, successor in zip(ordered, [*ordered[1:], None], strict=True):
        if snap.snapshot_id == current_id or (
            successor is not None and successor.timestamp_ms >= since_ms
        ):
            keep.append(snap.snapshot_id)
    return keep


#: Snapshots a publish always keeps (Iceberg's ``history.expire.min-snapshots-to-keep``):
#: time travel to the last few publishes.
MIN_SNAPSHOTS_TO_KEEP = 10


def expired_snapshots(
    snapshots: Sequence[SnapshotInfo], current_id: int | None, since_ms: int
) -> list[int]:
    """Snapshots a publish expires, so the metadata file stays small however often it
    publishes: all but the newest :data:`MIN_SNAPSHOTS_TO_KEEP` and those that protect a
    file for vacuum — one replaced at or after ``since_ms`` by a snapshot that removed
    files. One replaced by an append lists no file its successor does not list, so
    expiring it early loses no file a pinned reader needs: the first later snapshot
    replaced by a removal (or the current one) lists them all, and is kept."""
    ordered = sorted(snapshots, key=lambda s: s.sequence_number)
    newest = {s.snapshot_id for s in ordered[-MIN_SNAPSHOTS_TO_KEEP:]}
    out = []
    for snap, successor in zip(ordered, [*ordered[1:], None], strict=True):
        if snap.snapshot_id == current_id or snap.snapshot_id in newest or successor is None:
            continue
        removed = successor.summary.get("operation", "append") != "append"
        if removed and successor.timestamp_ms >= since_ms:
            continue
        out.append(snap.snapshot_id)
    return out
