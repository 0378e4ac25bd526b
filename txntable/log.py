"""A commit log on a store: versions, checkpoints, incremental refresh and the commit loop.

Version ``N`` of the log rooted at ``<root>`` is the object ``<root>/_log/<N:020d>.json``,
created with ``put_if_absent``: the writer that creates it has committed. A loser refreshes
(reads only the versions it has not seen), rebuilds its actions against the new state, and
retries with jittered, bounded backoff. The same machinery serves tables and group offset
logs.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from txntable import config
from txntable.actions import (
    Action,
    CommitInfo,
    check_protocol,
    decode_actions,
    encode_actions,
    loads_strict,
)
from txntable.errors import (
    CommitConflictError,
    CorruptLogError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from txntable.snapshot import TableSnapshot, checkpoint_actions, load_checkpoint
from txntable.storage.base import Store

LOG_DIR = "_log"
LAST_CHECKPOINT = "_last_checkpoint"
#: Name of a checkpoint object: its version zero-padded to 20 digits, as a log version's.
CHECKPOINT_NAME = re.compile(r"([0-9]{20})\.checkpoint\.json")

T = TypeVar("T")
_log = logging.getLogger(__name__)


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(time.time() * 1000)


@dataclass
class CommitPlan(Generic[T]):
    """What a commit attempt writes (``actions``) and returns to its caller (``result``).

    A plan with no actions writes nothing: for example every batch was a duplicate.
    """

    actions: list[Action]
    result: T
    operation: str = "WRITE"


@dataclass
class CommitStats:
    """Counters a writer can inspect (attempts lost to other writers, ambiguous puts)."""

    conflicts: int = 0
    ambiguous: int = 0
    commits: int = 0


#: Amortised budget of a commit: entries a checkpoint may re-encode per committed version.
CHECKPOINT_ENTRIES_PER_VERSION = 100


def checkpoint_due(version: int, interval: int, num_entries: int) -> bool:
    """Whether the writer of ``version`` writes a checkpoint (pure; every writer agrees).

    A checkpoint re-encodes the whole state (``num_entries`` batches and markers), so at a
    fixed interval its cost per commit would grow with the table. The spacing starts at
    ``interval`` and doubles while the state exceeds ``CHECKPOINT_ENTRIES_PER_VERSION``
    entries per version of spacing: the amortised cost per commit stays bounded, and a
    cold load replays a tail shorter than ``2 * num_entries / 100`` versions.
    """
    if interval <= 0 or version <= 0:
        return False
    spacing = interval
    while num_entries > spacing * CHECKPOINT_ENTRIES_PER_VERSION:
        spacing *= 2
    return version % spacing == 0


class Log:
    """The commit log rooted at ``root`` (a table name, or ``_groups/<group>``)."""

    def __init__(
        self,
        store: Store,
        root: str,
        checkpoint_interval: int = config.CHECKPOINT_INTERVAL_DEFAULT,
        max_attempts: int = config.COMMIT_MAX_ATTEMPTS_DEFAULT,
        backoff_ms: int = config.COMMIT_BACKOFF_MS_DEFAULT,
        backoff_max_ms: int = config.COMMIT_BACKOFF_MAX_MS_DEFAULT,
    ) -> None:
        self.store = store
        self.root = root
        self.checkpoint_interval = checkpoint_interval
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        self.stats = CommitStats()
        self._lock = threading.Lock()

    # --- keys -----------------------------------------------------------------------------

    def version_key(self, version: int) -> str:
        """Key of log version ``version``."""
        return f"{self.root}/{LOG_DIR}/{version:020d}.json"

    def checkpoint_key(self, version: int) -> str:
        """Key of the checkpoint at ``version``."""
        return f"{self.root}/{LOG_DIR}/{version:020d}.checkpoint.json"

    @property
    def last_checkpoint_key(self) -> str:
        """Key of the last-checkpoint hint."""
        return f"{self.root}/{LOG_DIR}/{LAST_CHECKPOINT}"

    # --- reading --------------------------------------------------------------------------

    def read_version(self, version: int) -> list[Action] | None:
        """Read and decode one version, or ``None`` if it does not exist yet."""
        key = self.version_key(version)
        try:
            data = self.store.get(key).data
        except ObjectNotFoundError:
            return None
        return decode_actions(data, key)

    def exists(self) -> bool:
        """Whether version 0 exists."""
        return self.store.head(self.version_key(0)) is not None

    def _checkpoint_hint(self) -> int | None:
        try:
            data = self.store.get(self.last_checkpoint_key).data
            version = loads_strict(data)["version"]
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a hint is never trusted blindly: fall back to listing
        return version if isinstance(version, int) and version >= 0 else None

    def _list_checkpoints(self, at_most: int | None) -> list[int]:
        """Checkpoint versions at or below ``at_most``, newest first (a cold-start fallback)."""
        versions = []
        for key in self.store.list(f"{self.root}/{LOG_DIR}/"):
            match = CHECKPOINT_NAME.fullmatch(key.rsplit("/", 1)[-1])
            if match:
                v = int(match.group(1))
                if at_most is None or v <= at_most:
                    versions.append(v)
        return sorted(versions, reverse=True)

    def _read_checkpoint(self, version: int) -> TableSnapshot | None:
        key = self.checkpoint_key(version)
        try:
            data = self.store.get(key).data
        except ObjectNotFoundError:
            return None
        return load_checkpoint(version, decode_actions(data, key), key)

    def _checkpoint_candidates(self, version: int | None) -> Iterator[int]:
        hint = self._checkpoint_hint()
        if hint is not None and (version is None or hint <= version):
            yield hint
        # The hint is missing, stale, dangling or damaged: list (costs O(log length) once).
        for listed in self._list_checkpoints(version):
            if listed != hint:
                yield listed

    def load(self, version: int | None = None) -> TableSnapshot:
        """Load the snapshot at ``version`` (latest if ``None``): checkpoint, then the tail.

        A damaged checkpoint is skipped with a warning: checkpoints are derived data and the
        log versions stay the source of truth.

        Raises:
            ObjectNotFoundError: If the log has no version 0 (no such table).
            CorruptLogError: If a log version is damaged.
        """
        snap: TableSnapshot | None = None
        for cp in self._checkpoint_candidates(version):
            try:
                snap = self._read_checkpoint(cp)
            except CorruptLogError as e:
                _log.warning("skipping damaged checkpoint: %s", e)
                continue
            if snap is not None:
                break
        if snap is None:
            snap = TableSnapshot()
            actions = self.read_version(0)
            if actions is None:
                raise ObjectNotFoundError(self.version_key(0))
            snap.apply(0, actions, self.version_key(0))
        self.refresh(snap, up_to=version)
        if version is not None and snap.version != version:
            raise CorruptLogError(f"version {version} does not exist (latest {snap.version})")
        return snap

    def refresh(self, snap: TableSnapshot, up_to: int | None = None) -> int:
        """Apply versions newer than ``snap.version`` in place; return how many.

        Probes ``version + 1``, ``version + 2``, … until one is missing, so a refresh costs
        one request per new version plus one, whatever the length of the history.
        """
        applied = 0
        while up_to is None or snap.version < up_to:
            nxt = snap.version + 1
            actions = self.read_version(nxt)
            if actions is None:
                break
            snap.apply(nxt, actions, self.version_key(nxt))
            applied += 1
        return applied

    # --- writing --------------------------------------------------------------------------

    def commit(
        self,
        snap: TableSnapshot,
        build: Callable[[TableSnapshot], CommitPlan[T]],
        transactional_id: str | None = None,
    ) -> tuple[CommitPlan[T], int]:
        """Commit the actions ``build`` makes from the newest state, retrying on conflict.

        ``build`` must be a pure function of the snapshot: it is called again after every
        lost race, against the refreshed snapshot, so validation and offset assignment
        always happen against the version being written after.

        Returns:
            The plan that was committed (or needed no write) and the version it is in
            (``snap.version`` when nothing was written).

        Raises:
            CommitConflictError: If ``max_attempts`` attempts all lost the race.
        """
        commit_id = uuid.uuid4().hex
        if snap.protocol is not None:
            check_protocol(snap.protocol, write=True)
        for attempt in range(self.max_attempts):
            plan = build(snap)
            if not plan.actions:
                # "Nothing to write" (all duplicates, markers already written) is only a
                # valid conclusion against the newest version: a stale snapshot would not
                # conflict on anything, so confirm by refreshing first.
                if self.refresh(snap):
                    continue
                return plan, snap.version
            info = CommitInfo(now_ms(), plan.operation, commit_id, transactionalId=transactional_id)
            actions = [*plan.actions, info]
            version = snap.version + 1
            key = self.version_key(version)
            try:
                self.store.put_if_absent(key, encode_actions(actions))
            except ObjectExistsError:
                self.stats.conflicts += 1
                self.refresh(snap)
                self._backoff(attempt)
                continue
            except (TransientStorageError, OSError):
                # The put may or may not have landed: read back, never write blindly again.
                self.stats.ambiguous += 1
                written = self.read_version(version)
                if written is None:
                    self._backoff(attempt)
                    continue
                if not any(isinstance(a, CommitInfo) and a.commitId == commit_id for a in written):
                    self.stats.conflicts += 1
                    self.refresh(snap)
                    self._backoff(attempt)
                    continue
            snap.apply(version, actions, key)
            self.stats.commits += 1
            self._maybe_checkpoint(snap)
            return plan, version
        raise CommitConflictError(
            f"{self.root}: gave up after {self.max_attempts} attempts to commit version "
            f"{snap.version + 1}"
        )

    def _backoff(self, attempt: int) -> None:
        ceiling = min(self.backoff_max_ms, self.backoff_ms * (2 ** min(attempt, 10)))
        time.sleep(random.uniform(0, ceiling) / 1000)

    def _maybe_checkpoint(self, snap: TableSnapshot) -> None:
        entries = sum(len(p.entries) for p in snap.partitions)
        if checkpoint_due(snap.version, self.checkpoint_interval, entries):
            self.write_checkpoint(snap)

    def write_checkpoint(self, snap: TableSnapshot) -> None:
        """Write the checkpoint of ``snap`` and point the hint at it.

        A checkpoint is an optimisation: the log versions stay the source of truth, so a
        failure here (after the commit it follows has landed) is logged, not raised, and
        costs only a longer replay later.
        """
        try:
            data = encode_actions(checkpoint_actions(snap))
            self.store.put(self.checkpoint_key(snap.version), data)
            self.store.put(self.last_checkpoint_key, json.dumps({"version": snap.version}).encode())
        except (StorageError, OSError) as e:
            _log.warning("checkpoint %s@%d not written: %s", self.root, snap.version, e)
