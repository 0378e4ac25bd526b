"""Publishing the Delta mirror: the I/O around :mod:`txntable.protocol.mirror`.

A publish loads the table's newest snapshot (version ``S``) on a handle of its own, plans
the Delta commit from what the mirror lists, and writes it with put-if-absent of
``<table>/_delta_log/<n>.json``. Any client may publish: a loser of the race reads the
winner's commit, does nothing if it published ``S`` or later, else plans again. Every
``checkpoint`` interval it writes a classic checkpoint and then ``_last_checkpoint`` (a crash
between the two leaves a hint to an older checkpoint: readers replay a longer tail).

:class:`AutoPublisher` runs publishes in a background thread after commits that change
what the mirror lists, at most one per ``mirror.interval.ms``: never on the commit path.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from txntable import config
from txntable.errors import (
    InvalidConfigurationError,
    MirrorConflictError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from txntable.layout import segment_created_ms
from txntable.log.log import checkpoint_due
from txntable.protocol.actions import Segment
from txntable.protocol.mirror import (
    DELTA_LOG_DIR,
    MirrorState,
    PartitionCursor,
    checkpoint_table,
    decode_commit,
    encode_commit,
    load_checkpoint,
    plan_publish,
)
from txntable.protocol.records import OFFSET_COLUMN
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage.base import Store
from txntable.util import now_ms

if TYPE_CHECKING:
    from txntable.mirror.iceberg import IcebergPublisher, IcebergPublishReport

_log = logging.getLogger(__name__)

#: The mirror formats a publish can write.
FORMATS = ("delta", "iceberg")

#: Delta versions between classic checkpoints (Spark's ``delta.checkpointInterval``),
#: spaced further apart as the mirror lists more files (see ``checkpoint_due``).
CHECKPOINT_INTERVAL = 10
#: Attempts of one publish that lose the race to other publishers.
MAX_ATTEMPTS = 20


def delta_log_dir(table: str) -> str:
    """Prefix of the mirror's log: ``<table>/_delta_log/``."""
    return f"{table}/{DELTA_LOG_DIR}/"


def delta_version_key(table: str, version: int) -> str:
    """Key of Delta commit ``version``."""
    return f"{delta_log_dir(table)}{version:020d}.json"


def delta_checkpoint_key(table: str, version: int) -> str:
    """Key of the classic checkpoint at ``version``."""
    return f"{delta_log_dir(table)}{version:020d}.checkpoint.parquet"


def last_checkpoint_key(table: str) -> str:
    """Key of the mirror's ``_last_checkpoint`` hint."""
    return f"{delta_log_dir(table)}_last_checkpoint"


@dataclass
class PublishReport:
    """What a publish did. ``delta_version`` is ``None`` when nothing was written to the
    Delta mirror: it already showed the table at ``txntable_version`` (or a later version),
    or the publish left Delta out. ``iceberg``: the Iceberg mirror's publish, if any."""

    txntable_version: int
    delta_version: int | None = None
    added: int = 0
    removed: int = 0
    bytes_written: int = 0
    checkpoint: bool = False
    conflicts: int = 0
    iceberg: IcebergPublishReport | None = None


def read_commit(store: Store, table: str, version: int) -> list[dict[str, object]] | None:
    """Delta commit ``version`` of the mirror, or ``None`` if it does not exist."""
    key = delta_version_key(table, version)
    try:
        data = store.get(key).data
    except ObjectNotFoundError:
        return None
    return decode_commit(data, key)


def _checkpoint_versions(store: Store, table: str) -> list[int]:
    prefix = delta_log_dir(table)
    out = []
    for key in store.list(prefix):
        name = key[len(prefix) :]
        if name.endswith(".checkpoint.parquet") and name[:20].isdigit() and len(name) == 39:
            out.append(int(name[:20]))
    return sorted(out, reverse=True)


def _hint(store: Store, table: str) -> int | None:
    try:
        value = json.loads(store.get(last_checkpoint_key(table)).data)["version"]
    except ObjectNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a hint is never trusted blindly: list instead
    return value if isinstance(value, int) and value >= 0 else None


