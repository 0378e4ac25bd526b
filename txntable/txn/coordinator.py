"""The transaction coordinator without a server: one CAS object per transactional id.

``_coordinator/txn/<transactional_id>.json`` holds Kafka's ``TransactionMetadata``; every
state change is a ``put_if_match`` on it, so exactly one of any number of racing clients
wins each transition and a producer whose epoch is behind is refused (fenced) at the CAS.
Producer ids come from a block allocator, ``_coordinator/producer_ids.json``, also by CAS.

Completing a transaction (writing markers to every participant, then the Complete state)
is a function any client can run: the CAS to PrepareCommit/PrepareAbort is the decision,
and markers are idempotent, so a crashed producer's transaction is finished by whoever
notices it first.

A transaction whose data all goes to one log needs none of that: its producer commits data
and markers in one log version (see the producer's one-log commit). The object then only
lists the table (``tables``, once), so that InitProducerId fences it for a new instance.
"""

from __future__ import annotations

import enum
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from txntable import config
from txntable.errors import (
    CorruptLogError,
    InvalidPathError,
    InvalidTxnStateError,
    ObjectNotFoundError,
    PreconditionFailedError,
    ProducerFencedError,
    TableNotFoundError,
    TransientStorageError,
    UnsupportedProtocolError,
)
from txntable.layout import (
    PRODUCER_ID_SHARD_SPAN,
    PRODUCER_ID_SHARDS,
    TXN_DIR,
    producer_ids_key,
    txn_key,
)
from txntable.protocol.actions import loads_strict
from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.storage.base import Store, StoredObject
from txntable.storage.cas import load_object, put_cas
from txntable.table import Table
from txntable.util import now_ms, remaining_ms, shared_pool

TXN_STATE_VERSION = 1
#: The object's format once it lists ``tables``: a client that does not know them would
#: initialise the id without fencing them, so it must refuse the object.
TXN_STATE_TABLES_VERSION = 2
PRODUCER_IDS_VERSION = 1
#: Kafka's producer epochs are int16; the last one is kept for the final abort (KIP-360).
MAX_PRODUCER_EPOCH = 32767


#: Markers of one transaction's participants in flight at once (shared by the process).
MARKER_WRITERS = 16


def _decided(on_decided: Callable[[bool], None] | None, committed: bool) -> None:
    if on_decided is not None:
        on_decided(committed)


def _between_transactions(meta: TxnMetadata) -> bool:
    return meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


def _require_between_transactions(meta: TxnMetadata, what: str) -> None:
    if not _between_transactions(meta):
        raise InvalidTxnStateError(
            f"transactional id {meta.transactional_id}: cannot {what} in state "
            f"{meta.state.value}"
        )


