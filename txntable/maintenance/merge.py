"""Segment merge (OPTIMIZE) and key compaction (Kafka's log cleaner), below the LSO.

Both rewrite runs of consecutive entries of a partition into merged segments
(:class:`~txntable.protocol.actions.Segment`): Parquet files that carry each record's offset in an
``offset`` column, so offsets never change. Only the records a read_committed reader returns
survive: markers and aborted transactional data are dropped (after a merge, read_uncommitted
returns the same as read_committed below the merge point, as after Kafka's cleaner). Key
compaction also drops every record whose key has a later record below the compaction
point, and tombstones past their delete horizon.

Planning is pure (:func:`plan_groups`, :func:`dirty_ratio`); :func:`rewrite` does the I/O:
it writes the new segments first, then commits one log version whose ``segment`` actions
swap each run for its output. A concurrent producer commit only appends above the LSO, so
the merge rebases over it; a run that another maintainer rewrote meanwhile is dropped from
the plan. A crash before the commit leaves only unreferenced files, which vacuum deletes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txntable.protocol.aborted import classify_entries
from txntable.protocol.actions import (
    MAINTENANCE_PROTOCOL_VERSION,
    Action,
    Batch,
    CommitPlan,
    Marker,
    Protocol,
    Segment,
)
from txntable.protocol.records import (
    MERGED_SEGMENT_SCHEMA,
    OFFSET_COLUMN,
    encode_table,
)
from txntable.protocol.schema import TypedLayout, fill_required
from txntable.protocol.snapshot import (
    Entry,
    PartitionState,
    TableSnapshot,
    entry_size,
    retained_from,
)
from txntable.read.reader import (
    read_segment,
    read_typed,
)
from txntable.storage.base import Store


@dataclass(frozen=True)
class MergeRun:
    """Consecutive entries of one partition to rewrite as one merged segment."""

    partition: int
    entries: tuple[Entry, ...]
    #: Per entry, whether read_committed returns it (markers and aborted batches: no).
    visible: tuple[bool, ...] = field(default=(), compare=False)

    @property
    def base_offset(self) -> int:
        """First offset of the run."""
        return self.entries[0].baseOffset

    @property
    def end_offset(self) -> int:
        """Offset just past the run."""
        return self.entries[-1].next_offset

    @property
    def input_bytes(self) -> int:
        """Bytes of the run's segments."""
        return sum(entry_size(e) for e in self.entries)


@dataclass
class RewriteReport:
    """What a merge or compaction did (one per call, all partitions)."""

    version: int | None = None
    segments_written: int = 0
    entries_replaced: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    runs_dropped_by_conflict: int = 0
    written_paths: list[str] = field(default_factory=list)


def mergeable_entries(part: PartitionState) -> list[tuple[Entry, bool]]:
    """The retained entries wholly below the LSO with their read_committed visibility.

    Every transaction with data below the LSO is decided, so the aborted index says which
    of its batches are aborted (the same filter readers use).
    """
    upper = part.last_stable_offset
    if not part.entries:
        return []
    # A v1 table keeps entries below its log start; the v2 upgrade of the merge's own commit
    # drops them, so a run must not start there (its segment would replace nothing).
    start = max(part.entries[0].baseOffset, min(part.log_start_offset, upper))
    below = (e for e in part.entries_between(start, upper) if e.next_offset <= upper)
    return list(classify_entries(below, part.aborted_between(start, upper)))


def plan_groups(
    part: PartitionState,
    target_bytes: int,
    rewrite_all: bool = False,
) -> list[MergeRun]:
    """Group a partition's entries below the LSO into runs of about ``target_bytes``.

    A run is rewritten if it has two entries or more, or holds something a rewrite drops
    (a marker next to data, an aborted batch). An entry of ``target_bytes`` or more stands
    alone. ``rewrite_all`` (compaction) keeps single-entry runs too.
    """
    runs: list[MergeRun] = []
    current: list[tuple[Entry, bool]] = []
    size = 0

    def close() -> None:
        if not current:
            return
        entries = tuple(e for e, _ in current)
        invisible = any(not v and not isinstance(e, Marker) for e, v in current)
        if len(entries) >= 2 or invisible or (rewrite_all and not isinstance(entries[0], Marker)):
            runs.append(MergeRun(part.partition, entries, tuple(v for _, v in current)))

    for entry, visible in mergeable_entries(part):
        n = entry_size(entry) if visible else 0  # dropped data costs nothing in the output
        if current and size + n > target_bytes:
            close()
            current, size = [], 0
        current.append((entry, visible))
        size += n
    close()
    return runs


def dirty_ratio(part: PartitionState) -> float:
    """Share of the bytes below the LSO not yet key-compacted (Kafka's dirty ratio)."""
    total = dirty = 0
    for entry, _ in mergeable_entries(part):
        n = entry_size(entry)
        total += n
        if not (isinstance(entry, Segment) and entry.compacted):
            dirty += n
    return dirty / total if total else 0.0


