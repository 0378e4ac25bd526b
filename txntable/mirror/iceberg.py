"""Publishing the Iceberg mirror: the I/O around :mod:`txntable.protocol.iceberg`.

pyiceberg (the ``txntable[iceberg]`` extra) writes the Avro manifests and manifest lists and
applies the metadata updates; everything goes through the table's :class:`Store` (a
:class:`pyiceberg.io.FileIO` over it), and a catalog of our own commits: it writes the next
``<table>/metadata/v<N>.metadata.json`` with put-if-absent (the commit point), then
``version-hint.text`` (a hint). A publisher that loses the race reloads the winner's
metadata, does nothing if it published ``S`` or later, else plans again — one linear
history. A snapshot whose summary does not name this table and a txntable version (a
foreign writer's) stops publishing with :class:`MirrorConflictError`.

Each publish expires the snapshots replaced longer than ``version.retention.ms`` ago, so the
metadata file stays bounded, and vacuum keeps every file a kept snapshot lists.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from txntable import config
from txntable.errors import (
    CommitConflictError,
    InvalidConfigurationError,
    MirrorConflictError,
    MirrorDependencyError,
    MirrorUnsupportedError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from txntable.layout import segment_created_ms
from txntable.protocol.iceberg import (
    FIXED_PROPERTIES,
    METADATA_DIR,
    NAME_MAPPING_PROPERTY,
    PARTITION_FIELD_ID,
    VERSION_HINT,
    SnapshotInfo,
    absolute_location,
    check_history,
    expired_snapshots,
    field_id,
    file_stats,
    iceberg_schema,
    metadata_file_name,
    metadata_version_of,
    name_mapping_json,
    retained_snapshots,
    snapshot_properties,
    table_location,
)
from txntable.protocol.mirror import MirrorFile, PartitionCursor, plan_files, segment_key_of
from txntable.protocol.schema import PARTITION_COLUMN
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage.base import Store
from txntable.util import now_ms

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

_log = logging.getLogger(__name__)

#: Attempts of one publish that lose the race to other publishers.
MAX_ATTEMPTS = 20


def _require_pyiceberg() -> None:
    try:
        import pyiceberg  # noqa: F401
    except ImportError as e:
        raise MirrorDependencyError(
            "publishing the Iceberg mirror needs pyiceberg: pip install 'txntable[iceberg]' "
            f"({e})"
        ) from None


def metadata_dir(table: str) -> str:
    """Prefix of the Iceberg mirror's metadata: ``<table>/metadata/``."""
    return f"{table}/{METADATA_DIR}/"


def metadata_key(table: str, version: int) -> str:
    """Key of metadata file ``version``."""
    return f"{metadata_dir(table)}{metadata_file_name(version)}"


def version_hint_key(table: str) -> str:
    """Key of ``version-hint.text``."""
    return f"{metadata_dir(table)}{VERSION_HINT}"


@dataclass
class IcebergPublishReport:
    """What an Iceberg publish did. ``metadata_version`` is ``None`` when nothing was
    written: the mirror already showed the table at ``txntable_version`` (or later)."""

    txntable_version: int
    metadata_version: int | None = None
    snapshot_id: int | None = None
    added: int = 0
    removed: int = 0
    expired: int = 0
    bytes_written: int = 0
    conflicts: int = 0


# --- a FileIO over the store ----------------------------------------------------------------


