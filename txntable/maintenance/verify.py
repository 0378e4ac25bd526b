"""Checking a log against the invariants of the spec (``Table.verify``, ``txntable verify``).

Replay (:mod:`txntable.protocol.snapshot`) stops at the first inconsistency and, by design, does not
re-check what the spec leaves to writers. :class:`LogChecker` replays the same actions with the
same rules (it drives :func:`~txntable.protocol.snapshot.apply_action`), but first checks each
action
against everything the spec requires — offsets dense and continuing, sequences and epochs
monotonic, markers closing open transactions, every ABORT marker followed by its exact
aborted-index entry, one ``commitInfo`` last in every version, … — and where replay would
stop it records a :class:`Violation` and goes on, so one run lists every problem.

Everything here is a pure function of actions, snapshots and bytes, except
:func:`verify_log`, the driver, which reads the log (one LIST, every version, every
checkpoint) and the segments.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

import pyarrow.compute as pc

from txntable.errors import (
    CorruptLogError,
    InvalidProducerEpochError,
    ObjectNotFoundError,
    OutOfOrderSequenceError,
    SchemaMismatchError,
    TxnTableError,
)
from txntable.layout import data_dir, segment_created_ms, segment_dirs
from txntable.protocol.actions import (
    AbortedTxn,
    Action,
    AppTxn,
    Batch,
    CommitInfo,
    ExpireProducer,
    LogStart,
    Marker,
    Metadata,
    OffsetCommit,
    PartitionStart,
    ProducerSnapshot,
    Segment,
    decode_actions,
)
from txntable.protocol.producer_state import check_batch
from txntable.protocol.records import merged_offsets
from txntable.protocol.schema import TypedLayout, layout_of
from txntable.protocol.snapshot import PartitionState, TableSnapshot, apply_action
from txntable.protocol.typed import decode_typed
from txntable.txn.coordinator import TransactionCoordinator, TxnMetadata, TxnState

if TYPE_CHECKING:
    from txntable.log.log import Log, LogListing

Severity = Literal["error", "warning"]
T = TypeVar("T")
R = TypeVar("R")

#: Every rule the checker knows: code → (severity, what it means). Errors break a guarantee
#: of the spec (a MUST); warnings are departures from a SHOULD, or harmless oddities.
RULES: dict[str, tuple[Severity, str]] = {
    "log.missing-version": ("error", "log versions are contiguous from 0"),
    "log.corrupt-version": ("error", "every version decodes strictly"),
    "log.no-metadata": ("error", "version 0 holds protocol and metadata"),
    "log.inconsistent": ("error", "replay accepts every version"),
    "commit-info.missing": ("error", "every version ends with exactly one commitInfo"),
    "commit-info.duplicate-id": ("error", "commitId is unique per commit"),
    "commit-info.malformed-id": ("warning", "commitId is 32 lowercase hex digits"),
    "partition.unknown": ("error", "actions name partitions of the table"),
    "metadata.partitions-shrink": ("error", "the partition count never shrinks"),
    "metadata.identity-changed": ("warning", "tableId and name stay as created"),
    "offsets.gap": ("error", "offsets are dense: an entry starts at the log end offset"),
    "offsets.overlap": ("error", "offsets never overlap"),
    "batch.path": ("error", "a batch's segment lies under <table>/data/<partition>/"),
    "batch.path-reused": ("error", "a segment belongs to one batch only"),
    "batch.size": ("error", "a batch's size is not negative"),
    "batch.timestamps": ("error", "minTimestamp <= maxTimestamp"),
    "batch.transactional-without-producer": ("error", "a transactional batch has a producer"),
    "batch.transactional-id": ("warning", "transactionalId is set on transactional batches only"),
    "append.two-batches": ("error", "one batch per partition and producer in a version"),
    "producer.duplicate": ("error", "a duplicate batch is never written twice"),
    "producer.sequence": ("error", "sequences continue within an epoch, from 0 in a new one"),
    "producer.fenced-epoch": ("error", "epochs never go back (table-wide, per producer)"),
    "txn.not-closed": ("error", "a transaction is closed before the next epoch writes"),
    "txn.first-offset": ("error", "an open transaction starts at a transactional batch"),
    "marker.no-open-transaction": ("error", "a marker closes a transaction"),
    "aborted.missing": ("error", "every ABORT marker is followed by its abortedTxn"),
    "aborted.mismatch": ("error", "an abortedTxn spans exactly its transaction"),
    "aborted.orphan": ("error", "an abortedTxn follows the ABORT marker it indexes"),
    "aborted.order": ("error", "aborted entries' lastOffset is non-decreasing"),
    "aborted.last-stable-offset": ("warning", "abortedTxn.lastStableOffset as in Kafka"),
    "log-start.above-high-watermark": ("error", "the log start offset never passes the HW"),
    "log-start.no-op": ("warning", "a logStart moves the log start offset forward"),
    "lso.above-high-watermark": ("error", "LSO <= HW"),
    "lso.below-log-start": ("warning", "LSO >= log start offset (as Kafka)"),
    "offset-commit.in-table": ("error", "offsetCommit actions live in group logs only"),
    "group.batch": ("error", "a group log holds no batches"),
    "app-txn.not-increasing": ("error", "an appTxn version increases per appId"),
    "checkpoint.mismatch": ("error", "a checkpoint replays to the state of its version"),
    "checkpoint.corrupt": ("warning", "a checkpoint decodes (a damaged one is skipped)"),
    "checkpoint.hint": ("warning", "_last_checkpoint names an existing checkpoint"),
    "segment.missing": ("error", "every referenced segment exists"),
    "segment.corrupt": ("error", "a segment is readable Parquet"),
    "segment.mismatch": ("error", "a segment casts to the record schema and has count rows"),
    "segment.size": ("error", "a batch's size is its segment's size in bytes"),
    "segment.timestamps": ("error", "a batch's min/max timestamps are its records'"),
    "merge.above-lso": ("error", "a merged segment never reaches past the LSO"),
    "merge.range": ("error", "a merged segment replaces whole retained entries"),
    "merge.path": ("error", "a merged segment's file lies under <table>/data/<partition>/"),
    "merge.offsets": ("error", "a merged segment's offsets increase inside its range"),
    "expire.open-transaction": ("error", "an expired producer has nothing open"),
    "checkpoint.only": ("error", "partitionStart and producerState appear in checkpoints only"),
    "txn.marker-missing": (
        "error",
        "a transaction its coordinator has moved past has its marker in the log",
    ),
    "segment.after-tip": (
        "warning",
        "no unreferenced segment is newer than the newest version",
    ),
}

_COMMIT_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Violation:
    """One broken invariant, located as precisely as the check can."""

    rule: str
    message: str
    version: int | None = None
    partition: int | None = None
    offset: int | None = None
    path: str | None = None

    @property
    def severity(self) -> Severity:
        """``error`` (a MUST of the spec is broken) or ``warning``."""
        return RULES[self.rule][0]


@dataclass
class VerifyReport:
    """What :func:`verify_log` found."""

    name: str
    #: Last version checked (-1 if none could be).
    version: int = -1
    #: First version replayed: 0, or the checkpoint a truncated log starts from.
    start_version: int = 0
    versions_checked: int = 0
    checkpoints_checked: int = 0
    segments_checked: int = 0
    errors: list[Violation] = field(default_factory=list)
    warnings: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No error (warnings allowed)."""
        return not self.errors

    def add(self, violations: Iterable[Violation]) -> None:
        """File violations under errors or warnings by their rule's severity."""
        for v in violations:
            (self.errors if v.severity == "error" else self.warnings).append(v)