def _runs_still_current(snap: TableSnapshot, runs: Sequence[MergeRun]) -> list[MergeRun]:
    """The runs whose entries are still exactly what the snapshot holds (a rebase check).

    A run whose first entry is wholly below where v2 keeps entries is not current either:
    on a v1 table a concurrent ``delete_records`` keeps the entries, but the upgrade to v2 in
    the same commit drops them, and the segment would then start at no retained entry.
    """
    out = []
    for run in runs:
        part = snap.partition(run.partition)
        now = tuple(part.entries_between(run.base_offset, run.end_offset))
        dropped = retained_from(part)
        if (
            now == run.entries
            and run.end_offset <= part.last_stable_offset
            and run.entries[0].next_offset > dropped
        ):
            out.append(run)
    return out


def plan_commit(
    snap: TableSnapshot, outputs: Sequence[tuple[MergeRun, Segment]]
) -> CommitPlan[list[Segment]]:
    """Pure: the ``segment`` actions of the runs still current in ``snap`` (plus the protocol
    upgrade to v2 if the table is older), for :meth:`Log.commit`."""
    current = set(_runs_still_current(snap, [r for r, _ in outputs]))
    segments = [seg for run, seg in outputs if run in current]
    actions: list[Action] = []
    if segments:
        actions.extend(upgrade_protocol(snap))
    actions.extend(segments)
    return CommitPlan(actions, segments, "OPTIMIZE")


def upgrade_protocol(snap: TableSnapshot) -> list[Action]:
    """A ``protocol`` action raising the table to v2, if it is older (else nothing)."""
    assert snap.protocol is not None
    p = snap.protocol
    if p.minReaderVersion >= MAINTENANCE_PROTOCOL_VERSION:
        return []
    return [
        Protocol(
            max(p.minReaderVersion, MAINTENANCE_PROTOCOL_VERSION),
            max(p.minWriterVersion, MAINTENANCE_PROTOCOL_VERSION),
        )
    ]


def read_entry(
    store: Store, entry: Batch | Segment, layout: TypedLayout | None = None
) -> pa.Table:
    """An entry's records with their offsets (merged-segment schema; a typed table's
    (``layout``): its merged-segment schema, older segments cast to the current one)."""
    if isinstance(entry, Segment):
        if entry.count == 0:
            return merged_schema(layout).empty_table()
        if layout is not None:
            return read_typed(store, entry.path, entry.count, True, layout)
        return read_segment(store, entry.path, entry.count, merged=True)
    if layout is not None:
        table = read_typed(store, entry.path, entry.count, False, layout)
    else:
        table = read_segment(store, entry.path, entry.count)
    offsets = pa.array(range(entry.baseOffset, entry.next_offset), pa.int64())
    return table.add_column(0, pa.field(OFFSET_COLUMN, pa.int64(), nullable=False), offsets)


#: Segments fetched concurrently by a rewrite (object-store reads are latency bound).
READ_AHEAD = 8


def merged_schema(layout: TypedLayout | None) -> pa.Schema:
    """The schema of a merged segment of the table (typed: of its current schema)."""
    return MERGED_SEGMENT_SCHEMA if layout is None else layout.merged_segment_schema


def record_keys(table: pa.Table, layout: TypedLayout | None) -> pa.ChunkedArray:
    """The key bytes of read records (typed: from the key columns)."""
    return table.column("key") if layout is None else layout.keys(table)


def read_entries(
    store: Store, entries: Sequence[Batch | Segment], layout: TypedLayout | None = None
) -> Iterator[pa.Table]:
    """:func:`read_entry` of each entry, in order, fetched a few at a time in threads."""
    if len(entries) <= 1:
        yield from (read_entry(store, e, layout) for e in entries)
        return
    with ThreadPoolExecutor(min(READ_AHEAD, len(entries))) as pool:
        yield from pool.map(lambda e: read_entry(store, e, layout), entries)


@dataclass
class Compaction:
    """What key compaction keeps: the latest offset per key, and the tombstone cutoff.

    ``latest`` holds only offsets (sorted, one per non-null key): whether a record is its
    key's latest is whether its offset is in it, so the rewrite never looks keys up.
    """

    latest: np.ndarray
    now: int
    delete_retention_ms: int

    def keeps(self, offsets: np.ndarray) -> np.ndarray:
        """Per offset (ascending, as in a segment), whether it is its key's latest."""
        if not len(offsets):
            return np.zeros(0, dtype=bool)
        lo, hi = np.searchsorted(self.latest, [offsets[0], offsets[-1]], side="left")
        # Only the slice of the map inside this segment's offsets matters.
        window = self.latest[lo : hi + 1]
        at = np.searchsorted(window, offsets)
        found = at < len(window)
        found[found] = window[at[found]] == offsets[found]
        return found


#: Rows of (key, offset) pairs gathered before they are folded into the offset map.
KEY_MAP_FOLD_ROWS = 1 << 20


def _fold(tables: list[pa.Table]) -> pa.Table:
    """One row per key, with its largest offset (Arrow's hash aggregation, no Python rows)."""
    grouped = pa.concat_tables(tables).group_by("key").aggregate([(OFFSET_COLUMN, "max")])
    return pa.table({"key": grouped["key"], OFFSET_COLUMN: grouped[f"{OFFSET_COLUMN}_max"]})