def load_state(store: Store, table: str, table_id: str) -> MirrorState:
    """The mirror's newest state: its newest readable checkpoint, then the commits after it.

    Returns an empty state (version -1) if the table has no mirror yet.

    Raises:
        MirrorConflictError: A commit or checkpoint not written by this table's publishers.
    """
    state: MirrorState | None = None
    hint = _hint(store, table)
    candidates = [hint] if hint is not None else []
    tried: set[int] = set()
    while state is None:
        for version in candidates:
            if version in tried:
                continue
            tried.add(version)
            key = delta_checkpoint_key(table, version)
            try:
                data = store.get(key).data
                rows = pq.read_table(io.BytesIO(data)).to_pylist()
            except ObjectNotFoundError:
                continue
            except (OSError, ValueError) as e:  # a damaged checkpoint: the commits remain
                _log.warning("skipping unreadable mirror checkpoint %s: %s", key, e)
                continue
            state = load_checkpoint(table_id, version, rows, key)
            break
        if state is None:
            listed = [v for v in _checkpoint_versions(store, table) if v not in tried]
            if not listed:
                state = MirrorState(table_id)
            candidates = listed
    catch_up(store, table, state)
    return state


def catch_up(store: Store, table: str, state: MirrorState) -> int:
    """Apply the mirror's commits after ``state.version``; return how many."""
    applied = 0
    while True:
        actions = read_commit(store, table, state.version + 1)
        if actions is None:
            return applied
        state.apply_commit(state.version + 1, actions, delta_version_key(table, state.version + 1))
        applied += 1


def mirror_referenced_keys(store: Store, table: str, table_id: str, since_ms: int) -> set[str]:
    """Segment keys the mirror lists, or removed at or after ``since_ms`` (what vacuum keeps).

    Raises:
        MirrorConflictError: The mirror holds a foreign writer's commit: what it lists is
            unknown, so nothing is safe to delete.
    """
    if next(iter(store.list(delta_log_dir(table))), None) is None:
        return set()
    return load_state(store, table, table_id).referenced_keys(table, since_ms)


def first_record_offset(store: Store, segment: Segment, cache: dict[str, int]) -> int:
    """First record offset of a merged segment (its ``offset`` column's statistics, or the
    column itself); files are immutable, so ``cache`` keeps it by path."""
    cached = cache.get(segment.path)
    if cached is not None:
        return cached
    try:
        f = pq.ParquetFile(io.BytesIO(store.get_data_file(segment.path)))
    except ObjectNotFoundError:
        return segment.baseOffset  # gone: readers fail on it too; do not list it
    index = f.schema_arrow.get_field_index(OFFSET_COLUMN)
    stats = [f.metadata.row_group(i).column(index).statistics for i in range(f.num_row_groups)]
    if stats and all(s is not None and s.has_min_max for s in stats):
        first = min(int(s.min) for s in stats if s is not None)
    else:
        first = int(min(f.read(columns=[OFFSET_COLUMN]).column(0).to_pylist()))
    cache[segment.path] = first
    return first


