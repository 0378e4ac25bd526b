"""Spark scan planning: the core's segment slices packed into Spark input partitions.

What a read returns is planned by :mod:`txntable.read.planning`, the planning shared with
``Table.scan`` and the consumer (LSO, aborted filtering through
:func:`txntable.protocol.aborted.classify_entries`, offset resolution); this module adds only what
is
Spark's: packing slices into input partitions of a target size, the default parallelism,
and admission control for streaming. Pure functions, no I/O and no Spark.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from txntable.protocol.snapshot import TableSnapshot
from txntable.read.planning import (
    OffsetRange,
    SegmentSlice,
    resolve_offset,
    slices_in_range,
    slices_in_ranges,
    upper_bound,
)
from txntable.read.planning import resolve_ranges as _resolve_ranges

from .options import ReadOptions

__all__ = [
    "MIN_SPLIT_BYTES",
    "OffsetRange",
    "SegmentSlice",
    "default_parallelism",
    "limit_offsets",
    "pack_slices",
    "plan_ranges",
    "plan_scan",
    "resolve_offset",
    "resolve_ranges",
    "slices_in_range",
    "upper_bound",
]

#: Smallest input partition worth its scheduling cost (Spark's ``openCostInBytes``).
MIN_SPLIT_BYTES = 4 * 1024 * 1024

#: Option names, for messages.
OFFSET_OPTIONS = ("startingOffsets", "endingOffsets")
DATA_LOSS_HINT = " (set failOnDataLoss=false to start there instead)"


#: The core's ``resolve_ranges`` with messages naming Spark's options.
resolve_ranges = partial(_resolve_ranges, names=OFFSET_OPTIONS, data_loss_hint=DATA_LOSS_HINT)


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
    slices = slices_in_ranges(snap, ranges, read_committed)
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
            stop = max(start.get(p, stop), first_left.first_offset)
        out[p] = stop
    return out


@dataclass(frozen=True)
class Pruning:
    """What pushed-down filters on ``partition`` and ``offset`` allow a scan to skip.

    Slices of other partitions, and slices whose offsets lie wholly outside
    ``[low, high)``, are not read. Spark still evaluates every filter on the rows read,
    so a slice kept whole that the filter cuts is exact.
    """

    partitions: frozenset[int] | None = None
    low: int = 0
    high: int | None = None

    def narrowed(self, f: object) -> Pruning:
        """This pruning and what the pushed filter ``f`` says (unchanged for a filter it
        does not know). Filters are recognised by their class name (``EqualTo``, ``In``,
        ``GreaterThan``, ...), so this module needs no Spark."""
        kind = type(f).__name__
        column = getattr(f, "attribute", None)
        value: Any = getattr(f, "value", None)
        if column == ("partition",):
            wanted: set[int] | None = None
            if kind == "EqualTo" and _is_int(value):
                wanted = {value}
            elif kind == "In" and all(_is_int(v) for v in value):
                wanted = set(value)
            if wanted is None:
                return self
            now = wanted if self.partitions is None else self.partitions & wanted
            return replace(self, partitions=frozenset(now))
        if column != ("offset",) or not _is_int(value):
            return self
        low, high = self.low, self.high
        v = int(value)
        if kind in ("EqualTo", "GreaterThan", "GreaterThanOrEqual"):
            low = max(low, v + 1 if kind == "GreaterThan" else v)
        if kind in ("EqualTo", "LessThan", "LessThanOrEqual"):
            bound = v if kind == "LessThan" else v + 1
            high = bound if high is None else min(high, bound)
        return replace(self, low=low, high=high)

    def keeps(self, s: SegmentSlice) -> bool:
        """Whether ``s`` may hold rows the filters accept."""
        if self.partitions is not None and s.partition not in self.partitions:
            return False
        return s.next_offset > self.low and (self.high is None or s.first_offset < self.high)

    def prune(self, groups: list[list[SegmentSlice]]) -> list[list[SegmentSlice]]:
        """``groups`` without the slices the filters exclude (and groups left empty)."""
        kept = [[s for s in g if self.keeps(s)] for g in groups]
        return [g for g in kept if g]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
