"""Group commit: many writers of one log, one committer per round, helping when it dies.

A log is a chain of put-if-absent versions; one operation per version caps a table at one
commit per storage round trip, and racing writers mostly lose. Here durability and
sequencing are apart: a writer's data is already durable (segments), its operation is
written as a small uniquely named **intent**, and one committer binds every pending intent
to the next version per round (:mod:`txntable.protocol.sequencing` decides what goes in). Who
commits (the spec's "Group commit"):

* **solo** — a writer that meets no other writer commits its own version directly, exactly
  as before (so one writer is no slower).
* After a lost race it reads the **lease** (``<root>/_commit/lease.json``: owner, epoch,
  expiry; changed by CAS only): another writer's live one makes it a **follower**. After
  ``ESCALATE_AFTER_CONFLICTS`` lost races in a row with no live lease it takes it and
  becomes the **committer**.
* The committer runs rounds in a background thread — LIST the intents, GET the new ones,
  sequence them after its own operations into one version, put it, publish the round's
  outcomes, delete the decided intents (the next round's LIST overlaps this round's put) —
  and steps down after ``idle_ms`` without another writer's intent, or when its lease is
  taken.
* A follower writes its intent (``<root>/_commit/intents/<ms>-<id>[.<payload>].json``, the
  intent itself in the key when it fits, so that a committer lists it without reading it)
  and waits for a round to decide it: it reads the committer's **outcome record**
  (``<root>/_commit/outcomes.json``, a hint: the outcomes and offsets of its last rounds,
  so a follower needs one read however many versions went by), and the log itself when the
  record does not tell. A record that stands still makes it read the lease once (a
  committer that stepped down is replaced at once); if nothing moves for ``help_ms`` (or a
  few of the usual gaps between versions, if longer) it commits a round itself (taking the
  lease if it lapsed; when many wait, about ``HELPERS_AT_ONCE`` of them do, and the others
  read the log only every few such waits): a dead committer costs latency, never progress.
  A committer that closes decides what it lists then.

Safety rests on put-if-absent alone: a zombie committer's version is a valid serialisation
of the intents it read, or it loses the put; the lease and the outcome record only decide
who does the work and how fast a follower hears of it. What a version decides is in its
``commitInfo.intents``.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import random
import re
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from txntable import config, errors
from txntable.errors import (
    CorruptLogError,
    KafkaTimeoutError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
    TxnTableError,
    UnsupportedProtocolError,
)
from txntable.layout import (
    intent_id_of,
    intent_key,
    intent_key_parts,
    intents_prefix,
    lease_key,
    outcomes_key,
)
from txntable.log.log import CATCH_UP_READS
from txntable.protocol.actions import (
    INTENT_WINDOW_VERSIONS,
    Batch,
    CommitInfo,
    CommitPlan,
    IntentOutcome,
    Marker,
    check_protocol,
    decode_strict_at,
    loads_strict,
)
from txntable.protocol.append import AppendResult
from txntable.protocol.sequencing import (
    AppendOp,
    Intent,
    Operation,
    RoundItem,
    RoundPlan,
    eligible,
    sequence_round,
)
from txntable.protocol.snapshot import TableSnapshot
from txntable.util import RETRIABLE, now_ms, shared_pool

if TYPE_CHECKING:
    from txntable.table import Table

_log = logging.getLogger(__name__)

LEASE_FORMAT_VERSION = 1
OUTCOMES_FORMAT_VERSION = 1
#: Lost races in a row after which a solo writer looks for (or becomes) a committer. Not
#: one: a handle that is merely behind (another handle of the same process committed)
#: loses once, then wins; escalating then started a committer and raised the table's
#: writer version to 4 for a single writer.
ESCALATE_AFTER_CONFLICTS = 2
#: A solo writer looks for a live committer once per lease_ms / LEASE_LOOKS, in the
#: background (one GET off its commit path, so that one writer is no slower); the look
#: serves its next commit.
LEASE_LOOKS = 20
#: A committer with nothing to do LISTs the intents this often at first, then less often.
IDLE_LIST_S = 0.005
IDLE_LIST_MAX_S = 0.05
#: Decided intents are deleted in batches of this many keys, or at least this often.
DELETE_BATCH = 200
DELETE_EVERY_S = 1.0
#: Versions the outcome record covers (the newest ones). Every waiting writer reads the
#: record each time it changes: its size is CPU on every writer's machine; a writer whose
#: outcome scrolled out reads the log.
OUTCOME_RECORD_VERSIONS = 16
#: A follower reads the log instead of the record after the record moved on this many
#: times without its intent (it may miss one round by listing late).
RECORD_MISSES = 3
#: The learned time to a decision is capped at this many help_ms (it spaces a follower's
#: looks at the outcome record; the looks stay at most half a patience apart).
DECIDE_S_MAX_HELPS = 10
#: A follower's first look at the outcome record comes after this share of the time its
#: last decisions took, the next ones every 1/FOLLOWER_LOOKS_PER_DECISION of it: the record
#: lands within about a round of the expected time, and a look that comes late costs its
#: writer the wait (at W=16, 0.8 and 1/4 left ~45 ms between the record and the look that
#: saw it; 0.7 and 1/8 ~15 ms, for as many looks per transaction).
FOLLOWER_FIRST_LOOK = 0.7
FOLLOWER_LOOKS_PER_DECISION = 8
#: A waiting writer that saw the outcome record stand still for this many of its usual
#: waits for a decision (at least help_ms / 4, at most 0.9 of its patience: before it would
#: help) reads the lease once: a committer that stepped down (closed, or idle) or whose
#: lease lapsed is replaced then, not after help_ms.
STALL_LEASE_LOOK = 3
#: A waiting writer helps when nothing moved for help_ms or this many of the usual gaps
#: between versions, whichever is longer (see GroupCommit._patience).
PATIENCE_GAPS = 3
#: Of the waiting writers that would help a live committer at the same moment, about this
#: many do (each with probability HELPERS_AT_ONCE / the intents listed).
HELPERS_AT_ONCE = 4
#: A waiting writer that left the round to others reads the log at every this many such
#: stalls (the helpers read it each time): an outcome whose record was lost is only there.
LOOK_EVERY_SKIPS = 3

Build = Callable[[TableSnapshot], CommitPlan[Any]]
R = TypeVar("R")


@dataclass(frozen=True)
class GroupCommitConfig:
    """Client settings of group commit (see :mod:`txntable.config` for the defaults)."""

    enabled: bool = config.GROUP_COMMIT_DEFAULT
    #: How long a committer's lease lasts unless renewed.
    lease_ms: int = config.COMMIT_LEASE_MS_DEFAULT
    #: How long a follower waits for a round to decide its intent before committing one.
    help_ms: int = config.COMMIT_HELP_MS_DEFAULT
    #: A committer with no other writer's intent for this long steps down.
    idle_ms: int = config.COMMIT_IDLE_MS_DEFAULT
    #: How often a follower looks for its outcome while it waits.
    poll_ms: int = config.COMMIT_POLL_MS_DEFAULT
    #: Most intents one round decides.
    max_round_intents: int = config.COMMIT_MAX_ROUND_INTENTS_DEFAULT
    #: How long one commit may take before it fails with a timeout (outcome unknown).
    timeout_ms: int = config.COMMIT_TIMEOUT_MS_DEFAULT


_CANONICAL: dict[str, Any] = {"sort_keys": True, "separators": (",", ":")}


def _unique_json(body: dict[str, Any]) -> bytes:
    """JSON of a CAS object with a fresh ``writeId``: equal bytes are always our own write."""
    body = {**body, "writeId": uuid.uuid4().hex}
    return json.dumps(body, **_CANONICAL).encode()


# --- the lease ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseState:
    """The lease object as read: who commits rounds, until when (holder's clock)."""

    owner: str
    epoch: int
    expires_ms: int
    etag: str

    def live(self, now: int) -> bool:
        return self.expires_ms > now


class Lease:
    """The committer lease of one log: a CAS object, never trusted for safety."""

    def __init__(self, table: Table, owner: str, ttl_ms: int) -> None:
        self.store = table.store
        self.key = lease_key(table.log.root)
        self.owner = owner
        self.ttl_ms = ttl_ms

    def read(self) -> LeaseState | None:
        """The current lease, or ``None`` if there is none. A damaged one reads as lapsed."""
        try:
            obj = self.store.get(self.key)
        except ObjectNotFoundError:
            return None
        try:
            body = loads_strict(obj.data)
            version, owner = body["version"], body["owner"]
            epoch, expires = body["epoch"], body["expiresMs"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            _log.warning("%s: lease object is damaged; it will be replaced", self.key)
            return LeaseState("", -1, 0, obj.etag)
        if not isinstance(version, int) or version > LEASE_FORMAT_VERSION:
            raise UnsupportedProtocolError(f"{self.key}: lease format {version!r} is newer")
        if not (isinstance(owner, str) and isinstance(epoch, int) and isinstance(expires, int)):
            return LeaseState("", -1, 0, obj.etag)
        return LeaseState(owner, epoch, expires, obj.etag)

    def take(self, current: LeaseState | None) -> LeaseState | None:
        """CAS the lease to this owner (over ``current``); ``None`` if another won."""
        epoch = 0 if current is None else current.epoch + 1
        return self._write(current, epoch, now_ms() + self.ttl_ms)

    def renew(self, held: LeaseState) -> LeaseState | None:
        """Extend a held lease; ``None`` if it was taken meanwhile."""
        return self._write(held, held.epoch, now_ms() + self.ttl_ms)

    def release(self, held: LeaseState) -> None:
        """Give the lease up at once (it expires now), unless it was taken meanwhile."""
        try:
            self._write(held, held.epoch, 0)
        except (StorageError, OSError) as e:
            _log.info("%s: lease not released (%s); it expires on its own", self.key, e)

    def _write(self, current: LeaseState | None, epoch: int, expires: int) -> LeaseState | None:
        data = _unique_json(
            {
                "version": LEASE_FORMAT_VERSION,
                "owner": self.owner,
                "epoch": epoch,
                "expiresMs": expires,
            }
        )
        try:
            if current is None:
                etag = self.store.put_if_absent(self.key, data)
            else:
                etag = self.store.put_if_match(self.key, data, current.etag)
        except (PreconditionFailedError, ObjectExistsError, ObjectNotFoundError):
            return None
        except TransientStorageError:
            try:  # ambiguous: ours iff our exact bytes (unique by writeId) are there
                obj = self.store.get(self.key)
            except (ObjectNotFoundError, TransientStorageError):
                return None
            if obj.data != data:
                return None
            etag = obj.etag
        return LeaseState(self.owner, epoch, expires, etag)


# --- results in the outcome record --------------------------------------------------------


def _result_to_json(result: Any) -> Any:
    if isinstance(result, AppendResult):
        return {
            "baseOffsets": result.base_offsets,
            "duplicates": result.duplicates,
            "markerOffsets": {str(p): o for p, o in result.marker_offsets.items()},
        }
    return None


def _result_from_json(op: Operation, body: Any) -> Any:
    if not isinstance(op, AppendOp):
        return None
    if not isinstance(body, dict):
        raise ValueError("no append result")
    result = AppendResult(
        [int(o) for o in body["baseOffsets"]],
        [bool(d) for d in body["duplicates"]],
        {int(p): int(o) for p, o in body["markerOffsets"].items()},
    )
    if len(result.base_offsets) != len(op.batches):
        raise ValueError("append result does not match the operation")
    return result


_DIGITS = re.compile(rb"-?[0-9]+")
_DIGITS_TEXT = re.compile(r"-?[0-9]+")


def _record_tip(data: bytes) -> int | None:
    """The record's newest version from its ``tip`` field, without parsing the record (a
    waiting writer looks often; its own intent's id is absent from most looks), or ``None``
    when the field is missing (an older writer) or malformed."""
    return _record_number(data, b'"tip":')


def _record_written_ms(data: bytes) -> int | None:
    """When the record was written (``writtenMs``), read the same way; ``None`` if it does
    not say (an older writer)."""
    return _record_number(data, b'"writtenMs":')


#: A record's ``lease`` (first: the keys are sorted), as the committer writes it.
_RECORD_LEASE = re.compile(
    rb'\{"lease":\{"epoch":([0-9]+),"expiresMs":([0-9]+),"owner":"([0-9a-f]+)"\}'
)


def _record_lease(data: bytes) -> tuple[str, int, int] | None:
    """The ``lease`` its committer held when it wrote the record, as ``(owner, epoch,
    expiresMs)``; ``None`` if the record does not say (a helper's, an older client's)."""
    found = _RECORD_LEASE.match(data)
    if found is None:
        return None
    return found.group(3).decode(), int(found.group(1)), int(found.group(2))


def _record_number(data: bytes, field: bytes) -> int | None:
    # The last occurrence is the top-level field: the record's keys are sorted and rounds
    # come first; a string holding the name has its quotes escaped.
    at = data.rfind(field)
    if at < 0:
        return None
    digits = _DIGITS.match(data, at + len(field))
    return int(digits.group()) if digits is not None else None


def _record_entry(data: bytes, intent_id: str) -> tuple[int, list[Any]] | None:
    """The version and ``[error, message, result]`` of ``intent_id`` in an outcome record
    written with ``tip`` (sorted keys, so a round is ``{"intents":{…},"version":N}``), or
    ``None`` if the record does not name it. Decodes only that entry: the first
    ``"version":`` after it is its round's (strings escape their quotes, and results have no
    such key).

    Raises:
        ValueError: The bytes at the entry are not what the writer writes.
    """
    key = f'"{intent_id}":'
    if key.encode() not in data:
        return None
    text = data.decode()
    at = text.find(key)
    entry, end = decode_strict_at(text, at + len(key))
    if not isinstance(entry, list):
        raise ValueError("outcome entry is not a list")
    version_at = text.find('"version":', end)
    digits = _DIGITS_TEXT.match(text, version_at + 10) if version_at >= 0 else None
    if digits is None:
        raise ValueError("outcome entry has no round version")
    return int(digits.group()), entry


def _parse_record(data: bytes) -> dict[int, dict[str, list[Any]]]:
    """The rounds of an outcome record, by version.

    Raises:
        ValueError, KeyError, TypeError: Not a well-formed record.
    """
    body = loads_strict(data)
    if body["version"] > OUTCOMES_FORMAT_VERSION:
        raise ValueError("outcome record format is newer")
    out: dict[int, dict[str, list[Any]]] = {}
    for r in body["rounds"]:
        intents = r["intents"]
        if not isinstance(intents, dict):
            raise TypeError("intents is not an object")
        out[int(r["version"])] = intents
    return out


# --- one commit waiting in the committer's queue ------------------------------------------


class _Local:
    """An operation of this process handed to its committer thread."""

    def __init__(self, item: RoundItem) -> None:
        self.item = item
        self.done = threading.Event()
        self.result: tuple[CommitPlan[Any], int] | None = None
        self.error: BaseException | None = None
        #: The committer stepped down before deciding it: submit it again.
        self.again = False

    def settle(
        self,
        result: tuple[CommitPlan[Any], int] | None = None,
        error: BaseException | None = None,
        again: bool = False,
    ) -> None:
        self.result, self.error, self.again = result, error, again
        self.done.set()


@dataclass
class _Listing:
    """Intents listed by one LIST, the new ones read."""

    keys: list[str]
    read: dict[str, Intent | None]


class GroupCommit:
    """Commits of one table handle: solo, as the committer, or as a follower."""

    def __init__(self, table: Table, cfg: GroupCommitConfig) -> None:
        self.table = table
        self.cfg = cfg
        self.id = uuid.uuid4().hex
        self.lease = Lease(table, self.id, cfg.lease_ms)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[_Local] = deque()
        self._held: LeaseState | None = None
        self._committer: threading.Thread | None = None
        self._closing = False
        #: The last lease seen held by another writer (a follower trusts it until expiry).
        self._seen: LeaseState | None = None
        self._conflicts = 0
        #: When this handle, committing solo, last looked for a committer (monotonic s).
        self._lease_looked = -math.inf
        self._intents: dict[str, Intent | None] = {}  # listed, undecided (None: unreadable)
        self._pool: ThreadPoolExecutor | None = None
        self._deleting: set[str] = set()  # intent keys being deleted
        self._to_delete: set[str] = set()  # decided intent keys not deleted yet
        self._deleted_at = time.monotonic()
        #: The outcome record as this handle last wrote or read it: version -> {intent id:
        #: [error, message, result]}, and its etag (None: not known).
        self._record: dict[int, dict[str, list[Any]]] = {}
        self._record_etag: str | None = None
        #: Each round's JSON in the record, with the outcomes it was made of: a round is
        #: encoded once, not at each of the 16 writes that carry it.
        self._round_json: dict[int, tuple[dict[str, list[Any]], str]] = {}
        self._recorder: ThreadPoolExecutor | None = None
        #: Rounds published and not written to the record yet (the recorder's next write
        #: takes them all).
        self._unrecorded: deque[tuple[int, dict[str, list[Any]]]] = deque()
        #: The newest version this handle knows exists (from the outcome record).
        self._tip_hint = -1
        #: How long deciding this handle's last intents took (a moving average, seconds).
        self._decide_s = 0.0
        #: The newest outcome record this handle read in its current wait: its tip, when it
        #: was written (``writtenMs``, the committer's clock; the look's time, on this
        #: handle's clock, for a record without it) and whether that is the committer's clock.
        self._record_written: tuple[int, int, bool] | None = None
        #: The usual time between log versions: a moving average of the record's write
        #: times per version (ms; 0: not known yet). It times the looks and the patience.
        self._gap_ms = 0.0
        #: The outcome record as last read, its parse (``None``: not parsed, it did not name
        #: the intent looked for) and its newest version (followers look often).
        self._seen_record: tuple[bytes, dict[int, dict[str, list[Any]]] | None, int] = (
            b"",
            {},
            -1,
        )
        self.stats = {
            "rounds": 0,
            "intents": 0,
            "helps": 0,
            "helps_skipped": 0,
            "direct": 0,
            "followed": 0,
            "stall_looks": 0,
            # A waiting writer read the log: its intent missed RECORD_MISSES record moves
            # (overlooked), or nothing moved for its patience (log_reads).
            "overlooked": 0,
            "log_reads": 0,
        }

    # --- entry points ----------------------------------------------------------------

    def submit(
        self, op: Operation, transactional_id: str | None = None, timeout_ms: int | None = None
    ) -> tuple[Any, int]:
        """Commit a declarative operation; returns its result and the deciding version.

        Raises:
            TxnTableError: The operation was refused (the class its validation raised).
            KafkaTimeoutError: Not decided within ``timeout_ms`` (default: the config's;
                outcome unknown).
        """
        deadline = self._deadline(timeout_ms)

        def build(s: TableSnapshot) -> CommitPlan[Any]:
            return op.plan(s, now_ms())

        item = RoundItem(build, None, transactional_id)

        def attempt() -> tuple[Any, int] | None:
            mode = self._mode(look=True)
            if mode == "committer":
                done = self._through_committer(item, deadline)
                return None if done is None else (done[0].result, done[1])
            if mode == "follower":
                return self._follow(op, transactional_id, deadline)
            direct = self._direct(build, transactional_id, deadline, can_follow=True)
            if direct is not None:
                return direct[0].result, direct[1]
            if self._seen is None:
                self._escalate(force=False)
            return None

        return self._until_done(attempt, deadline)

    def commit(
        self, build: Build, transactional_id: str | None = None, timeout_ms: int | None = None
    ) -> tuple[CommitPlan[Any], int]:
        """Commit what ``build`` plans (a pure function of the snapshot, as Log.commit).

        Such an operation cannot be handed to another writer, so under contention this
        writer becomes the committer (taking the lease over if needed) and puts it first in
        its next round: maintenance never starves behind producers.

        Raises:
            KafkaTimeoutError: Not decided within ``timeout_ms`` (default: the config's;
                outcome unknown).
        """
        deadline = self._deadline(timeout_ms)
        item = RoundItem(build, None, transactional_id)

        def attempt() -> tuple[CommitPlan[Any], int] | None:
            mode = self._mode()
            if mode == "committer":
                return self._through_committer(item, deadline)
            if mode == "follower":
                self._escalate(force=True)
                return None
            direct = self._direct(build, transactional_id, deadline)
            if direct is None:
                self._escalate(force=True)
            return direct

        return self._until_done(attempt, deadline)

    def _until_done(self, attempt: Callable[[], R | None], deadline: float) -> R:
        """Call ``attempt`` until it returns a result; an outage (a storage error) is
        retried with backoff until ``deadline``, then raised as a timeout."""
        outage: BaseException | None = None
        tries = 0
        while True:
            self._check_deadline(deadline, outage)
            try:
                done = attempt()
            except RETRIABLE as e:
                outage = e
                self.table.log._backoff(tries)
                tries += 1
                continue
            if done is not None:
                return done

    def close(self) -> None:
        """Step down if committing: the lease is released, so nobody waits for it to lapse."""
        with self._lock:
            committer = self._committer
            self._closing = True
            self._wake.notify_all()
        if committer is not None:
            # A round in flight finishes first (its versions are this handle's to count and
            # its followers' to learn); a round is bounded by the commit timeout.
            committer.join(self.cfg.timeout_ms / 1000)
            if committer.is_alive():
                _log.warning("%s: committer still running a round at close", self.table.name)
        with self._lock:
            self._closing = False  # usable again: a later commit starts as a single writer

    # --- modes -----------------------------------------------------------------------

    def _mode(self, look: bool = False) -> str:
        """``committer``, ``follower`` or ``solo``; ``look``: a solo writer of a declarative
        operation looks for a live committer now and then (an operation only this writer can
        plan races alone first, as it always did, instead of taking the lease over)."""
        with self._lock:
            if self._committer is not None and self._held is not None:
                return "committer"
            seen = self._seen
        if seen is None:
            if look:
                self._look_for_committer()
            return "solo"
        if not seen.live(now_ms()):
            # The lease we followed has expired by its own clock: it may have been renewed
            # since (one GET per lease period), or its committer stepped down.
            seen = self._seen = self.lease.read()
            if seen is None or seen.owner == self.id or not seen.live(now_ms()):
                self._seen = None
                return "solo"
        return "follower"

    def _look_for_committer(self) -> None:
        """Once per ``lease_ms / LEASE_LOOKS`` while committing solo, read the lease in the
        background; a live one held by another writer makes the next commit a follower's.

        A solo writer that keeps winning its races never escalates; without the look it
        would race a committer's rounds (each a version for many writers) with its own
        versions, and each round it wins from the committer delays every follower (issue 17:
        at the start of a W=16 run one writer won 17 versions in a row, the committer's
        round lost 7 times and every follower's first commit took ~1 s). In the background,
        so that a writer alone pays no round trip for it.
        """
        now = time.monotonic()
        if now - self._lease_looked < self.cfg.lease_ms / 1000 / LEASE_LOOKS:
            return
        self._lease_looked = now
        try:
            _lookers().submit(self._look)
        except RuntimeError:  # the interpreter is shutting down
            pass

    def expect_writes(self) -> None:
        """Look for a committer now, in the background: this handle's writer (a producer
        that just opened the table) is about to commit declarative operations, and its first
        one then joins a live committer's rounds instead of racing them. Without the look a
        new writer of a busy table lost its first race to a round, read the versions it
        missed and then the lease (at W=256, ~4 requests per writer; a round lost whenever
        the writer won instead)."""
        with self._lock:
            if self._committer is not None or self._seen is not None:
                return
        self._look_for_committer()

    def _read_lease_hint(self) -> tuple[bool, LeaseState | None]:
        """``(read, lease)``: the lease read as a hint — a storage error leaves it unknown
        (``read`` false) instead of raising; escalating reads it on the commit path and
        raises."""
        try:
            return True, self.lease.read()
        except (StorageError, OSError, UnsupportedProtocolError) as e:
            _log.debug("%s: lease not read (%s)", self.table.name, e)
            return False, None

    def _look(self) -> bool:
        """Read the lease; another writer's live one is followed from the next operation
        (``self._seen``). Returns whether this handle now follows one."""
        read, current = self._read_lease_hint()
        if not read or current is None or current.owner == self.id:
            return False
        if not current.live(now_ms()):
            return False
        with self._lock:
            if self._committer is not None:
                return False
            if self._seen is None:
                self._seen = current
            return True

    def _escalate(self, force: bool) -> None:
        """After lost races: follow a live committer, or become the committer (``force``:
        even over a live one — for operations only this writer can commit)."""
        current = self.lease.read()
        live = current is not None and current.live(now_ms())
        if live and current is not None and current.owner != self.id and not force:
            self._seen = current
            return
        held = self.lease.take(current)
        if held is None:
            self._seen = self.lease.read()  # someone else won: follow them
            return
        self._start_committer(held)

    def _start_committer(self, held: LeaseState) -> None:
        with self._lock:
            self._held = held
            self._seen = None
            if self._committer is None and not self._closing:
                self._committer = threading.Thread(
                    target=self._run_committer, name="txntable-committer", daemon=True
                )
                self._committer.start()
                _track(self)

    # --- solo ------------------------------------------------------------------------

    def _direct(
        self,
        build: Build,
        transactional_id: str | None,
        deadline: float,
        can_follow: bool = False,
    ) -> tuple[CommitPlan[Any], int] | None:
        """Commit alone; ``None`` after ``ESCALATE_AFTER_CONFLICTS`` lost races in a row,
        or (``can_follow``: a declarative operation) after one lost race when another writer
        holds a live lease (then ``self._seen`` names it: follow it).

        A storage error is an outage, not a lost race: retried with backoff until
        ``deadline`` (then ``KafkaTimeoutError``, outcome unknown), never escalated.
        """
        log = self.table.log
        commit_id = uuid.uuid4().hex
        attempt = 0
        outage: BaseException | None = None
        while True:
            self._check_deadline(deadline, outage)
            try:
                with self.table._lock:
                    snap = self._snapshot()
                    if snap.protocol is not None:
                        check_protocol(snap.protocol, write=True)
                    try:
                        plan = build(snap)
                    except TxnTableError:
                        if log.refresh(snap):
                            continue
                        raise
                    if not plan.actions:
                        if log.refresh(snap):
                            continue
                        return plan, snap.version
                    info = CommitInfo(
                        now_ms(), plan.operation, commit_id, transactionalId=transactional_id
                    )
                    if log.try_put(snap, [*plan.actions, info]):
                        self._conflicts = 0
                        self.stats["direct"] += 1
                        return plan, snap.version
            except RETRIABLE as e:
                outage = e
                log._backoff(attempt)
                attempt += 1
                continue
            outage = None
            self._conflicts += 1
            if self._conflicts >= ESCALATE_AFTER_CONFLICTS:
                self._conflicts = 0
                return None
            if can_follow and self._look():
                # A committer runs rounds: join them now rather than race them once more
                # (at W=256 writers racing a second time kept the committer's rounds losing
                # for seconds). A handle merely behind (no committer) still retries alone.
                self._conflicts = 0
                return None
            log._backoff(attempt)
            attempt += 1

    def _snapshot(self, behind_ok: int = CATCH_UP_READS) -> TableSnapshot:
        """The handle's snapshot to commit on; first caught up (from a checkpoint if need
        be) when it is more than ``behind_ok`` versions behind the newest version this
        handle heard of: a follower learns its outcomes from the outcome record, not the
        log, and back to committing it would otherwise lose a race and refresh one version
        per request (hundreds at W=16)."""
        snap = self.table.snapshot(refresh=False)
        if self._tip_hint - snap.version <= behind_ok:
            return snap
        try:
            return self.table.caught_up(self._tip_hint)
        except CorruptLogError as e:
            # The hint is a hint (an outcome record left by an earlier table of this name):
            # commit on the snapshot, whose refresh finds a real hole or damage itself.
            _log.warning("%s: not caught up to version %d: %s", self.table.name, self._tip_hint, e)
            self._tip_hint = snap.version
            return self.table.snapshot(refresh=False)

    def _deadline(self, timeout_ms: int | None) -> float:
        return time.monotonic() + (self.cfg.timeout_ms if timeout_ms is None else timeout_ms) / 1000

    def _check_deadline(self, deadline: float, outage: BaseException | None = None) -> None:
        """Raise once ``deadline`` has passed (``outage``: the storage error that kept the
        commit from being decided)."""
        if time.monotonic() > deadline:
            why = f"; storage failing: {outage}" if outage is not None else ""
            error = KafkaTimeoutError(
                f"{self.table.name}: commit not decided in time (its outcome is unknown{why})"
            )
            raise error from outage

    # --- the committer ---------------------------------------------------------------

    def _through_committer(
        self, item: RoundItem, deadline: float
    ) -> tuple[CommitPlan[Any], int] | None:
        local = _Local(item)
        with self._lock:
            if self._committer is None or self._held is None:
                return None
            self._queue.append(local)
            self._wake.notify_all()
        while not local.done.wait(0.1):
            self._check_deadline(deadline)
        if local.again:
            return None
        if local.error is not None:
            raise local.error
        assert local.result is not None
        return local.result

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(16, thread_name_prefix="txntable-commit")
        return self._pool

    def _run_committer(self) -> None:
        idle_since = time.monotonic()
        backoff = IDLE_LIST_S
        listing: Future[_Listing] | None = None
        try:
            while True:
                with self._lock:
                    held = self._held
                    if held is None:
                        break
                    closing = self._closing
                    locals_ = list(self._queue)
                    self._queue.clear()
                if held.expires_ms - now_ms() < self.cfg.lease_ms / 2:
                    renewed = self.lease.renew(held)
                    with self._lock:
                        self._held = renewed
                    if renewed is None:
                        for local in locals_:
                            local.settle(again=True)
                        break
                if closing:
                    # A last round, on a listing taken now: the intents written since the
                    # last one would otherwise wait until their writers help (help_ms).
                    listing = None
                elif listing is None:
                    try:
                        listing = self._executor().submit(self._list_intents)
                    except RuntimeError:  # the interpreter is shutting down
                        break
                try:
                    foreign, listing = self._round(locals_, listing, last=closing)
                except Exception as e:  # noqa: BLE001 - never leave a waiter hanging
                    _log.warning("%s: commit round failed: %s", self.table.name, e)
                    listing = None
                    for local in locals_:
                        if not local.done.is_set():
                            local.settle(error=e)
                    if closing:
                        break
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 0.1)
                    continue
                if closing:
                    break
                if foreign or locals_:
                    backoff = IDLE_LIST_S
                    if foreign:
                        idle_since = time.monotonic()
                    continue
                if (time.monotonic() - idle_since) * 1000 >= self.cfg.idle_ms:
                    break
                # Idle: each look for intents is a LIST; look less often the longer it lasts.
                self._flush_deletes(force=False)
                with self._lock:
                    if not self._queue:
                        self._wake.wait(backoff)
                backoff = min(backoff * 2, max(IDLE_LIST_MAX_S, self.cfg.poll_ms / 1000))
        finally:
            with self._lock:
                held, self._held = self._held, None
                self._committer = None
                leftover = list(self._queue)
                self._queue.clear()
            for local in leftover:
                local.settle(again=True)
            self._flush_deletes(force=True)
            if held is not None:
                self.lease.release(held)

    def _round(
        self,
        locals_: list[_Local],
        listing: Future[_Listing] | None,
        mine: Intent | None = None,
        last: bool = False,
    ) -> tuple[int, Future[_Listing] | None]:
        """One round: the listed intents after ``locals_``, as one version.

        Retries lost races until the round is written (or nothing is left to write, or a
        helper's intent was decided by the version that beat it). The next round's listing
        is started while this round's version is put (``listing`` in, the next one out;
        ``None``: list now, synchronously), unless this is a helper's round (``mine``) or
        the ``last`` one.

        Returns:
            How many other writers' intents it decided, and the next listing.
        """
        while True:
            if mine is not None and mine.id in self.table.snapshot(refresh=False).intents:
                # A helper whose intent the round that beat it decided stops: a round of
                # its own would race the committer's for other writers' intents.
                return 0, None
            listed = listing.result() if listing is not None else self._list_intents()
            listing = None
            intents = self._pending(listed, mine)
            items = [local.item for local in locals_] + [
                RoundItem.of_intent(i, now_ms()) for i in intents
            ]
            if not items:
                return 0, None
            with self.table._lock:
                snap = self._snapshot()
                plan = sequence_round(snap, items)
                if plan.empty:
                    # Nothing to write: final only against the newest version.
                    if self.table.log.refresh(snap):
                        continue
                    written = True
                else:
                    info = CommitInfo(
                        now_ms(),
                        plan.operation,
                        uuid.uuid4().hex,
                        transactionalId=plan.transactional_id,
                        intents=tuple(plan.outcomes),
                    )
                    # A busy round's next listing overlaps its put (an idle one waits).
                    if mine is None and intents and not last:
                        try:
                            listing = self._executor().submit(self._list_intents)
                        except RuntimeError:  # the interpreter is shutting down
                            listing = None
                    written = self.table.log.try_put(
                        snap, [*plan.actions, info], checkpoint_later=True
                    )
                version = snap.version
            if not written:
                continue  # lost the race: the snapshot was refreshed, sequence again
            self.stats["rounds"] += 1
            self.stats["intents"] += len(plan.outcomes)
            self._settle(locals_, plan, version)
            self._publish(items, plan, version)
            self._forget(intents, snap)
            return len([i for i in intents if mine is None or i.id != mine.id]), listing

    @staticmethod
    def _settle(locals_: list[_Local], plan: RoundPlan, version: int) -> None:
        for local, result in zip(locals_, plan.results, strict=False):
            if isinstance(result, TxnTableError):
                local.settle(error=result)
            else:
                assert result is not None
                local.settle(result=(result, version))

    def _publish(self, items: list[RoundItem], plan: RoundPlan, version: int) -> None:
        """Add the round to the outcome record (a hint for followers; written in order by
        one background thread, merged with other committers' rounds by CAS)."""
        decided: dict[str, list[Any]] = {}
        for item, result in zip(items, plan.results, strict=True):
            if item.intent is None or result is None:
                continue
            if isinstance(result, TxnTableError):
                decided[item.intent.id] = [type(result).__name__, str(result), None]
            else:
                decided[item.intent.id] = [None, "", _result_to_json(result.result)]
        if not decided:
            return
        if self._recorder is None:
            self._recorder = ThreadPoolExecutor(1, thread_name_prefix="txntable-outcomes")
        self._unrecorded.append((version, decided))
        try:
            self._recorder.submit(self._write_unrecorded)
        except RuntimeError:  # the interpreter is shutting down: followers read the log
            pass

    def _write_unrecorded(self) -> None:
        """Write every round published since the last write, in one write: rounds that
        landed while a write was slow wait for one more write, not one each (a W=16 run's
        slowest records landed ~116 ms after their version, queued behind each other)."""
        rounds: dict[int, dict[str, list[Any]]] = {}
        while self._unrecorded:
            version, decided = self._unrecorded.popleft()
            rounds[version] = decided
        if rounds:  # else an earlier task wrote them
            self._write_record(rounds)

    def _write_record(self, rounds: dict[int, dict[str, list[Any]]]) -> None:
        key = outcomes_key(self.table.log.root)
        self._record.update(rounds)
        for _ in range(5):
            newest = max(self._record)
            for v in [v for v in self._record if v <= newest - OUTCOME_RECORD_VERSIONS]:
                del self._record[v]
            data = self._record_json()
            try:
                if self._record_etag is None:
                    self._record_etag = self.table.store.put_if_absent(key, data)
                else:
                    self._record_etag = self.table.store.put_if_match(
                        key, data, self._record_etag
                    )
                return
            except (PreconditionFailedError, ObjectExistsError, ObjectNotFoundError):
                pass  # another committer wrote it: merge its rounds with ours
            except (StorageError, OSError) as e:
                self._record_etag = None
                _log.info("outcome record not written (%s): followers read the log", e)
                return
            try:
                obj = self.table.store.get(key)
                self._record.update(_parse_record(obj.data))
                self._record_etag = obj.etag
            except ObjectNotFoundError:
                self._record_etag = None
            except (StorageError, OSError, ValueError, KeyError, TypeError) as e:
                _log.info("outcome record not merged (%s): followers read the log", e)
                return

    def _record_json(self) -> bytes:
        """The record's canonical JSON (as :func:`_unique_json` writes it: sorted keys, no
        whitespace, a fresh ``writeId``), from each round's JSON made once."""
        rounds = []
        for v, decided in sorted(self._record.items()):
            made = self._round_json.get(v)
            if made is None or made[0] is not decided:
                text = json.dumps({"intents": decided, "version": v}, **_CANONICAL)
                made = self._round_json[v] = (decided, text)
            rounds.append(made[1])
        for v in [v for v in self._round_json if v not in self._record]:
            del self._round_json[v]
        tip, write_id = max(self._record), uuid.uuid4().hex
        held = self._held  # the committer's (a helper holds none)
        lease = (
            ""
            if held is None
            else f'"lease":{{"epoch":{held.epoch},"expiresMs":{held.expires_ms},'
            f'"owner":"{held.owner}"}},'
        )
        return (
            f'{{{lease}"rounds":[{",".join(rounds)}],"tip":{tip},'
            f'"version":{OUTCOMES_FORMAT_VERSION},"writeId":"{write_id}","writtenMs":{now_ms()}}}'
        ).encode()

    def _list_intents(self, keys: list[str] | None = None) -> _Listing:
        """LIST the intents (unless ``keys`` were listed) and read the ones not read yet
        (I/O only; run in the pool)."""
        if keys is None:
            keys = self._list_keys()
        decided = self.table.snapshot(refresh=False).intents
        fresh = [
            k
            for k in keys
            if k not in self._intents and (i := intent_id_of(k)) is not None and i not in decided
        ]
        return _Listing(keys, self._read_intents(fresh))

    def _list_keys(self) -> list[str]:
        return sorted(self.table.store.list(intents_prefix(self.table.log.root)))

    def _pending(self, listed: _Listing, mine: Intent | None) -> list[Intent]:
        """The listed intents still undecided, oldest first; deletes the decided ones.

        A committer that finds none eligible while one was written on a version it heard of
        but has not read catches its handle up and sorts them again: a follower's handle
        stops at the version it last read, and its intent is written on the outcome record's
        newest version, so on the handle's snapshot every such intent is from the future. A
        committer that found them all so would decide none and idle out, and the writer that
        took over the lapsed lease to decide its intent would take it again at its next
        stall, to its deadline. (When some intent is eligible the round goes on: a version
        put on a stale snapshot loses its race, and the handle refreshes then.)
        """
        snap = self.table.snapshot(refresh=False)
        self._intents.update(listed.read)
        present = set(listed.keys)
        for key in [k for k in self._intents if k not in present]:
            del self._intents[key]  # deleted by someone: decided or given up
        done: dict[str, None] = {}
        for key in listed.keys:
            intent_id = intent_id_of(key)
            if key not in self._intents and intent_id is not None and intent_id in snap.intents:
                done[key] = None  # decided, and not deleted yet (or its delete failed)
        out = self._sort_out(snap, done)
        if not out and not (mine is not None and eligible(mine, snap)) and self._heard_ahead(mine):
            snap = self._snapshot(behind_ok=0)
            out = self._sort_out(snap, done)
        for key in done:
            self._intents.pop(key, None)
        self._delete(list(done))
        if mine is not None and all(i.id != mine.id for i in out) and eligible(mine, snap):
            out.insert(0, mine)
        return out[: self.cfg.max_round_intents]

    def _sort_out(self, snap: TableSnapshot, done: dict[str, None]) -> list[Intent]:
        """The read intents eligible on ``snap``, oldest first; adds to ``done`` those it
        decided or whose window it passed (never decided now)."""
        out: list[Intent] = []
        for key, intent in sorted(self._intents.items()):
            if intent is None:
                continue
            if eligible(intent, snap):
                out.append(intent)
            elif intent.id in snap.intents or (
                intent.base_version <= snap.version - INTENT_WINDOW_VERSIONS
            ):
                done[key] = None
        return out

    def _heard_ahead(self, mine: Intent | None) -> bool:
        """Whether an intent (read, or this writer's own) was written on a version this
        handle heard of (the outcome record's newest) but has not read."""
        version = self.table.snapshot(refresh=False).version
        bases = [i.base_version for i in self._intents.values() if i is not None]
        if mine is not None:
            bases.append(mine.base_version)
        return any(version < base <= self._tip_hint for base in bases)

    def _read_intents(self, keys: list[str]) -> dict[str, Intent | None]:
        """The intents of ``keys``: decoded from the key when it carries the body, else
        read (a GET each, in parallel); ``None`` for one gone or unreadable."""
        out: dict[str, Intent | None] = {}
        unread: list[str] = []
        for key in keys:
            created_ms, intent_id, payload = intent_key_parts(key) or (0, "", None)
            if payload is not None:
                try:
                    out[key] = Intent.from_key_payload(payload, intent_id, created_ms, key)
                    continue
                except (CorruptLogError, UnsupportedProtocolError) as e:
                    _log.info("intent %s: %s; reading its object", key, e)
            unread.append(key)

        def read(key: str) -> Intent | None:
            try:
                return Intent.from_json(self.table.store.get(key).data, key)
            except ObjectNotFoundError:
                return None
            except (CorruptLogError, UnsupportedProtocolError) as e:
                _log.warning("skipping intent %s: %s", key, e)
                return None

        if len(unread) <= 1:
            out.update((k, read(k)) for k in unread)
        else:
            with ThreadPoolExecutor(min(16, len(unread))) as pool:
                out.update(zip(unread, pool.map(read, unread), strict=True))
        return out

    def _forget(self, intents: list[Intent], snap: TableSnapshot) -> None:
        decided = {i.id: i for i in intents if i.id in snap.intents}
        listed = {i.id: k for k, i in self._intents.items() if i is not None and i.id in decided}
        # A helper's own intent may be decided without being listed: its key is this
        # process's encoding of it, as _follow wrote it.
        root = self.table.log.root
        done = [
            listed.get(i.id) or intent_key(root, i.created_ms, i.id, i.key_payload())
            for i in decided.values()
        ]
        for key in done:
            self._intents.pop(key, None)
        self._delete(done)

    def _delete(self, keys: list[str]) -> None:
        """Delete decided (or expired) intents: gathered, then one batch delete in the
        background per ``DELETE_BATCH`` keys or ``DELETE_EVERY_S`` (each key once)."""
        with self._lock:
            self._to_delete.update(k for k in keys if k not in self._deleting)
        self._flush_deletes(force=False)

    def _flush_deletes(self, force: bool) -> None:
        with self._lock:
            due = len(self._to_delete) >= DELETE_BATCH or (
                time.monotonic() - self._deleted_at >= DELETE_EVERY_S
            )
            if not self._to_delete or not (force or due):
                return
            keys = sorted(self._to_delete)
            self._to_delete.clear()
            self._deleting.update(keys)
            self._deleted_at = time.monotonic()

        def delete() -> None:
            try:
                self.table.store.delete_many(keys)
            except (StorageError, OSError) as e:
                _log.info("intents not deleted (%s): a later round deletes them", e)
            finally:
                with self._lock:
                    self._deleting.difference_update(keys)

        try:
            self._executor().submit(delete)
        except RuntimeError:  # the interpreter is shutting down: a later round deletes them
            with self._lock:
                self._deleting.difference_update(keys)

    # --- follower --------------------------------------------------------------------

    def _follow(
        self, op: Operation, transactional_id: str | None, deadline: float
    ) -> tuple[Any, int]:
        """Write the operation as an intent and wait for the version that decides it."""
        self.stats["followed"] += 1
        while True:
            # The handle's version as the base, without a read first: it only has to be
            # within the window of the version that decides the intent.
            base = max(self.table.snapshot(refresh=False).version, self._tip_hint)
            intent = Intent(uuid.uuid4().hex, base, op, transactional_id, now_ms())
            key = intent_key(
                self.table.log.root, intent.created_ms, intent.id, intent.key_payload()
            )
            self._put_intent(key, intent, deadline)
            decided = self._await(intent, deadline)
            if decided is None:
                continue  # expired undecided (out of the window): submit it again
            error, message, result, version = decided
            if error is not None:
                raise _error(error, message)
            return result, version

    def _put_intent(self, key: str, intent: Intent, deadline: float) -> None:
        data = intent.to_json()
        while True:
            try:
                self.table.store.put(key, data)
                return
            except (TransientStorageError, OSError):
                self._check_deadline(deadline)
                time.sleep(random.uniform(0, 0.05))

    def _await(self, intent: Intent, deadline: float) -> tuple[Any, str, Any, int] | None:
        """``(error, message, result, version)`` of the round that decided ``intent``, or
        ``None`` once it can never be decided (the log moved past its window without it).

        The outcome record tells in one read, whatever number of versions went by; the log
        is read when the record does not know (the record lags, or was lost), and decides.
        The first look waits about as long as deciding took the last times.
        """
        started = time.monotonic()
        # The gaps between the record's writes are learned within a wait: a table left idle
        # between two transactions says nothing of how often rounds come.
        self._record_written = None
        # Help when nothing moves for the patience (the committer is gone), or after a long wait
        # however busy the committer looks (it may not see the intent); a slow committer
        # is not helped: helping adds work where time is short.
        patience = self._patience()
        help_at = started + patience * random.uniform(1, 1.5)
        # Look about when a decision is due, then a few times per expected wait: each look
        # is a request (and many waiting writers' looks are CPU a busy committer lacks).
        # At most half a patience apart, so that a stall is seen in time (where rounds come
        # seconds apart, W=256, looks every help_ms / 2 were ten reads per transaction).
        poll = min(
            max(self.cfg.poll_ms / 1000, self._decide_s / FOLLOWER_LOOKS_PER_DECISION),
            patience / 2,
        )
        # The first look at most a patience after the intent: help is not due before then.
        time.sleep(min(self._decide_s * FOLLOWER_FIRST_LOOK, patience))
        record_tip = -1
        misses = 0
        skipped = 0
        # Once per stall (the record standing still for a few usual waits): is there still
        # a committer? One that stepped down is replaced now, not after help_ms.
        look_at: float | None = started + self._stall_s()
        while True:
            found, tip = self._from_record(intent)
            if found is not None:
                self._learned(started)
                return found
            if tip > record_tip:
                now = time.monotonic()
                misses += record_tip >= 0
                record_tip = tip
                # Rounds are being committed: a slow committer is not helped (helping adds
                # work where time is short, and each helper reads every pending intent).
                help_at = now + self._patience() * random.uniform(1, 1.5)
                look_at = now + self._stall_s()
            elif look_at is not None and time.monotonic() >= look_at:
                look_at = None
                if self._committer_gone():
                    help_at = time.monotonic()
            if misses >= RECORD_MISSES or time.monotonic() >= help_at:
                overlooked = misses >= RECORD_MISSES
                misses = 0
                keys: list[str] | None = None
                helping = reading = True
                if not overlooked:
                    help_at = time.monotonic() + self._patience() * random.uniform(1, 1.5)
                    if self._take_lapsed_lease():
                        helping = reading = False  # its committer runs the rounds now
                    else:
                        # Nothing moves: most waiting writers leave the round to a few, and
                        # most of those do not read the log either (at W=256 the stalled
                        # writers' catch-ups were a fifth of all the log reads); every few
                        # stalls each reads it, as a round whose record was lost is only there.
                        keys = self._volunteer()
                        if keys is None:
                            skipped += 1
                            helping = False
                            reading = skipped % LOOK_EVERY_SKIPS == 0
                if reading:
                    self.stats["overlooked" if overlooked else "log_reads"] += 1
                    # The record moved on without it (or nothing moves): the log decides.
                    with self.table._lock:
                        snap = self.table.caught_up(max(record_tip, self._tip_hint))
                        outcome = snap.intents.get(intent.id)
                        past = snap.version > intent.base_version + INTENT_WINDOW_VERSIONS
                    if outcome is None and past:
                        outcome = self._scan_for(intent)
                        if outcome is None:
                            return None
                    if outcome is not None:
                        self._learned(started)
                        return self._from_log(intent, outcome)
                if helping:
                    # Rounds went by without it although they take every listed intent: the
                    # committer does not see it (or nothing moves): commit a round with it.
                    self._help(intent, keys)
                    help_at = time.monotonic() + self._patience() * random.uniform(1, 1.5)
                    continue
            self._check_deadline(deadline)
            time.sleep(self._next_look(poll, patience / 2))

    def _saw_written(self, tip: int, written_ms: int | None) -> None:
        """Learn the usual gap between versions from a record that changed: from when it
        was written, or, for a record without ``writtenMs`` (an older client's), from when
        this handle saw it (a coarser sample: within one look). Two samples on different
        clocks teach nothing."""
        seen = self._record_written
        committers = written_ms is not None
        at = written_ms if written_ms is not None else now_ms()
        if seen is not None and seen[2] == committers and tip > seen[0] and at >= seen[1]:
            gap = (at - seen[1]) / (tip - seen[0])
            if self._gap_ms > 0:
                # A stall counts as twice the usual gap at most: the committer was killed, or
                # paused, and the next one writes as often as before.
                gap = 0.7 * self._gap_ms + 0.3 * min(gap, 2 * self._gap_ms)
            self._gap_ms = gap
        if seen is None or seen[2] != committers or tip >= seen[0]:
            self._record_written = (tip, at, committers)

    def _saw_lease(self, data: bytes) -> None:
        """A record written by the committer this handle follows says until when its lease
        runs (its last renewal): the follower's copy lasts that long, with no read of the
        lease when it expires (at W=256 those reads were ~0.23 requests per transaction).
        Only the lease followed is extended (same owner and epoch): a record never makes a
        writer follow a committer, and a stall still reads the lease (a released one)."""
        lease = _record_lease(data) if self._seen is not None else None
        if lease is None:
            return
        owner, epoch, expires_ms = lease
        # Under the lock: another thread of this handle may have followed another lease, or
        # become the committer, since the read above; the extension must not undo that.
        with self._lock:
            seen = self._seen
            if seen is None or (owner, epoch) != (seen.owner, seen.epoch):
                return
            if expires_ms > seen.expires_ms:
                self._seen = replace(seen, expires_ms=expires_ms)

    def _next_look(self, poll: float, longest: float) -> float:
        """Seconds until a waiting writer's next look at the record: ``poll``, or later when
        the record's next write is not due before then (its last write's ``writtenMs`` plus
        the usual gap between writes): a look before it finds the record unchanged (at W=256
        rounds came ~0.45 s apart and waiting writers looked ~3 times per round). At most
        1.5 gaps (a committer whose clock is ahead of this writer's) and ``longest``."""
        seen = self._record_written
        gap_ms = self._gap_ms
        if seen is None or gap_ms <= 0:
            return poll
        due = (seen[1] + gap_ms - now_ms()) / 1000
        return max(poll, min(due, 1.5 * gap_ms / 1000, longest))

    def _patience(self) -> float:
        """How long nothing may move before a waiting writer reads the log and helps:
        help_ms, or a few of the usual gaps between versions when rounds come slower than
        that (at W=256 they took seconds, and every waiting writer read the versions it
        missed and listed the intents at each), at most half a lease."""
        help_s = self.cfg.help_ms / 1000
        return max(help_s, min(PATIENCE_GAPS * self._gap_ms / 1000, self.cfg.lease_ms / 2000))

    def _stall_s(self) -> float:
        """How long the outcome record may stand still before a waiting writer reads the
        lease once: a few of its usual waits for a decision (at least help_ms / 4), and at
        most 0.9 of its patience, so before it would help. Not 0.9 help_ms where rounds
        come seconds apart (W=256): that read the lease at almost every gap between them."""
        help_s = self.cfg.help_ms / 1000
        return min(max(STALL_LEASE_LOOK * self._decide_s, help_s / 4), 0.9 * self._patience())

    def _committer_gone(self) -> bool:
        """Whether no live lease names a committer (released, lapsed or never taken); an
        unreadable lease is not taken for gone (the writer waits out its patience as before)."""
        self.stats["stall_looks"] += 1
        read, current = self._read_lease_hint()
        return read and (current is None or not current.live(now_ms()))

    def _learned(self, started: float) -> None:
        # Capped: the first look comes at most half a patience after the intent anyway.
        took = min(time.monotonic() - started, DECIDE_S_MAX_HELPS * self.cfg.help_ms / 1000)
        self._decide_s = 0.7 * self._decide_s + 0.3 * took

    def _from_record(self, intent: Intent) -> tuple[tuple[Any, str, Any, int] | None, int]:
        """The intent's outcome in the outcome record, and the record's newest version."""
        key = outcomes_key(self.table.log.root)
        try:
            data = self.table.store.get(key).data
            seen, rounds, seen_tip = self._seen_record
            tip = seen_tip if data == seen else _record_tip(data)
            if data != seen:
                rounds = None
            found: tuple[int, list[Any]] | None = None
            if rounds is None and tip is not None:
                # Most looks: the record does not name the intent (a byte search), or names
                # it once — then only its entry and its round's version are decoded (a record
                # holds every writer's outcomes of 16 rounds, and every waiting writer looks).
                found = _record_entry(data, intent.id)
            elif rounds is None:
                rounds = _parse_record(data)  # no tip: written by an older client
                tip = max(rounds, default=-1)
        except (ObjectNotFoundError, TransientStorageError):
            return None, -1
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return None, -1  # a damaged hint: the log tells
        if tip is None:
            return None, -1
        if data != seen:
            self._saw_written(tip, _record_written_ms(data))
            self._saw_lease(data)
        self._seen_record = (data, rounds, tip)
        self._tip_hint = max(self._tip_hint, tip)
        if found is None and rounds is not None:
            found = next(
                ((v, d[intent.id]) for v, d in rounds.items() if intent.id in d), None
            )
        if found is None:
            return None, tip
        version, entry = found
        try:
            error, message, result = entry
            value = None if error is not None else _result_from_json(intent.op, result)
        except (ValueError, KeyError, TypeError):
            return None, tip
        return (error, str(message), value, version), tip

    def _from_log(self, intent: Intent, outcome: IntentOutcome) -> tuple[Any, str, Any, int]:
        if outcome.error is not None:
            return outcome.error, outcome.message, None, outcome.version
        result = None
        if isinstance(intent.op, AppendOp):
            result = append_result(self.table.snapshot(refresh=False), intent.op)
        return None, "", result, outcome.version

    def _scan_for(self, intent: Intent) -> IntentOutcome | None:
        """The handle jumped past the window (a reload): read the window's versions."""
        log = self.table.log
        first = intent.base_version + 1
        for version in range(first, first + INTENT_WINDOW_VERSIONS + 1):
            actions = log.read_version(version)
            if actions is None:
                break
            for a in actions:
                if isinstance(a, CommitInfo):
                    for o in a.intents:
                        if o.id == intent.id:
                            return o
        return None

    def _volunteer(self) -> list[str] | None:
        """Nothing moved for the patience (and a live committer holds the lease): the listed
        intents' keys if this writer commits the next round itself, ``None`` if it leaves
        the round to others."""
        keys = self._list_keys()
        waiting = len(keys)
        if waiting > HELPERS_AT_ONCE and random.random() * waiting >= HELPERS_AT_ONCE:
            # Many writers wait, and all saw nothing move at about the same time: a round
            # decides every listed intent, so about HELPERS_AT_ONCE of them help (at W=256
            # every writer helped at start-up, and 256 rounds raced for each version). The
            # intents are decoded only by those that help (at W=256 decoding every listed
            # key was 12% of the writers' CPU).
            self.stats["helps_skipped"] += 1
            return None
        return keys

    def _take_lapsed_lease(self) -> bool:
        """Whether this writer took over a lapsed (or released) lease and started its
        committer; else it follows the lease it read."""
        current = self.lease.read()
        if current is None or not current.live(now_ms()):
            held = self.lease.take(current)
            if held is not None:
                self.stats["helps"] += 1
                self._start_committer(held)
                return True
            current = self.lease.read()
        self._seen = current
        return False

    def _help(self, intent: Intent, keys: list[str] | None = None) -> None:
        """Commit one round with ``intent``: on ``keys`` when a stall made this writer
        volunteer; else rounds went by without the intent (the committer does not see it),
        which a round of its own fixes, unless the lease lapsed (then it is taken over)."""
        if keys is None:
            if self._take_lapsed_lease():
                return
            keys = self._list_keys()
        self.stats["helps"] += 1
        done: Future[_Listing] = Future()
        done.set_result(self._list_intents(keys))
        self._round([], done, mine=intent)
        self._flush_deletes(force=True)


#: Handles whose committer thread may still run; stopped when the interpreter exits.
_LIVE: weakref.WeakSet[GroupCommit] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_exit_hook = False


#: Solo writers' looks at the lease run on a pool of this many threads shared by every
#: handle of the process (a producer writing to many tables holds no thread per table).
LEASE_LOOKERS = 2


def _lookers() -> ThreadPoolExecutor:
    return shared_pool("lease-look", LEASE_LOOKERS)


def _stop_all() -> None:
    with _LIVE_LOCK:
        handles = list(_LIVE)
    for handle in handles:
        handle.close()


def _track(handle: GroupCommit) -> None:
    """Remember a running committer; stop them all when the main thread ends (before the
    thread pools they use are shut down), releasing their leases."""
    global _exit_hook
    with _LIVE_LOCK:
        _LIVE.add(handle)
        if _exit_hook:
            return
        _exit_hook = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_stop_all)
    except RuntimeError:  # missing, or the interpreter is already shutting down
        atexit.register(_stop_all)