class MirrorPublisher:
    """Publishes one table's Delta mirror. Thread-safe; keeps its own table handle, the
    mirror's state and where its last publish left each partition (so the next publish is
    incremental: O(entries above the previous LSO))."""

    def __init__(self, store: Store, name: str, clock: Callable[[], int] = now_ms) -> None:
        from txntable.log.group_commit import GroupCommitConfig
        from txntable.table import Table

        self.store = store
        self.name = name
        self.clock = clock
        # Its own handle: a publish reads partitions that a shared handle's commits change.
        self.table = Table(store, name, group_commit=GroupCommitConfig(enabled=False))
        self._state: MirrorState | None = None
        self._cursors: dict[int, PartitionCursor] | None = None
        self._cursor_snapshot: TableSnapshot | None = None
        self._first_offsets: dict[str, int] = {}
        self._lock = threading.Lock()

    def state(self) -> MirrorState:
        """The mirror's state as this publisher last saw it (loaded on first use)."""
        with self._lock:
            snap = self.table.snapshot(refresh=False)
            assert snap.metadata is not None
            if self._state is None:
                self._state = load_state(self.store, self.name, snap.metadata.tableId)
            return self._state

    def publish(self) -> PublishReport:
        """Publish the table's newest version (see the module docstring).

        Raises:
            MirrorConflictError: The mirror holds a commit no publisher of this table wrote.
            MirrorUnsupportedError: The table cannot be mirrored as Delta reader 1.
            CommitConflictError: Other publishers won every attempt.
        """
        from txntable.errors import CommitConflictError

        with self._lock:
            snap = self.table.snapshot()
            assert snap.metadata is not None
            table_id = snap.metadata.tableId
            if self._state is None or self._state.table_id != table_id:
                self._state = load_state(self.store, self.name, table_id)
                self._cursors = None
            state = self._state
            report = PublishReport(snap.version)
            publish_id = uuid.uuid4().hex
            for _attempt in range(MAX_ATTEMPTS):
                if state.txn_version >= snap.version:
                    return report  # another publisher got here first
                cursors = self._cursors if self._cursor_snapshot is snap else None
                now = self.clock()
                plan = plan_publish(
                    snap, state, cursors, now, self._first_offset, segment_created_ms
                )
                plan.actions[-1]["commitInfo"]["txnId"] = publish_id
                if not plan.changes:
                    self._remember(snap, plan.cursors)
                    return report
                data = encode_commit(plan.actions)
                key = delta_version_key(self.name, plan.version)
                if not self._put(key, data, publish_id):
                    report.conflicts += 1
                    self._cursors = None
                    catch_up(self.store, self.name, state)
                    continue
                state.apply_commit(plan.version, plan.actions, key)
                self._remember(snap, plan.cursors)
                report.delta_version = plan.version
                report.added, report.removed = len(plan.added), len(plan.removed)
                report.bytes_written = len(data)
                if checkpoint_due(plan.version, CHECKPOINT_INTERVAL, len(state.files)):
                    report.checkpoint = self._checkpoint(state, snap)
                return report
            raise CommitConflictError(
                f"{self.name}: gave up publishing the mirror after {MAX_ATTEMPTS} attempts"
            )

    def _remember(self, snap: TableSnapshot, cursors: dict[int, PartitionCursor]) -> None:
        self._cursors = cursors
        self._cursor_snapshot = snap

    def _put(self, key: str, data: bytes, publish_id: str) -> bool:
        """Put-if-absent of a commit; an ambiguous outcome is resolved by reading it back."""
        try:
            self.store.put_if_absent(key, data)
        except ObjectExistsError:
            return False
        except (TransientStorageError, OSError):
            try:
                written = self.store.get(key).data
            except ObjectNotFoundError:
                return False
            return publish_id.encode() in written
        return True

    def _first_offset(self, segment: Segment) -> int:
        return first_record_offset(self.store, segment, self._first_offsets)

    def _checkpoint(self, state: MirrorState, snap: TableSnapshot) -> bool:
        """Write the classic checkpoint of ``state``, then ``_last_checkpoint``. A failure is
        logged: the commits remain, a missing checkpoint costs only a longer replay."""
        assert snap.metadata is not None
        try:
            retention = config.table_setting(
                snap.metadata.configuration, config.VERSION_RETENTION_MS
            )
        except InvalidConfigurationError:
            retention = config.VERSION_RETENTION_MS_DEFAULT
        assert isinstance(retention, int)
        table = checkpoint_table(state, self.clock() - retention)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue()
        hint = {
            "version": state.version,
            "size": table.num_rows,
            "sizeInBytes": len(data),
            "numOfAddFiles": len(state.files),
        }
        try:
            self.store.put(delta_checkpoint_key(self.name, state.version), data)
            self.store.put(last_checkpoint_key(self.name), json.dumps(hint).encode())
        except (StorageError, OSError) as e:
            _log.warning("mirror checkpoint %s@%d not written: %s", self.name, state.version, e)
            return False
        return True


