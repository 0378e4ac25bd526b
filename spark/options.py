"""Options of the ``txntable`` Spark data source: parsing and validation, no Spark needed.

Spark hands a data source its options as a case-insensitive mapping whose keys are already
lower-cased; every name below is matched case-insensitively, as Spark's own sources do. An
option that is not listed here is refused with the list of accepted ones (never ignored);
options of Spark's Kafka source that make no sense for a table are refused with the reason.

Read options (batch and streaming):

* ``path`` (what ``load(path)`` sets): ``<warehouse URL>/<table>``; the last path component is
  the table name. Alternatively ``warehouse`` + ``table``.
* ``isolation.level`` (aliases ``isolationLevel`` and ``kafka.isolation.level``, the Kafka
  source's spelling): ``read_committed`` (default) or ``read_uncommitted``.
* ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON as in Spark's Kafka
  source, ``{"orders": {"0": 23, "1": -2}}`` with ``-2`` = earliest and ``-1`` = latest;
  partitions left out take the default (batch: earliest / latest; streaming start: the
  ``startingOffsets`` default, ``latest``). ``endingOffsets`` is for batch reads only.
* ``versionAsOf``: read the table as of that log version (batch only).
* ``failOnDataLoss`` (default ``true``): a requested offset below the log start offset is an
  error; with ``false`` it is moved up to the log start offset.
* ``maxBytesPerPartition`` (default 128 MiB) and ``minPartitions`` (default: the driver's
  cores, with input partitions of at least 4 MiB): how segments are packed into Spark input
  partitions.
* ``includeHeaders`` (default ``true``, unlike the Kafka source): ``false`` drops the
  ``headers`` column.
* ``finishStuckTransactions`` (default ``true``): complete a transaction that a dead producer
  left prepared (PrepareCommit / PrepareAbort) and that pins the LSO; ``false`` for
  read-only credentials (see ``Warehouse(finish_stuck_transactions=...)``).
* Streaming only, with Spark's Kafka-source semantics: ``maxOffsetsPerTrigger`` (at most this
  many offsets per micro-batch, split over partitions by backlog), ``minOffsetsPerTrigger``
  (wait until this many offsets are available, but no longer than ``maxTriggerDelay``,
  default ``15m``, since the last micro-batch or the query's first trigger),
  ``maxFilesPerTrigger`` (at most this many segments per micro-batch).
* ``storage.<name>``: storage options of the warehouse (``storage.s3.endpoint``, …). They are
  passed to :func:`txntable.storage.open_store` and never logged or shown in a ``repr``.

Time-based positions (Spark's Kafka source): ``startingTimestamp`` / ``endingTimestamp`` (ms,
every partition) or ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` (JSON per
partition; others use the offset options), winning over ``startingOffsets`` /
``endingOffsets``: the first offset whose record timestamp is at or after the time; none at
the start is an error (``startingOffsetsByTimestampStrategy=error``, Spark's default) or the
latest offset (``latest``), none at the end is the latest offset. ``timestampAsOf`` (Delta's
time travel): the last version committed at or before a time (ms or ISO-8601).

Refused: ``subscribe``, ``assign``, ``subscribePattern`` (the path names the table).

Write options: ``path`` / ``warehouse`` + ``table``, ``storage.*``, ``maxBytesPerSegment``
(default 128 MiB of buffered input per segment), ``txnAppId`` and, for a batch write,
``txnVersion`` (Delta's idempotent write: a version at or below the last one recorded for
the app id is skipped; both or neither). A streaming write's ``txnAppId`` defaults to the
query's id from its checkpoint (see :mod:`txntable_spark.checkpoint`); Spark's own
``checkpointLocation`` and ``queryName`` are accepted there.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from txntable.errors import InvalidConfigurationError
from txntable.layout import validate_table_name
from txntable.protocol.schema import TypedLayout
from txntable.read.planning import (
    EARLIEST,
    LATEST,
    OffsetSpec,
)
from txntable.storage import check_storage_options
from txntable.structs import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    IsolationLevel,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "OffsetSpec",
    "ReadOptions",
    "TableLocation",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]


STORAGE_PREFIX = "storage."
DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
DEFAULT_MAX_BYTES_PER_SEGMENT = 128 * 1024 * 1024
#: Spark's Kafka source default of ``maxTriggerDelay``.
DEFAULT_MAX_TRIGGER_DELAY = "15m"

#: Where an option may be used. Each option's canonical spelling, matched
#: case-insensitively; ``storage.*`` is handled apart (it is the storage layer's to check).
_LOCATION = ("path", "warehouse", "table")
READ_OPTIONS = frozenset(
    {
        *_LOCATION,
        "isolation.level",
        "isolationLevel",
        "kafka.isolation.level",
        "startingOffsets",
        "failOnDataLoss",
        "maxBytesPerPartition",
        "minPartitions",
        "includeHeaders",
        "finishStuckTransactions",
        "columns",
    }
)
#: Spark's Kafka-source time-based positions (and Delta's time travel by timestamp).
STARTING_TIME_OPTIONS = frozenset(
    {"startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy"}
)
BATCH_READ_OPTIONS = (
    READ_OPTIONS
    | STARTING_TIME_OPTIONS
    | {"endingOffsets", "versionAsOf", "endingTimestamp", "endingOffsetsByTimestamp"}
    | {"timestampAsOf", "pushFilters"}
)
STREAM_READ_OPTIONS = READ_OPTIONS | STARTING_TIME_OPTIONS | {
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxFilesPerTrigger",
}
WRITE_OPTIONS = frozenset({*_LOCATION, "txnAppId", "maxBytesPerSegment", "mergeSchema"})
BATCH_WRITE_OPTIONS = WRITE_OPTIONS | {"txnVersion"}
#: ``checkpointLocation`` and ``queryName`` are set by Spark itself.
STREAM_WRITE_OPTIONS = WRITE_OPTIONS | {"checkpointLocation", "queryName"}

#: Kafka-source options refused with a reason rather than as unknown.
REFUSED_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        ("subscribe", "assign", "subscribePattern"),
        "the path (or warehouse + table) names the one table a txntable source reads",
    ),
}

_MASK = "***"


@dataclass(frozen=True)
class TableLocation:
    """Where a table lives: warehouse URL, table name and storage options."""

    warehouse_url: str
    table: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        # Storage options carry credentials: show only their names.
        shown = {k: _MASK for k in sorted(self.storage_options)}
        return f"TableLocation({self.warehouse_url!r}, {self.table!r}, storage_options={shown})"


@dataclass(frozen=True)
class TimestampSpec:
    """Positions by timestamp (ms): one for every partition, or per partition."""

    default: int | None = None
    timestamps: dict[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int | None:
        """The timestamp asked for ``partition``, or ``None`` (use the offset option)."""
        return self.timestamps.get(partition, self.default)


@dataclass(frozen=True)
class ReadOptions:
    """Validated read options."""

    location: TableLocation
    isolation_level: IsolationLevel = READ_COMMITTED
    starting: OffsetSpec = OffsetSpec(EARLIEST)
    ending: OffsetSpec = OffsetSpec(LATEST)
    version_as_of: int | None = None
    fail_on_data_loss: bool = True
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    max_files_per_trigger: int | None = None
    include_headers: bool = True
    finish_stuck_transactions: bool = True
    #: ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (they take precedence over
    #: ``startingOffsets``, as in Spark), and the same for the end.
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    #: ``startingOffsetsByTimestampStrategy``: ``error`` (Spark's default) or ``latest``.
    starting_timestamp_strategy: str = "error"
    #: ``timestampAsOf`` (Delta): read the last version committed at or before this (ms).
    timestamp_as_of: int | None = None
    #: Typed tables: the columns to read (``columns`` option or a user-given schema);
    #: ``None``: all.
    columns: tuple[str, ...] | None = None
    #: Typed tables: the layout the read was planned with (set by the source once it has
    #: loaded the table; ``None``: Kafka's record).
    layout: TypedLayout | None = None
    #: Typed tables: the exact Arrow schema of the batches Spark expects.
    arrow_schema: pa.Schema | None = None

    @property
    def read_committed(self) -> bool:
        """Whether the reader stops at the LSO and skips aborted transactions."""
        return self.isolation_level == READ_COMMITTED


@dataclass(frozen=True)
class WriteOptions:
    """Validated write options."""

    location: TableLocation
    txn_app_id: str | None = None
    max_bytes_per_segment: int = DEFAULT_MAX_BYTES_PER_SEGMENT
    #: Batch writes: Delta's ``txnVersion`` (with ``txn_app_id``).
    txn_version: int | None = None
    #: Typed tables: evolve the table's schema to hold the DataFrame's columns.
    merge_schema: bool = False


def check_option_names(options: Mapping[str, str], accepted: frozenset[str], what: str) -> None:
    """Refuse every option ``what`` (e.g. ``"a batch read"``) does not accept.

    ``storage.*`` options pass: the storage layer validates them.

    Raises:
        InvalidConfigurationError: Naming the option, and listing the accepted ones or why
            it is refused.
    """
    known = {name.lower(): name for name in accepted}
    refused = {name.lower(): (name, why) for name, why in REFUSED_OPTIONS.items()}
    everywhere = {
        n.lower(): n
        for n in BATCH_READ_OPTIONS | STREAM_READ_OPTIONS | BATCH_WRITE_OPTIONS
        | STREAM_WRITE_OPTIONS
    }
    for key in options:
        lowered = key.lower()
        if lowered in known or (
            lowered.startswith(STORAGE_PREFIX) and len(lowered) > len(STORAGE_PREFIX)
        ):
            continue
        if lowered in refused:
            name, why = refused[lowered]
            raise InvalidConfigurationError(f"option {name} is not supported: {why}")
        if lowered in everywhere:
            raise InvalidConfigurationError(
                f"option {everywhere[lowered]} does not apply to {what}"
            )
        raise InvalidConfigurationError(
            f"unknown option {key!r} for {what}; accepted: {', '.join(sorted(accepted))} "
            f"and {STORAGE_PREFIX}<storage option>"
        )


def _get(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None:
            return str(value)
    return None


def split_table_path(path: str) -> tuple[str, str]:
    """Split ``<warehouse URL>/<table>`` into the warehouse URL and the table name.

    Raises:
        InvalidConfigurationError: If the path has no table component.
        InvalidTableNameError: If the last component is not a legal table name.
    """
    stripped = path.rstrip("/")
    scheme_end = stripped.find("://")
    # Never split inside "scheme://" (e.g. "memory://orders" has no warehouse part).
    floor = scheme_end + 3 if scheme_end >= 0 else 0
    cut = stripped.rfind("/", floor)
    if cut < 0 or not stripped[cut + 1 :]:
        raise InvalidConfigurationError(
            f"path {path!r} must be <warehouse URL>/<table name>, e.g. s3://bucket/lake/orders"
        )
    warehouse, table = stripped[:cut], stripped[cut + 1 :]
    if not warehouse or warehouse.endswith("://"):
        if scheme_end >= 0 and stripped.startswith("file://"):
            warehouse = "file:///"
        elif not warehouse:
            warehouse = "/"  # "/orders": a table at the filesystem root
        else:
            raise InvalidConfigurationError(f"path {path!r} names no warehouse before the table")
    validate_table_name(table)
    return warehouse, table


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``storage.``-prefixed options, with the prefix removed."""
    return {
        k[len(STORAGE_PREFIX) :]: str(v)
        for k, v in options.items()
        if k.lower().startswith(STORAGE_PREFIX) and len(k) > len(STORAGE_PREFIX)
    }


