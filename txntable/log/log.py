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
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from txntable import config, layout
from txntable.errors import (
    CommitConflictError,
    CorruptLogError,
    KafkaTimeoutError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
    TxnTableError,
    VersionNotAvailableError,
    VersionNotFoundError,
)
from txntable.layout import (
    CHECKPOINT_NAME,
    CHECKPOINT_PART_NAME,
    LAST_CHECKPOINT,
    LOG_DIR,
    VERSION_NAME,
)
from txntable.protocol.actions import (
    MAINTENANCE_PROTOCOL_VERSION,
    Action,
    CommitInfo,
    CommitPlan,
    PartitionStart,
    Protocol,
    check_protocol,
    decode_actions,
    encode_action,
    encode_actions,
    encode_lines,
    loads_strict,
)
from txntable.protocol.snapshot import TableSnapshot, checkpoint_actions, load_checkpoint
from txntable.storage.base import Store, StoredObject
from txntable.util import RETRIABLE, now_ms, shared_pool

T = TypeVar("T")
_log = logging.getLogger(__name__)


#: A load retries a read that failed transiently in place, this many times (from this
#: many ms, doubling): the load is not restarted for one failed request.
LOAD_READ_RETRIES = 3
LOAD_READ_BACKOFF_MS = 20
#: Versions a load reads at once when a listing names them (the tail after a checkpoint).
LOAD_READS = 32
#: Reads ahead of a refresh after a lost race (one version each, in flight beside the
#: caller's own read) and a load's reads of a listed tail: shared by every log of the
#: process.
READ_AHEAD_THREADS = 32
#: A checkpoint hint fetched while a handle checked that its table exists serves the
#: handle's first load if that starts within this many seconds (a hint may be stale anyway:
#: the load checks the tip).
HINT_PREFETCH_S = 2.0


def _read_ahead_pool() -> ThreadPoolExecutor:
    return shared_pool("read-ahead", READ_AHEAD_THREADS)


@dataclass(frozen=True)
class LogListing:
    """What a LIST of a log directory holds: version and checkpoint numbers, ascending.

    ``checkpoints`` holds the versions with a complete checkpoint (a single file, or every
    part of a multi-part one); ``parts`` their part count (the largest complete set; 1 for a
    single file).
    """

    versions: list[int]
    checkpoints: list[int]
    parts: dict[int, int] = field(default_factory=dict)

    def above(self, version: int) -> LogListing:
        """The part of the listing above ``version``."""
        return LogListing(
            [v for v in self.versions if v > version],
            [c for c in self.checkpoints if c > version],
            {c: n for c, n in self.parts.items() if c > version},
        )

    def parts_of(self, version: int) -> int:
        """Part count of the checkpoint at ``version`` (1 if it is a single file)."""
        return self.parts.get(version, 1)


def find_gap(tip: int, listing: LogListing) -> tuple[int, str] | None:
    """The first missing version above ``tip`` that a listing proves is missing (pure).

    Versions are only ever created in order (version ``N+1`` by a writer that read ``N``),
    and a checkpoint only for a committed version, so a listed version or checkpoint above
    ``tip + k`` while ``tip + k`` is not listed means ``tip + k`` existed and was deleted.

    Returns:
        ``None``, or the missing version and what proves it (``"version 9"``, ``"checkpoint
        9"``).
    """
    above = listing.above(tip)
    newest = max(above.versions + above.checkpoints, default=None)
    if newest is None:
        return None
    present = set(above.versions)
    missing = tip + 1
    while missing in present:
        missing += 1
    if missing > newest:
        return None
    if max(above.versions, default=-1) > missing:
        return missing, f"version {max(above.versions)}"
    return missing, f"checkpoint {max(above.checkpoints)}"


@dataclass
class CommitStats:
    """Counters a writer can inspect (attempts lost to other writers, ambiguous puts)."""

    conflicts: int = 0
    ambiguous: int = 0
    commits: int = 0


#: Versions a handle that is far behind reads at once (:meth:`Log.catch_up`).
CATCH_UP_READS = 16

#: A put that completes longer than this after its handle last listed the log is checked
#: (one LIST) before it counts: log cleanup may have deleted its version meanwhile. Far
#: below the hour for which the store must date a checkpoint before cleanup deletes the
#: versions under it, far above the minute between a writer's listings.
PUT_RECHECK_MS = 10 * 60 * 1000

#: Actions per checkpoint part: a larger state is written in several parts.
CHECKPOINT_PART_ACTIONS = 50_000

#: Amortised budget of a commit: entries a checkpoint may re-encode per committed version.
CHECKPOINT_ENTRIES_PER_VERSION = 100