@functools.cache
def _file_io_classes() -> tuple[type, type, type]:
    """The FileIO, InputFile and OutputFile over a :class:`Store` (built on first use:
    pyiceberg is an optional dependency)."""
    from pyiceberg.io import FileIO, InputFile, OutputFile

    class _Sink(io.BytesIO):
        """Buffers an output file; ``close`` writes it (manifests are small)."""

        def __init__(self, out: _StoreOutputFile) -> None:
            super().__init__()
            self._out = out

        def close(self) -> None:
            if not self.closed:
                data = self.getvalue()
                super().close()
                self._out.write(data)

        def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> None:
            if exc_type is not None:
                io.BytesIO.close(self)  # a failed writer leaves nothing behind
                return
            self.close()

    class _StoreInputFile(InputFile):
        def __init__(self, fio: StoreFileIO, location: str) -> None:
            super().__init__(location)
            self._fio = fio

        def __len__(self) -> int:
            info = self._fio.store.head(self._fio.key(self.location))
            if info is None:
                raise FileNotFoundError(self.location)
            return info.size

        def exists(self) -> bool:
            return self._fio.store.exists(self._fio.key(self.location))

        def open(self, seekable: bool = True) -> io.BytesIO:
            try:
                return io.BytesIO(self._fio.store.get(self._fio.key(self.location)).data)
            except ObjectNotFoundError:
                raise FileNotFoundError(self.location) from None

    class _StoreOutputFile(OutputFile):
        def __init__(self, fio: StoreFileIO, location: str) -> None:
            super().__init__(location)
            self._fio = fio
            self._overwrite = False

        def __len__(self) -> int:
            return len(self.to_input_file())

        def exists(self) -> bool:
            return self.to_input_file().exists()

        def to_input_file(self) -> _StoreInputFile:
            return _StoreInputFile(self._fio, self.location)

        def create(self, overwrite: bool = False) -> _Sink:
            self._overwrite = overwrite
            return _Sink(self)

        def write(self, data: bytes) -> None:
            """Without ``overwrite``, put-if-absent: a lost race is ``FileExistsError``; an
            unknown outcome is resolved by reading back."""
            key = self._fio.key(self.location)
            store = self._fio.store
            if self._overwrite:
                store.put(key, data)
            else:
                try:
                    store.put_if_absent(key, data)
                except ObjectExistsError:
                    raise FileExistsError(self.location) from None
                except (TransientStorageError, OSError):
                    try:
                        written = store.get(key).data
                    except ObjectNotFoundError:
                        raise FileExistsError(self.location) from None
                    if written != data:
                        raise FileExistsError(self.location) from None
            self._fio.bytes_written += len(data)

    class StoreFileIO(FileIO):
        """pyiceberg's I/O through a txntable store: the locations under the table's
        location are its keys under ``<table>/``."""

        def __init__(self, store: Store, location: str, table: str) -> None:
            super().__init__({})
            self.store = store
            self.location = location
            self.table = table
            self.bytes_written = 0

        def key(self, location: str) -> str:
            prefix = self.location + "/"
            if not location.startswith(prefix):
                raise MirrorUnsupportedError(
                    f"{location} lies outside the Iceberg mirror's location {self.location}"
                )
            return f"{self.table}/{location[len(prefix):]}"

        def new_input(self, location: str) -> _StoreInputFile:
            return _StoreInputFile(self, location)

        def new_output(self, location: str) -> _StoreOutputFile:
            return _StoreOutputFile(self, location)

        def delete(self, location: Any) -> None:
            where = location if isinstance(location, str) else location.location
            self.store.delete(self.key(where))

    return StoreFileIO, _StoreInputFile, _StoreOutputFile


def store_file_io(store: Store, location: str, table: str) -> Any:
    """A pyiceberg ``FileIO`` reading and writing the mirror through ``store``."""
    _require_pyiceberg()
    return _file_io_classes()[0](store, location, table)


# --- the mirror's state ---------------------------------------------------------------------


@dataclass
class IcebergState:
    """What the Iceberg mirror lists at metadata version ``version`` (0: no mirror yet) and
    the txntable version its current snapshot publishes."""

    table_id: str
    location: str
    version: int = 0
    metadata: TableMetadata | None = None
    txn_version: int = -1
    files: dict[str, MirrorFile] = field(default_factory=dict)
    by_partition: dict[int, dict[str, MirrorFile]] = field(default_factory=dict, repr=False)

    def add(self, f: MirrorFile) -> None:
        self.files[f.path] = f
        self.by_partition.setdefault(f.partition, {})[f.path] = f

    def remove(self, path: str) -> None:
        gone = self.files.pop(path, None)
        if gone is not None:
            self.by_partition.get(gone.partition, {}).pop(path, None)


def _snapshot_infos(metadata: TableMetadata) -> list[SnapshotInfo]:
    return [
        SnapshotInfo(
            s.snapshot_id,
            s.sequence_number or 0,
            s.timestamp_ms,
            {**s.summary.additional_properties, "operation": s.summary.operation.value}
            if s.summary is not None
            else {},
        )
        for s in metadata.snapshots
    ]