def parse_location(options: Mapping[str, str]) -> TableLocation:
    """The table location from ``path`` or ``warehouse`` + ``table``.

    Raises:
        InvalidConfigurationError: If neither form is given, or both disagree, or a
            ``storage.*`` option is unknown to the warehouse's backend.
    """
    path = _get(options, "path")
    warehouse = _get(options, "warehouse")
    table = _get(options, "table")
    if path:
        url, name = split_table_path(path)
        if table is not None and table != name:
            raise InvalidConfigurationError(f"option table={table!r} disagrees with path {path!r}")
    elif warehouse and table:
        url, name = warehouse.rstrip("/") or "/", validate_table_name(table)
    else:
        raise InvalidConfigurationError(
            "txntable needs a path (load('<warehouse>/<table>')) or options warehouse and table"
        )
    storage = storage_options(options)
    check_storage_options(url, storage)  # refused here, at planning, not in a task
    return TableLocation(url, name, storage)


def parse_isolation_level(value: str | None) -> IsolationLevel:
    """``read_committed`` (default) or ``read_uncommitted``.

    Raises:
        InvalidConfigurationError: For any other value.
    """
    if value is None:
        return READ_COMMITTED
    v = value.strip().lower()
    if v == READ_COMMITTED:
        return READ_COMMITTED
    if v == READ_UNCOMMITTED:
        return READ_UNCOMMITTED
    raise InvalidConfigurationError(
        f"isolation.level must be {READ_COMMITTED} or {READ_UNCOMMITTED}, not {value!r}"
    )


