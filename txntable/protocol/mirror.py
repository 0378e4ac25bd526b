"""The Delta Lake mirror of read_committed: what a publish writes, as a function of a snapshot.

Because a segment is one producer batch — wholly committed, wholly aborted or still open —
the committed view of a table at version ``S`` is a set of files, and publishing it as a
Delta log (``<table>/_delta_log/``, reader version 1 / writer version 2, relative paths, no
deletion vectors, column mapping or row tracking) is a metadata-only diff. This module is
pure: the published set of a partition, the diff against what the mirror lists, the Delta
actions and their JSON, the replay of the mirror's own log and its checkpoint's Parquet
schema. :mod:`txntable.mirror.publisher` does the I/O.

The published set of a partition at ``S``: every batch or merged segment that holds
records, lies wholly in ``[logStartOffset, LSO)`` and that read_committed returns (the
consumer algorithm of :mod:`txntable.protocol.aborted`). A merged segment that straddles
the log start is published when its first record is at or above it (merges drop records
below the log start); a batch that straddles it (``delete_records`` inside a batch) is not,
since a file-level mirror cannot hide part of a file — until a merge rewrites it.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa

from txntable.errors import MirrorConflictError, MirrorUnsupportedError
from txntable.protocol.aborted import classify_entries
from txntable.protocol.actions import Batch, Metadata, Segment
from txntable.protocol.records import OFFSET_COLUMN
from txntable.protocol.schema import PARTITION_COLUMN, TIMESTAMP_COLUMN, schema_from_json
from txntable.protocol.snapshot import PartitionState, TableSnapshot

#: The only protocol every engine reads today (Spark, Trino, delta-rs, DuckDB, Polars).
DELTA_READER_VERSION = 1
DELTA_WRITER_VERSION = 2
DELTA_LOG_DIR = "_delta_log"
#: ``add.tags`` keys carrying the entry's offset range (readers ignore tags).
TAG_BASE_OFFSET = "txntable.baseOffset"
TAG_END_OFFSET = "txntable.endOffset"
ENGINE = "txntable-python"

DataEntry = Batch | Segment


def app_id(table_id: str) -> str:
    """The ``txn.appId`` of every publish of the table: its version is the txntable version."""
    return f"txntable:{table_id}"


# --- schema -------------------------------------------------------------------------------


def _field(name: str, dtype: Any, nullable: bool = True) -> dict[str, Any]:
    return {"name": name, "type": dtype, "nullable": nullable, "metadata": {}}


HEADERS_DELTA_TYPE: dict[str, Any] = {
    "type": "array",
    "elementType": {
        "type": "struct",
        "fields": [_field("key", "string", False), _field("value", "binary")],
    },
    "containsNull": False,
}

_PRIMITIVE_DELTA: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.binary(): "binary",
    pa.date32(): "date",
}


def delta_type(t: pa.DataType, where: str) -> Any:
    """The Delta (Spark JSON schema) type of an allowed Arrow type of a typed table.

    Raises:
        MirrorUnsupportedError: A type reader 1 / writer 2 cannot express (a timestamp
            without a zone needs Delta's ``timestampNtz`` feature, reader 3 / writer 7).
    """
    if t in _PRIMITIVE_DELTA:
        return _PRIMITIVE_DELTA[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise MirrorUnsupportedError(
                f"column {where}: a timestamp without a time zone needs Delta's timestampNtz "
                "feature (reader 3 / writer 7); the mirror writes reader 1 / writer 2"
            )
        return "timestamp"
    if pa.types.is_list(t):
        return {
            "type": "array",
            "elementType": delta_type(t.value_type, f"{where}.element"),
            "containsNull": t.value_field.nullable,
        }
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": delta_type(t.key_type, f"{where}.key"),
            "valueType": delta_type(t.item_type, f"{where}.value"),
            "valueContainsNull": t.item_field.nullable,
        }
    if pa.types.is_struct(t):
        return {
            "type": "struct",
            "fields": [
                _field(c.name, delta_type(c.type, f"{where}.{c.name}"), c.nullable)
                for c in (t.field(i) for i in range(t.num_fields))
            ],
        }
    raise MirrorUnsupportedError(f"column {where}: type {t} has no Delta equivalent")


def delta_schema(metadata: Metadata) -> dict[str, Any]:
    """The mirror's schema: Spark's Kafka source columns (no ``topic``), or a typed table's
    columns; then ``partition`` (the partition column), ``offset`` (null except in merged
    segments, which store it) and ``timestamp`` (UTC).

    Raises:
        MirrorUnsupportedError: A column Delta reader 1 cannot read, or two names that
            differ only in case (Delta names are case-insensitive).
    """
    system = [
        _field(PARTITION_COLUMN, "integer", False),
        _field(OFFSET_COLUMN, "long", True),
        _field(TIMESTAMP_COLUMN, "timestamp", False),
    ]
    if not metadata.typed:
        fields = [
            _field("key", "binary"),
            _field("value", "binary"),
            *system,
            _field("headers", HEADERS_DELTA_TYPE),
        ]
    else:
        schema = schema_from_json(metadata.schema)
        fields = [_field(f.name, delta_type(f.type, f.name), f.nullable) for f in schema]
        fields += system
    seen: dict[str, str] = {}
    for f in fields:
        other = seen.setdefault(f["name"].lower(), f["name"])
        if other != f["name"]:
            raise MirrorUnsupportedError(
                f"columns {other!r} and {f['name']!r} differ only in case: Delta column "
                "names are case-insensitive"
            )
    return {"type": "struct", "fields": fields}


def metadata_action(metadata: Metadata) -> dict[str, Any]:
    """The mirror's ``metaData`` action (its id is the txntable table id)."""
    return {
        "metaData": {
            "id": metadata.tableId,
            "name": metadata.name,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(delta_schema(metadata), separators=(",", ":")),
            "partitionColumns": [PARTITION_COLUMN],
            "configuration": {},
            "createdTime": metadata.createdTime,
        }
    }


PROTOCOL_ACTION: dict[str, Any] = {
    "protocol": {"minReaderVersion": DELTA_READER_VERSION, "minWriterVersion": DELTA_WRITER_VERSION}
}


# --- files --------------------------------------------------------------------------------


def relative_path(table: str, key: str) -> str:
    """The ``add.path`` of a segment: relative to the table root, URI-encoded.

    Raises:
        MirrorUnsupportedError: The segment lies outside the table's directory (delta-rs
            and Polars refuse absolute paths).
    """
    prefix = f"{table}/"
    if not key.startswith(prefix):
        raise MirrorUnsupportedError(
            f"segment {key} lies outside {prefix}: the mirror lists relative paths only"
        )
    return quote(key[len(prefix) :], safe="/=")


def segment_key_of(table: str, path: str) -> str:
    """The store key of a mirror path (inverse of :func:`relative_path`)."""
    return f"{table}/{unquote(path)}"


def iso_ms(ms: int) -> str:
    """A timestamp statistic: ISO 8601 in UTC with milliseconds (what delta-rs writes)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass(frozen=True)
class MirrorFile:
    """A file the mirror lists: one entry of the log, by its table-relative path."""

    path: str
    partition: int
    size: int
    base_offset: int
    end_offset: int
    records: int = 0
    min_timestamp: int = 0
    max_timestamp: int = 0
    merged: bool = False
    compacted: bool = False
    modification_time: int = 0

    @classmethod
    def of(cls, table: str, entry: DataEntry, created_ms: int) -> MirrorFile:
        """The mirror file of a batch or merged segment (``created_ms``: the file's time)."""
        merged = isinstance(entry, Segment)
        return cls(
            path=relative_path(table, entry.path),
            partition=entry.partition,
            size=entry.size,
            base_offset=entry.baseOffset,
            end_offset=entry.next_offset,
            records=entry.count,
            min_timestamp=entry.minTimestamp,
            max_timestamp=entry.maxTimestamp,
            merged=merged,
            compacted=isinstance(entry, Segment) and entry.compacted,
            modification_time=created_ms,
        )

    def stats(self) -> str:
        """``add.stats``: exact record count, timestamps and the nulls of ``offset``
        (every row of a batch's file: it has no such column; none in a merged segment)."""
        stats = {
            "numRecords": self.records,
            "minValues": {TIMESTAMP_COLUMN: iso_ms(self.min_timestamp)},
            "maxValues": {TIMESTAMP_COLUMN: iso_ms(self.max_timestamp)},
            "nullCount": {
                TIMESTAMP_COLUMN: 0,
                OFFSET_COLUMN: 0 if self.merged else self.records,
            },
        }
        return json.dumps(stats, separators=(",", ":"))

    def tags(self) -> dict[str, str]:
        """``add.tags``: the offset range, so a publisher can diff without the log."""
        return {TAG_BASE_OFFSET: str(self.base_offset), TAG_END_OFFSET: str(self.end_offset)}

    def add(self, data_change: bool) -> dict[str, Any]:
        """The ``add`` action."""
        return {
            "add": {
                "path": self.path,
                "partitionValues": {PARTITION_COLUMN: str(self.partition)},
                "size": self.size,
                "modificationTime": self.modification_time,
                "dataChange": data_change,
                "stats": self.stats(),
                "tags": self.tags(),
            }
        }

    def remove(self, now: int, data_change: bool) -> dict[str, Any]:
        """The ``remove`` action (a tombstone: vacuum keeps the file for the grace period)."""
        return {
            "remove": {
                "path": self.path,
                "deletionTimestamp": now,
                "dataChange": data_change,
                "extendedFileMetadata": True,
                "partitionValues": {PARTITION_COLUMN: str(self.partition)},
                "size": self.size,
                "tags": self.tags(),
            }
        }

    @classmethod
    def from_add(cls, body: Mapping[str, Any], where: str) -> MirrorFile:
        """Parse an ``add`` (or extended ``remove``) the publisher wrote.

        Raises:
            MirrorConflictError: It lacks what a txntable publisher writes.
        """
        try:
            tags = body.get("tags") or {}
            stats = json.loads(body["stats"]) if body.get("stats") else {}
            return cls(
                path=str(body["path"]),
                partition=int(body["partitionValues"][PARTITION_COLUMN]),
                size=int(body.get("size") or 0),
                base_offset=int(tags[TAG_BASE_OFFSET]),
                end_offset=int(tags[TAG_END_OFFSET]),
                records=int(stats.get("numRecords", 0)),
                modification_time=int(body.get("modificationTime") or 0),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise MirrorConflictError(
                f"{where}: file action {str(body.get('path'))!r:.120} was not written by a "
                f"txntable publisher ({type(e).__name__}: {e})"
            ) from None


# --- the published set --------------------------------------------------------------------


def published_entries(
    part: PartitionState, start: int, first_offset: Callable[[Segment], int] | None = None
) -> list[DataEntry]:
    """The entries of ``part`` a publish lists, from offset ``start`` to the LSO.

    ``start`` is the log start offset (a full computation) or a previous publish's LSO (an
    incremental one: read_committed from any position returns the same records above it).
    ``first_offset`` gives the first record's offset of a merged segment that straddles
    ``start`` (its file says; ``None``: such a segment is not listed).
    """
    upper = part.last_stable_offset
    if start >= upper:
        return []
    out: list[DataEntry] = []
    entries = (e for e in part.entries_between(start, upper) if e.next_offset <= upper)
    for entry, visible in classify_entries(entries, part.aborted_between(start, upper)):
        if not visible or not isinstance(entry, Batch | Segment):
            continue
        if entry.count == 0 or not entry.path:
            continue
        if entry.baseOffset < start and not (
            isinstance(entry, Segment) and first_offset is not None and first_offset(entry) >= start
        ):
            continue  # a batch straddling the log start: part of it is deleted
        out.append(entry)
    return out


def straddling_segment(part: PartitionState) -> Segment | None:
    """A merged segment with records that holds the log start offset strictly inside."""
    start = part.log_start_offset
    entry = part.entry_at(start)
    if isinstance(entry, Segment) and entry.baseOffset < start and entry.count > 0:
        return entry
    return None


@dataclass(frozen=True)
class PartitionCursor:
    """Where a publish left a partition: an incremental publish starts from here when
    nothing below ``upper`` changed (same log start, no rewrite)."""

    log_start: int
    upper: int
    rewrites: int


def cursor_of(part: PartitionState) -> PartitionCursor:
    """The cursor a publish of ``part`` leaves."""
    return PartitionCursor(part.log_start_offset, part.last_stable_offset, part.rewrites)


@dataclass
class PublishPlan:
    """One publish: the actions of the Delta commit and the files it adds and removes."""

    version: int
    actions: list[dict[str, Any]]
    added: list[MirrorFile] = field(default_factory=list)
    removed: list[MirrorFile] = field(default_factory=list)
    cursors: dict[int, PartitionCursor] = field(default_factory=dict)
    metadata_changed: bool = False

    @property
    def changes(self) -> bool:
        """Whether the published view changes (else nothing needs writing)."""
        return bool(self.added or self.removed or self.metadata_changed)


@dataclass
class FilePlan:
    """What a publish of any mirror format changes: files to add and remove (each with its
    ``dataChange``) and where it leaves each partition."""

    adds: list[tuple[MirrorFile, bool]]
    removes: list[tuple[MirrorFile, bool]]
    cursors: dict[int, PartitionCursor]


def plan_files(
    snap: TableSnapshot,
    listed_by_partition: Mapping[int, Mapping[str, MirrorFile]],
    cursors: Mapping[int, PartitionCursor] | None,
    now: int,
    first_offset: Callable[[Segment], int] | None = None,
    created_ms: Callable[[str], int | None] = lambda _path: None,
) -> FilePlan:
    """The files that bring a mirror listing ``listed_by_partition`` to the published set
    at ``snap`` (the format-independent part of a publish: Delta and Iceberg share it).

    ``cursors``: where this publisher left each partition, valid only for the snapshot
    object the previous plan was made from and for the listing being that plan's result
    (``None``: compute every partition in full, which also repairs any difference with
    what the mirror lists). A full computation is O(entries) of the partition; an
    incremental one, taken when nothing below the previous LSO changed (same log start,
    no merge), O(entries above it).

    ``dataChange`` is false exactly where a commit only rearranges records: a merged
    (not compacted) segment whose records are those of the files it replaces, and those
    files; retention and compaction remove with ``dataChange`` true.

    Raises:
        MirrorUnsupportedError: A segment outside the table's directory.
    """
    assert snap.metadata is not None
    table = snap.metadata.name
    adds: list[tuple[MirrorFile, bool]] = []
    removes: list[tuple[MirrorFile, bool]] = []
    new_cursors: dict[int, PartitionCursor] = {}

    def mirror_file(entry: DataEntry) -> MirrorFile:
        return MirrorFile.of(table, entry, created_ms(entry.path) or now)

    for part in snap.partitions:
        p = part.partition
        listed = listed_by_partition.get(p, {})
        old = (cursors or {}).get(p)
        new_cursors[p] = cursor_of(part)
        if old is not None and (old.log_start, old.rewrites) == (
            part.log_start_offset,
            part.rewrites,
        ):
            for entry in published_entries(part, max(old.upper, part.log_start_offset)):
                f = mirror_file(entry)
                if f.path not in listed:
                    adds.append((f, True))
            continue
        wanted = published_entries(part, part.log_start_offset, first_offset)
        part_adds, part_removes = diff_partition(listed, [mirror_file(e) for e in wanted])
        adds += part_adds
        removes += part_removes
    return FilePlan(adds, removes, new_cursors)


def plan_publish(
    snap: TableSnapshot,
    state: MirrorState,
    cursors: Mapping[int, PartitionCursor] | None,
    now: int,
    first_offset: Callable[[Segment], int] | None = None,
    created_ms: Callable[[str], int | None] = lambda _path: None,
) -> PublishPlan:
    """The Delta commit that brings the mirror (``state``) to the published set at ``snap``
    (the files: :func:`plan_files`).

    Raises:
        MirrorUnsupportedError: The table cannot be mirrored (see :func:`delta_schema`,
            :func:`relative_path`), or its schema changed in a way reader 1 cannot read.
    """
    assert snap.metadata is not None
    meta = metadata_action(snap.metadata)
    metadata_changed = state.metadata is None or any(
        state.metadata.get(k) != meta["metaData"][k] for k in ("schemaString", "id")
    )
    if state.metadata is not None and metadata_changed:
        check_schema_change(state.metadata, meta["metaData"])
    files = plan_files(snap, state.files_by_partition(), cursors, now, first_offset, created_ms)
    adds, removes = files.adds, files.removes
    actions: list[dict[str, Any]] = []
    if state.version < 0:
        actions.append(PROTOCOL_ACTION)
    if metadata_changed:
        actions.append(meta)
    txn = {"appId": app_id(snap.metadata.tableId), "version": snap.version, "lastUpdated": now}
    actions.append({"txn": txn})
    actions += [f.remove(now, change) for f, change in removes]
    actions += [f.add(change) for f, change in adds]
    actions.append(commit_info(now, snap.version, len(adds), len(removes)))
    return PublishPlan(
        state.version + 1,
        actions,
        [f for f, _ in adds],
        [f for f, _ in removes],
        files.cursors,
        metadata_changed,
    )


def diff_partition(
    listed: Mapping[str, MirrorFile], wanted: Sequence[MirrorFile]
) -> tuple[list[tuple[MirrorFile, bool]], list[tuple[MirrorFile, bool]]]:
    """Adds and removes (each with its ``dataChange``) from ``listed`` to ``wanted``.

    A merged, not compacted, segment holds exactly the records read_committed returns in
    its range, so it only rearranges data (``dataChange`` false) when the files it
    replaces held all of them; those files then leave with ``dataChange`` false too.
    """
    wanted_paths = {f.path for f in wanted}
    new = [f for f in wanted if f.path not in listed]
    gone = [f for path, f in listed.items() if path not in wanted_paths]
    rearranged: list[MirrorFile] = []

    def inside(g: MirrorFile, f: MirrorFile) -> bool:
        return f.base_offset <= g.base_offset and g.end_offset <= f.end_offset

    for f in new:
        if f.merged and not f.compacted:
            replaced = [g for g in gone if inside(g, f)]
            if replaced and sum(g.records for g in replaced) == f.records:
                rearranged.append(f)
    adds = [(f, f not in rearranged) for f in new]
    removes = [(g, not any(inside(g, f) for f in rearranged)) for g in gone]
    return adds, removes


def check_schema_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """A schema change the mirror can publish: columns added, none changed or dropped.

    Raises:
        MirrorConflictError: The mirror belongs to another table (another id).
        MirrorUnsupportedError: A column changed type (Delta's type widening is a reader 3 /
            writer 7 feature) or went away.
    """
    if old.get("id") != new.get("id"):
        raise MirrorConflictError(
            f"the Delta log's table id {old.get('id')} is not this table's ({new.get('id')})"
        )
    before = {f["name"]: f for f in json.loads(old["schemaString"])["fields"]}
    after = {f["name"]: f for f in json.loads(new["schemaString"])["fields"]}
    for name, f in before.items():
        g = after.get(name)
        if g is None or g["type"] != f["type"]:
            raise MirrorUnsupportedError(
                f"column {name} changed from {f['type']} to {g['type'] if g else 'nothing'}: "
                "Delta reader 1 / writer 2 has no type widening; the mirror stops here"
            )


def commit_info(now: int, version: int, added: int, removed: int) -> dict[str, Any]:
    """Provenance of a publish (Delta's ``commitInfo``; readers do not interpret it)."""
    return {
        "commitInfo": {
            "timestamp": now,
            "operation": "TXNTABLE PUBLISH",
            "operationParameters": {"txntableVersion": str(version)},
            "engineInfo": ENGINE,
            "operationMetrics": {"numAddedFiles": str(added), "numRemovedFiles": str(removed)},
        }
    }


def encode_commit(actions: Iterable[Mapping[str, Any]]) -> bytes:
    """A Delta commit: one JSON action per line."""
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()


def decode_commit(data: bytes, where: str) -> list[dict[str, Any]]:
    """The actions of a Delta commit.

    Raises:
        MirrorConflictError: It is not newline-delimited JSON objects.
    """
    try:
        out = [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]
    except (UnicodeDecodeError, ValueError) as e:
        raise MirrorConflictError(f"{where} is not a Delta commit: {e}") from None
    if not all(isinstance(a, dict) and len(a) == 1 for a in out):
        raise MirrorConflictError(f"{where} is not a Delta commit (an action is not an object)")
    return out


# --- the mirror's own log -----------------------------------------------------------------


@dataclass
class MirrorState:
    """What the mirror lists at one of its versions (Delta's reconciled snapshot) and the
    txntable version it was published from. Built only from logs this publisher writes:
    a commit without the table's ``txn`` is a foreign writer's and is refused."""

    table_id: str
    version: int = -1
    txn_version: int = -1
    metadata: dict[str, Any] | None = None
    files: dict[str, MirrorFile] = field(default_factory=dict)
    #: Removed files (tombstones): path -> (file, deletion time).
    tombstones: dict[str, tuple[MirrorFile, int]] = field(default_factory=dict)

    #: ``files`` by partition, kept as commits apply (a publish must not rebuild it: O(files)).
    _by_partition: dict[int, dict[str, MirrorFile]] = field(default_factory=dict, repr=False)

    def files_by_partition(self) -> dict[int, dict[str, MirrorFile]]:
        """The listed files, by partition (do not modify)."""
        return self._by_partition

    def apply_commit(self, version: int, actions: Sequence[Mapping[str, Any]], where: str) -> None:
        """Apply Delta commit ``version`` (one this table's publishers wrote).

        Raises:
            MirrorConflictError: The commit is not the next version, holds no ``txn`` of
                this table with a newer version (a foreign writer), or changes the
                protocol or the table id.
        """
        if version != self.version + 1:
            raise MirrorConflictError(f"{where}: version {version} does not follow {self.version}")
        ours = app_id(self.table_id)
        txns = [a["txn"] for a in actions if "txn" in a]
        mine = [t for t in txns if isinstance(t, dict) and t.get("appId") == ours]
        if len(mine) != 1 or len(txns) != 1 or not isinstance(mine[0].get("version"), int):
            raise MirrorConflictError(
                f"{where}: Delta commit {version} was not written by a txntable publisher of "
                f"this table (no txn {ours}); the mirror refuses to publish over a foreign "
                "writer's commit — remove the foreign commits or the _delta_log directory"
            )
        txn_version = mine[0]["version"]
        if txn_version <= self.txn_version:
            raise MirrorConflictError(
                f"{where}: Delta commit {version} publishes txntable version {txn_version}, "
                f"not after {self.txn_version}"
            )
        self.txn_version = txn_version
        self._apply_actions(version, actions, where)
        self.version = version

    def _apply_actions(
        self, version: int, actions: Iterable[Mapping[str, Any]], where: str
    ) -> None:
        for action in actions:
            ((name, body),) = action.items()
            if name == "protocol":
                if (body.get("minReaderVersion"), body.get("minWriterVersion")) != (
                    DELTA_READER_VERSION,
                    DELTA_WRITER_VERSION,
                ):
                    raise MirrorConflictError(f"{where}: protocol {body} is not the mirror's")
            elif name == "metaData":
                if body.get("id") != self.table_id:
                    raise MirrorConflictError(
                        f"{where}: the Delta log belongs to table id {body.get('id')}, not "
                        f"{self.table_id}"
                    )
                self.metadata = dict(body)
            elif name == "add":
                f = MirrorFile.from_add(body, where)
                self.files[f.path] = f
                self._by_partition.setdefault(f.partition, {})[f.path] = f
                self.tombstones.pop(f.path, None)
            elif name == "remove":
                path = body.get("path")
                gone = self.files.pop(str(path), None)
                if gone is not None:
                    self._by_partition.get(gone.partition, {}).pop(gone.path, None)
                    self.tombstones[gone.path] = (gone, int(body.get("deletionTimestamp") or 0))
        if self.metadata is None:
            raise MirrorConflictError(f"{where}: the Delta log has no metaData at {version}")

    def referenced_keys(self, table: str, since_ms: int) -> set[str]:
        """Store keys of the files the mirror lists, and of those it removed at or after
        ``since_ms`` (a reader pinned to an older mirror version may still read them)."""
        keys = {segment_key_of(table, p) for p in self.files}
        for path, (_, removed_at) in self.tombstones.items():
            if removed_at >= since_ms:
                keys.add(segment_key_of(table, path))
        return keys


# --- checkpoints --------------------------------------------------------------------------

_STRING_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct(
    [
        pa.field("storageType", pa.string(), nullable=False),
        pa.field("pathOrInlineDv", pa.string(), nullable=False),
        pa.field("offset", pa.int32()),
        pa.field("sizeInBytes", pa.int32(), nullable=False),
        pa.field("cardinality", pa.int64(), nullable=False),
    ]
)
#: A classic (V1) checkpoint's Parquet schema: one struct column per action, one action
#: per row (Delta's "Checkpoint Schema"; ``deletionVector`` always null, for readers that
#: project it).
CHECKPOINT_SCHEMA = pa.schema(
    [
        pa.field(
            "txn",
            pa.struct(
                [
                    pa.field("appId", pa.string(), nullable=False),
                    pa.field("version", pa.int64(), nullable=False),
                    pa.field("lastUpdated", pa.int64()),
                ]
            ),
        ),
        pa.field(
            "add",
            pa.struct(
                [
                    pa.field("path", pa.string(), nullable=False),
                    pa.field("partitionValues", _STRING_MAP, nullable=False),
                    pa.field("size", pa.int64(), nullable=False),
                    pa.field("modificationTime", pa.int64(), nullable=False),
                    pa.field("dataChange", pa.bool_(), nullable=False),
                    pa.field("stats", pa.string()),
                    pa.field("tags", _STRING_MAP),
                    pa.field("deletionVector", _DV),
                ]
            ),
        ),
        pa.field(
            "remove",
            pa.struct(
                [
                    pa.field("path", pa.string(), nullable=False),
                    pa.field("deletionTimestamp", pa.int64()),
                    pa.field("dataChange", pa.bool_(), nullable=False),
                    pa.field("extendedFileMetadata", pa.bool_()),
                    pa.field("partitionValues", _STRING_MAP),
                    pa.field("size", pa.int64()),
                    pa.field("tags", _STRING_MAP),
                    pa.field("deletionVector", _DV),
                ]
            ),
        ),
        pa.field(
            "metaData",
            pa.struct(
                [
                    pa.field("id", pa.string(), nullable=False),
                    pa.field("name", pa.string()),
                    pa.field("description", pa.string()),
                    pa.field(
                        "format",
                        pa.struct(
                            [
                                pa.field("provider", pa.string(), nullable=False),
                                pa.field("options", _STRING_MAP, nullable=False),
                            ]
                        ),
                        nullable=False,
                    ),
                    pa.field("schemaString", pa.string(), nullable=False),
                    pa.field("partitionColumns", pa.list_(pa.string()), nullable=False),
                    pa.field("createdTime", pa.int64()),
                    pa.field("configuration", _STRING_MAP, nullable=False),
                ]
            ),
        ),
        pa.field(
            "protocol",
            pa.struct(
                [
                    pa.field("minReaderVersion", pa.int32(), nullable=False),
                    pa.field("minWriterVersion", pa.int32(), nullable=False),
                ]
            ),
        ),
    ]
)


def _pairs(m: Mapping[str, str] | None) -> list[tuple[str, str]] | None:
    return None if m is None else list(m.items())


def checkpoint_rows(state: MirrorState, tombstones_since: int) -> list[dict[str, Any]]:
    """The rows of the classic checkpoint of ``state``: protocol, metaData, the txn, every
    listed file (``dataChange`` false: a checkpoint adds nothing) and the tombstones removed
    at or after ``tombstones_since`` (vacuum's grace period)."""
    assert state.metadata is not None
    meta = dict(state.metadata)
    meta["format"] = {"provider": "parquet", "options": []}
    meta["configuration"] = _pairs(meta.get("configuration") or {})
    rows: list[dict[str, Any]] = [
        {"protocol": PROTOCOL_ACTION["protocol"]},
        {"metaData": meta},
        {"txn": {"appId": app_id(state.table_id), "version": state.txn_version}},
    ]
    for f in state.files.values():
        add = f.add(False)["add"]
        add["partitionValues"] = _pairs(add["partitionValues"])
        add["tags"] = _pairs(add["tags"])
        rows.append({"add": add})
    for f, ts in state.tombstones.values():
        if ts >= tombstones_since:
            rm = f.remove(ts, False)["remove"]
            rm["partitionValues"] = _pairs(rm["partitionValues"])
            rm["tags"] = _pairs(rm["tags"])
            rows.append({"remove": rm})
    return rows


def checkpoint_table(state: MirrorState, tombstones_since: int) -> pa.Table:
    """The classic checkpoint of ``state`` as an Arrow table in :data:`CHECKPOINT_SCHEMA`."""
    rows = checkpoint_rows(state, tombstones_since)
    return pa.Table.from_pylist(
        [{name: row.get(name) for name in CHECKPOINT_SCHEMA.names} for row in rows],
        schema=CHECKPOINT_SCHEMA,
    )


def _unpair(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(x, tuple) and len(x) == 2 for x in value):
        return dict(value)
    if isinstance(value, dict):
        return {k: _unpair(v) for k, v in value.items()}
    return value


def load_checkpoint(
    table_id: str, version: int, rows: Iterable[Mapping[str, Any]], where: str
) -> MirrorState:
    """The state a classic checkpoint of the mirror holds (rows as ``to_pylist`` gives).

    Raises:
        MirrorConflictError: It lacks this table's txn or metaData.
    """
    state = MirrorState(table_id)
    actions: list[dict[str, Any]] = []
    for row in rows:
        for name, body in row.items():
            if body is not None:
                actions.append({name: _unpair(body)})
    txns = [a["txn"] for a in actions if "txn" in a]
    if len(txns) != 1 or txns[0].get("appId") != app_id(table_id):
        raise MirrorConflictError(f"{where}: checkpoint without this table's txn")
    state.txn_version = int(txns[0]["version"])
    removes = [a for a in actions if "remove" in a]
    state._apply_actions(version, [a for a in actions if "remove" not in a], where)
    for action in removes:
        body = action["remove"]
        f = MirrorFile.from_add({**body, "stats": None}, where)
        state.tombstones[f.path] = (f, int(body.get("deletionTimestamp") or 0))
    state.version = version
    return state
