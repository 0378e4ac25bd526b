"""Read planning: snapshot + offset range -> the segment slices a reader returns.

Pure functions of a :class:`~txntable.protocol.snapshot.TableSnapshot`; no I/O, no engine. Every
reader plans here: :meth:`Table.scan <txntable.table.Table.scan>`, the
:class:`~txntable.consumer.Consumer` and the Spark source (which then packs the slices into
input partitions). The cost is O(entries and aborted transactions in the range) per
partition (``entries_between`` and ``aborted_between`` bisect), never O(history).

read_committed follows Kafka's fetcher: the range ends at the last stable offset, and
:func:`txntable.protocol.aborted.classify_entries` (the one filter of every reader) decides which
batches are visible. A segment is exactly one producer batch, so an invisible batch is
dropped here and its segment is never opened.

A merged segment (protocol v2, :class:`~txntable.protocol.actions.Segment`) is always visible, but
its
records carry their offsets in a column, with gaps where maintenance dropped records: a plan
bounds its slice by offsets, and which rows fall inside is found when the segment is read
(:func:`txntable.read.reader.slice_rows`). A fetch limited to ``n`` records is therefore planned
with a lower bound of the rows each slice holds and cut to ``n`` once the rows are known
(:func:`take`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from txntable.errors import InvalidConfigurationError, OffsetOutOfRangeError
from txntable.protocol.aborted import Entry, classify_entries
from txntable.protocol.actions import Batch, Marker, Segment
from txntable.protocol.snapshot import PartitionState, TableSnapshot

if TYPE_CHECKING:
    import numpy as np


#: Special offsets (Spark's Kafka source JSON offsets use the same numbers).
EARLIEST: Final = -2
LATEST: Final = -1


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest`` or explicit per-partition offsets of one table.

    ``default`` (``EARLIEST`` or ``LATEST``) applies to every partition not in ``offsets``.
    """

    default: int
    offsets: dict[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int:
        """Requested offset of ``partition``: an offset, ``EARLIEST`` or ``LATEST``."""
        return self.offsets.get(partition, self.default)


def offset_spec(value: str | int | Mapping[int, int] | None, default: int) -> OffsetSpec:
    """An :class:`OffsetSpec` from a Python argument.

    Args:
        value: ``"earliest"``, ``"latest"``, one offset for every partition, a mapping
            partition -> offset (``-2`` earliest, ``-1`` latest), or ``None`` for ``default``.
        default: ``EARLIEST`` or ``LATEST``.

    Raises:
        InvalidConfigurationError: For any other value, or an offset below ``-2``.
    """
    if value is None:
        return OffsetSpec(default)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("earliest", "latest"):
            return OffsetSpec(EARLIEST if v == "earliest" else LATEST)
        raise InvalidConfigurationError(
            f"offsets must be 'earliest', 'latest', an offset or a mapping, not {value!r}"
        )
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetSpec(_check_offset(value, None))
    if isinstance(value, Mapping):
        offsets = {}
        for p, off in value.items():
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise InvalidConfigurationError(f"partition must be an int >= 0, not {p!r}")
            offsets[p] = _check_offset(off, p)
        return OffsetSpec(default, offsets)
    raise InvalidConfigurationError(f"offsets must be a str, int or mapping, not {value!r}")


def _check_offset(off: object, partition: int | None) -> int:
    if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
        where = "" if partition is None else f" of partition {partition}"
        raise InvalidConfigurationError(f"offset{where} must be an int >= -2, not {off!r}")
    return off


@dataclass(frozen=True)
class SegmentSlice:
    """The records of one segment with offsets in ``[first_offset, next_offset)``.

    A batch's segment holds one record per offset (row ``i`` has offset ``base_offset + i``),
    so the slice is its rows ``[row_start, row_stop)`` and :attr:`rows` is exact. A merged
    segment (``merged``) carries each record's offset in a column, with gaps where records
    were dropped: ``row_start`` and ``row_stop`` then bound offsets (relative to
    ``base_offset``), the rows are those whose offset falls inside (found when the segment
    is read), and :attr:`rows` / :attr:`min_rows` bound their number.
    """

    partition: int
    path: str
    base_offset: int
    count: int
    row_start: int
    row_stop: int
    size: int
    merged: bool = False
    #: Offsets the segment covers (a merged segment's ``endOffset - baseOffset``); 0 for a
    #: batch, whose span is its ``count``.
    span: int = 0

    @property
    def rows(self) -> int:
        """Number of rows kept (for part of a merged segment: at most this many)."""
        n = self.row_stop - self.row_start
        return min(n, self.count) if self.merged else n

    @property
    def min_rows(self) -> int:
        """At least this many rows are kept (:attr:`rows`, except for part of a merged
        segment: its records minus the offsets of its range left out)."""
        if not self.merged:
            return self.rows
        return max(0, self.count - (self.span - (self.row_stop - self.row_start)))

    @property
    def first_offset(self) -> int:
        """Offset of the first row kept (for a merged segment: no row kept is below it)."""
        return self.base_offset + self.row_start

    @property
    def next_offset(self) -> int:
        """Offset after the last row kept (for a merged segment: every row kept is below)."""
        return self.base_offset + self.row_stop

    @property
    def segment_end(self) -> int:
        """Offset past the whole segment's range."""
        return self.base_offset + (self.span if self.merged else self.count)

    @property
    def est_bytes(self) -> int:
        """Segment bytes prorated to the rows kept (what packing balances on)."""
        return max(1, self.size * self.rows // max(self.count, 1))


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
    *,
    start: bool,
    fail_on_data_loss: bool = True,
    name: str | None = None,
    data_loss_hint: str = "",
) -> int:
    """Turn a requested offset (or ``EARLIEST`` / ``LATEST``) into a concrete offset.

    An ending offset above the upper bound is lowered to it: data past the LSO is not
    stable yet, so a read_committed reader never returns it.

    Args:
        part: The partition.
        requested: An offset, ``EARLIEST`` or ``LATEST``.
        read_committed: Whether the upper bound is the LSO (else the high watermark).
        start: Whether this is a starting offset (else an ending offset).
        fail_on_data_loss: Raise for an offset below the log start offset (else move up).
        name: What to call the offset in messages (default "starting/ending offset").
        data_loss_hint: Appended to the below-log-start message.

    Raises:
        OffsetOutOfRangeError: If the offset is below the log start offset and
            ``fail_on_data_loss`` is set, or a starting offset is past the high watermark.
    """
    what = name or ("starting offset" if start else "ending offset")
    upper = upper_bound(part, read_committed)
    if requested == EARLIEST:
        return part.log_start_offset
    if requested == LATEST:
        return upper
    if requested < part.log_start_offset:
        if fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{what} {requested} of partition {part.partition} is below the log start offset "
                f"{part.log_start_offset}{data_loss_hint}"
            )
        return part.log_start_offset
    if start:
        if requested > part.high_watermark:
            raise OffsetOutOfRangeError(
                f"{what} {requested} of partition {part.partition} is past the high "
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
    partitions: Iterable[int] | None = None,
    names: tuple[str, str] | None = None,
    data_loss_hint: str = "",
) -> list[OffsetRange]:
    """Per partition (all, or ``partitions`` in the order given), the range a read covers.

    Args:
        snap: The snapshot read.
        starting: Where each partition starts.
        ending: Where each partition ends (lowered to the LSO or high watermark).
        read_committed: Whether ranges end at most at the LSO.
        fail_on_data_loss: See :func:`resolve_offset`.
        partitions: The partitions to read (default: all, in order).
        names: Names of the starting and ending offsets, for messages.
        data_loss_hint: See :func:`resolve_offset`.

    Raises:
        OffsetOutOfRangeError: See :func:`resolve_offset`; also for offsets given for a
            partition the table does not have.
        UnknownTopicOrPartitionError: If ``partitions`` names one the table does not have.
    """
    for p in (*starting.offsets, *ending.offsets):
        if not 0 <= p < snap.num_partitions:
            raise OffsetOutOfRangeError(f"table has {snap.num_partitions} partitions, not {p + 1}")
    start_name, end_name = names or (None, None)
    wanted = range(snap.num_partitions) if partitions is None else list(partitions)
    out = []
    for p in wanted:
        part = snap.partition(p)
        first, end = (
            resolve_offset(
                part,
                spec.for_partition(p),
                read_committed,
                start=is_start,
                fail_on_data_loss=fail_on_data_loss,
                name=name,
                data_loss_hint=data_loss_hint,
            )
            for spec, is_start, name in ((starting, True, start_name), (ending, False, end_name))
        )
        # A start past the end (e.g. inside an open transaction) is an empty range.
        out.append(OffsetRange(p, first, max(first, end)))
    return out