def _newest_version(store: Store, table: str) -> int:
    """The newest metadata version (0: none): the hint, then probing forward (the hint may
    lag: it is written after the commit); listing only without a usable hint."""
    version = 0
    try:
        text = store.get(version_hint_key(table)).data.decode().strip()
        version = int(text) if text.isdigit() else 0
    except (ObjectNotFoundError, UnicodeDecodeError):
        version = 0
    if version > 0 and not store.exists(metadata_key(table, version)):
        version = 0  # a hint to nothing: never trusted blindly
    if version == 0:
        prefix = metadata_dir(table)
        for key in store.list(prefix):
            v = metadata_version_of(key[len(prefix) :])
            if v is not None:
                version = max(version, v)
    while store.exists(metadata_key(table, version + 1)):
        version += 1
    return version


def _read_metadata(store: Store, table: str, version: int) -> TableMetadata:
    from pyiceberg.table.metadata import TableMetadataUtil

    key = metadata_key(table, version)
    data = store.get(key).data
    try:
        return TableMetadataUtil.parse_raw(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MirrorConflictError(f"{key} is not Iceberg table metadata: {e}") from None


def _check(state: IcebergState, metadata: TableMetadata, where: str) -> int:
    if str(metadata.table_uuid) != str(_table_uuid(state.table_id)):
        raise MirrorConflictError(
            f"{where}: the Iceberg metadata belongs to table uuid {metadata.table_uuid}, not "
            f"this table's ({state.table_id})"
        )
    current = metadata.current_snapshot_id
    return check_history(state.table_id, _snapshot_infos(metadata), current, where)


def _table_uuid(table_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(table_id)
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"txntable:{table_id}")


def _live_entries(metadata: TableMetadata, fio: Any, snapshot_id: int | None) -> Iterator[Any]:
    snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snapshot is None:
        return
    for manifest in snapshot.manifests(io=fio):
        yield from manifest.fetch_manifest_entry(io=fio, discard_deleted=True)


def _relative(location: str, path: str) -> str | None:
    prefix = location + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def load_state(store: Store, table: str, table_id: str, location: str) -> IcebergState:
    """The mirror's newest state (empty, version 0, if the table has none), with what its
    current snapshot lists (read from its manifests: O(files)).

    Raises:
        MirrorConflictError: Metadata of another table, or a foreign writer's snapshot.
    """
    _require_pyiceberg()
    state = IcebergState(table_id, location)
    version = _newest_version(store, table)
    if version == 0:
        return state
    metadata = _read_metadata(store, table, version)
    state.txn_version = _check(state, metadata, metadata_key(table, version))
    state.version, state.metadata = version, metadata
    fio = store_file_io(store, metadata.location, table)
    for entry in _live_entries(metadata, fio, metadata.current_snapshot_id):
        df = entry.data_file
        path = _relative(metadata.location, df.file_path)
        if path is None:
            raise MirrorConflictError(
                f"{metadata_key(table, version)}: data file {df.file_path} lies outside the "
                "table: not written by a txntable publisher"
            )
        # The offsets of a listed file are not in Iceberg's manifests: unknown (-1) only
        # marks a merge as a data change (an overwrite, never a wrong listing).
        state.add(
            MirrorFile(
                quote(path, safe="/="),
                int(df.partition[0]),
                df.file_size_in_bytes,
                -1,
                -1,
                df.record_count,
            )
        )
    return state


def iceberg_referenced_keys(store: Store, table: str, table_id: str, since_ms: int) -> set[str]:
    """Segment keys that a snapshot of the Iceberg mirror a reader may still read lists
    (the current one and those replaced at or after ``since_ms``): what vacuum keeps.

    Raises:
        MirrorConflictError: The mirror holds a foreign writer's snapshot: what it lists is
            unknown, so nothing is safe to delete.
        MirrorDependencyError: The table has an Iceberg mirror and pyiceberg is missing.
    """
    if next(iter(store.list(metadata_dir(table))), None) is None:
        return set()
    _require_pyiceberg()
    version = _newest_version(store, table)
    if version == 0:
        return set()
    metadata = _read_metadata(store, table, version)
    probe = IcebergState(table_id, metadata.location)
    _check(probe, metadata, metadata_key(table, version))
    fio = store_file_io(store, metadata.location, table)
    keys: set[str] = set()
    manifests: set[str] = set()
    for snapshot_id in retained_snapshots(
        _snapshot_infos(metadata), metadata.current_snapshot_id, since_ms
    ):
        snapshot = metadata.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        for manifest in snapshot.manifests(io=fio):
            if manifest.manifest_path in manifests:
                continue  # shared by several snapshots: read once
            manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io=fio, discard_deleted=True):
                path = _relative(metadata.location, entry.data_file.file_path)
                if path is not None:
                    keys.add(segment_key_of(table, path))
    return keys