class TxnState(enum.Enum):
    """Coordinator-side transaction states (Kafka's ``TransactionState``)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"


S = TxnState
#: Legal previous states of each state (Kafka's ``TransactionState.validPreviousStates``).
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    # From a complete state only with an intent: an earlier client's short path committed
    # data and markers in one log version per table, deciding before anything was in a log.
    S.PREPARE_COMMIT: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}


@dataclass(frozen=True)
class TxnMetadata:
    """The coordinator object of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    partitions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    txn_start_timestamp: int = -1
    last_update_timestamp: int = 0
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    #: An earlier client's short path only: per table, the segments to commit with the
    #: markers (so any client can finish the transaction from the coordinator object alone).
    intent: dict[str, tuple[PendingBatch, ...]] = field(default_factory=dict)
    #: The tables this id ever committed a one-log transaction to (sorted): InitProducerId
    #: fences each, since such transactions never register with the coordinator.
    tables: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        """Encode the object.

        Every write carries a fresh ``writeId``: two writes never have equal bytes, so an
        etag (an MD5 of the bytes on local disk and S3) never repeats (no ABA for the CAS),
        and reading back an ambiguous write recognises exactly our own bytes.
        """
        body: dict[str, Any] = {"tables": list(self.tables)} if self.tables else {}
        return json.dumps(
            {
                **body,
                "version": TXN_STATE_TABLES_VERSION if self.tables else TXN_STATE_VERSION,
                "transactionalId": self.transactional_id,
                "producerId": self.producer_id,
                "producerEpoch": self.producer_epoch,
                "lastProducerId": self.last_producer_id,
                "lastProducerEpoch": self.last_producer_epoch,
                "state": self.state.value,
                "txnTimeoutMs": self.timeout_ms,
                "partitions": {t: list(ps) for t, ps in sorted(self.partitions.items())},
                "txnStartTimestamp": self.txn_start_timestamp,
                "lastUpdateTimestamp": self.last_update_timestamp,
                "intent": {
                    t: [_pending_to_json(b) for b in batches]
                    for t, batches in sorted(self.intent.items())
                },
                "writeId": uuid.uuid4().hex,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def from_json(data: bytes, path: str) -> TxnMetadata:
        """Decode the object, strictly.

        Raises:
            CorruptLogError: If it is not a valid coordinator object.
            UnsupportedProtocolError: If it was written by a newer protocol version.
        """
        try:
            obj = loads_strict(data)
        except (ValueError, UnicodeDecodeError):
            raise CorruptLogError("coordinator object is not valid JSON", path) from None
        if not isinstance(obj, dict):
            raise CorruptLogError("coordinator object is not a JSON object", path)
        version = _field(obj, "version", int, path)
        if version > TXN_STATE_TABLES_VERSION:
            raise UnsupportedProtocolError(
                f"coordinator object version {version} is newer than "
                f"{TXN_STATE_TABLES_VERSION} ({path})"
            )
        try:
            state = TxnState(_field(obj, "state", str, path))
        except ValueError:
            raise CorruptLogError(f"unknown coordinator state {obj['state']!r}", path) from None
        partitions = _field(obj, "partitions", dict, path)
        intent = obj.get("intent", {})
        if not isinstance(intent, dict):
            raise CorruptLogError("coordinator field intent is not an object", path)
        tables = obj.get("tables", [])
        if not isinstance(tables, list):
            raise CorruptLogError("coordinator field tables is not an array", path)
        try:
            return TxnMetadata(
                transactional_id=_field(obj, "transactionalId", str, path),
                producer_id=_field(obj, "producerId", int, path),
                producer_epoch=_field(obj, "producerEpoch", int, path),
                state=state,
                timeout_ms=_field(obj, "txnTimeoutMs", int, path),
                partitions={
                    str(t): tuple(_checked(p, int, f"partitions.{t}", path) for p in ps)
                    for t, ps in partitions.items()
                },
                txn_start_timestamp=_field(obj, "txnStartTimestamp", int, path),
                last_update_timestamp=_field(obj, "lastUpdateTimestamp", int, path),
                last_producer_id=_field(obj, "lastProducerId", int, path),
                last_producer_epoch=_field(obj, "lastProducerEpoch", int, path),
                intent={
                    str(t): tuple(
                        _pending_from_json(b, path, _field(obj, "transactionalId", str, path))
                        for b in batches
                    )
                    for t, batches in intent.items()
                },
                tables=tuple(sorted({_checked(t, str, "tables", path) for t in tables})),
            )
        except TypeError as e:  # a list where an object belongs, and the like
            raise CorruptLogError(f"invalid coordinator object ({e})", path) from None

    def transition(self, to: TxnState, **changes: Any) -> TxnMetadata:
        """A copy in state ``to``; raises if Kafka's state machine forbids the move.

        Raises:
            InvalidTxnStateError: If ``to`` cannot follow the current state.
        """
        if self.state not in VALID_PREVIOUS_STATES[to]:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id}: cannot move from "
                f"{self.state.value} to {to.value}"
            )
        return replace(self, state=to, last_update_timestamp=now_ms(), **changes)


@dataclass(frozen=True)
class TransactionListing:
    """One transactional id's coordinator object, or why it could not be read."""

    transactional_id: str
    metadata: TxnMetadata | None
    error: str | None = None


