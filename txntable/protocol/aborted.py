"""read_committed filtering: which entries of a fetch range a committed reader may see.

This is the consumer algorithm of Kafka's fetcher (``CompletedFetch.nextFetchedRecord``):
aborted-transaction entries are kept in a min-heap by first offset; walking the entries in
offset order, every aborted entry whose first offset is at or below the current entry's last
offset makes its producer "aborted"; a transactional batch of an aborted producer is
skipped; that producer's ABORT marker clears it again. Markers themselves are never data.

One departure from Kafka: a producer is aborted only up to its index entry's ``lastOffset``
(the ABORT marker's offset), not until the marker is seen. A merge may have rewritten the
marker into a merged segment while the index entry stays (its transaction started before
the merged range, e.g. below the log start or in a run of its own); waiting for the marker
would hide every later transaction of that producer, committed ones too.

Both the Python consumer and the Spark reader use this one module. Because a segment is
exactly one producer batch, a skipped batch is skipped without reading its segment.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from txntable.protocol.actions import (
    AbortedTxn,
    Batch,
    Marker,
    Segment,
)

Entry = Batch | Marker | Segment


def classify_entries(
    entries: Iterable[Entry], aborted: Iterable[AbortedTxn]
) -> Iterator[tuple[Entry, bool]]:
    """Yield every entry with whether a read_committed reader returns its records.

    Args:
        entries: Batches and markers of one partition in offset order, all below the LSO.
        aborted: Aborted-transaction entries of that partition overlapping the range.

    Yields:
        ``(entry, visible)``: markers are never visible; a transactional batch of an aborted
        producer is not visible; every other batch is, and so is every merged segment
        (it holds committed records only).
    """
    heap = [(a.firstOffset, i, a.producerId, a.lastOffset) for i, a in enumerate(aborted)]
    heapq.heapify(heap)
    # producer id -> last offset (its ABORT marker) of the aborted transaction being walked
    aborted_pids: dict[int, int] = {}
    for entry in entries:
        pid = entry.producerId
        if pid >= 0:
            while heap and heap[0][0] <= entry.last_offset:
                _, _, aborted_pid, last = heapq.heappop(heap)
                aborted_pids[aborted_pid] = last
        if isinstance(entry, Marker):
            if entry.type == "ABORT":
                aborted_pids.pop(pid, None)
            yield entry, False
        else:
            hidden = entry.transactional and aborted_pids.get(pid, -1) >= entry.baseOffset
            yield entry, not hidden


def visible_batches(
    entries: Iterable[Entry], aborted: Iterable[AbortedTxn]
) -> Iterator[Batch | Segment]:
    """The batches and merged segments a read_committed reader returns, in offset order."""
    for entry, visible in classify_entries(entries, aborted):
        if visible:
            assert not isinstance(entry, Marker)
            yield entry