# --- the catalog that commits by put-if-absent ------------------------------------------------


def _catalog(publisher: IcebergPublisher) -> Any:
    from pyiceberg.catalog.noop import NoopCatalog
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.table import CommitTableResponse
    from pyiceberg.table.update import AddSnapshotUpdate, update_table_metadata

    class _PutIfAbsentCatalog(NoopCatalog):
        """Commits by writing the next ``v<N>.metadata.json`` with put-if-absent."""

        def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
            base = table.metadata
            for requirement in requirements:
                requirement.validate(base)
            # A snapshot is stamped by the publisher's clock (never before the metadata it
            # follows): snapshot expiry and vacuum's grace period read these times.
            stamp = publisher.committing_stamp
            updates = tuple(
                AddSnapshotUpdate(snapshot=u.snapshot.model_copy(update={"timestamp_ms": stamp}))
                if isinstance(u, AddSnapshotUpdate)
                else u
                for u in updates
            )
            new = update_table_metadata(
                base, updates, metadata_location=table.metadata_location or None
            )
            version = publisher.committing_version
            location = f"{new.location}/{METADATA_DIR}/{metadata_file_name(version)}"
            try:
                ToOutputFile.table_metadata(new, publisher.fio.new_output(location))
            except FileExistsError:
                raise CommitFailedException(f"{location} exists: another publisher won") from None
            try:
                publisher.store.put(version_hint_key(publisher.name), str(version).encode())
            except (StorageError, OSError) as e:  # a hint: readers probe past a stale one
                _log.warning("version hint of %s not written: %s", publisher.name, e)
            return CommitTableResponse(metadata=new, metadata_location=location)  # type: ignore[call-arg]

    return _PutIfAbsentCatalog("txntable")


# --- the publisher --------------------------------------------------------------------------