_PENDING_FIELDS = {
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


def _checked(value: Any, kind: type, name: str, path: str) -> Any:
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise CorruptLogError(f"coordinator field {name} has invalid value {value!r}", path)
    return value


def _field(obj: dict[str, Any], name: str, kind: type, path: str) -> Any:
    if name not in obj:
        raise CorruptLogError(f"coordinator object misses field {name}", path)
    return _checked(obj[name], kind, name, path)


def _pending_to_json(batch: PendingBatch) -> dict[str, Any]:
    body = asdict(batch)
    return {camel: body[snake] for camel, (snake, _) in _PENDING_FIELDS.items()}


def _pending_from_json(obj: Any, path: str, transactional_id: str) -> PendingBatch:
    if not isinstance(obj, dict):
        raise CorruptLogError("coordinator intent entry is not an object", path)
    values = {
        snake: _field(obj, camel, kind, path) for camel, (snake, kind) in _PENDING_FIELDS.items()
    }
    return PendingBatch(**values, transactional_id=transactional_id)


#: Threads of the process's pool that read producer-id blocks ahead (producers starting
#: together share it; a read still queued when its block is needed is read directly).
ID_BLOCK_READERS = 4


class ProducerIdAllocator:
    """Hands out producer ids from blocks reserved by CAS on one of the producer-id shards.

    A block is reserved on shard ``first_shard`` (0: ids stay small and in order while
    producers start one at a time, as before shards), and after a lost race on another one
    chosen at random: hundreds of producers starting together (a Spark job's tasks) would
    otherwise take one block each from a single object, one CAS per round trip (256 at once:
    14,479 CAS attempts).
    """

    def __init__(
        self,
        store: Store,
        block_size: int = config.PRODUCER_ID_BLOCK_SIZE_DEFAULT,
        shards: int = PRODUCER_ID_SHARDS,
        first_shard: int = 0,
    ):
        self.store = store
        self.block_size = block_size
        self.shards = shards
        self.first_shard = first_shard
        self._next = 0
        self._end = 0
        self._lock = threading.Lock()

    def prefetch(self) -> Future[StoredObject | None] | None:
        """If the next :meth:`allocate` must reserve a block, the read of its first shard's
        object, started now (``None``: ids are left, or the read could not be started).
        A caller that may need an id reads it beside its own read (InitProducerId of a new
        transactional id: one round trip less); a stale read only loses its CAS."""
        with self._lock:
            if self._next < self._end:
                return None
        try:
            return shared_pool("id-blocks", ID_BLOCK_READERS).submit(
                load_object, self.store, producer_ids_key(self.first_shard)
            )
        except RuntimeError:  # the interpreter is shutting down
            return None

    def allocate(self, prefetched: Future[StoredObject | None] | None = None) -> int:
        """A producer id never handed out before in this warehouse (``prefetched``: a
        :meth:`prefetch` to use for the first attempt at a block, if one is needed)."""
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = self._reserve_block(prefetched)
            pid = self._next
            self._next += 1
            return pid

    def _reserve_block(
        self, prefetched: Future[StoredObject | None] | None = None
    ) -> tuple[int, int]:
        shard = self.first_shard
        full: set[int] = set()
        for _ in range(1000):
            key = producer_ids_key(shard)
            first = shard * PRODUCER_ID_SHARD_SPAN
            end = first + PRODUCER_ID_SHARD_SPAN
            read, obj = _prefetched(prefetched if shard == self.first_shard else None)
            prefetched = None
            if not read:
                obj = load_object(self.store, key)
            start = first if obj is None else self._parse(obj.data, key, first)
            if start + self.block_size > end:
                full.add(shard)  # spent (2**40 ids): another shard
                if len(full) == self.shards:
                    break
                shard = random.choice([s for s in range(self.shards) if s not in full])
                continue
            # A fresh writeId makes our bytes unique, so an ambiguous write is recognised.
            body = json.dumps(
                {
                    "version": PRODUCER_IDS_VERSION,
                    "nextBlockStart": start + self.block_size,
                    "writeId": uuid.uuid4().hex,
                },
                separators=(",", ":"),
                sort_keys=True,
            ).encode()
            try:
                put_cas(self.store, key, body, None if obj is None else obj.etag)
                return start, start + self.block_size
            except PreconditionFailedError:
                # Another producer took this shard's block: try another shard (the others
                # taking one now race here; spread, each shard sees a few of them).
                if self.shards > 1:
                    shard = random.choice([s for s in range(self.shards) if s != shard])
                time.sleep(random.uniform(0, 0.01))
            except TransientStorageError:
                pass  # did not land (put_cas read it back): reload and try again
        why = "every shard is spent" if len(full) == self.shards else "after 1000 attempts"
        raise InvalidTxnStateError(f"could not reserve a producer id block: {why}")

    @staticmethod
    def _parse(data: bytes, key: str, first: int) -> int:
        try:
            obj = loads_strict(data)
            version, start = obj["version"], obj["nextBlockStart"]
        except (ValueError, KeyError, TypeError):
            raise CorruptLogError("invalid producer id block", key) from None
        if not isinstance(version, int) or version > PRODUCER_IDS_VERSION:
            raise UnsupportedProtocolError(
                f"producer id block version {version!r} is newer than {PRODUCER_IDS_VERSION}"
            )
        if not isinstance(start, int) or isinstance(start, bool) or not first <= start:
            raise CorruptLogError(f"invalid nextBlockStart {start!r}", key)
        return start


def _prefetched(
    read: Future[StoredObject | None] | None,
) -> tuple[bool, StoredObject | None]:
    """``(True, object or None if there is none)`` if a prefetch read it; ``(False, None)``
    without one, or if it failed (the caller reads the object itself)."""
    if read is None or read.cancel():  # still queued behind other prefetches: read now
        return False, None
    try:
        return True, read.result()
    except (TransientStorageError, OSError):
        return False, None


class TransactionCoordinator:
    """CAS transitions of coordinator objects, and completion of prepared transactions."""

    def __init__(
        self,
        store: Store,
        allocator: ProducerIdAllocator | None = None,
        table_provider: Callable[[str], Table] | None = None,
    ) -> None:
        self.store = store
        self.allocator = allocator or ProducerIdAllocator(store)
        self._table_provider = table_provider
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()
        #: The object (and etag) this client last read or wrote, by transactional id: a
        #: producer's next step puts on it directly instead of reading it first (a round trip
        #: per coordinator step). Only ever the basis of a CAS: an answer that is not a write
        #: (already registered, nothing to end, fenced, not allowed in this state) is read
        #: from storage again before it is given.
        self._known: dict[str, tuple[TxnMetadata, str]] = {}
        #: One step at a time per transactional id from this client (the sender's
        #: AddPartitionsToTxn and the caller's offsets): each then puts on the copy the
        #: other wrote, instead of both putting on one and the loser reading the object.
        self._steps: dict[str, threading.Lock] = {}

    def close(self) -> None:
        """Close the table handles the coordinator opened itself (group offset logs)."""
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            table.close()

    @staticmethod
    def key(transactional_id: str) -> str:
        """Key of the coordinator object of ``transactional_id``."""
        return txn_key(transactional_id)

    def transactional_ids(self) -> Iterator[str]:
        """Every transactional id with a coordinator object (one LIST; maintenance only)."""
        for key in self.store.list(TXN_DIR):
            if key.endswith(".json"):
                yield key[len(TXN_DIR) : -len(".json")]

    def describe_all(self) -> list[TransactionListing]:
        """Every coordinator object (Kafka's ListTransactions + DescribeTransactions).

        A damaged or too new object is listed with its error; the others are still read.
        """
        out = []
        for tid in self.transactional_ids():
            try:
                loaded = self.load(tid)
            except (CorruptLogError, UnsupportedProtocolError, InvalidPathError) as e:
                out.append(TransactionListing(tid, None, f"{type(e).__name__}: {e}"))
                continue
            if loaded is not None:
                out.append(TransactionListing(tid, loaded[0]))
        return out

    def load(self, transactional_id: str) -> tuple[TxnMetadata, str] | None:
        """The current object and its etag, or ``None`` if there is none."""
        key = self.key(transactional_id)
        obj = load_object(self.store, key)
        if obj is None:
            with self._lock:
                self._known.pop(transactional_id, None)
            return None
        meta = TxnMetadata.from_json(obj.data, key)
        with self._lock:
            self._known[transactional_id] = (meta, obj.etag)
        return meta, obj.etag

    def cas(self, meta: TxnMetadata, etag: str | None) -> str:
        """Write ``meta`` if the object still has ``etag`` (``None``: if it does not exist).

        Raises:
            PreconditionFailedError: Another client changed the object first.
            TransientStorageError: The outcome is unknown and the write did not land.
        """
        tid = meta.transactional_id
        try:
            written = put_cas(self.store, self.key(tid), meta.to_json(), etag)
        except BaseException:
            with self._lock:
                self._known.pop(tid, None)
            raise
        with self._lock:
            self._known[tid] = (meta, written)
        return written

    def _table(self, name: str) -> Table:
        if self._table_provider is not None:
            # The producer's handles (its tables and its groups' offset logs): their
            # incremental snapshots, and no race between its appends and these markers.
            return self._table_provider(name)
        with self._lock:
            if name not in self._tables:
                self._tables[name] = Table(self.store, name)
            return self._tables[name]

    def write_markers(
        self, meta: TxnMetadata, marker_type: str, deadline: float | None = None
    ) -> None:
        """Write ``marker_type`` markers for ``meta``'s transaction to every participant.

        One log commit per table covers all its partitions. Markers are skipped where the
        producer has nothing open, so running this twice writes each marker once. Each
        append is retried until ``deadline`` (``time.monotonic()``; default: the table's
        commit timeout).
        """
        assert marker_type in ("COMMIT", "ABORT")

        def write(table_name: str, partitions: tuple[int, ...]) -> None:
            markers = [
                PendingMarker(p, meta.producer_id, meta.producer_epoch, marker_type)  # type: ignore[arg-type]
                for p in partitions
            ]
            # An earlier client's short-path data goes in the same version as its markers; if
            # it was committed already, the sequences make it a duplicate and only missing
            # markers are written.
            batches = list(meta.intent.get(table_name, ())) if marker_type == "COMMIT" else []
            self._table(table_name).append(
                batches,
                markers,
                transactional_id=meta.transactional_id,
                timeout_ms=None if deadline is None else remaining_ms(deadline),
            )

        participants = sorted(meta.partitions.items())
        if len(participants) == 1:
            write(*participants[0])
            return
        # Participants are independent logs: their markers are written at once (a round
        # trip for all, not one per participant), every one attempted; the first error in
        # name order is raised once all ended.
        pool = shared_pool("markers", MARKER_WRITERS)
        writes = [pool.submit(write, name, partitions) for name, partitions in participants]
        for error in [w.exception() for w in writes]:
            if error is not None:
                raise error

    def _next_epoch(self, meta: TxnMetadata) -> dict[str, int]:
        """The producer id and epoch after ``meta``'s epoch, rotating the id when exhausted."""
        if meta.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
            # Epoch exhausted: rotate to a new producer id (Kafka's KIP-360).
            return {"producer_id": self.allocator.allocate(), "producer_epoch": 0}
        return {"producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch + 1}

    def complete(
        self, meta: TxnMetadata, etag: str, deadline: float | None = None
    ) -> tuple[TxnMetadata, str]:
        """Finish a PrepareCommit/PrepareAbort: markers everywhere, then the Complete state.

        The Complete state carries the next epoch (Kafka's KIP-890 bumps the epoch with every
        transaction): the producer continues under it, so a marker of this transaction that
        a slow completer writes late is refused once the next transaction has written, and
        can never close it.

        Raises:
            PreconditionFailedError: Another client completed the transaction first (its CAS
                won, or the table already refuses this epoch because the producer moved on).
        """
        if meta.state is TxnState.PREPARE_COMMIT:
            marker, to = "COMMIT", TxnState.COMPLETE_COMMIT
        elif meta.state is TxnState.PREPARE_ABORT:
            marker, to = "ABORT", TxnState.COMPLETE_ABORT
        else:
            raise InvalidTxnStateError(f"cannot complete a transaction in {meta.state.value}")
        try:
            self.write_markers(meta, marker, deadline)
        except ProducerFencedError as e:
            raise PreconditionFailedError(
                f"transactional id {meta.transactional_id}: transaction already completed and "
                f"superseded ({e})"
            ) from e
        done = meta.transition(
            to,
            partitions={},
            txn_start_timestamp=-1,
            intent={},
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch,
            **self._next_epoch(meta),
        )
        return done, self.cas(done, etag)

    def fence_and_abort(self, meta: TxnMetadata, etag: str) -> tuple[TxnMetadata, str]:
        """Abort an Ongoing transaction with the epoch bumped, fencing its producer."""
        fenced = meta.transition(TxnState.PREPARE_EPOCH_FENCE)
        bumped = replace(fenced, producer_epoch=min(meta.producer_epoch + 1, MAX_PRODUCER_EPOCH))
        prepared = bumped.transition(TxnState.PREPARE_ABORT)
        etag = self.cas(prepared, etag)
        return self.complete(prepared, etag)

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, deadline: float | None = None
    ) -> TxnMetadata:
        """Kafka's InitProducerId: finish or abort what a previous instance left, bump the epoch,
        then fence every table of the id's one-log transactions (``deadline``: for those
        appends, ``time.monotonic()``).

        Returns:
            The new object: producer id, new epoch, and the tables of one-log transactions.

        Raises:
            ProducerFencedError: A newer instance took over while this one was fencing.
        """
        # The producer id a zombie may hold: the object's as first seen, even if completing
        # its transaction below rotates it.
        zombie_pid: int | None = None
        # A new id needs a producer id: its block is read beside the id's object (a wasted
        # read, in parallel, when the id exists; a round trip less when it does not).
        block = self.allocator.prefetch()
        while True:
            loaded = self.load(transactional_id)
            try:
                if loaded is None:
                    meta = TxnMetadata(
                        transactional_id,
                        self.allocator.allocate(block),
                        0,
                        TxnState.EMPTY,
                        timeout_ms,
                        last_update_timestamp=now_ms(),
                    )
                    block = None
                    self.cas(meta, None)
                    return meta
                block = None
                meta, etag = loaded
                if zombie_pid is None:
                    zombie_pid = meta.producer_id
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    self.complete(meta, etag)
                    continue
                if meta.state in (TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE):
                    if meta.state is TxnState.PREPARE_EPOCH_FENCE:
                        meta = replace(meta, state=TxnState.ONGOING)
                    self.fence_and_abort(meta, etag)
                    continue
                if meta.state is TxnState.DEAD:
                    raise InvalidTxnStateError(f"transactional id {transactional_id} is dead")
                new = meta.transition(
                    TxnState.EMPTY,
                    last_producer_id=meta.producer_id,
                    last_producer_epoch=meta.producer_epoch,
                    timeout_ms=timeout_ms,
                    **self._next_epoch(meta),
                )
                self.cas(new, etag)
            except PreconditionFailedError:
                time.sleep(random.uniform(0, 0.01))
                continue
            assert zombie_pid is not None  # set by the load that led here
            self._fence_tables(zombie_pid, new, deadline)
            return new

    def _fence_tables(self, zombie_pid: int, new: TxnMetadata, deadline: float | None) -> None:
        """Write an ABORT marker of the new epoch to every table of ``new.tables``.

        The epoch is new to each log, so the marker is written and the table refuses every
        batch and marker of an older epoch from then on: a zombie's one-log commit (never
        registered per transaction, so not stopped by the coordinator) lands before the
        fence or not at all. After a rotation, the old id is fenced at the last epoch.
        """
        if new.producer_id == zombie_pid:
            pid, epoch = new.producer_id, new.producer_epoch
        else:
            pid, epoch = zombie_pid, MAX_PRODUCER_EPOCH
        fence = [PendingMarker(0, pid, epoch, "ABORT")]
        for name in new.tables:
            try:
                table = self._table(name)
                table.append(
                    [],
                    fence,
                    transactional_id=new.transactional_id,
                    timeout_ms=None if deadline is None else remaining_ms(deadline),
                )
            except (TableNotFoundError, ObjectNotFoundError):
                continue  # dropped: nothing of it is left to protect

    def register_table(
        self, transactional_id: str, pid: int, epoch: int, table: str
    ) -> TxnMetadata:
        """Add ``table`` to the object's ``tables`` before the id's first one-log commit to
        it, so that every later InitProducerId fences it.

        Raises:
            ProducerFencedError: The object belongs to a newer epoch or another producer.
            InvalidTxnStateError: The object is in a transaction.
        """
        known = True
        while True:
            meta, etag, known = self._load_checked(transactional_id, pid, epoch, known=known)
            if known and (table in meta.tables or not _between_transactions(meta)):
                known = False  # an answer without a write: as stored
                continue
            if table in meta.tables:
                return meta
            _require_between_transactions(meta, "register a table")
            new = replace(
                meta,
                tables=tuple(sorted({*meta.tables, table})),
                last_update_timestamp=now_ms(),
            )
            try:
                self.cas(new, etag)
                return new
            except PreconditionFailedError:
                known = False
                continue

    def bump_epoch(self, transactional_id: str, pid: int, epoch: int) -> TxnMetadata:
        """Move the producer to its next epoch between transactions (KIP-360), after a
        one-log append was refused: its next transaction starts at sequence 0.

        Raises:
            ProducerFencedError: The object belongs to a newer epoch or another producer.
            InvalidTxnStateError: The object is in a transaction.
        """
        while True:
            meta, etag, _ = self._load_checked(transactional_id, pid, epoch)
            _require_between_transactions(meta, "bump the epoch")
            new = meta.transition(
                TxnState.EMPTY,
                last_producer_id=meta.producer_id,
                last_producer_epoch=meta.producer_epoch,
                **self._next_epoch(meta),
            )
            try:
                self.cas(new, etag)
                return new
            except PreconditionFailedError:
                continue

    @staticmethod
    def completed_for(meta: TxnMetadata, pid: int, epoch: int) -> bool:
        """Whether ``meta`` is the Complete state of the transaction ``pid``/``epoch`` ran."""
        return (
            meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
            and meta.last_producer_id == pid
            and meta.last_producer_epoch == epoch
        )

    def _load_checked(
        self,
        transactional_id: str,
        pid: int,
        epoch: int,
        allow_completed: bool = False,
        known: bool = False,
    ) -> tuple[TxnMetadata, str, bool]:
        """The object if it belongs to ``pid``/``epoch`` (``allow_completed``: or is the
        completed state of their transaction), its etag, and whether it is this client's
        last known copy (``known``: may be; it is used only if it passes the checks).

        Raises:
            ProducerFencedError, InvalidTxnStateError: As read from storage.
        """
        if known:
            with self._lock:
                cached = self._known.get(transactional_id)
            if cached is not None:
                meta, etag = cached
                if (allow_completed and self.completed_for(meta, pid, epoch)) or (
                    meta.producer_id == pid and meta.producer_epoch == epoch
                ):
                    return meta, etag, True
        meta, etag = self._load_fresh(transactional_id, pid, epoch, allow_completed)
        return meta, etag, False

    def _load_fresh(
        self, transactional_id: str, pid: int, epoch: int, allow_completed: bool
    ) -> tuple[TxnMetadata, str]:
        loaded = self.load(transactional_id)
        if loaded is None:
            raise InvalidTxnStateError(f"transactional id {transactional_id} is not initialised")
        meta, etag = loaded
        if allow_completed and self.completed_for(meta, pid, epoch):
            return meta, etag
        if meta.producer_id != pid or meta.producer_epoch != epoch:
            raise ProducerFencedError(
                f"transactional id {transactional_id}: producer {pid} epoch {epoch} is fenced "
                f"by producer {meta.producer_id} epoch {meta.producer_epoch}"
            )
        return meta, etag

    def _step(self, transactional_id: str) -> threading.Lock:
        with self._lock:
            return self._steps.setdefault(transactional_id, threading.Lock())

    def add_partitions(
        self, transactional_id: str, pid: int, epoch: int, partitions: dict[str, set[int]]
    ) -> None:
        """Kafka's AddPartitionsToTxn: register participants before their data is committed.

        Raises:
            ProducerFencedError: The object belongs to a newer epoch or another producer.
        """
        with self._step(transactional_id):
            self._add_partitions(transactional_id, pid, epoch, partitions)

    def _add_partitions(
        self, transactional_id: str, pid: int, epoch: int, partitions: dict[str, set[int]]
    ) -> None:
        known = True
        while True:
            meta, etag, known = self._load_checked(transactional_id, pid, epoch, known=known)
            merged = {t: set(ps) for t, ps in meta.partitions.items()}
            for t, ps in partitions.items():
                merged.setdefault(t, set()).update(ps)
            added = meta.state is TxnState.ONGOING and all(
                set(ps) <= set(meta.partitions.get(t, ())) for t, ps in partitions.items()
            )
            if known and (added or meta.state not in VALID_PREVIOUS_STATES[TxnState.ONGOING]):
                known = False  # an answer without a write (or a refusal): as stored
                continue
            if added:
                return
            start = meta.txn_start_timestamp if meta.state is TxnState.ONGOING else now_ms()
            new = meta.transition(
                TxnState.ONGOING,
                partitions={t: tuple(sorted(ps)) for t, ps in merged.items()},
                txn_start_timestamp=start,
            )
            try:
                self.cas(new, etag)
                return
            except PreconditionFailedError:
                known = False
                continue

    def end_transaction(
        self,
        transactional_id: str,
        pid: int,
        epoch: int,
        commit: bool,
        deadline: float | None = None,
        on_decided: Callable[[bool], None] | None = None,
    ) -> tuple[int, int]:
        """Kafka's EndTxn: CAS to Prepare*, write markers, CAS to Complete*.

        ``on_decided(committed)`` is called once the decision is known to be made (the
        Prepare CAS landed, or an earlier attempt's decision was found), before the markers;
        they are retried until ``deadline``.

        Returns:
            The producer id and epoch the producer continues with (the epoch is bumped by
            every completed transaction).

        Raises:
            ProducerFencedError: The producer was fenced.
            InvalidTxnStateError: The transaction ended the other way: aborted by the
                coordinator (a timeout) when committing, or already decided to commit (an
                earlier attempt whose outcome was unknown) when aborting.
        """
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        known = True
        while True:
            meta, etag, known = self._load_checked(
                transactional_id, pid, epoch, allow_completed=True, known=known
            )
            if known and meta.state is not TxnState.ONGOING:
                known = False  # only an Ongoing transaction is prepared on a known copy
                continue
            if self.completed_for(meta, pid, epoch):
                committed = meta.state is TxnState.COMPLETE_COMMIT
                _decided(on_decided, committed)
                if committed != commit:
                    raise InvalidTxnStateError(
                        f"transactional id {transactional_id}: the transaction was "
                        f"{'committed' if committed else 'aborted'} (state {meta.state.value})"
                    )
                return meta.producer_id, meta.producer_epoch
            if meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                return pid, epoch  # nothing was registered: an empty transaction
            try:
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    # Our own earlier attempt (outcome unknown) made a decision: finish it;
                    # the completed state then tells which way it went.
                    _decided(on_decided, meta.state is TxnState.PREPARE_COMMIT)
                    self.complete(meta, etag, deadline=deadline)
                    continue
                prepared = meta.transition(target)
                etag = self.cas(prepared, etag)
                known = False
                _decided(on_decided, commit)
                done, _ = self.complete(prepared, etag, deadline=deadline)
                return done.producer_id, done.producer_epoch
            except PreconditionFailedError:
                known = False
                continue  # another client moved it first: reload and confirm
