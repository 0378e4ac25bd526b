"""Log actions: the records a table's commit log is made of, and their JSON encoding.

Each log version is newline-delimited JSON; every line is an object with exactly one key,
the action's name, whose value holds the action's fields (Delta's layout). Decoding is
strict: an unknown action, a missing required field or a wrongly typed one is a
:class:`~txntable.errors.CorruptLogError` naming the file, so a damaged log is never
half-applied.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, Generic, Literal, TypeVar

from txntable.errors import (
    CorruptLogError,
    SchemaMismatchError,
    TxnTableError,
    UnsupportedProtocolError,
)
from txntable.protocol.schema import Field, normalize_schema, schema_from_json

#: Highest reader/writer protocol version this client implements.
READER_VERSION = 3
WRITER_VERSION = 4
#: Protocol of a table that holds merged segments, producer expiry or a truncated log (v2).
MAINTENANCE_PROTOCOL_VERSION = 2
#: Protocol new tables and group logs are created with: what they need until maintenance
#: upgrades them (Delta's rule), so older clients keep reading tables that never use v2.
CREATE_READER_VERSION = 1
CREATE_WRITER_VERSION = 1

#: Group commit: an intent may be decided only while the version being written is at most
#: this many versions after the intent's ``baseVersion``; decided intents are remembered for
#: as long, so no intent is ever decided twice (see the spec's Group commit).
INTENT_WINDOW_VERSIONS = 100
#: Writer version a table needs once group commit has decided an intent in its log: older
#: writers would not remember decided intents across their checkpoints.
GROUP_COMMIT_WRITER_VERSION = 4

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

MarkerType = Literal["COMMIT", "ABORT"]

#: JSON's insignificant whitespace (RFC 8259); a line holding only these is blank.
JSON_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class Protocol:
    """Reader and writer versions a client must implement to use the table."""

    NAME: ClassVar[str] = "protocol"
    minReaderVersion: int
    minWriterVersion: int


DEFAULT_RECORD_SCHEMA: tuple[Field, ...] = (
    Field("key", "binary"),
    Field("value", "binary"),
    Field("headers", "array<struct<key:string,value:binary>>"),
    Field("timestamp", "timestamp_ms_utc", nullable=False),
)


@dataclass(frozen=True)
class Metadata:
    """Table identity, partition count, record schema and configuration."""

    NAME: ClassVar[str] = "metadata"
    tableId: str
    name: str
    partitions: int
    schema: tuple[Field, ...] = DEFAULT_RECORD_SCHEMA
    createdTime: int = 0
    configuration: dict[str, str] = field(default_factory=dict)
    #: A typed table (protocol v3): ``schema`` is the user's columns (see
    #: :mod:`txntable.protocol.schema`). Absent from the JSON when false.
    typed: bool = False
    #: Columns of a typed table whose values are the record's key. Absent when empty.
    keyColumns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Batch:
    """One producer batch on one partition, stored as one Parquet segment.

    Offsets are not stored in the segment: record ``i`` of the segment has offset
    ``baseOffset + i``. ``baseOffset`` is assigned when the version is committed.
    """

    NAME: ClassVar[str] = "batch"
    partition: int
    baseOffset: int
    count: int
    path: str
    size: int
    producerId: int = NO_PRODUCER_ID
    producerEpoch: int = NO_PRODUCER_EPOCH
    baseSequence: int = NO_SEQUENCE
    transactional: bool = False
    minTimestamp: int = 0
    maxTimestamp: int = 0
    #: Set on transactional batches: lets any writer of the table find the coordinator
    #: object of a transaction that pins the LSO, to abort it once it has timed out.
    transactionalId: str | None = None

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record."""
        return self.baseOffset + self.count - 1

    @property
    def next_offset(self) -> int:
        """Offset just past the batch."""
        return self.baseOffset + self.count

    @property
    def last_sequence(self) -> int:
        """Sequence number of the batch's last record (int32 wrap-around, as Kafka)."""
        if self.baseSequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.baseSequence + self.count - 1) % (2**31)


