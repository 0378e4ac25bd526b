"""Group commit: a round of writers' operations bound to one log version. Pure; no I/O.

Many writers of one log do not race for its next version: each writes an **intent** (a
small uniquely named object holding one declarative operation: an append of batches and
markers, or an offset commit), and a committer folds every pending intent into one version
(see :mod:`txntable.log.group_commit` for who commits and when). Sequencing is a function of
the snapshot and the round's items: each operation is planned, in the round's order,
against the state the items before it left (a :meth:`~TableSnapshot.fork`), exactly as a
direct commit plans against the newest snapshot, so offsets are assigned, epochs fenced,
sequences deduplicated and transaction states checked in log order. An operation refused
by validation is decided with its error, which its writer then raises.

Every decided intent is recorded in the version's ``commitInfo.intents``. An intent may be
decided only while the version being written is at most ``INTENT_WINDOW_VERSIONS`` after
its ``baseVersion``, and decided ones are remembered (``TableSnapshot.intents``) for that
long: so an intent is decided at most once whoever commits it, however late.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from txntable.errors import CorruptLogError, TxnTableError, UnsupportedProtocolError
from txntable.protocol.actions import (
    GROUP_COMMIT_WRITER_VERSION,
    INTENT_WINDOW_VERSIONS,
    Action,
    AppTxn,
    CommitPlan,
    IntentOutcome,
    loads_strict,
)
from txntable.protocol.actions import (
    Protocol as ProtocolAction,
)
from txntable.protocol.append import PendingBatch, PendingMarker, plan_append
from txntable.protocol.offsets import plan_offset_commit
from txntable.protocol.snapshot import TableSnapshot, apply_action
from txntable.structs import OffsetAndMetadata, TopicPartition

#: Version of the intent object's encoding.
INTENT_FORMAT_VERSION = 1
#: An intent id: 32 lowercase hex digits (a uuid4), as a commitId.
INTENT_ID = re.compile(r"[0-9a-f]{32}")
#: Preset dictionary of an intent key's payload (:meth:`Intent.key_payload`; spec: Group
#: commit, Objects): an intent's field names in their encoded order, so that a key carries
#: little more than the values. Part of the format: never changed within a format version.
INTENT_KEY_DICTIONARY = (
    b'{"baseVersion":,"op":{"offsetCommit":{"generation":,"group":"","offsets":[{"metadata":"'
    b'","offset":,"partition":,"table":"},"producerEpoch":,"producerId":'
    b'"appTxn":{"appId":"","lastUpdated":,"version":}'
    b'{"append":{"batches":[{"baseSequence":,"count":,"maxTimestamp":17,"minTimestamp":17,'
    b'"partition":,"path":"/data/partition=/17-.parquet","producerEpoch":,"producerId":,'
    b'"size":,"transactional":true,"transactionalId":"}],"markers":[{"coordinatorEpoch":,'
    b'"partition":,"producerEpoch":,"producerId":,"type":"ABORT"COMMIT"}]}},'
    b'"transactionalId":"","version":1}'
)
#: Largest body a key payload may inflate to (a 255-byte name holds far less).
INTENT_PAYLOAD_MAX_BYTES = 64 * 1024


class Operation(Protocol):
    """A declarative change any committer can plan: a pure function of the snapshot."""

    NAME: str

    def plan(self, snap: TableSnapshot, now: int) -> CommitPlan[Any]:
        """The actions against ``snap`` (raises a TxnTableError to refuse)."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The operation's body in an intent object."""
        ...


@dataclass(frozen=True)
class AppendOp:
    """Segments already written and/or transaction markers: one append (see plan_append)."""

    NAME = "append"
    batches: tuple[PendingBatch, ...] = ()
    markers: tuple[PendingMarker, ...] = ()
    app_txn: AppTxn | None = None

    def plan(self, snap: TableSnapshot, now: int) -> CommitPlan[Any]:
        return plan_append(snap, list(self.batches), list(self.markers), self.app_txn, now)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "batches": [_batch_to_json(b) for b in self.batches],
            "markers": [_marker_to_json(m) for m in self.markers],
        }
        if self.app_txn is not None:
            out["appTxn"] = {
                "appId": self.app_txn.appId,
                "version": self.app_txn.version,
                "lastUpdated": self.app_txn.lastUpdated,
            }
        return out

    @staticmethod
    def from_json(body: dict[str, Any], path: str) -> AppendOp:
        app = body.get("appTxn")
        return AppendOp(
            tuple(_batch_from_json(b, path) for b in _list(body, "batches", path)),
            tuple(_marker_from_json(m, path) for m in _list(body, "markers", path)),
            None
            if app is None
            else AppTxn(
                _get(app, "appId", str, path),
                _get(app, "version", int, path),
                _get(app, "lastUpdated", int, path),
            ),
        )