def parse_offset_spec(value: str | None, table: str, default: int, name: str) -> OffsetSpec:
    """Parse ``earliest`` / ``latest`` / Kafka-source JSON offsets for ``table``.

    Args:
        value: The option value, or ``None`` for ``default``.
        table: Table name the JSON must be keyed by (Kafka's topic).
        default: ``EARLIEST`` or ``LATEST``, for ``None`` and for unlisted partitions.
        name: Option name, for messages.

    Raises:
        InvalidConfigurationError: If the value is not one of the forms, names another
            table, or holds a negative partition or an offset below ``-2``.
    """
    if value is None:
        return OffsetSpec(default)
    v = value.strip()
    if v.lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if v.lower() == "latest":
        return OffsetSpec(LATEST)
    try:
        obj = json.loads(v)
    except json.JSONDecodeError:
        raise InvalidConfigurationError(
            f"{name} must be earliest, latest or JSON like "
            f'{{"{table}": {{"0": 23, "1": -2}}}}, not {value!r}'
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(x, dict) for x in obj.values()):
        raise InvalidConfigurationError(f"{name}: JSON must map table -> partition -> offset")
    others = sorted(set(obj) - {table})
    if others:
        raise InvalidConfigurationError(
            f"{name} names table(s) {others}, the source reads {table!r}"
        )
    offsets: dict[int, int] = {}
    for p, off in obj.get(table, {}).items():
        if not re.fullmatch(r"\d+", str(p)) or isinstance(off, bool) or not isinstance(off, int):
            raise InvalidConfigurationError(f"{name}: bad partition/offset {p!r}: {off!r}")
        if off < EARLIEST:
            raise InvalidConfigurationError(f"{name}: offset {off} of partition {p} is below -2")
        offsets[int(p)] = off
    return OffsetSpec(default, offsets)