@dataclass(frozen=True)
class Marker:
    """A transaction control record (COMMIT or ABORT); it occupies one offset."""

    NAME: ClassVar[str] = "marker"
    partition: int
    offset: int
    producerId: int
    producerEpoch: int
    type: MarkerType
    coordinatorEpoch: int = 0
    timestamp: int = 0

    @property
    def baseOffset(self) -> int:
        """The marker's offset (markers and batches share the entry interface)."""
        return self.offset

    @property
    def last_offset(self) -> int:
        """Same as :attr:`offset`."""
        return self.offset

    @property
    def next_offset(self) -> int:
        """Offset just past the marker."""
        return self.offset + 1


@dataclass(frozen=True)
class AbortedTxn:
    """An aborted-transaction index entry, written with every ABORT marker (Kafka's .txnindex)."""

    NAME: ClassVar[str] = "abortedTxn"
    partition: int
    producerId: int
    firstOffset: int
    lastOffset: int
    lastStableOffset: int


@dataclass(frozen=True)
class OffsetCommit:
    """A consumer group's committed offset for one table partition."""

    NAME: ClassVar[str] = "offsetCommit"
    group: str
    table: str
    partition: int
    offset: int
    metadata: str = ""
    producerId: int = NO_PRODUCER_ID
    producerEpoch: int = NO_PRODUCER_EPOCH
    generation: int = -1
    commitTimestamp: int = 0


@dataclass(frozen=True)
class AppTxn:
    """Idempotency key of an application writer (Delta's ``txn``): the last version applied."""

    NAME: ClassVar[str] = "appTxn"
    appId: str
    version: int
    lastUpdated: int = 0


@dataclass(frozen=True)
class LogStart:
    """Moves a partition's log start offset forward (retention, delete-records)."""

    NAME: ClassVar[str] = "logStart"
    partition: int
    offset: int


@dataclass(frozen=True)
class Segment:
    """A merged segment: records of offsets ``[baseOffset, endOffset)`` with explicit offsets.

    Written by segment merge and key compaction (protocol v2). In a log version it replaces
    the entries (batches, markers, segments) that exactly cover ``[baseOffset, endOffset)``;
    in a checkpoint it is appended. The Parquet file has an ``offset`` column: only the
    records that survived the rewrite are in it (``count`` of them, possibly none, then
    ``path`` is empty), so offsets keep gaps where markers, aborted or compacted records were.
    """

    NAME: ClassVar[str] = "segment"
    partition: int
    baseOffset: int
    endOffset: int
    count: int
    path: str
    size: int
    minTimestamp: int = 0
    maxTimestamp: int = 0
    #: Key-compacted: only the latest record per key (below the compaction point) remains.
    compacted: bool = False
    #: Tombstones (null values) in this segment may be dropped by a compaction after this
    #: time (Kafka's delete horizon); -1: none recorded.
    deleteHorizonMs: int = -1

    #: A merged segment belongs to no producer and is never part of an open transaction:
    #: everything in it was committed (read_committed filtering treats it as plain data).
    producerId: ClassVar[int] = NO_PRODUCER_ID
    transactional: ClassVar[bool] = False

    @property
    def last_offset(self) -> int:
        """Last offset of the range (the record there may have been removed)."""
        return self.endOffset - 1

    @property
    def next_offset(self) -> int:
        """Offset just past the range."""
        return self.endOffset


@dataclass(frozen=True)
class PartitionStart:
    """Checkpoint only: where a partition's retained entries begin and its log start offset."""

    NAME: ClassVar[str] = "partitionStart"
    partition: int
    logStartOffset: int
    baseOffset: int


@dataclass(frozen=True)
class ProducerSnapshot:
    """Checkpoint only: one producer's state on one partition (Kafka's producer snapshot).

    ``batches`` holds the retained batches as ``[firstSeq, lastSeq, baseOffset, count]``.
    """

    NAME: ClassVar[str] = "producerState"
    partition: int
    producerId: int
    epoch: int
    batches: tuple[tuple[int, int, int, int], ...] = ()
    currentTxnFirstOffset: int = -1
    coordinatorEpoch: int = -1
    lastTimestamp: int = 0


@dataclass(frozen=True)
class ExpireProducer:
    """Removes an idle producer's state from every partition (``producer.id.expiration.ms``)."""

    NAME: ClassVar[str] = "expireProducer"
    producerId: int