@dataclass
class _PendingAbort:
    """The abortedTxn an ABORT marker must be followed by."""

    partition: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class LogChecker:
    """Replays versions in order, checking every action first; collects violations.

    Args:
        name: The log's root (a table name or ``_groups/<group>``), for segment paths.
        group_log: Check the rules of a consumer-group log instead of a table's.
    """

    def __init__(self, name: str, group_log: bool = False) -> None:
        self.name = name
        self.group_log = group_log
        self.snapshot = TableSnapshot()
        self.violations: list[Violation] = []
        self._commit_ids: dict[str, int] = {}
        self._paths: dict[str, int] = {}
        # Per version:
        self._version = -1
        self._leo_before: dict[int, int] = {}
        self._batch_keys: set[tuple[int, int]] = set()
        self._pending_abort: _PendingAbort | None = None
        self._epochs_before: dict[int, int] = {}

    # --- entry points ------------------------------------------------------------------------

    def start_from_checkpoint(self, snapshot: TableSnapshot) -> None:
        """Start from a checkpoint's state (a log whose older versions are gone: truncated by
        log cleanup, or never there)."""
        self.snapshot = snapshot
        for part in self.snapshot.partitions:
            for e in part.entries:
                if not isinstance(e, Marker) and e.path:
                    self._paths[e.path] = snapshot.version

    @property
    def referenced_paths(self) -> set[str]:
        """Every segment file a version (or the starting checkpoint) has referenced."""
        return set(self._paths)

    def skip_to(self, version: int, reason: str, rule: str = "log.missing-version") -> None:
        """Record that versions up to ``version`` cannot be applied, and move past them.

        The checks go on against the state before them, so what follows may report
        consequences of the skipped versions too.
        """
        self._report(rule, reason, version=version)
        self.snapshot.version = version

    def apply_version(self, version: int, actions: list[Action]) -> None:
        """Check and apply one decoded version (``version`` follows the last one applied)."""
        self._version = version
        self._leo_before = {}
        self._batch_keys = set()
        self._pending_abort = None
        self._epochs_before = {}
        self._check_commit_info(actions)
        for action in actions:
            if self._pending_abort is not None and not isinstance(action, AbortedTxn):
                self._missing_abort()
            self._check_and_apply(action)
        if self._pending_abort is not None:
            self._missing_abort()
        if self.snapshot.protocol is None or self.snapshot.metadata is None:
            self._report("log.no-metadata", "no protocol or metadata action by this version")
        self.snapshot.version = version

    def finish(self) -> list[Violation]:
        """Final checks on the replayed state; returns every violation found."""
        for part in self.snapshot.partitions:
            p = part.partition
            lso, hw = part.last_stable_offset, part.high_watermark
            if lso > hw:
                self._report("lso.above-high-watermark", f"LSO {lso} > HW {hw}", at=(p, None))
            if lso < part.log_start_offset:
                self._report(
                    "lso.below-log-start",
                    f"LSO {lso} is below the log start offset {part.log_start_offset} "
                    "(a transaction open across delete-records)",
                    at=(p, None),
                )
            for pid, first in sorted(part.ongoing.items()):
                entry = part.entry_at(first)
                if not (
                    isinstance(entry, Batch) and entry.transactional and entry.producerId == pid
                ):
                    self._report(
                        "txn.first-offset",
                        f"producer {pid}'s open transaction starts at {first}, which holds no "
                        "transactional batch of it",
                        at=(p, first),
                    )
        return self.violations

    # --- helpers ------------------------------------------------------------------------------

    def _report(
        self,
        rule: str,
        message: str,
        at: tuple[int | None, int | None] = (None, None),
        version: int | None = None,
        path: str | None = None,
    ) -> None:
        """Record a violation ``at`` (partition, offset) of the current version."""
        assert rule in RULES, rule
        v = self._version if version is None else version
        self.violations.append(Violation(rule, message, v, at[0], at[1], path))

    def _partition(self, p: int) -> PartitionState | None:
        parts = self.snapshot.partitions
        if 0 <= p < len(parts):
            self._leo_before.setdefault(p, parts[p].log_end_offset)
            return parts[p]
        self._report("partition.unknown", f"partition {p} outside [0, {len(parts)})", at=(p, None))
        return None

    def _table_epoch(self, pid: int) -> int:
        """The producer's highest epoch in the log before this version (the writer rules are
        evaluated against version N - 1: a version's own markers do not fence each other)."""
        if pid not in self._epochs_before:
            self._epochs_before[pid] = self.snapshot.producer_epochs.get(pid, -1)
        return self._epochs_before[pid]

    def _place(self, part: PartitionState, entry: Batch | Marker) -> bool:
        """Check the entry continues its partition; resynchronise after a gap."""
        leo = part.log_end_offset
        kind = "marker" if isinstance(entry, Marker) else "batch"
        if entry.baseOffset > leo:
            self._report(
                "offsets.gap",
                f"{kind} at offset {entry.baseOffset}, log end offset is {leo}: offsets "
                f"{leo}..{entry.baseOffset - 1} are missing",
                at=(part.partition, entry.baseOffset),
            )
            part.log_end_offset = entry.baseOffset  # check the rest as if the gap were meant
            return True
        if entry.baseOffset < leo:
            self._report(
                "offsets.overlap",
                f"{kind} at offset {entry.baseOffset} overlaps the log, whose end offset is "
                f"{leo}; not applied",
                at=(part.partition, entry.baseOffset),
            )
            return False
        return True

    def _missing_abort(self) -> None:
        pa = self._pending_abort
        assert pa is not None
        self._pending_abort = None
        self._report(
            "aborted.missing",
            f"ABORT marker of producer {pa.producer_id} at {pa.last_offset} is not followed by "
            "its abortedTxn entry: read_committed readers would return the aborted data",
            at=(pa.partition, pa.last_offset),
        )

    def _check_commit_info(self, actions: list[Action]) -> None:
        infos = [i for i, a in enumerate(actions) if isinstance(a, CommitInfo)]
        if len(infos) != 1 or infos[0] != len(actions) - 1:
            self._report(
                "commit-info.missing",
                f"{len(infos)} commitInfo action(s), "
                + ("not last" if infos and infos[-1] != len(actions) - 1 else "expected 1, last"),
            )
        for i in infos:
            info = actions[i]
            assert isinstance(info, CommitInfo)
            if not _COMMIT_ID.fullmatch(info.commitId):
                self._report("commit-info.malformed-id", f"commitId {info.commitId!r}")
            elif info.commitId in self._commit_ids:
                self._report(
                    "commit-info.duplicate-id",
                    f"commitId {info.commitId} already used by version "
                    f"{self._commit_ids[info.commitId]}",
                )
            else:
                self._commit_ids[info.commitId] = self._version

    def _apply(self, action: Action) -> None:
        try:
            apply_action(self.snapshot, action)
        except CorruptLogError as e:  # a case the checks above did not foresee
            self._report("log.inconsistent", str(e))

    # --- per action ---------------------------------------------------------------------------

    def _check_and_apply(self, action: Action) -> None:
        if isinstance(action, Batch):
            self._batch(action)
        elif isinstance(action, Marker):
            self._marker(action)
        elif isinstance(action, AbortedTxn):
            self._aborted(action)
        elif isinstance(action, LogStart):
            self._log_start(action)
        elif isinstance(action, Metadata):
            self._metadata(action)
        elif isinstance(action, Segment):
            self._segment(action)
        elif isinstance(action, ExpireProducer):
            pid = action.producerId
            open_on = [p.partition for p in self.snapshot.partitions if pid in p.ongoing]
            if open_on or pid in self.snapshot.pending_offsets:
                self._report(
                    "expire.open-transaction",
                    f"producer {pid} expired with a transaction open (partitions {open_on}) or "
                    "offset commits pending; not applied",
                )
                return
            self._apply(action)
        elif isinstance(action, PartitionStart | ProducerSnapshot):
            self._report("checkpoint.only", f"{action.NAME} in a log version; not applied")
        elif isinstance(action, AppTxn):
            prev = self.snapshot.app_txns.get(action.appId)
            if prev is not None and action.version <= prev.version:
                self._report(
                    "app-txn.not-increasing",
                    f"appTxn {action.appId} version {action.version} after {prev.version}",
                )
            self._apply(action)
        elif isinstance(action, OffsetCommit):
            if not self.group_log:
                self._report("offset-commit.in-table", f"offsetCommit of group {action.group}")
            if action.producerId >= 0:
                self._table_epoch(action.producerId)  # before this commit raises it
            self._apply(action)
        else:  # protocol, commitInfo: nothing to check beyond decoding
            self._apply(action)

    def _segment(self, seg: Segment) -> None:
        part = self._partition(seg.partition)
        if part is None:
            return
        loc = (seg.partition, seg.baseOffset)
        if seg.endOffset > part.last_stable_offset:
            self._report(
                "merge.above-lso",
                f"segment [{seg.baseOffset}, {seg.endOffset}) reaches past the LSO "
                f"{part.last_stable_offset}; not applied",
                at=loc,
            )
            return
        covered = list(part.entries_between(seg.baseOffset, seg.endOffset))
        if (
            not covered
            or covered[0].baseOffset != seg.baseOffset
            or covered[-1].next_offset != seg.endOffset
        ):
            self._report(
                "merge.range",
                f"segment [{seg.baseOffset}, {seg.endOffset}) does not cover whole retained "
                "entries; not applied",
                at=loc,
            )
            return
        if seg.path:
            if not in_segment_dir(self.name, seg.partition, seg.path):
                prefix = data_dir(self.name, seg.partition)
                self._report("merge.path", f"segment {seg.path} is not under {prefix}", at=loc)
            if seg.path in self._paths:
                self._report(
                    "batch.path-reused",
                    f"segment {seg.path} is already used by version {self._paths[seg.path]}",
                    path=seg.path,
                    at=loc,
                )
            self._paths.setdefault(seg.path, self._version)
        self._apply(seg)

    def _metadata(self, action: Metadata) -> None:
        old = self.snapshot.metadata
        if old is not None and action.partitions < old.partitions:
            self._report(
                "metadata.partitions-shrink",
                f"partitions {old.partitions} -> {action.partitions}; not applied",
            )
            return
        if old is not None and (old.tableId, old.name) != (action.tableId, action.name):
            self._report(
                "metadata.identity-changed",
                f"table {old.name} ({old.tableId}) became {action.name} ({action.tableId})",
            )
        self._apply(action)

    def _batch(self, b: Batch) -> None:
        p = b.partition
        part = self._partition(p)
        if part is None or not self._place(part, b):
            return
        if self.group_log:
            self._report("group.batch", "a batch in a group log", at=(p, b.baseOffset))
            self._apply(b)
            return
        loc = (p, b.baseOffset)
        if not in_segment_dir(self.name, p, b.path):
            prefix = data_dir(self.name, p)
            self._report("batch.path", f"segment {b.path} is not under {prefix}", at=loc)
        if b.path in self._paths:
            self._report(
                "batch.path-reused",
                f"segment {b.path} is already the batch of version {self._paths[b.path]}",
                path=b.path,
                at=loc,
            )
        self._paths.setdefault(b.path, self._version)
        if b.size < 0:
            self._report("batch.size", f"size {b.size}", at=loc)
        if b.minTimestamp > b.maxTimestamp:
            self._report("batch.timestamps", f"{b.minTimestamp} > {b.maxTimestamp}", at=loc)
        if b.transactional and b.producerId < 0:
            self._report(
                "batch.transactional-without-producer",
                "a transactional batch without producer id: no marker can ever close it",
                at=loc,
            )
        if b.transactional != (b.transactionalId is not None):
            self._report(
                "batch.transactional-id",
                f"transactional={b.transactional}, transactionalId={b.transactionalId!r}",
                at=loc,
            )
        if b.producerId >= 0:
            self._producer_batch(part, b)
        self._apply(b)

    def _producer_batch(self, part: PartitionState, b: Batch) -> None:
        pid, p = b.producerId, part.partition
        loc = (p, b.baseOffset)
        if (p, pid) in self._batch_keys:
            self._report(
                "append.two-batches", f"producer {pid} has two batches in one version", at=loc
            )
        self._batch_keys.add((p, pid))
        entry = part.producers.get(pid)
        try:
            dup = check_batch(
                entry,
                self._table_epoch(pid),
                pid,
                b.producerEpoch,
                b.baseSequence,
                b.last_sequence,
                p,
            )
        except InvalidProducerEpochError as e:
            self._report("producer.fenced-epoch", str(e), at=loc)
        except OutOfOrderSequenceError as e:
            self._report("producer.sequence", str(e), at=loc)
        else:
            if dup is not None:
                self._report(
                    "producer.duplicate",
                    f"producer {pid} epoch {b.producerEpoch} sequences {b.baseSequence}.."
                    f"{b.last_sequence} were already written at offset {dup.base_offset}",
                    at=loc,
                )
        if (
            b.transactional
            and pid in part.ongoing
            and entry is not None
            and b.producerEpoch > entry.epoch
        ):
            self._report(
                "txn.not-closed",
                f"producer {pid} writes at epoch {b.producerEpoch} while its transaction of "
                f"epoch {entry.epoch} from offset {part.ongoing[pid]} is still open",
                at=loc,
            )

    def _marker(self, m: Marker) -> None:
        part = self._partition(m.partition)
        if part is None or not self._place(part, m):
            return
        pid, p = m.producerId, m.partition
        loc = (p, m.offset)
        table_epoch = self._table_epoch(pid)
        if m.producerEpoch < table_epoch:
            self._report(
                "producer.fenced-epoch",
                f"{m.type} marker of producer {pid} at epoch {m.producerEpoch}, the log has "
                f"seen epoch {table_epoch}",
                at=loc,
            )
        if pid in part.ongoing:  # (a) an open transaction
            first = part.ongoing[pid]
        elif pid in self.snapshot.pending_offsets:  # (b) pending offset commits
            first = self._leo_before[p]
        elif m.producerEpoch > 0 and m.producerEpoch > table_epoch:  # (c) a new epoch
            first = m.offset
        else:
            self._report(
                "marker.no-open-transaction",
                f"{m.type} marker of producer {pid} epoch {m.producerEpoch}: nothing is open",
                at=loc,
            )
            first = m.offset
        if m.type == "ABORT":
            others = [f for q, f in part.ongoing.items() if q != pid]
            self._pending_abort = _PendingAbort(
                p, pid, first, m.offset, min(others, default=m.offset + 1)
            )
        self._apply(m)

    def _aborted(self, a: AbortedTxn) -> None:
        pending, self._pending_abort = self._pending_abort, None
        part = self._partition(a.partition)
        if part is None:
            return
        loc = (a.partition, a.lastOffset)
        if pending is None:
            self._report(
                "aborted.orphan",
                f"abortedTxn of producer {a.producerId} {a.firstOffset}..{a.lastOffset} does not "
                "follow its ABORT marker",
                at=loc,
            )
        elif (pending.partition, pending.producer_id, pending.first_offset) != (
            a.partition,
            a.producerId,
            a.firstOffset,
        ) or (pending.last_offset != a.lastOffset):
            self._report(
                "aborted.mismatch",
                f"abortedTxn says producer {a.producerId} {a.firstOffset}..{a.lastOffset} on "
                f"partition {a.partition}; its ABORT marker closes producer "
                f"{pending.producer_id} {pending.first_offset}..{pending.last_offset} on "
                f"partition {pending.partition}",
                at=loc,
            )
        elif a.lastStableOffset != pending.last_stable_offset:
            self._report(
                "aborted.last-stable-offset",
                f"lastStableOffset {a.lastStableOffset}, expected {pending.last_stable_offset}",
                at=loc,
            )
        if part.aborted_last_offsets and a.lastOffset < part.aborted_last_offsets[-1]:
            self._report(
                "aborted.order",
                f"lastOffset {a.lastOffset} after {part.aborted_last_offsets[-1]}; not applied",
                at=loc,
            )
            return
        self._apply(a)

    def _log_start(self, ls: LogStart) -> None:
        part = self._partition(ls.partition)
        if part is None:
            return
        loc = (ls.partition, ls.offset)
        if ls.offset > part.high_watermark:
            self._report(
                "log-start.above-high-watermark",
                f"logStart {ls.offset} above the high watermark {part.high_watermark}",
                at=loc,
            )
        elif ls.offset <= part.log_start_offset:
            self._report(
                "log-start.no-op",
                f"logStart {ls.offset} at or below the log start offset {part.log_start_offset}",
                at=loc,
            )
        self._apply(ls)