class IcebergPublisher:
    """Publishes one table's Iceberg mirror. Thread-safe; keeps its own table handle, the
    mirror's state and where its last publish left each partition (incremental, like the
    Delta publisher)."""

    def __init__(self, store: Store, name: str, clock: Callable[[], int] = now_ms) -> None:
        from txntable.log.group_commit import GroupCommitConfig
        from txntable.table import Table

        _require_pyiceberg()
        self.store = store
        self.name = name
        self.clock = clock
        self.table = Table(store, name, group_commit=GroupCommitConfig(enabled=False))
        self.location = table_location(store.url, name)
        self.fio = store_file_io(store, self.location, name)
        self.committing_version = 0
        self.committing_stamp = 0
        self._state: IcebergState | None = None
        self._cursors: dict[int, PartitionCursor] | None = None
        self._cursor_snapshot: TableSnapshot | None = None
        self._first_offsets: dict[str, int] = {}
        self._lock = threading.Lock()

    def state(self) -> IcebergState:
        """The mirror's state as this publisher last saw it (loaded on first use)."""
        with self._lock:
            snap = self.table.snapshot(refresh=False)
            assert snap.metadata is not None
            if self._state is None:
                self._state = self._load(snap.metadata.tableId)
            return self._state

    def _load(self, table_id: str) -> IcebergState:
        state = load_state(self.store, self.name, table_id, self.location)
        if state.metadata is not None:
            self.fio = store_file_io(self.store, state.metadata.location, self.name)
        return state

    def publish(self) -> IcebergPublishReport:
        """Publish the table's newest version (see the module docstring).

        Raises:
            MirrorConflictError: The mirror holds a snapshot no publisher of this table wrote.
            MirrorUnsupportedError: The table cannot be mirrored as Iceberg format v2.
            CommitConflictError: Other publishers won every attempt.
        """
        from pyiceberg.exceptions import CommitFailedException

        from txntable.mirror.publisher import first_record_offset

        with self._lock:
            snap = self.table.snapshot()
            assert snap.metadata is not None
            table_id = snap.metadata.tableId
            if self._state is None or self._state.table_id != table_id:
                self._state = self._load(table_id)
                self._cursors = None
            report = IcebergPublishReport(snap.version)
            for _attempt in range(MAX_ATTEMPTS):
                state = self._state
                if state.txn_version >= snap.version:
                    return report
                cursors = self._cursors if self._cursor_snapshot is snap else None
                now = self.clock()
                plan = plan_files(
                    snap,
                    state.by_partition,
                    cursors,
                    now,
                    lambda s: first_record_offset(self.store, s, self._first_offsets),
                    segment_created_ms,
                )
                schema = iceberg_schema(snap.metadata)
                if (
                    state.metadata is not None
                    and not plan.adds
                    and not plan.removes
                    and not self._schema_changed(state.metadata, schema)
                ):
                    self._cursors, self._cursor_snapshot = plan.cursors, snap
                    return report
                self.fio.bytes_written = 0
                try:
                    expired = self._commit(state, snap, schema, plan.adds, plan.removes, now)
                except CommitFailedException:
                    report.conflicts += 1
                    self._cursors = None
                    self._state = self._load(table_id)
                    continue
                self._cursors, self._cursor_snapshot = plan.cursors, snap
                assert state.metadata is not None
                report.metadata_version = state.version
                report.snapshot_id = state.metadata.current_snapshot_id
                report.added, report.removed = len(plan.adds), len(plan.removes)
                report.expired = expired
                report.bytes_written = self.fio.bytes_written
                return report
            raise CommitConflictError(
                f"{self.name}: gave up publishing the Iceberg mirror after {MAX_ATTEMPTS} "
                "attempts"
            )

    @staticmethod
    def _schema_changed(metadata: TableMetadata, schema: Mapping[str, Any]) -> bool:
        return _shape(json.loads(metadata.schema().model_dump_json())["fields"]) != _shape(
            schema["fields"]
        )

    def _new_metadata(self, snap: TableSnapshot, schema: Mapping[str, Any]) -> TableMetadata:
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.table.metadata import new_table_metadata
        from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
        from pyiceberg.transforms import IdentityTransform

        assert snap.metadata is not None
        ice_schema = Schema.model_validate(schema)
        spec = PartitionSpec(
            PartitionField(
                source_id=field_id(schema["fields"], PARTITION_COLUMN),
                field_id=PARTITION_FIELD_ID,
                transform=IdentityTransform(),
                name=PARTITION_COLUMN,
            )
        )
        properties = {**FIXED_PROPERTIES, "format-version": "2"}
        metadata = new_table_metadata(
            ice_schema,
            spec,
            UNSORTED_SORT_ORDER,
            self.location,
            properties,
            _table_uuid(snap.metadata.tableId),
        )
        fields = json.loads(metadata.schema().model_dump_json())["fields"]
        properties = {**metadata.properties, NAME_MAPPING_PROPERTY: name_mapping_json(fields)}
        return metadata.model_copy(update={"properties": properties})

    def _commit(
        self,
        state: IcebergState,
        snap: TableSnapshot,
        schema: Mapping[str, Any],
        adds: list[tuple[MirrorFile, bool]],
        removes: list[tuple[MirrorFile, bool]],
        now: int,
    ) -> int:
        """One Iceberg commit: the schema if it changed, a snapshot adding and removing
        files, the expiry of old snapshots; returns how many expired.

        Raises:
            CommitFailedException: Another publisher wrote the next metadata version.
        """
        from pyiceberg.exceptions import ValidationError
        from pyiceberg.schema import Schema
        from pyiceberg.table import Table as IcebergTable
        from pyiceberg.table.snapshots import Operation
        from pyiceberg.table.update.snapshot import ExpireSnapshots, _OverwriteFiles

        assert snap.metadata is not None
        metadata = state.metadata or self._new_metadata(snap, schema)
        location = (  # "": no metadata file yet
            f"{metadata.location}/{METADATA_DIR}/{metadata_file_name(state.version)}"
            if state.version > 0
            else ""
        )
        ice = IcebergTable(("txntable", self.name), metadata, location, self.fio, _catalog(self))
        txn = ice.transaction()
        if state.metadata is not None and self._schema_changed(metadata, schema):
            try:
                with txn.update_schema() as update:
                    update.union_by_name(Schema.model_validate(schema))
            except (ValidationError, ValueError) as e:
                raise MirrorUnsupportedError(
                    f"{self.name}: the schema change cannot be published to Iceberg: {e}"
                ) from None
            fields = json.loads(txn.table_metadata.schema().model_dump_json())["fields"]
            txn.set_properties({NAME_MAPPING_PROPERTY: name_mapping_json(fields)})
        fields = json.loads(txn.table_metadata.schema().model_dump_json())["fields"]
        data_change = any(change for _, change in adds) or any(c for _, c in removes)
        props = snapshot_properties(snap.metadata.tableId, snap.version, data_change or not removes)
        if removes:
            operation = Operation.OVERWRITE if adds else Operation.DELETE
            producer: Any = _OverwriteFiles(
                operation=operation, transaction=txn, io=self.fio, snapshot_properties=props
            )
            gone = {f.path for f, _ in removes}
            for entry in _live_entries(metadata, self.fio, metadata.current_snapshot_id):
                path = _relative(metadata.location, entry.data_file.file_path)
                if path in gone:
                    producer.delete_data_file(entry.data_file)
        else:
            producer = txn.update_snapshot(snapshot_properties=props).merge_append()
        for f, _ in adds:
            producer.append_data_file(self._data_file(metadata.location, fields, f, snap))
        producer.commit()
        # The snapshot's time: the publisher's clock, never before the metadata it follows.
        self.committing_stamp = max(now, metadata.last_updated_ms)
        expire = self._expired(txn.table_metadata, snap, self.committing_stamp)
        if expire:
            expiry = ExpireSnapshots(txn)
            for snapshot_id in expire:
                expiry.by_id(snapshot_id)
            expiry.commit()
        self.committing_version = state.version + 1
        committed = txn.commit_transaction()
        state.version = self.committing_version
        state.metadata = committed.metadata
        state.txn_version = snap.version
        for f, _ in removes:
            state.remove(f.path)
        for f, _ in adds:
            state.add(f)
        return len(expire)

    def _data_file(
        self, location: str, fields: list[dict[str, Any]], f: MirrorFile, snap: TableSnapshot
    ) -> DataFile:
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        stats = file_stats(
            fields,
            f.records,
            f.min_timestamp,
            f.max_timestamp,
            f.merged,
            f.base_offset,
            f.end_offset,
        )
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=absolute_location(location, _unquote(f.path)),
            file_format=FileFormat.PARQUET,
            partition=Record(f.partition),
            record_count=f.records,
            file_size_in_bytes=f.size,
            null_value_counts=stats.null_value_counts,
            lower_bounds=stats.lower_bounds,
            upper_bounds=stats.upper_bounds,
        )
        data_file.spec_id = 0
        return data_file

    def _expired(self, metadata: TableMetadata, snap: TableSnapshot, now: int) -> list[int]:
        assert snap.metadata is not None
        try:
            retention = config.table_setting(
                snap.metadata.configuration, config.VERSION_RETENTION_MS
            )
        except InvalidConfigurationError:
            retention = config.VERSION_RETENTION_MS_DEFAULT
        assert isinstance(retention, int)
        current = metadata.current_snapshot_id
        infos = [  # the snapshot being committed is stamped ``now`` (see the catalog)
            replace(s, timestamp_ms=now) if s.snapshot_id == current else s
            for s in _snapshot_infos(metadata)
        ]
        return expired_snapshots(infos, current, now - retention)


def _shape(fields: list[dict[str, Any]]) -> Any:
    """A schema's fields without their ids (assigned by whoever wrote it) nor their order
    (a column added by evolution comes last in Iceberg, before the mirror's own in ours)."""
    kept = ("name", "required", "type", "fields", "element", "element-required", "key", "value",
            "value-required")

    def strip(t: Any) -> Any:
        if isinstance(t, dict):
            return {k: strip(v) for k, v in t.items() if k in kept}
        if isinstance(t, list):
            return sorted((strip(x) for x in t), key=lambda f: json.dumps(f, sort_keys=True))
        return t

    return strip(fields)


def _unquote(path: str) -> str:
    return unquote(path)