@dataclass(frozen=True)
class IntentOutcome:
    """How a group-commit round decided one writer's intent (see the spec's Group commit).

    ``error`` is ``None`` when the intent's operation is in the version, else the name of the
    :class:`~txntable.errors.TxnTableError` that refused it (its writer raises that class).
    """

    id: str
    baseVersion: int
    version: int
    error: str | None = None
    message: str = ""


@dataclass(frozen=True)
class CommitInfo:
    """Provenance of a version; ``commitId`` lets a writer recognise its own version."""

    NAME: ClassVar[str] = "commitInfo"
    timestamp: int
    operation: str
    commitId: str
    writer: str = "txntable-python"
    transactionalId: str | None = None
    #: Group commit: the intents this version decides (absent when empty). In a checkpoint,
    #: every intent decided within the dedup window.
    intents: tuple[IntentOutcome, ...] = ()


Action = (
    Protocol
    | Metadata
    | Batch
    | Marker
    | AbortedTxn
    | OffsetCommit
    | AppTxn
    | LogStart
    | CommitInfo
    | Segment
    | PartitionStart
    | ProducerSnapshot
    | ExpireProducer
)

ACTION_TYPES: dict[str, type] = {
    cls.NAME: cls
    for cls in (
        Protocol,
        Metadata,
        Batch,
        Marker,
        AbortedTxn,
        OffsetCommit,
        AppTxn,
        LogStart,
        CommitInfo,
        Segment,
        PartitionStart,
        ProducerSnapshot,
        ExpireProducer,
    )
}


#: Field names of each dataclass, in order (``dataclasses.fields`` per call is slow).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


class _NotPlain(Exception):
    """A value :func:`_plain` does not convert: ``asdict`` does."""


def _plain(value: Any) -> Any:
    """``asdict``'s conversion of a value made of scalars, tuples, lists, str-keyed dicts
    and dataclasses, without its recursive deep copy (5x the cost: every version and
    checkpoint encodes thousands of batches and markers)."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    if kind is tuple:
        return tuple(_plain(v) for v in value)
    if kind is list:
        return [_plain(v) for v in value]
    if kind is dict and all(type(k) is str for k in value):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(kind, "__dataclass_fields__") and not isinstance(value, type):
        names = _FIELD_NAMES.get(kind)
        if names is None:
            names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(value))
        return {name: _plain(getattr(value, name)) for name in names}
    raise _NotPlain


def _body(action: Action) -> dict[str, Any]:
    try:
        body: dict[str, Any] = _plain(action)
    except _NotPlain:
        body = asdict(action)
    return body


def action_to_dict(action: Action) -> dict[str, Any]:
    """Encode an action as its one-key JSON object."""
    body = _body(action)
    if isinstance(action, Batch) and action.transactionalId is None:
        del body["transactionalId"]  # optional: absent rather than null
    if isinstance(action, Metadata):
        body["schema"] = [_field_to_dict(f) for f in action.schema]
        if not action.typed:
            del body["typed"]  # optional: a v2 table's metadata is as v2 wrote it
        if action.keyColumns:
            body["keyColumns"] = list(action.keyColumns)
        else:
            del body["keyColumns"]
    if isinstance(action, ProducerSnapshot):
        body["batches"] = [list(b) for b in action.batches]
    if isinstance(action, CommitInfo) and not action.intents:
        del body["intents"]  # optional: versions without group commit are as before
    return {action.NAME: body}


def _field_to_dict(f: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "type": f.type, "nullable": f.nullable}
    if f.children:
        out["children"] = [_field_to_dict(c) for c in f.children]
    return out


def _field_from_dict(f: Any) -> Field:
    if not isinstance(f, dict) or not isinstance(f["name"], str) or not isinstance(
        f["type"], str
    ):
        raise TypeError(f"field {f!r:.100} is not an object with string name and type")
    nullable = f.get("nullable", True)
    children = f.get("children", [])
    if not isinstance(nullable, bool) or not isinstance(children, list):
        raise TypeError(f"field {f['name']!r}: nullable must be a bool, children a list")
    return Field(f["name"], f["type"], nullable, tuple(_field_from_dict(c) for c in children))


#: One encoder (``json.dumps`` with options builds one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def encode_action(action: Action) -> str:
    """One action's line of a version or checkpoint (without its newline)."""
    return _ENCODER.encode(action_to_dict(action))