class MirrorPublishers:
    """The publishers of the mirror formats ``formats`` of one table, published together:
    Delta first, then Iceberg. A failing format does not keep the others from publishing;
    its error is raised after them."""

    def __init__(
        self, store: Store, name: str, formats: tuple[str, ...], clock: Callable[[], int] = now_ms
    ) -> None:
        unknown = [f for f in formats if f not in FORMATS]
        if unknown or not formats:
            raise InvalidConfigurationError(
                f"mirror formats {list(formats)}: choose among {', '.join(FORMATS)}"
            )
        self.store = store
        self.name = name
        self.clock = clock
        self.formats = formats
        self.delta: MirrorPublisher | None = None
        self.iceberg: IcebergPublisher | None = None
        self._lock = threading.Lock()

    def publish(self) -> PublishReport:
        """Publish every format; the report is Delta's with Iceberg's as ``iceberg``.

        Raises:
            MirrorConflictError, MirrorUnsupportedError, CommitConflictError: From the first
                format that failed (the others published).
        """
        with self._lock:
            report: PublishReport | None = None
            iceberg: IcebergPublishReport | None = None
            failure: Exception | None = None
            if "delta" in self.formats:
                if self.delta is None:
                    self.delta = MirrorPublisher(self.store, self.name, self.clock)
                try:
                    report = self.delta.publish()
                except Exception as e:  # noqa: BLE001 - raised below, after the other formats
                    failure = e
            if "iceberg" in self.formats:
                try:
                    if self.iceberg is None:
                        from txntable.mirror.iceberg import IcebergPublisher

                        self.iceberg = IcebergPublisher(self.store, self.name, self.clock)
                    iceberg = self.iceberg.publish()
                except Exception as e:  # noqa: BLE001 - raised below
                    failure = failure or e
            if failure is not None:
                raise failure
            if report is None:
                assert iceberg is not None
                report = PublishReport(iceberg.txntable_version)
            report.iceberg = iceberg
            return report


class AutoPublisher:
    """Coalesces "the committed view changed" hints into background publishes: at most one
    per ``interval_ms``, in a thread that ends when idle. A failed publish is logged (the
    mirror may lag the log, never lead it) and retried at the next hint."""

    def __init__(
        self, open_publisher: Callable[[], MirrorPublisher | MirrorPublishers], interval_ms: int
    ) -> None:
        self._open_publisher = open_publisher
        self._publisher: MirrorPublisher | MirrorPublishers | None = None
        self.interval_ms = interval_ms
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last = 0.0
        #: Reports of the background publishes (the last few), for inspection.
        self.last_report: PublishReport | None = None
        self.last_error: Exception | None = None

    def hint(self) -> None:
        """Ask for a publish soon (cheap; never blocks on I/O)."""
        self._wanted.set()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="txntable-mirror", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        idle = max(5.0, 5 * self.interval_ms / 1000)
        while self._wanted.wait(idle):
            wait = self._last + self.interval_ms / 1000 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._wanted.clear()
            self._last = time.monotonic()
            try:
                if self._publisher is None:
                    self._publisher = self._open_publisher()
                self.last_report = self._publisher.publish()
                self.last_error = None
            except MirrorConflictError as e:
                self.last_error = e
                _log.error("mirror of %s: %s", self._publisher_name(), e)
            except Exception as e:  # noqa: BLE001 - background work: never kill the writer
                self.last_error = e
                _log.exception("background publish of the mirror failed")
        with self._lock:
            self._thread = None

    def _publisher_name(self) -> str:
        return self._publisher.name if self._publisher is not None else "?"

    def join(self, timeout: float | None = None) -> None:
        """Wait until no publish is wanted or running (tests, shutdown)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            thread = self._thread
            if thread is None or not thread.is_alive() or (
                not self._wanted.is_set() and self._publishing_done()
            ):
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def _publishing_done(self) -> bool:
        return self._publisher is None or not self._publisher._lock.locked()