def compare_snapshots(version: int, expected: TableSnapshot, got: TableSnapshot) -> list[Violation]:
    """Differences between the replayed state at ``version`` and a checkpoint's (pure)."""
    out: list[Violation] = []

    def differ(what: str, partition: int | None = None) -> None:
        out.append(
            Violation(
                "checkpoint.mismatch",
                f"checkpoint at version {version}: {what} differs from the log's replay",
                version,
                partition,
            )
        )

    for name in ("protocol", "metadata", "producer_epochs", "app_txns", "offsets"):
        if getattr(expected, name) != getattr(got, name):
            differ(name)
    # A committed transactional offset is written to checkpoints as a plain one.
    if expected.pending_offsets != got.pending_offsets:
        differ("pending_offsets")
    if len(expected.partitions) != len(got.partitions):
        differ("partition count")
    for exp, cp in zip(expected.partitions, got.partitions, strict=False):
        for f in dataclasses.fields(PartitionState):
            if f.compare and getattr(exp, f.name) != getattr(cp, f.name):
                differ(f.name.replace("_", " "), exp.partition)
    return out


def check_segment(
    batch: Batch, data: bytes | None, layout: TypedLayout | None = None
) -> list[Violation]:
    """Check a segment's bytes (``None``: the object is missing) against its batch (pure);
    a typed table's (``layout``) against its schema."""

    def found(rule: str, message: str) -> Violation:
        return Violation(rule, message, None, batch.partition, batch.baseOffset, batch.path)

    if data is None:
        return [found("segment.missing", f"segment {batch.path} is missing")]
    out: list[Violation] = []
    if len(data) != batch.size:
        out.append(found("segment.size", f"{len(data)} bytes, its batch says {batch.size}"))
    try:
        table = decode_typed(data, batch.path, batch.count, False, layout)
    except CorruptLogError as e:
        return [*out, found("segment.corrupt", str(e))]
    except SchemaMismatchError as e:
        return [*out, found("segment.mismatch", str(e))]
    stamps = pc.min_max(table.column("timestamp").cast("int64"))
    lo, hi = stamps["min"].as_py(), stamps["max"].as_py()
    if (lo, hi) != (batch.minTimestamp, batch.maxTimestamp):
        out.append(
            found(
                "segment.timestamps",
                f"records span timestamps {lo}..{hi}, its batch says "
                f"{batch.minTimestamp}..{batch.maxTimestamp}",
            )
        )
    return out