def classify_range(
    part: PartitionState, start: int, end: int, read_committed: bool
) -> Iterator[tuple[Entry, bool]]:
    """Entries holding offsets in ``[start, end)``, each with whether a reader returns it.

    read_committed uses :func:`txntable.protocol.aborted.classify_entries` (``end`` must be at most
    the LSO); read_uncommitted sees every batch and merged segment. Markers are never
    visible.
    """
    entries = part.entries_between(start, end)
    if read_committed:
        assert end <= part.last_stable_offset, "read_committed range past the LSO"
        return classify_entries(entries, part.aborted_between(start, end))
    return ((e, not isinstance(e, Marker)) for e in entries)


@dataclass(frozen=True)
class FetchPlan:
    """What one fetch of a partition may return, and where its position goes.

    Attributes:
        slices: Rows to return, in offset order. A fetch limited to ``n`` records may plan
            more than ``n`` when merged segments are in range (their row counts are bounds
            until read); :func:`take` cuts them to ``n``.
        position: The position after the fetch when every slice is returned whole: past
            every entry examined, so past skipped markers and aborted batches too (a
            read_committed consumer sees gaps).
        ahead: The next visible slices after ``position`` (for read-ahead), possibly
            starting with the rest of the last batch of ``slices``.
        start: The position the fetch starts from.
    """

    slices: list[SegmentSlice]
    position: int
    ahead: list[SegmentSlice]
    start: int

    @property
    def rows(self) -> int:
        """Rows the slices hold at most."""
        return sum(s.rows for s in self.slices)

    @property
    def min_rows(self) -> int:
        """Rows the slices hold at least (exact without part of a merged segment)."""
        return sum(s.min_rows for s in self.slices)


