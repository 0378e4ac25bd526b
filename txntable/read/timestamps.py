"""Time-based positions: the first offset whose record timestamp is at or after ``t``.

Kafka's ``offsetsForTimes`` (ListOffsets by timestamp): per partition, the first offset,
in offset order, of a record visible at the isolation level (read_committed: below the
LSO, aborted transactions removed; read_uncommitted: below the high watermark) whose
timestamp is ``>= t``; none if there is no such record. Timestamps need not grow with
offsets, so "first" is by offset.

Every batch and merged segment carries its min and max record timestamps in the log, so
entries with ``maxTimestamp < t`` are skipped without reading them; the first entry that
may hold a match is answered from the log alone when every record in it qualifies
(``minTimestamp >= t``, all its offsets in range, nothing in it can be aborted), and
otherwise read (one segment, exact).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from txntable.errors import VersionNotAvailableError, VersionNotFoundError
from txntable.protocol.actions import Batch, CommitInfo, Marker
from txntable.protocol.schema import layout_of
from txntable.protocol.snapshot import DataEntry, PartitionState, TableSnapshot
from txntable.read.planning import (
    EARLIEST,
    LATEST,
    offset_spec,
    resolve_ranges,
    slices_in_ranges,
)
from txntable.read.reader import SegmentReader
from txntable.structs import (
    READ_COMMITTED,
    OffsetAndTimestamp,
)
from txntable.table import Table


def timestamps_ms(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A timestamp column (any unit) as int64 milliseconds since the epoch."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", column.type.tz))
    return column.cast(pa.int64())


def candidates(part: PartitionState, start: int, end: int, ts: int) -> Iterator[DataEntry]:
    """Entries holding offsets in ``[start, end)`` that may hold a record at/after ``ts`` (pure)."""
    for entry in part.entries_between(start, end):
        if isinstance(entry, Marker) or entry.maxTimestamp < ts or entry.count == 0:
            continue
        yield entry


def answered_by_log(entry: DataEntry, start: int, end: int, ts: int, committed: bool) -> bool:
    """Whether ``entry``'s first offset is the answer without reading it (pure)."""
    return (
        isinstance(entry, Batch)
        and entry.minTimestamp >= ts
        and entry.baseOffset >= start
        and entry.baseOffset < end
        # Under read_committed a transactional batch may be aborted: read to be sure.
        and not (committed and entry.transactional)
    )


def offset_for_time(
    table: Table,
    snap: TableSnapshot,
    partition: int,
    ts: int,
    isolation_level: str = READ_COMMITTED,
    need_timestamp: bool = True,
) -> OffsetAndTimestamp | None:
    """The first offset of ``partition`` with a record timestamp ``>= ts``, or ``None``.

    Args:
        table: Handle used to read a segment when the log cannot answer alone.
        snap: The snapshot (version) to answer from.
        partition: Partition of the table.
        ts: Timestamp in ms since the epoch.
        isolation_level: ``read_committed`` or ``read_uncommitted``.
        need_timestamp: Whether the record's timestamp is wanted; without it a batch whose
            records all qualify is never read (``timestamp`` is then its ``minTimestamp``
            only when that is exact, else -1).

    Raises:
        UnknownTopicOrPartitionError: A partition the table does not have.
    """
    part = snap.partition(partition)
    committed = isolation_level == READ_COMMITTED
    start = part.log_start_offset
    end = part.last_stable_offset if committed else part.high_watermark
    for entry in candidates(part, start, end, ts):
        exact_ts = entry.minTimestamp == entry.maxTimestamp
        if answered_by_log(entry, start, end, ts, committed) and (exact_ts or not need_timestamp):
            return OffsetAndTimestamp(entry.baseOffset, entry.minTimestamp if exact_ts else -1)
        lo, hi = max(entry.baseOffset, start), min(entry.next_offset, end)
        rows = _read(table, snap, partition, lo, hi, committed)
        if rows is None:
            continue
        stamps = timestamps_ms(rows.column("timestamp"))
        hits = pc.indices_nonzero(pc.greater_equal(stamps, pa.scalar(ts, pa.int64())))
        if len(hits):
            i = hits[0].as_py()
            return OffsetAndTimestamp(rows.column("offset")[i].as_py(), stamps[i].as_py())
    return None


def _read(
    table: Table, snap: TableSnapshot, partition: int, lo: int, hi: int, committed: bool
) -> pa.Table | None:
    """Records of ``[lo, hi)`` visible at the isolation level, read from ``snap``'s segments."""
    ranges = resolve_ranges(
        snap,
        offset_spec({partition: lo}, EARLIEST),
        offset_spec({partition: hi}, LATEST),
        committed,
        partitions=[partition],
    )
    # A typed table's segments hold its own columns: read them with its layout.
    reader = SegmentReader(table.store, layout_of(snap.metadata))
    parts = [reader.read_output(s, table.name) for s in slices_in_ranges(snap, ranges, committed)]
    parts = [t for t in parts if t.num_rows]
    return pa.concat_tables(parts) if parts else None


def commit_timestamp(table: Table, version: int) -> int | None:
    """The ``commitInfo.timestamp`` of ``version``, or ``None`` if it is gone or has none."""
    actions = table.log.read_version(version)
    if actions is None:
        return None
    return next((a.timestamp for a in actions if isinstance(a, CommitInfo)), None)


def version_at_timestamp(table: Table, ts: int) -> int:
    """Delta's ``timestampAsOf``: the last version committed at or before ``ts`` (ms).

    Binary search over the versions' commit timestamps (one GET per step; the reference
    writers' clocks make them non-decreasing). On a log whose versions 1.. log cleanup
    deleted, the search runs over the versions kept, from the oldest checkpoint on.

    Raises:
        VersionNotAvailableError: ``ts`` falls before the oldest version kept after log
            cleanup (at or after version 0's commit): the version it names may be deleted.
        VersionNotFoundError: ``ts`` is before the first commit, or after the latest one
            (Delta refuses both).
    """
    latest = table.snapshot().version
    newest_ts = commit_timestamp(table, latest)
    if newest_ts is not None and ts > newest_ts:
        raise VersionNotFoundError(
            f"timestamp {ts} is after the latest commit of {table.name} (version {latest} "
            f"at {newest_ts})"
        )
    earliest = table.log.earliest_version()
    if earliest > 0:
        kept = commit_timestamp(table, earliest)
        first = commit_timestamp(table, 0)
        if kept is not None and ts < kept:
            if first is not None and ts < first:
                raise VersionNotFoundError(
                    f"timestamp {ts} is before the first commit of {table.name} (version 0 "
                    f"at {first})"
                )
            # The last version committed at or before ts lies among the deleted ones (or
            # is version 0, if none of those was that early: no longer knowable).
            raise VersionNotAvailableError(earliest - 1, earliest)
    lo, hi, found = earliest, latest, -1
    while lo <= hi:
        mid = (lo + hi) // 2
        at = commit_timestamp(table, mid)
        if at is None or at <= ts:
            if at is not None:
                found = mid
            lo = mid + 1
        else:
            hi = mid - 1
    if found < 0:
        raise VersionNotFoundError(
            f"timestamp {ts} is before the earliest available commit of {table.name}"
        )
    return found