def check_merged_segment(
    seg: Segment, data: bytes | None, layout: TypedLayout | None = None
) -> list[Violation]:
    """Check a merged segment's bytes against its ``segment`` action (pure)."""

    def found(rule: str, message: str) -> Violation:
        return Violation(rule, message, None, seg.partition, seg.baseOffset, seg.path)

    if data is None:
        return [found("segment.missing", f"segment {seg.path} is missing")]
    out: list[Violation] = []
    if len(data) != seg.size:
        out.append(found("segment.size", f"{len(data)} bytes, its action says {seg.size}"))
    try:
        table = decode_typed(data, seg.path, seg.count, True, layout)
    except CorruptLogError as e:
        return [*out, found("segment.corrupt", str(e))]
    except SchemaMismatchError as e:
        return [*out, found("segment.mismatch", str(e))]
    try:
        merged_offsets(table, seg.path, seg.baseOffset, seg.endOffset)  # what readers check
    except SchemaMismatchError as e:
        out.append(found("merge.offsets", str(e)))
    return out


# --- the driver: the only I/O ------------------------------------------------------------------

#: Concurrent GETs of log versions and segments (object-store latency, not CPU, is the limit).
VERIFY_WORKERS = 8


def _ordered(
    fn: Callable[[T], R], items: list[T], pool: ThreadPoolExecutor, window: int = 256
) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` in order, at most ``window`` in flight (bounded memory)."""
    for i in range(0, len(items), window):
        chunk = items[i : i + window]
        yield from zip(chunk, pool.map(fn, chunk), strict=True)


def verify_log(
    log: Log,
    name: str,
    segments: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    group_log: bool = False,
) -> VerifyReport:
    """Replay every version of ``log`` with :class:`LogChecker`, compare every checkpoint with
    the replay, and (with ``segments``) check every segment the final state references.

    Args:
        log: The log to check.
        name: Its root (table name), for segment paths.
        segments: Read and check the segments too.
        progress: Called with ``(phase, done, total)``; phase is ``"log"``, then
            ``"segments"``.
        group_log: It is a consumer-group log.

    Raises:
        ObjectNotFoundError: If the log has neither version 0 nor a checkpoint.
        UnsupportedProtocolError: If the table needs a newer client.
    """
    report = VerifyReport(name)
    checker = LogChecker(name, group_log)
    listing = log.listing()
    versions, checkpoints = listing.versions, set(listing.checkpoints)
    if not versions and not checkpoints:
        raise ObjectNotFoundError(log.version_key(0))
    # Log cleanup keeps version 0 and deletes 1 .. C-1: start from a checkpoint then too.
    later = [v for v in versions if v > 0]
    truncated = bool(later) and later[0] > 1
    if not versions or versions[0] != 0:
        # Log cleanup never deletes version 0: without it readers see no table at all.
        report.add(
            [Violation("log.missing-version", "version 0 is missing: readers see no table "
                       "(create_table refuses the name); restore it from a backup", 0,
                       path=log.version_key(0))]
        )
    if not versions or versions[0] != 0 or truncated:
        start = _start_from_checkpoint(log, checker, later if truncated else versions, listing)
        if start is None:
            present = later if truncated else versions
            first = present[0] if present else None
            report.add(
                [Violation("log.missing-version", "no checkpoint replaces the versions before "
                           f"version {first}: they cannot be checked", first)]
            )
            return report
        report.start_version = start
        versions = [v for v in versions if v > start]
    with ThreadPoolExecutor(VERIFY_WORKERS, thread_name_prefix="txntable-verify") as pool:
        done = 0
        for version, actions in _ordered(
            lambda v: _read_decoded(log, log.version_key(v)), versions, pool
        ):
            expected = checker.snapshot.version + 1
            if version > expected:
                missing = f"{expected}..{version - 1}" if version - 1 > expected else expected
                checker.skip_to(version - 1, f"version(s) {missing} missing")
            if actions is None:  # deleted between the LIST and the GET
                checker.skip_to(version, f"version {version} vanished during the check")
            elif isinstance(actions, CorruptLogError):
                checker.skip_to(version, str(actions), "log.corrupt-version")
            else:
                checker.apply_version(version, actions)
            report.versions_checked += 1
            if version in checkpoints:
                report.checkpoints_checked += 1
                parts = listing.parts_of(version)
                report.add(_check_checkpoint(log, version, parts, checker.snapshot))
            done += 1
            if progress is not None:
                progress("log", done, len(versions))
        report.add(checker.finish())
        report.add(_check_hint(log, checkpoints, checker.snapshot.version))
        report.version = checker.snapshot.version
        if not group_log:
            report.add(_check_open_transactions(log, checker.snapshot))
        if segments:
            report.add(
                unreferenced_after_tip(
                    checker.snapshot, checker.referenced_paths, log.store.list(data_dir(name))
                )
            )
            batches = [
                e
                for part in checker.snapshot.partitions
                for e in part.entries
                if not isinstance(e, Marker) and e.path
            ]
            layout = layout_of(checker.snapshot.metadata)
            for i, (_, found) in enumerate(
                _ordered(lambda b: _read_segment(log, b, layout), batches, pool, 32), 1
            ):
                report.add(found)
                report.segments_checked += 1
                if progress is not None:
                    progress("segments", i, len(batches))
    return report


def transaction_over(meta: TxnMetadata, pid: int, epoch: int) -> bool:
    """Whether the coordinator object ``meta`` proves that the transaction producer ``pid``
    ran at ``epoch`` is complete, so that its markers are written (pure).

    Complete writes every marker before its CAS, and every later state of the object comes
    after that CAS: a state of the same producer at a later epoch, or a completion that
    rotated the id away from ``pid``, means the markers exist. A ``PrepareAbort`` one epoch
    later may be the fencing abort of this very transaction, still writing its markers.
    """
    if meta.producer_id != pid:
        return (
            meta.last_producer_id == pid
            and meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.EMPTY)
            and meta.last_producer_epoch >= epoch
        )
    if meta.state in (TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE):
        return meta.producer_epoch > epoch + 1
    return meta.producer_epoch > epoch


def _check_open_transactions(log: Log, snap: TableSnapshot) -> list[Violation]:
    """Open transactions whose coordinator object says they are complete: their marker is
    gone, so the newest version(s) were deleted (issue 19.12).

    The objects are read after the log: a transaction that completed meanwhile is not
    flagged when its marker is found in the versions committed since.
    """
    suspects: list[tuple[int, int, Batch]] = []
    for part in snap.partitions:
        for pid, first in sorted(part.ongoing.items()):
            entry = part.entry_at(first)
            if isinstance(entry, Batch) and entry.transactionalId is not None:
                suspects.append((part.partition, pid, entry))
    if not suspects:
        return []
    coordinator = TransactionCoordinator(log.store)
    loaded: dict[str, TxnMetadata | None] = {}
    over = []
    for p, pid, batch in suspects:
        tid = batch.transactionalId
        assert tid is not None
        if tid not in loaded:
            try:
                got = coordinator.load(tid)
            except TxnTableError:
                got = None  # a damaged or unreadable object proves nothing here
            loaded[tid] = got[0] if got is not None else None
        meta = loaded[tid]
        if meta is not None and transaction_over(meta, pid, batch.producerEpoch):
            over.append((p, pid, batch, meta))
    if not over:
        return []
    closed = _markers_after(log, snap.version)
    return [
        Violation(
            "txn.marker-missing",
            f"transaction {batch.transactionalId!r} (producer {pid}, epoch "
            f"{batch.producerEpoch}) is open from offset {batch.baseOffset}, but its "
            f"coordinator object is {meta.state.value} at producer {meta.producer_id} epoch "
            f"{meta.producer_epoch}: the version holding its marker was deleted",
            snap.version,
            p,
            batch.baseOffset,
        )
        for p, pid, batch, meta in over
        if (p, pid) not in closed
    ]


def _markers_after(log: Log, version: int) -> set[tuple[int, int]]:
    """(partition, producer) of the markers in the versions after ``version`` (read until
    the first missing one)."""
    out: set[tuple[int, int]] = set()
    while True:
        version += 1
        try:
            actions = log.read_version(version)
        except CorruptLogError:
            continue
        if actions is None:
            return out
        out.update((a.partition, a.producerId) for a in actions if isinstance(a, Marker))


def unreferenced_after_tip(
    snap: TableSnapshot, referenced: set[str], keys: Iterable[str]
) -> list[Violation]:
    """Segment files that no version references, created after the newest version was
    committed (pure, given the listing): an append still in flight, one that gave up, or
    the segments of a deleted newest version."""
    tip = snap.last_commit_timestamp
    late = sorted(
        key
        for key in keys
        if key not in referenced and (segment_created_ms(key) or -1) > tip
    )
    if not late:
        return []
    shown = ", ".join(late[:3]) + (f" and {len(late) - 3} more" if len(late) > 3 else "")
    return [
        Violation(
            "segment.after-tip",
            f"{len(late)} segment(s) no version references were written after the newest "
            f"version {snap.version} was committed ({shown}): appends in flight or "
            "abandoned, or the newest version(s) were deleted",
            snap.version,
        )
    ]


def _start_from_checkpoint(
    log: Log, checker: LogChecker, versions: list[int], listing: LogListing
) -> int | None:
    """Start a log whose first versions are gone from the oldest usable checkpoint."""
    first = versions[0] if versions else max(listing.checkpoints) + 1
    for c in sorted(c for c in listing.checkpoints if c >= first - 1):
        try:
            snap = log.read_checkpoint(c, listing.parts_of(c))
        except CorruptLogError:
            continue
        if snap is not None:
            checker.start_from_checkpoint(snap)
            return c
    return None


def _read_decoded(log: Log, key: str) -> list[Action] | CorruptLogError | None:
    try:
        data = log.store.get(key).data
    except ObjectNotFoundError:
        return None
    try:
        return decode_actions(data, key)
    except CorruptLogError as e:
        return e


def _read_segment(
    log: Log, entry: Batch | Segment, layout: TypedLayout | None = None
) -> list[Violation]:
    try:
        data: bytes | None = log.store.get_data_file(entry.path)
    except ObjectNotFoundError:
        data = None
    if isinstance(entry, Segment):
        return check_merged_segment(entry, data, layout)
    return check_segment(entry, data, layout)


def _check_checkpoint(
    log: Log, version: int, parts: int, expected: TableSnapshot
) -> list[Violation]:
    key = log.checkpoint_key(version, 1, parts)
    try:
        got = log.read_checkpoint(version, parts)
    except CorruptLogError as e:
        return [Violation("checkpoint.corrupt", str(e), version, path=key)]
    if got is None:
        return []
    return compare_snapshots(version, expected, got)


def _check_hint(log: Log, checkpoints: set[int], latest: int) -> list[Violation]:
    try:
        data = log.store.get(log.last_checkpoint_key).data
    except ObjectNotFoundError:
        return []
    try:
        hint = json.loads(data)["version"]
    except (ValueError, KeyError, TypeError):
        hint = None
    if not isinstance(hint, int) or hint not in checkpoints or hint > latest:
        return [
            Violation(
                "checkpoint.hint",
                f"_last_checkpoint says {data[:100]!r}, which names no checkpoint of the log "
                "(readers fall back to a listing)",
                path=log.last_checkpoint_key,
            )
        ]
    return []


def in_segment_dir(table: str, partition: int, path: str) -> bool:
    """Whether ``path`` is a file directly in one of the partition's segment directories."""
    return any(
        path.startswith(d) and "/" not in path[len(d) :] for d in segment_dirs(table, partition)
    )