def latest_offsets(
    store: Store, runs: Sequence[MergeRun], layout: TypedLayout | None = None
) -> np.ndarray:
    """Offsets of the latest committed record of every non-null key in ``runs`` (sorted).

    Kafka's cleaner builds this offset map too. Here it lives in Arrow columns: each
    segment's key and offset columns are folded, every ``KEY_MAP_FOLD_ROWS`` rows, into one
    row per key by a hash group-by (``max`` offset: offsets grow along the log), so memory
    is the distinct keys' bytes plus 8 bytes each, never a Python object per record or key.
    ``runs`` are one partition's, in offset order.
    """
    entries = [
        entry
        for run in runs
        for entry, visible in zip(run.entries, run.visible, strict=True)
        if visible and not isinstance(entry, Marker)
    ]
    folded: list[pa.Table] = []
    pending = 0
    for table in read_entries(store, entries, layout):
        keys = record_keys(table, layout)
        pairs = pa.table({"key": keys, OFFSET_COLUMN: table[OFFSET_COLUMN]})
        pairs = pairs.filter(pc.is_valid(pairs["key"]))  # null keys are never compacted
        folded.append(pairs)
        pending += pairs.num_rows
        if pending >= max(KEY_MAP_FOLD_ROWS, 2 * folded[0].num_rows) and len(folded) > 1:
            folded = [_fold(folded)]
            pending = 0
    if not folded:
        return np.zeros(0, dtype=np.int64)
    return np.sort(_fold(folded).column(OFFSET_COLUMN).to_numpy())


def rewrite_run(
    store: Store,
    run: MergeRun,
    log_start: int,
    new_path: Callable[[int], str],
    compaction: Compaction | None = None,
    layout: TypedLayout | None = None,
) -> tuple[Segment, int, int]:
    """Write the merged segment of ``run``; return it, records kept and records dropped.

    Raises:
        MissingSegmentError, CorruptLogError, SchemaMismatchError: An input is unreadable.
    """
    pieces: list[pa.Table] = []
    horizon = -1
    pairs = zip(run.entries, run.visible, strict=True)
    inputs = [(e, v) for e, v in pairs if not isinstance(e, Marker)]
    wanted = [e for e, v in inputs if v]
    dropped = sum(e.count for e, v in inputs if not v)  # aborted: never read
    for entry, table in zip(wanted, read_entries(store, wanted, layout), strict=True):
        mask = pc.greater_equal(table.column(OFFSET_COLUMN), log_start)
        if compaction is not None:
            latest = compaction.keeps(table.column(OFFSET_COLUMN).to_numpy())
            keys = record_keys(table, layout)
            keep = pc.or_(pc.is_null(keys), pa.array(latest, pa.bool_()))
            mask = pc.and_(mask, keep)
            if layout is None:
                # A tombstone deletes its key; a null-key record is never compacted, so a
                # null value under a null key is an ordinary record.
                tombstone = pc.and_(pc.is_null(table.column("value")), pc.is_valid(keys))
            else:  # a typed record is never a tombstone
                tombstone = pa.array(np.zeros(table.num_rows, dtype=bool))
            expired = (
                isinstance(entry, Segment)
                and entry.compacted
                and 0 <= entry.deleteHorizonMs <= compaction.now
            )
            if expired:
                mask = pc.and_(mask, pc.invert(tombstone))
            kept_tombstones = pc.sum(pc.and_(mask, tombstone).cast(pa.int64())).as_py() or 0
            if kept_tombstones:
                own = (
                    entry.deleteHorizonMs
                    if isinstance(entry, Segment) and entry.compacted and entry.deleteHorizonMs >= 0
                    else compaction.now + compaction.delete_retention_ms
                )
                horizon = max(horizon, own)
        kept = table.filter(mask)
        dropped += table.num_rows - kept.num_rows
        pieces.append(kept)
    merged = (
        pa.concat_tables(pieces).combine_chunks()
        if pieces
        else merged_schema(layout).empty_table()
    )
    count = merged.num_rows
    path, size, lo, hi = "", 0, 0, 0
    if count:
        path = new_path(run.partition)
        out = merged.cast(merged_schema(layout))
        data = encode_table(out if layout is None else fill_required(out))
        store.put_data_file(path, data)
        size = len(data)
        stamps = merged.column("timestamp").cast(pa.int64())
        lo, hi = pc.min(stamps).as_py(), pc.max(stamps).as_py()
    else:
        hi = max((e.maxTimestamp for e in run.entries if not isinstance(e, Marker)), default=0)
        hi = max([hi, *(e.timestamp for e in run.entries if isinstance(e, Marker))])
        lo = hi
    segment = Segment(
        partition=run.partition,
        baseOffset=run.base_offset,
        endOffset=run.end_offset,
        count=count,
        path=path,
        size=size,
        minTimestamp=lo,
        maxTimestamp=hi,
        compacted=compaction is not None,
        deleteHorizonMs=horizon,
    )
    return segment, count, dropped