def _slice(part: int, entry: Batch | Segment, lo: int, hi: int) -> SegmentSlice:
    if isinstance(entry, Segment):
        span = entry.endOffset - entry.baseOffset
        return SegmentSlice(
            part, entry.path, entry.baseOffset, entry.count, lo, hi, entry.size, True, span
        )
    return SegmentSlice(part, entry.path, entry.baseOffset, entry.count, lo, hi, entry.size)


def plan_fetch(
    part: PartitionState,
    position: int,
    end: int,
    read_committed: bool,
    max_records: int | None = None,
    lookahead: int = 0,
) -> FetchPlan:
    """Plan reading ``part`` from ``position`` up to ``end``, at most ``max_records`` rows.

    As Kafka's fetcher: the records returned are the visible ones in offset order; the new
    position is past the last entry examined, so entries skipped (markers, aborted batches,
    merged segments left without records) move it even when no record is returned.
    Examination stops as soon as the slices hold at least ``max_records`` rows, so a marker
    right after them is skipped by the next fetch. A batch's slice is cut at the limit here;
    a merged segment's slice covers the rest of its range, and :func:`take` cuts it once its
    rows are known.

    Args:
        part: The partition's state.
        position: First offset.
        end: Offset past the last (at most the LSO for read_committed).
        read_committed: Drop aborted transactional batches (markers are always dropped).
        max_records: Row limit (``None``: no limit).
        lookahead: How many further visible slices to plan for read-ahead.
    """
    slices: list[SegmentSlice] = []
    ahead: list[SegmentSlice] = []
    taken = 0  # rows the slices hold at least
    pos = position
    if end <= position:
        return FetchPlan(slices, pos, ahead, position)
    for entry, visible in classify_range(part, position, end, read_committed):
        full = max_records is not None and taken >= max_records
        if full and len(ahead) >= lookahead:
            break
        # A merged segment may hold no record at all (its path is then empty).
        if not visible or isinstance(entry, Marker) or entry.count == 0:
            if not full:
                pos = max(pos, min(entry.next_offset, end))
            continue
        lo = max(pos, entry.baseOffset) - entry.baseOffset
        hi = min(end, entry.next_offset) - entry.baseOffset
        if full:
            ahead.append(_slice(part.partition, entry, lo, hi))
            continue
        if max_records is not None and isinstance(entry, Batch):
            stop = min(hi, lo + max_records - taken)
            if stop < hi and lookahead:
                ahead.append(_slice(part.partition, entry, stop, hi))
            hi = stop
        if hi > lo:
            s = _slice(part.partition, entry, lo, hi)
            slices.append(s)
            taken += s.min_rows
        pos = entry.baseOffset + hi
    return FetchPlan(slices, pos, ahead, position)


def take(
    plan: FetchPlan, found: Iterable[np.ndarray], max_records: int | None
) -> tuple[list[int], int]:
    """Cut a fetch to ``max_records`` rows once its slices' rows are known.

    Args:
        plan: The fetch.
        found: For each slice of ``plan``, in order, the offsets of the rows it holds (as
            read). Consumed only as far as needed: slices after the limit are not asked for.
        max_records: Rows the fetch may return (``None``: no limit).

    Returns:
        How many rows of each slice the fetch returns (the first ones; slices not reached
        are left out of the list), and the position after it: just past the last record
        returned when the limit ends inside a slice; the slice's end offset when it ends
        with a slice (an entry after it is skipped by the next fetch); ``plan.start`` when
        nothing may be returned; else ``plan.position``.
    """
    taken: list[int] = []
    budget = max_records
    if budget is not None and budget <= 0:
        return taken, plan.start
    for s, offsets in zip(plan.slices, found, strict=False):
        n = len(offsets)
        if budget is not None and n > budget:
            taken.append(budget)
            return taken, int(offsets[budget - 1]) + 1
        taken.append(n)
        if budget is not None:
            budget -= n
            if budget == 0:
                return taken, s.next_offset
    return taken, plan.position


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
    return plan_fetch(part, start, end, read_committed).slices


def slices_in_ranges(
    snap: TableSnapshot, ranges: Iterable[OffsetRange], read_committed: bool
) -> list[SegmentSlice]:
    """Every slice of ``ranges``, in the order of the ranges, each in offset order."""
    out: list[SegmentSlice] = []
    for r in ranges:
        out.extend(slices_in_range(snap.partition(r.partition), r.start, r.end, read_committed))
    return out