def encode_actions(actions: list[Action]) -> bytes:
    """Encode actions as newline-delimited JSON (one log version)."""
    return encode_lines([encode_action(a) for a in actions])


def encode_lines(lines: list[str]) -> bytes:
    """Newline-delimited lines of :func:`encode_action` as a version or checkpoint's bytes."""
    return ("\n".join(lines) + "\n").encode()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        names = [k for k, _ in pairs]
        twice = next(k for i, k in enumerate(names) if k in names[:i])
        raise ValueError(f"key {twice!r} appears twice in an object")
    return obj


_STRICT = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
_PLAIN = json.JSONDecoder(parse_constant=_refuse_constant)


def _count_keys(value: Any) -> int:
    """How many keys the objects in ``value`` hold (nested ones included)."""
    if type(value) is dict:
        n = len(value)
        for v in value.values():
            if type(v) is dict or type(v) is list:
                n += _count_keys(v)
        return n
    if type(value) is list:
        return sum(_count_keys(v) for v in value if type(v) is dict or type(v) is list)
    return 0


def _keys_unique(text: str, keys: int) -> bool:
    """Whether decoding ``text`` kept every key it holds: ``keys`` (the count of keys of
    what it decoded to) is the count of its key ends, ``"`` then ``:``. Each key of the
    text ends there, and other places only add to the count (a string that opens with a
    colon, an escaped quote before one), so equal counts prove no key was dropped as a
    duplicate. ``False`` when unsure (whitespace before a colon): check object by object.

    The C parser with a duplicate check on every object (a Python call each) took twice
    as long; a log version holds hundreds of objects, and every writer reads every version.
    """
    if '" ' in text or '"\t' in text or '"\r' in text or '"\n' in text:
        return False
    return text.count('":') == keys