def append_result(snap: TableSnapshot, op: AppendOp) -> AppendResult:
    """Offsets of a decided append, found in the snapshot (pure).

    An idempotent batch is found through its producer's state (the last five batches:
    committed now or, as a duplicate, before); others by their segment path, from the end
    of the partition (they were just committed).

    Raises:
        CorruptLogError: A batch the log says was committed is not in the snapshot.
    """
    result = AppendResult()
    for b in op.batches:
        part = snap.partition(b.partition)
        found = None
        if b.producer_id >= 0 and b.base_sequence >= 0:
            entry = part.producers.get(b.producer_id)
            if entry is not None:
                meta = entry.find_duplicate(b.producer_epoch, b.base_sequence, b.last_sequence)
                found = None if meta is None else meta.base_offset
        if found is None:
            for e in reversed(part.entries):
                if isinstance(e, Batch) and e.path == b.path:
                    found = e.baseOffset
                    break
        if found is None:
            raise CorruptLogError(f"batch {b.path} was committed but is not in the snapshot")
        result.base_offsets.append(found)
        result.duplicates.append(False)
    for m in op.markers:
        part = snap.partition(m.partition)
        for e in reversed(part.entries):
            if isinstance(e, Marker) and e.producerId == m.producer_id:
                result.marker_offsets[m.partition] = e.offset
                break
    return result


def _error(name: str, message: str) -> TxnTableError:
    """The error a round refused an intent with, as its class (TxnTableError if unknown)."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, TxnTableError):
        try:
            return cls(message)
        except TypeError:
            pass
    return TxnTableError(f"{name}: {message}")