@dataclass(frozen=True)
class OffsetCommitOp:
    """Offsets committed to a consumer group's log (plain, or pending in a transaction)."""

    NAME = "offsetCommit"
    group: str
    #: ``(table, partition, offset, metadata)`` per committed partition.
    offsets: tuple[tuple[str, int, int, str], ...]
    generation: int = -1
    producer_id: int = -1
    producer_epoch: int = -1

    @staticmethod
    def of(
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        generation: int = -1,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> OffsetCommitOp:
        """The operation committing ``offsets`` (already checked) for ``group``."""
        return OffsetCommitOp(
            group,
            tuple((tp.topic, tp.partition, om.offset, om.metadata) for tp, om in offsets.items()),
            generation,
            producer_id,
            producer_epoch,
        )

    def plan(self, snap: TableSnapshot, now: int) -> CommitPlan[Any]:
        offsets = {TopicPartition(t, p): OffsetAndMetadata(o, m) for t, p, o, m in self.offsets}
        return plan_offset_commit(
            snap, self.group, offsets, self.generation, self.producer_id, self.producer_epoch, now
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "offsets": [
                {"table": t, "partition": p, "offset": o, "metadata": m}
                for t, p, o, m in self.offsets
            ],
            "generation": self.generation,
            "producerId": self.producer_id,
            "producerEpoch": self.producer_epoch,
        }

    @staticmethod
    def from_json(body: dict[str, Any], path: str) -> OffsetCommitOp:
        return OffsetCommitOp(
            _get(body, "group", str, path),
            tuple(
                (
                    _get(o, "table", str, path),
                    _get(o, "partition", int, path),
                    _get(o, "offset", int, path),
                    _get(o, "metadata", str, path),
                )
                for o in _list(body, "offsets", path)
            ),
            _get(body, "generation", int, path),
            _get(body, "producerId", int, path),
            _get(body, "producerEpoch", int, path),
        )


#: Operation kinds an intent may hold, by name.
OPERATIONS: dict[str, Callable[[dict[str, Any], str], Operation]] = {
    AppendOp.NAME: AppendOp.from_json,
    OffsetCommitOp.NAME: OffsetCommitOp.from_json,
}


@dataclass(frozen=True)
class Intent:
    """One writer's pending operation, waiting to be sequenced into the log."""

    id: str
    base_version: int
    op: Operation
    transactional_id: str | None = None
    created_ms: int = 0

    def to_json(self) -> bytes:
        return _dumps(self._object())

    def key_payload(self) -> str:
        """The intent's body less ``id`` and ``createdMs`` (its key names both), as its key
        may carry it: raw DEFLATE with :data:`INTENT_KEY_DICTIONARY`, base64url unpadded.
        A committer that lists the key then has the intent without reading it."""
        body = self._object()
        del body["id"], body["createdMs"]
        deflate = zlib.compressobj(
            9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, INTENT_KEY_DICTIONARY
        )
        data = deflate.compress(_dumps(body)) + deflate.flush()
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

    def _object(self) -> dict[str, Any]:
        return {
            "version": INTENT_FORMAT_VERSION,
            "id": self.id,
            "baseVersion": self.base_version,
            "createdMs": self.created_ms,
            "transactionalId": self.transactional_id,
            "op": {self.op.NAME: self.op.to_json()},
        }

    @staticmethod
    def from_json(data: bytes, path: str) -> Intent:
        """Decode an intent object, strictly.

        Raises:
            CorruptLogError: Not a well-formed intent.
            UnsupportedProtocolError: Written by a newer intent format.
        """
        try:
            obj = loads_strict(data)
        except (ValueError, UnicodeDecodeError):
            raise CorruptLogError("intent is not valid JSON", path) from None
        return Intent._from_object(obj, path)

    @staticmethod
    def from_key_payload(payload: str, intent_id: str, created_ms: int, path: str) -> Intent:
        """Decode the intent a key carries (:meth:`key_payload`), as strictly as its object.

        Raises:
            CorruptLogError: Not a well-formed payload (the object's body still decides).
            UnsupportedProtocolError: Written by a newer intent format.
        """
        try:
            data = base64.b64decode(payload + "=" * (-len(payload) % 4), b"-_", validate=True)
            inflate = zlib.decompressobj(-15, INTENT_KEY_DICTIONARY)
            body = inflate.decompress(data, INTENT_PAYLOAD_MAX_BYTES)
            if not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
                raise ValueError("not one whole DEFLATE stream of at most 64 KiB")
            obj = loads_strict(body)
        except (ValueError, zlib.error, UnicodeDecodeError) as e:
            raise CorruptLogError(f"intent key payload does not decode ({e})", path) from None
        if not isinstance(obj, dict) or "id" in obj or "createdMs" in obj:
            raise CorruptLogError("intent key payload is not an intent body less id", path)
        obj["id"] = intent_id
        obj["createdMs"] = created_ms
        return Intent._from_object(obj, path)

    @staticmethod
    def _from_object(obj: Any, path: str) -> Intent:
        if not isinstance(obj, dict):
            raise CorruptLogError("intent is not a JSON object", path)
        version = _get(obj, "version", int, path)
        if version > INTENT_FORMAT_VERSION:
            raise UnsupportedProtocolError(
                f"intent format {version} is newer than {INTENT_FORMAT_VERSION} ({path})"
            )
        intent_id = _get(obj, "id", str, path)
        if not INTENT_ID.fullmatch(intent_id):
            raise CorruptLogError(f"intent id {intent_id!r} is not 32 hex digits", path)
        op = obj.get("op")
        if not isinstance(op, dict) or len(op) != 1:
            raise CorruptLogError("intent op is not a one-key object", path)
        ((name, body),) = op.items()
        decode = OPERATIONS.get(name)
        if decode is None or not isinstance(body, dict):
            raise CorruptLogError(f"unknown intent operation {name!r}", path)
        tid = obj.get("transactionalId")
        if tid is not None and not isinstance(tid, str):
            raise CorruptLogError("intent transactionalId is not a string", path)
        try:
            operation = decode(body, path)
        except (TypeError, KeyError, ValueError) as e:
            raise CorruptLogError(f"invalid intent operation ({e})", path) from None
        return Intent(
            intent_id,
            _get(obj, "baseVersion", int, path),
            operation,
            tid,
            _get(obj, "createdMs", int, path),
        )


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _get(obj: Any, name: str, kind: type, path: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise CorruptLogError(f"intent misses field {name}", path)
    value = obj[name]
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise CorruptLogError(f"intent field {name} has invalid value {value!r:.60}", path)
    return value


def _list(obj: Any, name: str, path: str) -> list[Any]:
    value = _get(obj, name, list, path)
    assert isinstance(value, list)
    return value


_BATCH_FIELDS: dict[str, tuple[str, type]] = {
    "partition": ("partition", int),
    "path": ("path", str),
    "count": ("count", int),
    "size": ("size", int),
    "producerId": ("producer_id", int),
    "producerEpoch": ("producer_epoch", int),
    "baseSequence": ("base_sequence", int),
    "transactional": ("transactional", bool),
    "minTimestamp": ("min_timestamp", int),
    "maxTimestamp": ("max_timestamp", int),
}


def _batch_to_json(b: PendingBatch) -> dict[str, Any]:
    out = {camel: getattr(b, snake) for camel, (snake, _) in _BATCH_FIELDS.items()}
    if b.transactional_id is not None:
        out["transactionalId"] = b.transactional_id
    return out


def _batch_from_json(obj: Any, path: str) -> PendingBatch:
    values = {snake: _get(obj, camel, kind, path) for camel, (snake, kind) in _BATCH_FIELDS.items()}
    tid = obj.get("transactionalId")
    if tid is not None and not isinstance(tid, str):
        raise CorruptLogError("intent batch transactionalId is not a string", path)
    return PendingBatch(**values, transactional_id=tid)


def _marker_to_json(m: PendingMarker) -> dict[str, Any]:
    return {
        "partition": m.partition,
        "producerId": m.producer_id,
        "producerEpoch": m.producer_epoch,
        "type": m.type,
        "coordinatorEpoch": m.coordinator_epoch,
    }


def _marker_from_json(obj: Any, path: str) -> PendingMarker:
    kind = _get(obj, "type", str, path)
    if kind not in ("COMMIT", "ABORT"):
        raise CorruptLogError(f"intent marker type {kind!r}", path)
    return PendingMarker(
        _get(obj, "partition", int, path),
        _get(obj, "producerId", int, path),
        _get(obj, "producerEpoch", int, path),
        kind,
        _get(obj, "coordinatorEpoch", int, path),
    )


# --- sequencing ------------------------------------------------------------------------


Build = Callable[[TableSnapshot], CommitPlan[Any]]


@dataclass
class RoundItem:
    """One operation of a round: a stored intent (``intent`` set), or the committer's own
    (``build``: a pure function of the snapshot, as :meth:`Log.commit` takes)."""

    build: Build
    intent: Intent | None = None
    transactional_id: str | None = None

    @staticmethod
    def of_intent(intent: Intent, now: int) -> RoundItem:
        return RoundItem(lambda s: intent.op.plan(s, now), intent, intent.transactional_id)


@dataclass
class RoundPlan:
    """What a round writes and what each of its items gets.

    ``results[i]`` is item ``i``'s plan (its ``actions`` are in ``actions``), the
    ``TxnTableError`` that refused it, or ``None`` for a stored intent that was not
    eligible (decided already, or outside the window): nothing of it is in this version.
    """

    actions: list[Action]
    outcomes: list[IntentOutcome]
    results: list[CommitPlan[Any] | TxnTableError | None]
    operation: str
    transactional_id: str | None
    state: TableSnapshot = field(repr=False)

    @property
    def empty(self) -> bool:
        """Nothing to write: no action and no decided intent."""
        return not self.actions and not self.outcomes


def eligible(intent: Intent, snap: TableSnapshot) -> bool:
    """Whether ``intent`` may be decided in the version after ``snap`` (pure).

    Not if it was decided already, or if the version being written is more than
    ``INTENT_WINDOW_VERSIONS`` after its ``baseVersion`` (then it can be remembered no
    longer, so it is never decided: its writer learns that from the log and submits again).
    An intent from the future (``baseVersion`` beyond the newest version) is malformed.
    """
    version = snap.version + 1
    return (
        intent.id not in snap.intents
        and version - INTENT_WINDOW_VERSIONS <= intent.base_version < version
    )


def sequence_round(snap: TableSnapshot, items: Sequence[RoundItem]) -> RoundPlan:
    """Plan one round on top of ``snap`` (pure; ``snap`` itself is not changed).

    Items are planned in order, each against the state the accepted items before it left;
    an item whose plan raises ``TxnTableError`` is refused with that error and leaves
    nothing. Stored intents that are not :func:`eligible` are skipped.
    """
    state = snap.fork()
    version = snap.version + 1
    actions: list[Action] = []
    outcomes: list[IntentOutcome] = []
    results: list[CommitPlan[Any] | TxnTableError | None] = []
    operations: set[str] = set()
    tids: set[str | None] = set()
    seen: set[str] = set()
    if any(item.intent is not None and eligible(item.intent, snap) for item in items):
        _require_group_commit_writer(state, actions)
    for item in items:
        intent = item.intent
        if intent is not None and (intent.id in seen or not eligible(intent, snap)):
            results.append(None)
            continue
        try:
            plan = item.build(state)
        except TxnTableError as e:
            results.append(e)
            if intent is not None:
                seen.add(intent.id)
                outcomes.append(
                    IntentOutcome(intent.id, intent.base_version, version, type(e).__name__, str(e))
                )
            continue
        for action in plan.actions:
            apply_action(state, action)
        actions.extend(plan.actions)
        results.append(plan)
        if plan.actions or intent is not None:
            operations.add(plan.operation)
            tids.add(item.transactional_id)
        if intent is not None:
            seen.add(intent.id)
            outcomes.append(IntentOutcome(intent.id, intent.base_version, version))
    operation = operations.pop() if len(operations) == 1 else "WRITE"
    tid = tids.pop() if len(tids) == 1 else None
    return RoundPlan(actions, outcomes, results, operation, tid, state)


def _require_group_commit_writer(state: TableSnapshot, actions: list[Action]) -> None:
    """Raise the table's writer version to the group-commit one (once, in the first round
    that decides intents): older writers would forget decided intents in checkpoints."""
    protocol = state.protocol
    if protocol is not None and protocol.minWriterVersion < GROUP_COMMIT_WRITER_VERSION:
        upgrade = ProtocolAction(protocol.minReaderVersion, GROUP_COMMIT_WRITER_VERSION)
        apply_action(state, upgrade)
        actions.append(upgrade)