def parse_timestamps(
    options: Mapping[str, str], global_name: str, by_partition_name: str, table: str
) -> TimestampSpec | None:
    """``startingTimestamp`` (one ms timestamp) or ``startingOffsetsByTimestamp`` (JSON
    ``{"table": {"0": ms}}``), and the ending pair; the global one wins, as in Spark.

    Raises:
        InvalidConfigurationError: Not a non-negative integer, or malformed JSON.
    """
    value = _get(options, global_name)
    if value is not None:
        if not re.fullmatch(r"\s*\d+\s*", value):
            raise InvalidConfigurationError(
                f"{global_name} must be a timestamp in ms since the epoch, not {value!r}"
            )
        return TimestampSpec(int(value))
    value = _get(options, by_partition_name)
    if value is None:
        return None
    spec = parse_offset_spec(value, table, LATEST, by_partition_name)
    if spec.default != LATEST or not spec.offsets:
        raise InvalidConfigurationError(
            f'{by_partition_name} must be JSON like {{"{table}": {{"0": 1732280000000}}}}'
        )
    if any(ts < 0 for ts in spec.offsets.values()):
        raise InvalidConfigurationError(f"{by_partition_name}: timestamps must be >= 0")
    return TimestampSpec(None, dict(spec.offsets))


def parse_timestamp_as_of(value: str | None) -> int | None:
    """``timestampAsOf``: ms since the epoch, or an ISO-8601 date / date-time (UTC if no
    zone), as Delta accepts.

    Raises:
        InvalidConfigurationError: Anything else.
    """
    if value is None:
        return None
    v = value.strip()
    if re.fullmatch(r"\d+", v):
        return int(v)
    try:
        parsed = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidConfigurationError(
            f"timestampAsOf must be ms since the epoch or an ISO-8601 date-time, not {value!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return int(parsed.timestamp() * 1000)


def parse_int(
    options: Mapping[str, str], name: str, default: int | None, minimum: int
) -> int | None:
    """An integer option ``>= minimum``, or ``default`` when absent.

    Raises:
        InvalidConfigurationError: If the value is not an integer or is too small.
    """
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidConfigurationError(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise InvalidConfigurationError(f"{name} must be >= {minimum}, not {value}")
    return value


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    """A ``true``/``false`` option.

    Raises:
        InvalidConfigurationError: For any other value.
    """
    raw = _get(options, name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v not in ("true", "false"):
        raise InvalidConfigurationError(f"{name} must be true or false, not {raw!r}")
    return v == "true"


_DURATION_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def parse_duration_ms(name: str, value: str) -> int:
    """A Spark time string (``500ms``, ``30s``, ``15m``, ``1h``, ``2d``; bare = ms) in ms.

    Raises:
        InvalidConfigurationError: For anything else, or a negative duration.
    """
    match = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", value.lower())
    if match is None or match.group(2) not in ("", *_DURATION_UNITS_MS):
        raise InvalidConfigurationError(
            f"{name} must be a duration like 500ms, 30s, 15m or 1h, not {value!r}"
        )
    return int(match.group(1)) * _DURATION_UNITS_MS.get(match.group(2), 1)


def parse_read_options(options: Mapping[str, str], streaming: bool = False) -> ReadOptions:
    """Validate the options of a batch (or, with ``streaming``, a streaming) read.

    Raises:
        InvalidConfigurationError: For a malformed or contradictory option.
    """
    check_option_names(
        options,
        STREAM_READ_OPTIONS if streaming else BATCH_READ_OPTIONS,
        "a streaming read" if streaming else "a batch read",
    )
    location = parse_location(options)
    levels: dict[str, IsolationLevel] = {
        name: parse_isolation_level(value)
        for name in ("isolation.level", "isolationLevel", "kafka.isolation.level")
        if (value := _get(options, name)) is not None
    }
    if len(set(levels.values())) > 1:
        raise InvalidConfigurationError(f"isolation level options disagree: {levels}")
    isolation: IsolationLevel = next(iter(levels.values()), READ_COMMITTED)
    starting = parse_offset_spec(
        _get(options, "startingOffsets"),
        location.table,
        LATEST if streaming else EARLIEST,
        "startingOffsets",
    )
    ending = parse_offset_spec(
        _get(options, "endingOffsets"), location.table, LATEST, "endingOffsets"
    )
    # (endingOffsets and versionAsOf on a streaming read are refused by check_option_names.)
    version = parse_int(options, "versionAsOf", None, 0)
    if not streaming:
        # As in Spark's Kafka source: a batch read cannot start at "latest" or end at
        # "earliest" (both would move under the query).
        if starting.default == LATEST or LATEST in starting.offsets.values():
            raise InvalidConfigurationError(
                "startingOffsets may not be latest (-1) for a batch read"
            )
        if ending.default == EARLIEST or EARLIEST in ending.offsets.values():
            raise InvalidConfigurationError(
                "endingOffsets may not be earliest (-2) for a batch read"
            )
    max_bytes = parse_int(options, "maxBytesPerPartition", DEFAULT_MAX_BYTES_PER_PARTITION, 1)
    assert max_bytes is not None
    max_offsets = parse_int(options, "maxOffsetsPerTrigger", None, 1)
    min_offsets = parse_int(options, "minOffsetsPerTrigger", None, 1)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise InvalidConfigurationError(
            f"minOffsetsPerTrigger ({min_offsets}) is greater than maxOffsetsPerTrigger "
            f"({max_offsets})"
        )
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidConfigurationError(
            f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}"
        )
    timestamp_as_of = parse_timestamp_as_of(_get(options, "timestampAsOf"))
    if timestamp_as_of is not None and version is not None:
        raise InvalidConfigurationError("give versionAsOf or timestampAsOf, not both")
    delay = _get(options, "maxTriggerDelay")
    if delay is not None and min_offsets is None:
        raise InvalidConfigurationError("maxTriggerDelay applies only with minOffsetsPerTrigger")
    return ReadOptions(
        location=location,
        isolation_level=isolation,
        starting=starting,
        ending=ending,
        version_as_of=version,
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", True),
        max_bytes_per_partition=max_bytes,
        min_partitions=parse_int(options, "minPartitions", None, 1),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=parse_duration_ms(
            "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY if delay is None else delay
        ),
        max_files_per_trigger=parse_int(options, "maxFilesPerTrigger", None, 1),
        include_headers=parse_bool(options, "includeHeaders", True),
        finish_stuck_transactions=parse_bool(options, "finishStuckTransactions", True),
        starting_timestamps=parse_timestamps(
            options, "startingTimestamp", "startingOffsetsByTimestamp", location.table
        ),
        ending_timestamps=parse_timestamps(
            options, "endingTimestamp", "endingOffsetsByTimestamp", location.table
        ),
        starting_timestamp_strategy=strategy,
        timestamp_as_of=timestamp_as_of,
        columns=parse_columns(options),
    )


def check_read_options(options: Mapping[str, str]) -> None:
    """Refuse, when a read is defined (``load()``), options that neither a batch nor a
    streaming read accepts: Spark asks a Python source for its schema then, for ``read`` and
    ``readStream`` alike and without saying which, and creates the streaming reader only at
    ``start()``. An option only the other kind of read takes is refused when the reader is
    created.

    Raises:
        InvalidConfigurationError: The streaming read's error if an option only a stream
            takes is given, else the batch read's.
    """
    try:
        parse_read_options(options, streaming=False)
    except InvalidConfigurationError as batch_error:
        try:
            parse_read_options(options, streaming=True)
        except InvalidConfigurationError as stream_error:
            only_stream = {n.lower() for n in STREAM_READ_OPTIONS - BATCH_READ_OPTIONS}
            if any(k.lower() in only_stream for k in options):
                raise stream_error from None
            raise batch_error from None


def parse_columns(options: Mapping[str, str]) -> tuple[str, ...] | None:
    """The ``columns`` option: comma-separated column names of a typed table.

    Raises:
        InvalidConfigurationError: Empty, or a name twice.
    """
    raw = _get(options, "columns")
    if raw is None:
        return None
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise InvalidConfigurationError(
            f"columns must be distinct comma-separated names, not {raw!r}"
        )
    return names


def parse_write_options(options: Mapping[str, str], streaming: bool = False) -> WriteOptions:
    """Validate the options of a batch (or, with ``streaming``, a streaming) write.

    Raises:
        InvalidConfigurationError: For a malformed option.
    """
    check_option_names(
        options,
        STREAM_WRITE_OPTIONS if streaming else BATCH_WRITE_OPTIONS,
        "a streaming write" if streaming else "a batch write",
    )
    location = parse_location(options)
    app_id = _get(options, "txnAppId")
    if app_id is not None and not app_id.strip():
        raise InvalidConfigurationError("txnAppId must not be empty")
    seg = parse_int(options, "maxBytesPerSegment", DEFAULT_MAX_BYTES_PER_SEGMENT, 1)
    assert seg is not None
    version = None if streaming else parse_int(options, "txnVersion", None, 0)
    if not streaming and (app_id is None) != (version is None):
        # Delta's rule: one without the other would silently write without idempotence.
        raise InvalidConfigurationError(
            "an idempotent batch write needs both txnAppId and txnVersion"
        )
    return WriteOptions(location, app_id, seg, version, parse_bool(options, "mergeSchema", False))
