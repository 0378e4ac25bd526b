"""Time-based read options resolved to offsets and versions on the driver.

``startingTimestamp`` & co. become concrete per-partition offsets of the snapshot being
planned (:func:`txntable.read.timestamps.offset_for_time`, reading at most one segment per
partition), and ``timestampAsOf`` a log version, before the usual offset planning runs.
"""

from __future__ import annotations

from dataclasses import replace

from txntable.errors import NoOffsetForPartitionError
from txntable.protocol.snapshot import TableSnapshot
from txntable.read.planning import LATEST, OffsetSpec
from txntable.read.timestamps import offset_for_time
from txntable.table import Table

from .options import ReadOptions, TimestampSpec


def _offsets(
    table: Table,
    snap: TableSnapshot,
    spec: TimestampSpec,
    fallback: OffsetSpec,
    isolation_level: str,
    on_none: str,
    name: str,
) -> OffsetSpec:
    offsets = dict(fallback.offsets)
    for part in snap.partitions:
        ts = spec.for_partition(part.partition)
        if ts is None:
            continue
        found = offset_for_time(table, snap, part.partition, ts, isolation_level, False)
        if found is not None:
            offsets[part.partition] = found.offset
        elif on_none == "error":
            raise NoOffsetForPartitionError(
                f"{name}: no record of {table.name} partition {part.partition} has a timestamp "
                f">= {ts} (startingOffsetsByTimestampStrategy=latest starts at the latest offset)"
            )
        else:
            offsets[part.partition] = LATEST
    return OffsetSpec(fallback.default, offsets)


def resolve_time_options(table: Table, snap: TableSnapshot, opts: ReadOptions) -> ReadOptions:
    """``opts`` with starting/ending timestamps replaced by offsets of ``snap``.

    Raises:
        NoOffsetForPartitionError: A starting timestamp matches nothing and the strategy
            is ``error`` (Spark's default).
    """
    starting, ending = opts.starting, opts.ending
    if opts.starting_timestamps is not None:
        starting = _offsets(
            table,
            snap,
            opts.starting_timestamps,
            starting,
            opts.isolation_level,
            opts.starting_timestamp_strategy,
            "startingTimestamp",
        )
    if opts.ending_timestamps is not None:
        # Spark's Kafka source: an ending timestamp that matches nothing reads to the end.
        ending = _offsets(
            table,
            snap,
            opts.ending_timestamps,
            ending,
            opts.isolation_level,
            "latest",
            "endingTimestamp",
        )
    return replace(
        opts, starting=starting, ending=ending, starting_timestamps=None, ending_timestamps=None
    )
