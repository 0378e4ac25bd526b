"""Scan planning: snapshot + offset range -> segment slices packed into input partitions.

Pure functions of a :class:`~txntable.snapshot.TableSnapshot`; no I/O and no Spark, so the
whole read_committed planning logic is unit-testable in milliseconds. The cost is
O(entries and aborted transactions in the range) per partition (``entries_between`` and
``aborted_between`` bisect), never O(history).

read_committed follows Kafka's fetcher: the range ends at the last stable offset, and
:func:`txntable.aborted.classify_entries` (the one filter shared with the Python consumer)
decides which batches are visible. A segment is exactly one producer batch, so an invisible
batch is dropped here and its segment is never opened.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from txntable.aborted import classify_entries
from txntable.actions import Marker, Segment
from txntable.errors import OffsetOutOfRangeError
from txntable.snapshot import PartitionState, TableSnapshot

from .options import EARLIEST, LATEST, OffsetSpec, ReadOptions

#: Smallest input partition worth its scheduling cost (Spark's ``openCostInBytes``).
MIN_SPLIT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SegmentSlice:
    """Rows ``[row_start, row_stop)`` of one segment; row ``i`` has offset ``base_offset + i``."""

    partition: int
    path: str
    base_offset: int
    count: int
    row_start: int
    row_stop: int
    size: int
    #: A merged segment: rows are chosen by its offset column, in ``[first, end)`` offsets
    #: (``row_start`` / ``row_stop`` then hold those offsets minus ``base_offset``).
    merged: bool = False

    @property
    def rows(self) -> int:
        """Number of rows kept."""
        return self.row_stop - self.row_start

    @property
    def est_bytes(self) -> int:
        """Segment bytes prorated to the rows kept (what packing balances on)."""
        return max(1, min(self.size, self.size * self.rows // max(self.count, 1)))


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int


def upper_bound(part: PartitionState, read_committed: bool) -> int:
    """Highest end offset a reader may use: the LSO (read_committed) or the high watermark."""
    return part.last_stable_offset if read_committed else part.high_watermark


def resolve_offset(
    part: PartitionState,
    requested: int,
    read_committed: bool,
    fail_on_data_loss: bool,
    what: str,
) -> int:
    """Turn a requested offset (or ``EARLIEST`` / ``LATEST``) into a concrete offset.

    An ending offset above the upper bound is lowered to it: data past the LSO is not
    stable yet, so a read_committed reader never returns it.

    Raises:
        OffsetOutOfRangeError: If the offset is below the log start offset and
            ``fail_on_data_loss`` is set, or a starting offset is past the high watermark.
    """
    upper = upper_bound(part, read_committed)
    if requested == EARLIEST:
        return part.log_start_offset
    if requested == LATEST:
        return upper
    if requested < part.log_start_offset:
        if fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{what} {requested} of partition {part.partition} is below the log start offset "
                f"{part.log_start_offset} (set failOnDataLoss=false to start there instead)"
            )
        return part.log_start_offset
    if what == "startingOffsets":
        if requested > part.high_watermark:
            raise OffsetOutOfRangeError(
                f"startingOffsets {requested} of partition {part.partition} is past the high "
                f"watermark {part.high_watermark}"
            )
        # Never lowered to the LSO: that would return offsets before the requested start
        # (a stream starting there just waits for the LSO to pass it).
        return requested
    return min(requested, upper)


def resolve_ranges(
    snap: TableSnapshot,
    starting: OffsetSpec,
    ending: OffsetSpec,
    read_committed: bool,
    fail_on_data_loss: bool = True,
) -> list[OffsetRange]:
    """Per partition, the offset range a batch read covers.

    Raises:
        OffsetOutOfRangeError: See :func:`resolve_offset`; also for a partition the
            table does not have.
    """
    for p in (*starting.offsets, *ending.offsets):
        if not 0 <= p < snap.num_partitions:
            raise OffsetOutOfRangeError(f"table has {snap.num_partitions} partitions, not {p + 1}")
    out = []
    for part in snap.partitions:
        p = part.partition
        start = resolve_offset(
            part, starting.for_partition(p), read_committed, fail_on_data_loss, "startingOffsets"
        )
        end = resolve_offset(
            part, ending.for_partition(p), read_committed, fail_on_data_loss, "endingOffsets"
        )
        # A start past the end (e.g. inside an open transaction) is an empty range.
        out.append(OffsetRange(p, start, max(start, end)))
    return out


def slices_in_range(
    part: PartitionState, start: int, end: int, read_committed: bool
) -> list[SegmentSlice]:
    """Slices of the batches a reader returns for offsets ``[start, end)`` of ``part``.

    Args:
        part: The partition's state.
        start: First offset.
        end: Offset past the last; for read_committed it must be at most the LSO.
        read_committed: Drop aborted transactional batches (and always drop markers).
    """
    if end <= start:
        return []
    entries = part.entries_between(start, end)
    if read_committed:
        assert end <= part.last_stable_offset, "read_committed range past the LSO"
        classified = classify_entries(entries, part.aborted_between(start, end))
    else:
        classified = ((e, True) for e in entries)
    out = []
    for entry, visible in classified:
        if not visible or isinstance(entry, Marker) or entry.count == 0:
            continue
        lo = max(start, entry.baseOffset) - entry.baseOffset
        hi = min(end, entry.next_offset) - entry.baseOffset
        if hi > lo:
            out.append(
                SegmentSlice(
                    part.partition,
                    entry.path,
                    entry.baseOffset,
                    entry.count,
                    lo,
                    hi,
                    entry.size,
                    isinstance(entry, Segment),
                )
            )
    return out


def pack_slices(
    slices: list[SegmentSlice],
    max_bytes: int,
    min_partitions: int | None = None,
    min_bytes: int = 1,
) -> list[list[SegmentSlice]]:
    """Pack slices, in order, into groups of about ``max_bytes`` each.

    ``min_partitions`` lowers the target so about that many groups come out when there are
    enough slices (Kafka source's ``minPartitions``), but never below ``min_bytes`` (Spark's
    file-open cost: tiny groups cost more to schedule than to read). A slice is never
    split across groups: a segment is the unit of I/O.
    """
    if not slices:
        return []
    # A group closes before it would pass max_bytes (hard cap) or once it holds its share
    # of min_partitions (soft target: closing at, not before, the share yields at most
    # min_partitions groups, where "would pass" packing often spills into one more wave).
    share = max_bytes
    if min_partitions:
        total = sum(s.est_bytes for s in slices)
        share = max(min_bytes, math.ceil(total / min_partitions))
    groups: list[list[SegmentSlice]] = [[]]
    size = 0
    for s in slices:
        if groups[-1] and (size >= share or size + s.est_bytes > max_bytes):
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += s.est_bytes
    return groups


def default_parallelism() -> int:
    """How many input partitions a read aims for by default: the driver's cores.

    The Python planner runs without a SparkContext, so Spark's ``defaultParallelism`` is
    out of reach; the driver's core count is right for local mode and a floor elsewhere
    (set ``minPartitions`` on a cluster).
    """
    return max(2, os.cpu_count() or 2)


def plan_ranges(
    snap: TableSnapshot,
    ranges: list[OffsetRange],
    read_committed: bool,
    max_bytes: int,
    min_partitions: int | None = None,
) -> list[list[SegmentSlice]]:
    """Slices of ``ranges`` packed into input partitions (batch reads and micro-batches).

    Without ``min_partitions`` the slices are spread over :func:`default_parallelism`
    groups of at least :data:`MIN_SPLIT_BYTES`, as Spark's file sources do.
    """
    slices: list[SegmentSlice] = []
    for r in ranges:
        slices.extend(slices_in_range(snap.partition(r.partition), r.start, r.end, read_committed))
    if min_partitions is not None:
        return pack_slices(slices, max_bytes, min_partitions)
    return pack_slices(slices, max_bytes, default_parallelism(), MIN_SPLIT_BYTES)


def plan_scan(snap: TableSnapshot, opts: ReadOptions) -> list[list[SegmentSlice]]:
    """Plan a batch read of ``snap`` with ``opts``: the slices of each input partition.

    Raises:
        OffsetOutOfRangeError: If a requested offset is out of range.
    """
    ranges = resolve_ranges(
        snap, opts.starting, opts.ending, opts.read_committed, opts.fail_on_data_loss
    )
    return plan_ranges(
        snap, ranges, opts.read_committed, opts.max_bytes_per_partition, opts.min_partitions
    )


def limit_offsets(
    start: dict[int, int], available: dict[int, int], max_offsets: int
) -> dict[int, int]:
    """End offsets that admit at most ``max_offsets`` offsets in all, spread over partitions.

    Spark's Kafka source rule: each partition gets a share proportional to its backlog
    (rounded down, or up when the share is below one so small partitions still move).
    """
    lags = {p: max(0, available[p] - start.get(p, available[p])) for p in available}
    total = sum(lags.values())
    if total <= max_offsets:
        return dict(available)
    out = {}
    for p, end in available.items():
        begin = start.get(p, end)
        share = max_offsets * lags[p] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[p] = min(end, begin + step)
    return out


def limit_segments(
    snap: TableSnapshot,
    start: dict[int, int],
    end: dict[int, int],
    max_segments: int,
    read_committed: bool,
) -> dict[int, int]:
    """End offsets that admit at most ``max_segments`` segments in all (``maxFilesPerTrigger``).

    A segment is the unit a reader opens; one that is only partly in range counts whole,
    skipped ones (aborted) and markers count nothing. Segments are taken in offset order,
    one partition at a time in turn, so every partition with a backlog moves. A partition's
    end is cut just before its first segment not admitted.
    """
    queues: dict[int, list[SegmentSlice]] = {}
    for p, stop in end.items():
        begin = start.get(p, stop)
        queues[p] = slices_in_range(snap.partition(p), begin, stop, read_committed)
    if sum(len(q) for q in queues.values()) <= max_segments:
        return dict(end)
    taken = dict.fromkeys(queues, 0)
    budget = max_segments
    while budget:
        for p in sorted(queues):
            if budget and taken[p] < len(queues[p]):
                taken[p] += 1
                budget -= 1
    out = {}
    for p, stop in end.items():
        queue = queues[p]
        if taken[p] < len(queue):
            first_left = queue[taken[p]]
            stop = max(start.get(p, stop), first_left.base_offset + first_left.row_start)
        out[p] = stop
    return out