def loads_strict(data: str | bytes) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity``, and an object
    with a key twice.

    Python's decoder accepts both by default; RFC 8259 (and the spec) does not allow the
    constants, and leaves duplicate names to each parser (Python keeps the last value, other
    readers the first or an error), so a duplicate would let two readers disagree.

    Raises:
        ValueError: If ``data`` is not valid JSON.
    """
    if isinstance(data, str):
        text = data
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    else:
        text = data.decode(json.detect_encoding(data), "surrogatepass")
    obj = _PLAIN.decode(text)
    keys = _count_keys(obj)
    if keys and not _keys_unique(text, keys):
        return _STRICT.decode(text)  # raises ValueError on a key twice
    return obj


def decode_strict_at(text: str, index: int) -> tuple[Any, int]:
    """The JSON value starting at ``text[index]`` and the index after it, as strict as
    :func:`loads_strict` (to decode one value out of a larger document without the rest).

    Raises:
        ValueError: If no valid JSON value starts there.
    """
    return _STRICT.raw_decode(text, index)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validator(annotation: str) -> Callable[[Any], bool]:
    """Whether a JSON value fits a field of this annotation (its type as written)."""
    ann = annotation.replace(" ", "")
    if ann == "int":
        return _is_int
    if ann == "bool":
        return lambda v: isinstance(v, bool)
    if ann == "str":
        return lambda v: isinstance(v, str)
    if ann == "str|None":
        return lambda v: v is None or isinstance(v, str)
    if ann == "MarkerType":
        return lambda v: v in ("COMMIT", "ABORT")
    if ann.startswith("dict"):
        return lambda v: (
            isinstance(v, dict)
            and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
        )
    if ann.startswith("tuple[Field"):
        return lambda v: isinstance(v, list)
    if ann.startswith("tuple[str"):
        return lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
    if ann.startswith("tuple[IntentOutcome"):
        return lambda v: isinstance(v, list) and all(_is_outcome(o) for o in v)
    if ann.startswith("tuple[tuple[int"):
        return lambda v: (
            isinstance(v, list)
            and all(isinstance(b, list) and len(b) == 4 and all(_is_int(x) for x in b) for b in v)
        )
    raise TypeError(f"no validator for a field of type {annotation}")  # pragma: no cover


@functools.cache
def _field_specs(cls: type) -> tuple[tuple[str, Callable[[Any], bool], bool], ...]:
    """Each field of an action class: its name, its validator, whether it is required
    (worked out once per class: a log version holds hundreds of actions)."""
    return tuple(
        (f.name, _validator(str(f.type)), f.default is MISSING and f.default_factory is MISSING)
        for f in fields(cls)
    )


def _is_outcome(obj: Any) -> bool:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    return (
        isinstance(obj, dict)
        and isinstance(obj.get("id"), str)
        and is_int(obj.get("baseVersion"))
        and is_int(obj.get("version"))
        and (obj.get("error") is None or isinstance(obj.get("error"), str))
        and isinstance(obj.get("message", ""), str)
        and set(obj) <= {"id", "baseVersion", "version", "error", "message"}
    )


def action_from_dict(obj: Any, path: str | None = None) -> Action:
    """Decode one JSON object into an action.

    Raises:
        CorruptLogError: If the object is not a known, well-formed action.
    """
    return _action(obj, path)[0]


def _action(obj: Any, path: str | None) -> tuple[Action, int]:
    """The action of one JSON object, and how many keys the object holds (those of values
    that are not fields of the action not counted)."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CorruptLogError(f"log line is not a one-key action object: {obj!r:.200}", path)
    ((name, body),) = obj.items()
    cls = ACTION_TYPES.get(name)
    if cls is None:
        raise CorruptLogError(f"unknown action {name!r}", path)
    if not isinstance(body, dict):
        raise CorruptLogError(f"action {name}: body is not an object", path)
    keys = 1 + len(body)
    kwargs: dict[str, Any] = {}
    for key, valid, required in _field_specs(cls):
        if key in body:
            value = body[key]
            if not valid(value):
                raise CorruptLogError(
                    f"action {name}: field {key} has invalid value {value!r}", path
                )
            kwargs[key] = value
            if type(value) is dict or type(value) is list:
                keys += _count_keys(value)
        elif required:
            raise CorruptLogError(f"action {name}: missing required field {key}", path)
    if cls is Metadata:
        try:
            if "schema" in kwargs:
                kwargs["schema"] = tuple(_field_from_dict(f) for f in kwargs["schema"])
            kwargs["keyColumns"] = tuple(kwargs.get("keyColumns", ()))
        except (KeyError, TypeError) as e:
            raise CorruptLogError(f"metadata: invalid schema ({e})", path) from None
    if cls is ProducerSnapshot and "batches" in kwargs:
        kwargs["batches"] = tuple(tuple(b) for b in kwargs["batches"])
    if cls is CommitInfo and "intents" in kwargs:
        kwargs["intents"] = tuple(IntentOutcome(**o) for o in kwargs["intents"])
    action: Action = _build(cls, kwargs)
    _check_ranges(action, path)
    return action, keys


@functools.cache
def _defaults(cls: type) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    plain = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
    made = tuple(
        (f.name, f.default_factory) for f in fields(cls) if f.default_factory is not MISSING
    )
    return plain, made