#: How far above a missing version a cold load on a store without an ordered listing probes
#: for later versions (at doubling distances: about 40 existence checks).
TIP_PROBE_SPAN = 1 << 40


def tip_probes(tip: int, span: int = TIP_PROBE_SPAN) -> list[int]:
    """Versions a bounded tip check looks for when ``tip + 1`` is missing (pure).

    ``tip + 1 + 2**k`` for ``k = 0, 1, …`` up to ``span``: if versions ``tip + 1 … tip + h``
    were deleted and at least ``h - 1`` versions follow them, one of these exists (a power
    of two lies in every ``[x, 2x]``). A single deleted version is found if any follows it.
    """
    out = []
    step = 1
    while step <= span:
        out.append(tip + 1 + step)
        step *= 2
    return out


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
        commit_timeout_ms: int = config.COMMIT_TIMEOUT_MS_DEFAULT,
        backoff_ms: int = config.COMMIT_BACKOFF_MS_DEFAULT,
        backoff_max_ms: int = config.COMMIT_BACKOFF_MAX_MS_DEFAULT,
        gap_check_interval_ms: int = config.LOG_GAP_CHECK_INTERVAL_MS_DEFAULT,
    ) -> None:
        self.store = store
        self.root = root
        self.checkpoint_interval = checkpoint_interval
        #: How long :meth:`commit` retries lost races and transient storage errors.
        self.commit_timeout_ms = commit_timeout_ms
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        #: How often a handle that keeps refreshing (or committing) lists the log to make
        #: sure the version its probe stopped at is really the newest (see ``check_tip``).
        self.gap_check_interval_ms = gap_check_interval_ms
        self._gap_checked_at: float | None = None
        #: When this handle last listed the log above its tip (a full check); a bounded
        #: probe (:meth:`probe_tip`) counts for readers, not before a write.
        self._listed_at: float | None = None
        self.stats = CommitStats()
        self.checkpoint_part_actions = CHECKPOINT_PART_ACTIONS
        self._lock = threading.Lock()
        self._checkpointer: ThreadPoolExecutor | None = None
        #: The last checkpoint's lines by action (see _checkpoint_lines).
        self._lines: dict[int, tuple[Action, str]] = {}
        #: ``_last_checkpoint`` read beside ``exists``: (when, its read), used once.
        self._hint_prefetch: tuple[float, Future[StoredObject]] | None = None

    # --- keys -----------------------------------------------------------------------------

    def version_key(self, version: int) -> str:
        """Key of log version ``version``."""
        return layout.version_key(self.root, version)

    def checkpoint_key(self, version: int, part: int = 1, parts: int = 1) -> str:
        """Key of part ``part`` of ``parts`` of the checkpoint at ``version``."""
        return layout.checkpoint_key(self.root, version, part, parts)

    @property
    def last_checkpoint_key(self) -> str:
        """Key of the last-checkpoint hint."""
        return f"{self.root}/{LOG_DIR}/{LAST_CHECKPOINT}"

    # --- reading --------------------------------------------------------------------------

    def read_version(self, version: int, retries: int = 0) -> list[Action] | None:
        """Read and decode one version, or ``None`` if it does not exist yet.

        ``retries``: a transient storage error is retried in place that many times (a load
        of a large table is hundreds of reads: restarting it on any of them made a load at
        1% failed requests finish one attempt in twelve).
        """
        key = self.version_key(version)
        try:
            data = self._get(key, retries).data
        except ObjectNotFoundError:
            return None
        return decode_actions(data, key)

    def _get(self, key: str, retries: int = 0) -> StoredObject:
        for attempt in range(retries + 1):
            try:
                return self.store.get(key)
            except TransientStorageError:
                if attempt == retries:
                    raise
                time.sleep(random.uniform(0, LOAD_READ_BACKOFF_MS * 2**attempt) / 1000)
        raise AssertionError("unreachable")

    def exists(self) -> bool:
        """Whether version 0 exists (maintenance never deletes it).

        The checkpoint hint a first load starts with is read at the same time: every caller
        loads the log right after it found it (a round trip less).
        """
        try:
            read = _read_ahead_pool().submit(self.store.get, self.last_checkpoint_key)
            self._hint_prefetch = (time.monotonic(), read)
        except RuntimeError:  # the interpreter is shutting down
            pass
        return self.store.head(self.version_key(0)) is not None

    def _read_hint(self) -> StoredObject:
        prefetch, self._hint_prefetch = self._hint_prefetch, None
        if prefetch is not None and time.monotonic() - prefetch[0] < HINT_PREFETCH_S:
            try:
                return prefetch[1].result()
            except ObjectNotFoundError:
                raise
            except (TxnTableError, OSError):
                pass  # a failed prefetch is not the answer: read again in place
        return self.store.get(self.last_checkpoint_key)

    def _checkpoint_hint(self) -> tuple[int, int] | None:
        try:
            hint = loads_strict(self._read_hint().data)
            version = hint["version"]
            parts = hint.get("parts", 1)
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a hint is never trusted blindly: fall back to listing
        if not (isinstance(version, int) and version >= 0 and isinstance(parts, int)):
            return None
        return (version, parts) if parts >= 1 else None

    def listing(self, after: int | None = None) -> LogListing:
        """Version and checkpoint numbers in the log directory (one LIST).

        Without ``after`` this is O(log length) (maintenance, cold start without a hint).
        With ``after``, the listing starts after version ``after``'s key, so in a healthy
        log it returns only what is newer: its size does not grow with the history. Names
        that are neither (``_last_checkpoint``, strays) are ignored.
        """
        prefix = f"{self.root}/{LOG_DIR}/"
        start = None if after is None else self.version_key(after)
        versions: list[int] = []
        parts: dict[int, int] = {}
        multipart: dict[tuple[int, int], set[int]] = {}
        for key in self.store.list(prefix, start_after=start):
            name = key[len(prefix) :]
            if match := VERSION_NAME.fullmatch(name):
                versions.append(int(match.group(1)))
            elif match := CHECKPOINT_NAME.fullmatch(name):
                parts.setdefault(int(match.group(1)), 1)
            elif match := CHECKPOINT_PART_NAME.fullmatch(name):
                v, i, n = (int(g) for g in match.groups())
                multipart.setdefault((v, n), set()).add(i)
        for (v, n), found in multipart.items():
            if found == set(range(1, n + 1)):
                parts[v] = max(parts.get(v, 1), n)
        return LogListing(sorted(versions), sorted(parts), parts)

    def read_checkpoint(self, version: int, parts: int = 1) -> TableSnapshot | None:
        """Load the checkpoint at ``version`` (``None`` if it is missing or a v1 stub).

        Raises:
            CorruptLogError: If a part is damaged or the state is inconsistent.
        """
        keys = [self.checkpoint_key(version, i, parts) for i in range(1, parts + 1)]

        def get(key: str) -> StoredObject:
            return self._get(key, LOAD_READ_RETRIES)

        try:
            if parts == 1:
                datas = [get(keys[0]).data]
            else:
                # Parts are independent objects: fetch them concurrently (latency-bound).
                with ThreadPoolExecutor(min(parts, 8)) as pool:
                    datas = [r.data for r in pool.map(get, keys)]
        except ObjectNotFoundError:
            return None
        actions: list[Action] = []
        for key, data in zip(keys, datas, strict=True):
            actions.extend(decode_actions(data, key))
        state = any(isinstance(a, PartitionStart) for a in actions[:3])
        if not state and parts == 1:
            first = actions[0]
            stub = isinstance(first, Protocol) and (
                first.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION
            )
            if stub:
                return None  # a stub telling v1 readers to refuse a multi-part checkpoint
        return load_checkpoint(version, actions, keys[0], state=state)

    def _checkpoint_candidates(
        self, version: int | None, listed: list[LogListing]
    ) -> Iterator[tuple[int, int]]:
        hint = self._checkpoint_hint()
        if hint is not None and (version is None or hint[0] <= version):
            yield hint
        # The hint is missing, stale, dangling or damaged: list (costs O(log length) once).
        # The listing is kept: the load checks its tip against it instead of listing again.
        listing = self.listing()
        listed.append(listing)
        for cp in sorted(listing.checkpoints, reverse=True):
            candidate = (cp, listing.parts_of(cp))
            if candidate != hint and (version is None or cp <= version):
                yield candidate

    def load(self, version: int | None = None) -> TableSnapshot:
        """Load the snapshot at ``version`` (latest if ``None``): checkpoint, then the tail.

        A damaged checkpoint is skipped with a warning: checkpoints are derived data and the
        log versions stay the source of truth. Where the tail ends the log is listed once
        (see :meth:`check_tip`), so a deleted version is never mistaken for the end — on a
        store whose listing reads the whole directory (local disk), a bounded probe
        (:meth:`probe_tip`) instead, so the load stays O(live state) however long the log.
        Where the listing comes first (an ordered store lists the tail while the checkpoint
        is read; a load without a usable hint lists the log) the versions it names are read
        concurrently: a load costs a few round trips, not one per version after the
        checkpoint.

        Raises:
            ObjectNotFoundError: If the log has no version 0 (no such table).
            CorruptLogError: If a log version is damaged or missing, or the log is truncated
                and no checkpoint that covers it is readable.
            VersionNotFoundError: If ``version`` is beyond the newest version, or negative.
            VersionNotAvailableError: If ``version`` is older than log cleanup kept.
        """
        if version is not None and version < 0:
            raise self._version_not_found(version)
        snap: TableSnapshot | None = None
        listed: list[LogListing] = []
        tail: tuple[int, Future[LogListing]] | None = None
        for cp, parts in self._checkpoint_candidates(version, listed):
            if tail is None and not listed and self.store.ordered_listing:
                # What follows the hint's checkpoint does not depend on its content: list it
                # while the checkpoint is read (a round trip less).
                try:
                    tail = (cp, _read_ahead_pool().submit(self.listing, cp))
                except RuntimeError:  # the interpreter is shutting down
                    tail = None
            try:
                snap = self.read_checkpoint(cp, parts)
            except CorruptLogError as e:
                _log.warning("skipping damaged checkpoint: %s", e)
                continue
            if snap is not None:
                break
        if snap is None:
            snap = TableSnapshot()
            if listed and 0 in listed[0].versions:
                # A young table (no checkpoint yet) was listed: version 0 is read with the
                # versions after it, not a round trip before them.
                self._read_listed(snap, listed[0], up_to=version)
            if snap.version < 0:
                actions = self.read_version(0, LOAD_READ_RETRIES)
                if actions is None:
                    raise ObjectNotFoundError(self.version_key(0))
                snap.apply(0, actions, self.version_key(0))
            if version != 0:
                self._check_not_truncated(listed, version)
        listing = listed[0] if listed else None
        if listing is None and tail is not None and tail[0] == snap.version:
            listing = tail[1].result()
        if listing is not None:
            # The listing names the tail: read it concurrently, not a round trip a version.
            self._read_listed(snap, listing, up_to=version)
            if version is None or snap.version < version:
                self.check_tip(snap, up_to=version, listing=listing)
        else:
            self._probe(snap, up_to=version, retries=LOAD_READ_RETRIES)
            if version is None or snap.version < version:
                if self.store.ordered_listing:
                    self.check_tip(snap, up_to=version)
                else:
                    self.probe_tip(snap, up_to=version)
        if version is not None and snap.version != version:
            raise self._version_not_found(version, snap.version)
        return snap

    def _read_listed(self, snap: TableSnapshot, listing: LogListing, up_to: int | None) -> None:
        """Apply the versions ``listing`` holds right after ``snap.version`` (up to ``up_to``,
        until the first it lacks), ``LOAD_READS`` at a time. A version that is gone by the
        time it is read ends the run: the caller's tip check settles it."""
        present = set(listing.versions)
        last = snap.version
        while last + 1 in present and (up_to is None or last < up_to):
            last += 1
        self._read_known(snap, last, LOAD_READS, LOAD_READ_RETRIES)

    def _read_known(
        self, snap: TableSnapshot, last: int, at_once: int, retries: int = 0
    ) -> int | None:
        """Apply ``snap.version + 1`` … ``last`` (versions known to exist), read ``at_once``
        at a time concurrently and applied in order.

        Returns:
            The first version that was missing when read (the rest are not applied), or
            ``None``.
        """
        pool = _read_ahead_pool()
        while snap.version < last:
            wanted = range(snap.version + 1, min(last, snap.version + at_once) + 1)
            reads = [pool.submit(self.read_version, v, retries) for v in wanted]
            try:
                for version, read in zip(wanted, reads, strict=True):
                    actions = read.result()
                    if actions is None:
                        return version
                    snap.apply(version, actions, self.version_key(version))
            finally:
                for read in reads:
                    read.cancel()
        return None

    def _check_not_truncated(self, listed: list[LogListing], version: int | None) -> None:
        """Replay from version 0 needs version 1 onwards: refuse a truncated log."""
        listing = listed[0] if listed else self.listing()
        later = [v for v in listing.versions if v > 0]
        if later and later[0] > 1:
            earliest = min(listing.checkpoints, default=later[0])
            if version is not None and version < earliest:
                raise VersionNotAvailableError(version, earliest)
            raise CorruptLogError(
                f"log truncated before version {later[0]} and no checkpoint covering it is "
                "readable",
                self.root,
            )

    def _version_not_found(self, version: int, newest: int | None = None) -> VersionNotFoundError:
        if newest is None:
            try:
                newest = self.load().version
            except TxnTableError:
                newest = None
        available = "none" if newest is None else f"0..{newest}"
        return VersionNotFoundError(
            f"{self.root}: cannot time travel to version {version}; available versions: {available}"
        )

    def refresh(self, snap: TableSnapshot, up_to: int | None = None, lost: bool = False) -> int:
        """Apply versions newer than ``snap.version`` in place; return how many.

        Probes ``version + 1``, ``version + 2``, … until one is missing, so a refresh costs
        one request per new version plus one, whatever the length of the history (``lost``:
        after a lost race, two at a time). At most once per ``gap_check_interval_ms`` the
        miss is confirmed by :meth:`check_tip`.

        Raises:
            CorruptLogError: A version is damaged, or a check found one missing.
        """
        applied = self._probe(snap, up_to, paired=lost)
        if (up_to is None or snap.version < up_to) and self._gap_check_due():
            applied += self.check_tip(snap, up_to)
        return applied

    def catch_up(self, snap: TableSnapshot, known: int) -> int:
        """Apply versions up to ``known``, a version known to exist, reading them
        concurrently (a handle that fell far behind pays one round trip per
        ``CATCH_UP_READS`` versions, not one per version); then refresh as usual.

        Raises:
            CorruptLogError: A version is damaged, or missing below ``known``.
        """
        applied = 0
        while snap.version < known:
            before = snap.version
            missing = self._read_known(snap, known, CATCH_UP_READS)
            applied += snap.version - before
            if missing is None:
                break
            if self.check_tip(snap) == 0:  # a hole below a version known to exist
                raise CorruptLogError(
                    f"{self.root}: log version {missing} is missing below {known}",
                    self.version_key(missing),
                )
        return applied + self.refresh(snap)

    def caught_up(self, snap: TableSnapshot, known: int) -> TableSnapshot:
        """``snap`` brought to ``known`` (a version known to exist), the cheaper way: its
        missing versions (:meth:`catch_up`) or, when more than a checkpoint interval of them
        is missing, the newest checkpoint (its hint) at or below ``known`` and the versions
        after it — a new snapshot. A handle that stopped reading the log (a group-commit
        follower learns its outcomes from the outcome record) then pays O(interval) requests
        to come back, not one per version it missed.

        Raises:
            CorruptLogError: A version is damaged, or missing below ``known``.
        """
        if known - snap.version > max(self.checkpoint_interval, CATCH_UP_READS):
            hint = self._checkpoint_hint()
            if hint is not None and snap.version < hint[0] <= known:
                try:
                    fresh = self.read_checkpoint(*hint)
                except CorruptLogError as e:
                    _log.warning("skipping damaged checkpoint: %s", e)
                    fresh = None
                if fresh is not None:
                    self.catch_up(fresh, known)
                    return fresh
        self.catch_up(snap, known)
        return snap

    def _probe(
        self, snap: TableSnapshot, up_to: int | None = None, paired: bool = False, retries: int = 0
    ) -> int:
        """Apply ``snap.version + 1``, ``+ 2``, … until one is missing (or ``up_to``).

        Reads ramp up while versions keep coming: one at a time (``paired``: two, the next
        version is known to exist after a lost race, and under contention several writers
        won since), twice as many at once after two rounds that found every version they
        read, up to ``CATCH_UP_READS``. A handle far behind (a consumer of a busy table, a
        writer back from a pause) pays a round trip per up to 16 versions, not one per
        version; one that is up to date or nearly so reads what it did (an idle refresh is
        one read), and the reads past the end are fewer than the last round's.
        """
        applied = 0
        width, full_rounds = (2 if paired else 1), 0
        while up_to is None or snap.version < up_to:
            nxt = snap.version + 1
            count = width if up_to is None else min(width, up_to - snap.version)
            ahead: list[Future[list[Action] | None]] = []
            if count > 1:
                try:
                    pool = _read_ahead_pool()
                    for v in range(nxt + 1, nxt + count):
                        ahead.append(pool.submit(self.read_version, v, retries))
                except RuntimeError:  # the interpreter is shutting down: one at a time
                    pass
            try:
                actions = self.read_version(nxt, retries)
                if actions is None:
                    return applied
                snap.apply(nxt, actions, self.version_key(nxt))
                applied += 1
                for version, read in enumerate(ahead, nxt + 1):
                    after = read.result()
                    if after is None:
                        return applied
                    snap.apply(version, after, self.version_key(version))
                    applied += 1
            finally:
                for read in ahead:
                    read.cancel()
            full_rounds += 1
            if full_rounds == 2 and width < CATCH_UP_READS:
                width, full_rounds = min(2 * width, CATCH_UP_READS), 0
        return applied

    def _gap_check_due(self, listed: bool = False) -> bool:
        """Whether a gap check is due: any check for a reader, a listing (``listed``) for a
        writer, which must never create a version inside a hole."""
        last = self._listed_at if listed else self._gap_checked_at
        if last is None:
            return True
        return (time.monotonic() - last) * 1000 >= self.gap_check_interval_ms

    def probe_tip(self, snap: TableSnapshot, up_to: int | None = None) -> int:
        """A cold load's gap check where listing costs O(directory): look, don't list.

        ``snap.version + 1`` was just found missing. Checks the versions of
        :func:`tip_probes` (about 40 existence checks, whatever the log's length): a later
        version is evidence of a gap (or of versions committed meanwhile), settled by
        :meth:`check_tip`'s listing. (A load whose hint was unusable has listed already.)
        A hole longer than the log after it is not seen here; the handle lists before its
        first write and once per ``gap_check_interval_ms``.

        Returns:
            How many versions were applied.

        Raises:
            CorruptLogError: As :meth:`check_tip`.
        """
        if any(self.store.exists(self.version_key(v)) for v in tip_probes(snap.version)):
            return self.check_tip(snap, up_to)
        self._gap_checked_at = time.monotonic()
        return 0

    def check_tip(
        self, snap: TableSnapshot, up_to: int | None = None, listing: LogListing | None = None
    ) -> int:
        """Make sure no version or checkpoint exists above a missing ``snap.version + 1``.

        One LIST starting after the tip (or ``listing``, a listing of the whole log taken
        earlier by the same load). Versions that arrived since the probe are applied; a
        version or checkpoint beyond a missing one is a gap: someone deleted a version.

        Returns:
            How many versions were applied.

        Raises:
            CorruptLogError: Naming the missing version (its ``path`` is the version's key).
        """
        if listing is None:
            listing = self.listing(after=snap.version)
        self._gap_checked_at = self._listed_at = time.monotonic()
        gap = find_gap(snap.version, listing)
        if gap is not None and (up_to is None or gap[0] <= up_to):
            missing, proof = gap
            if self.store.exists(self.version_key(missing)):
                # A listing is not a snapshot (a local directory is read in pieces): one
                # taken while writers commit can hold version N+1 but not N. N is there:
                # read on, and check again above it.
                return self._probe(snap, up_to) + self.check_tip(snap, up_to)
            covering = [c for c in listing.checkpoints if c >= missing]
            if covering:
                # Missing below a checkpoint is not corruption: log cleanup deletes the
                # versions below one (the handle loaded the table before it ran), and the
                # checkpoint holds their state. Go on from it.
                return self._reload(snap, covering, listing, up_to, missing)
            raise CorruptLogError(
                f"{self.root}: log version {missing} is missing, but {proof} exists: a "
                "version was deleted; restore it (or the table) from a backup",
                self.version_key(missing),
            )
        if listing.above(snap.version).versions:
            # Versions written after the probe missed them: read them now.
            return self._probe(snap, up_to)
        return 0

    def _reload(
        self,
        snap: TableSnapshot,
        checkpoints: list[int],
        listing: LogListing,
        up_to: int | None,
        missing: int,
    ) -> int:
        """Replace ``snap`` (in place) by the newest readable of ``checkpoints`` (at most
        ``up_to``), then read on from it; return how many versions that moved it.

        Raises:
            VersionNotAvailableError: Every such checkpoint is beyond ``up_to``: the target
                version was cleaned up.
            CorruptLogError: None of them is readable.
        """
        usable = sorted((c for c in checkpoints if up_to is None or c <= up_to), reverse=True)
        if not usable:
            assert up_to is not None
            raise VersionNotAvailableError(up_to, min(checkpoints))
        for c in usable:
            try:
                loaded = self.read_checkpoint(c, listing.parts_of(c))
            except CorruptLogError as e:
                _log.warning("skipping damaged checkpoint: %s", e)
                continue
            if loaded is None:
                continue
            _log.info(
                "%s: versions from %d are gone below checkpoint %d (log cleanup): reloading "
                "from it",
                self.root,
                missing,
                c,
            )
            moved = loaded.version - snap.version
            snap.become(loaded)
            return moved + self._probe(snap, up_to) + self.check_tip(snap, up_to)
        raise CorruptLogError(
            f"{self.root}: log version {missing} is missing, but checkpoint {usable[0]} "
            "exists and no checkpoint after the missing version is readable: restore the "
            "version (or the table) from a backup",
            self.version_key(missing),
        )

    def earliest_version(self) -> int:
        """The oldest version still readable: 0 (never deleted), or, on a log whose
        versions 1.. log cleanup deleted, the oldest checkpoint kept (one LIST then)."""
        if self.read_version(1) is not None or self.read_version(0) is None:
            return 0
        listing = self.listing()
        later = [v for v in listing.versions if v > 0]
        if not later:
            return 0
        return min((v for v in listing.checkpoints if v >= later[0] - 1), default=later[0])

    # --- writing --------------------------------------------------------------------------

    def commit(
        self,
        snap: TableSnapshot,
        build: Callable[[TableSnapshot], CommitPlan[T]],
        transactional_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> tuple[CommitPlan[T], int]:
        """Commit the actions ``build`` makes from the newest state, retrying on conflict.

        ``build`` must be a pure function of the snapshot: it is called again after every
        lost race, against the refreshed snapshot, so validation and offset assignment
        always happen against the version being written after. A ``TxnTableError`` from
        ``build`` is raised only once the snapshot is confirmed newest (by a refresh), so a
        stale handle never refuses what the current table allows.

        Lost races and transient storage errors are retried, with backoff, for
        ``timeout_ms`` (default ``commit_timeout_ms``): a time budget, not an attempt count.

        Returns:
            The plan that was committed (or needed no write) and the version it is in
            (``snap.version`` when nothing was written).

        Raises:
            KafkaTimeoutError: Storage kept failing until the budget was spent; whether the
                commit landed is unknown (a retry of an idempotent append resolves it).
            CommitConflictError: Every attempt lost a race until the budget was spent
                (nothing was written).
        """
        budget_ms = self.commit_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        commit_id = uuid.uuid4().hex
        if snap.protocol is not None:
            check_protocol(snap.protocol, write=True)
        attempt = 0
        while True:
            failure: BaseException | None = None  # an outage (None: a lost race)
            try:
                try:
                    plan = build(snap)
                except TxnTableError:
                    # The attempt starts from a snapshot that may be stale (optimistic): a
                    # plan refused by validation is only final against the newest version.
                    if self.refresh(snap):
                        continue
                    raise
                if not plan.actions:
                    # "Nothing to write" (all duplicates, markers already written) is only a
                    # valid conclusion against the newest version: a stale snapshot would
                    # not conflict on anything, so confirm by refreshing first.
                    if self.refresh(snap):
                        continue
                    return plan, snap.version
                info = CommitInfo(
                    now_ms(), plan.operation, commit_id, transactionalId=transactional_id
                )
                if self.try_put(snap, [*plan.actions, info]):
                    return plan, snap.version
            except RETRIABLE as e:
                failure = e  # an outage is not a lost race: retried within the budget too
            if time.monotonic() >= deadline:
                if failure is not None:
                    raise KafkaTimeoutError(
                        f"{self.root}: commit not decided within {budget_ms} ms while storage "
                        f"failed; its outcome is unknown ({failure})"
                    ) from failure
                raise CommitConflictError(
                    f"{self.root}: lost every race for version {snap.version + 1} for "
                    f"{budget_ms} ms; nothing was written"
                )
            self._backoff(attempt)
            attempt += 1

    def try_put(
        self, snap: TableSnapshot, actions: list[Action], checkpoint_later: bool = False
    ) -> bool:
        """One attempt to write ``actions`` as the version after ``snap`` (put-if-absent).

        ``actions`` end with a ``commitInfo`` whose ``commitId`` is unique to the commit. On
        success they are applied to ``snap`` (and a checkpoint written when due: in the
        background if ``checkpoint_later``, for a caller others wait on); when
        another writer won the version, ``snap`` is refreshed and the result is ``False``.
        An ambiguous put is resolved by reading the version back, never by writing again.

        Raises:
            CorruptLogError: A version is missing below the tip (never fill a gap).
            TransientStorageError: The put failed and the version is absent (an outage, not
                a lost race: the caller retries within its time budget), or the read-back
                of an ambiguous put failed too.
        """
        info = actions[-1]
        assert isinstance(info, CommitInfo)
        if self._gap_check_due(listed=True) and self.check_tip(snap):
            # Never write version N+1 into a hole left by a deleted version (the versions
            # after it would join the log behind a different N+1). Versions that arrived
            # meanwhile were applied: the actions were planned before them, plan again.
            return False
        version = snap.version + 1
        key = self.version_key(version)
        try:
            self.store.put_if_absent(key, encode_actions(actions))
        except ObjectExistsError:
            self.stats.conflicts += 1
            self.refresh(snap, lost=True)
            return False
        except (TransientStorageError, OSError):
            # The put may or may not have landed: read back, never write blindly again.
            self.stats.ambiguous += 1
            written = self.read_version(version)
            if written is None:
                raise
            if not any(
                isinstance(a, CommitInfo) and a.commitId == info.commitId for a in written
            ):
                self.stats.conflicts += 1
                self.refresh(snap)
                return False
        if self._put_outlived_listing() and self._below_a_checkpoint(snap, version):
            return False
        snap.apply(version, actions, key)
        self.stats.commits += 1
        self._maybe_checkpoint(snap, later=checkpoint_later)
        return True

    def _put_outlived_listing(self) -> bool:
        """Whether this handle's last listing is older than :data:`PUT_RECHECK_MS` (the put
        just made completed long after it: the process was paused, or the request hung)."""
        listed = self._listed_at
        return listed is None or (time.monotonic() - listed) * 1000 > PUT_RECHECK_MS

    def _below_a_checkpoint(self, snap: TableSnapshot, version: int) -> bool:
        """After a slow put of ``version``: whether a checkpoint above it exists, so that
        log cleanup may have deleted ``version`` before the put re-created it, below the
        checkpoint every reader loads. Then ``snap`` is reloaded from that checkpoint and
        the put is not accepted (the caller plans again: a version that did count is in
        the reloaded state, and its batches are duplicates then).

        Log cleanup waits until the store dates a checkpoint an hour old, and a writer
        lists at least once a minute, so only a put that outlived its listing by that much
        can land there; one LIST after such a put rules it out.
        """
        listing = self.listing(after=version)
        self._gap_checked_at = self._listed_at = time.monotonic()
        above = [c for c in listing.checkpoints if c > version]
        if not above:
            return False
        _log.warning(
            "%s: version %d was put long after this handle listed the log, and checkpoint %d "
            "exists above it: not counting it, reloading from the checkpoint",
            self.root,
            version,
            max(above),
        )
        self._reload(snap, above, listing, None, version)
        return True

    def _backoff(self, attempt: int) -> None:
        ceiling = min(self.backoff_max_ms, self.backoff_ms * (2 ** min(attempt, 10)))
        time.sleep(random.uniform(0, ceiling) / 1000)

    def _maybe_checkpoint(self, snap: TableSnapshot, later: bool = False) -> None:
        entries = sum(len(p.entries) for p in snap.partitions)
        if not checkpoint_due(snap.version, self.checkpoint_interval, entries):
            return
        if not later:
            self.write_checkpoint(snap)
            return
        # The state's actions now (immutable; 0.1 ms for 4,000 entries), their encoding and
        # puts in order on one thread: ~80 ms of CPU and two round trips at 4,000 entries,
        # which a committer's round (every follower in it) would otherwise wait for.
        assert snap.protocol is not None
        args = (snap.version, snap.protocol, checkpoint_actions(snap))
        with self._lock:
            if self._checkpointer is None:
                self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="txntable-checkpoint")
        try:
            self._checkpointer.submit(self._put_checkpoint, *args)
        except RuntimeError:  # the interpreter is shutting down: a later writer checkpoints
            pass

    def write_checkpoint(self, snap: TableSnapshot, strict: bool = False) -> bool:
        """Write the checkpoint of ``snap`` and point the hint at it; return whether it landed.

        A large state is split into parts of at most ``checkpoint_part_actions`` actions. A
        checkpoint is an optimisation: the log versions stay the source of truth, so a
        failure here (after the commit it follows has landed) is logged, not raised, and
        costs only a longer replay later — unless ``strict`` (an explicit request to
        checkpoint, which must say when it failed).
        """
        assert snap.protocol is not None
        return self._put_checkpoint(snap.version, snap.protocol, checkpoint_actions(snap), strict)

    def _checkpoint_lines(self, actions: list[Action]) -> list[str]:
        """The encoded lines of ``actions``, reusing the last checkpoint's line of every
        action that is still the same object (the state's entries are immutable and mostly
        unchanged between checkpoints): its CPU is O(new entries), not O(state) — a
        committer's process waits for it (one GIL)."""
        previous = self._lines
        lines: list[str] = []
        kept: dict[int, tuple[Action, str]] = {}
        for action in actions:
            hit = previous.get(id(action))
            line = hit[1] if hit is not None and hit[0] is action else encode_action(action)
            kept[id(action)] = (action, line)
            lines.append(line)
        self._lines = kept
        return lines

    def _put_checkpoint(
        self, version: int, protocol: Protocol, actions: list[Action], strict: bool = False
    ) -> bool:
        size = max(1, self.checkpoint_part_actions)
        lines = self._checkpoint_lines(actions)
        chunks = [lines[i : i + size] for i in range(0, len(lines), size)]
        parts = len(chunks)
        try:
            for i, chunk in enumerate(chunks, 1):
                self.store.put(self.checkpoint_key(version, i, parts), encode_lines(chunk))
            if parts > 1 and protocol.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION:
                # v1 readers only know single-file checkpoints: give them one that holds the
                # protocol, so they refuse the table instead of replaying a truncated log.
                stub = encode_actions([protocol, *actions[1:2]])
                self.store.put(self.checkpoint_key(version), stub)
            hint = {"version": version, "parts": parts, "size": len(actions)}
            self.store.put(self.last_checkpoint_key, json.dumps(hint).encode())
        except (StorageError, OSError) as e:
            if strict:
                raise
            _log.warning("checkpoint %s@%d not written: %s", self.root, version, e)
            return False
        return True