def _build(cls: type, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)`` for a frozen action dataclass of checked fields, without its
    ``__init__`` (a ``object.__setattr__`` call per field: a third of decoding a version)."""
    action: Any = object.__new__(cls)
    state = action.__dict__
    plain, made = _defaults(cls)
    state.update(plain)
    for name, factory in made:
        if name not in kwargs:
            state[name] = factory()
    state.update(kwargs)
    return action


def _check_ranges(action: Action, path: str | None) -> None:
    bad: str | None = None
    if isinstance(action, Batch):
        if action.partition < 0 or action.baseOffset < 0 or action.count <= 0:
            bad = "negative partition/offset or empty batch"
    elif isinstance(action, Marker):
        if action.partition < 0 or action.offset < 0 or action.producerId < 0:
            bad = "negative partition/offset/producerId"
    elif isinstance(action, LogStart):
        if action.partition < 0 or action.offset < 0:
            bad = "negative partition/offset"
    elif isinstance(action, OffsetCommit):
        if action.offset < 0:
            bad = "negative offset"
    elif isinstance(action, AbortedTxn):
        if action.firstOffset > action.lastOffset or action.firstOffset < 0:
            bad = "firstOffset negative or after lastOffset"
    elif isinstance(action, Metadata) and action.partitions <= 0:
        bad = "partitions must be positive"
    elif isinstance(action, Metadata) and action.typed:
        try:
            normalize_schema(schema_from_json(action.schema), action.keyColumns)
        except SchemaMismatchError as e:
            bad = f"invalid record schema ({e})"
    elif isinstance(action, Metadata) and action.keyColumns:
        bad = "keyColumns on a table without a record schema of its own"
    elif isinstance(action, Segment):
        if (
            action.partition < 0
            or action.baseOffset < 0
            or action.endOffset <= action.baseOffset
            or not 0 <= action.count <= action.endOffset - action.baseOffset
            or (action.count > 0) != bool(action.path)
        ):
            bad = "bad range, count or path"
    elif isinstance(action, PartitionStart):
        if action.partition < 0 or not 0 <= action.baseOffset <= action.logStartOffset:
            bad = "negative partition or baseOffset after logStartOffset"
    elif isinstance(action, ProducerSnapshot | ExpireProducer) and action.producerId < 0:
        bad = "negative producerId"
    if bad:
        raise CorruptLogError(f"action {action.NAME}: {bad}", path)


def decode_actions(data: bytes, path: str | None = None) -> list[Action]:
    """Decode one log version.

    Raises:
        CorruptLogError: If any line is not valid JSON or not a well-formed action, or the
            version is empty or truncated (the last line must end with a newline).
        UnsupportedProtocolError: If a protocol action needs a newer client.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptLogError("log version is not UTF-8", path) from None
    if not text.endswith("\n"):
        raise CorruptLogError("log version is empty or truncated (no final newline)", path)
    # Lines end with "\n" only: str.splitlines() would also split at U+2028, U+0085 and
    # other Unicode line breaks, which are legal raw characters inside JSON strings.
    lines = text.split("\n")[:-1]
    try:
        actions = _decode_compact(text, lines, path)
    except (ValueError, TxnTableError):
        actions = None
    # Anything the quick pass did not accept is decoded line by line, checking each object:
    # the first fault in line order is the one raised.
    return actions if actions is not None else _decode_checked(lines, path)


def _decode_compact(text: str, lines: list[str], path: str | None) -> list[Action] | None:
    """The actions of a version as writers write it (compact JSON, a key at most once per
    object: every writer reads every version, so this is a hot path), or ``None`` where
    that is not proven (whitespace, a key that may appear twice): decode it checked."""
    actions: list[Action] = []
    keys = 0
    for line in lines:
        if not line:
            continue
        obj, end = _PLAIN.raw_decode(line)
        if end != len(line):
            return None
        action, n = _action(obj, path)
        if isinstance(action, Protocol):
            check_protocol(action)
        keys += n
        actions.append(action)
    if not actions or not _keys_unique(text, keys):
        return None
    return actions


def _decode_checked(lines: list[str], path: str | None) -> list[Action]:
    actions: list[Action] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip(JSON_WHITESPACE):
            continue
        try:
            obj = loads_strict(line)
        except ValueError as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise CorruptLogError(f"line {lineno} is not valid JSON ({reason})", path) from None
        action = action_from_dict(obj, path)
        if isinstance(action, Protocol):
            check_protocol(action)
        actions.append(action)
    if not actions:
        raise CorruptLogError("log version holds no actions", path)
    return actions


def check_protocol(protocol: Protocol, write: bool = False) -> None:
    """Raise if this client cannot read (or, with ``write``, write) the table."""
    if protocol.minReaderVersion > READER_VERSION:
        raise UnsupportedProtocolError(
            f"table needs reader version {protocol.minReaderVersion}; "
            f"this client implements {READER_VERSION}"
        )
    if write and protocol.minWriterVersion > WRITER_VERSION:
        raise UnsupportedProtocolError(
            f"table needs writer version {protocol.minWriterVersion}; "
            f"this client implements {WRITER_VERSION}"
        )


T = TypeVar("T")


@dataclass
class CommitPlan(Generic[T]):
    """What a commit attempt writes (``actions``) and returns to its caller (``result``).

    A plan with no actions writes nothing: for example every batch was a duplicate.
    """

    actions: list[Action]
    result: T
    operation: str = "WRITE"
