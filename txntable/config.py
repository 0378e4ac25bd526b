"""Configuration keys, their defaults and their validation (Kafka's names where Kafka has one).

Three kinds of settings live here:

* **Table configuration** (``Warehouse.create_table(configuration=...)``, stored in the
  table's ``metadata`` action): string keys and values, one :class:`TableConfigKey` per key
  in :data:`TABLE_CONFIG`. ``create_table`` refuses an unknown key, a malformed value, and
  a key whose feature is not built yet (``implemented=False``), so nobody believes data is
  retained or compacted when it is not. To implement one, set ``implemented=True`` on its
  row and read it with :func:`table_setting`.
* **Client arguments** of ``Producer`` and ``Consumer``: one row per argument in
  :data:`PRODUCER_ARGUMENTS` / :data:`CONSUMER_ARGUMENTS`, checked at construction by
  :func:`validate_arguments` (``InvalidConfigurationError`` naming the argument). A new
  argument needs a constructor parameter and a row.
* Internal defaults (``*_DEFAULT`` without a key).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from txntable.errors import InvalidConfigurationError
from txntable.layout import validate_id

# --- log ----------------------------------------------------------------------------------

COMMIT_BACKOFF_MS_DEFAULT = 5
COMMIT_BACKOFF_MAX_MS_DEFAULT = 500
#: How often (ms) a long-lived handle confirms with one LIST that the version its refresh
#: stopped at is the newest one (a deleted version is otherwise invisible to a refresh).
LOG_GAP_CHECK_INTERVAL_MS_DEFAULT = 60_000

#: Group commit (many writers of one log; see txntable.log.group_commit): on by default.
GROUP_COMMIT_DEFAULT = True
#: How long a committer's lease lasts unless renewed.
COMMIT_LEASE_MS_DEFAULT = 5_000
#: How long a writer waits for a round to decide its intent before committing one itself.
COMMIT_HELP_MS_DEFAULT = 500
#: A committer with no other writer's intent for this long steps down.
COMMIT_IDLE_MS_DEFAULT = 1_000
#: How often a waiting writer reads the log for its intent's outcome.
COMMIT_POLL_MS_DEFAULT = 10
#: Most intents one round decides.
COMMIT_MAX_ROUND_INTENTS_DEFAULT = 1_000
#: How long a commit may take before it fails with a timeout (outcome unknown).
COMMIT_TIMEOUT_MS_DEFAULT = 120_000

# --- table configuration keys -------------------------------------------------------------

#: Versions between checkpoints (0 disables them).
CHECKPOINT_INTERVAL = "checkpoint.interval"
CHECKPOINT_INTERVAL_DEFAULT = 100
#: Kafka's time-based retention: records older than this (their newest timestamp) go; -1
#: keeps all. Acts when maintenance runs (``Table.maintain``/``apply_retention``).
RETENTION_MS = "retention.ms"
RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000
#: Kafka's size-based retention per partition; -1 keeps all.
RETENTION_BYTES = "retention.bytes"
RETENTION_BYTES_DEFAULT = -1
#: ``delete`` (retention), ``compact`` (key compaction) or ``compact,delete``.
CLEANUP_POLICY = "cleanup.policy"
CLEANUP_POLICY_DEFAULT = "delete"
#: Target size of merged segments (segment merge and compaction).
SEGMENT_BYTES = "segment.bytes"
SEGMENT_BYTES_DEFAULT = 128 * 1024 * 1024
#: How long compaction keeps a tombstone (null value) after first compacting it.
DELETE_RETENTION_MS = "delete.retention.ms"
DELETE_RETENTION_MS_DEFAULT = 24 * 3600 * 1000
#: Compaction of a partition starts when this share of its bytes is not compacted yet.
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MIN_CLEANABLE_DIRTY_RATIO_DEFAULT = 0.5
#: When an idle producer's state (no open transaction) is dropped from snapshots.
PRODUCER_ID_EXPIRATION_MS = "producer.id.expiration.ms"
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 24 * 3600 * 1000
#: How long old versions stay readable (time travel): log versions before the oldest
#: retained checkpoint, and segment files no version in the window references, go after it.
VERSION_RETENTION_MS = "version.retention.ms"
VERSION_RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000
#: Below this, a slow writer's not-yet-committed segment could be deleted by vacuum.
VERSION_RETENTION_MS_MIN = 3600 * 1000
#: How often a producer checks, after a commit, whether the table needs maintenance
#: (-1: never). The work itself runs in a background thread, never on the commit path.
MAINTENANCE_INTERVAL_MS = "maintenance.interval.ms"
MAINTENANCE_INTERVAL_MS_DEFAULT = 5 * 60 * 1000
#: Retained entries on a partition from which that check starts a merge.
MAINTENANCE_MERGE_MIN_ENTRIES = "maintenance.merge.min.entries"
MAINTENANCE_MERGE_MIN_ENTRIES_DEFAULT = 1000
#: Publish a Delta Lake mirror of read_committed at ``<table>/_delta_log/`` (see
#: txntable.mirror): writers publish in the background after their commits.
MIRROR_DELTA = "mirror.delta"
MIRROR_DELTA_DEFAULT = "false"
#: Publish an Iceberg (format v2) mirror of read_committed at ``<table>/metadata/`` (needs
#: pyiceberg: the ``txntable[iceberg]`` extra), in the background like ``mirror.delta``.
MIRROR_ICEBERG = "mirror.iceberg"
MIRROR_ICEBERG_DEFAULT = "false"
#: At most one background publish per this many ms (-1: only on demand).
MIRROR_INTERVAL_MS = "mirror.interval.ms"
MIRROR_INTERVAL_MS_DEFAULT = 1000

# --- producer -----------------------------------------------------------------------------

BATCH_SIZE_DEFAULT = 16384
LINGER_MS_DEFAULT = 5
BUFFER_MEMORY_DEFAULT = 32 * 1024 * 1024
MAX_BLOCK_MS_DEFAULT = 60_000
MAX_REQUEST_SIZE_DEFAULT = 1024 * 1024
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
DELIVERY_TIMEOUT_MS_DEFAULT = 120_000
#: How long a PrepareCommit / PrepareAbort is left to its producer before any reader or
#: writer that sees it pinning a table's LSO completes it (the decision is durable).
STUCK_TRANSACTION_GRACE_MS_DEFAULT = 10_000
#: Whether a client finishes transactions dead producers left stuck (False for clients
#: with read-only credentials; then only ``recover`` and the producers' own restarts do).
FINISH_STUCK_TRANSACTIONS_DEFAULT = True
PRODUCER_ID_BLOCK_SIZE_DEFAULT = 1000

# --- recovery -----------------------------------------------------------------------------

#: How long ``recover()`` retries transient storage errors (of its listing, and per id).
RECOVERY_TIMEOUT_MS_DEFAULT = 60_000

# --- consumer -----------------------------------------------------------------------------

MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BACKOFF_MS_DEFAULT = 20
AUTO_COMMIT_INTERVAL_MS_DEFAULT = 5000
#: Kafka's ``fetch.max.bytes``: segment bytes a consumer fetches ahead of its positions.
FETCH_MAX_BYTES_DEFAULT = 52_428_800
#: Kafka's group membership defaults (``session.timeout.ms`` since 3.0,
#: ``heartbeat.interval.ms``, ``max.poll.interval.ms``, ``partition.assignment.strategy``).
SESSION_TIMEOUT_MS_DEFAULT = 45_000
HEARTBEAT_INTERVAL_MS_DEFAULT = 3_000
MAX_POLL_INTERVAL_MS_DEFAULT = 300_000
PARTITION_ASSIGNMENT_STRATEGY_DEFAULT: tuple[str, ...] = ("range", "cooperative-sticky")
#: Kafka's ``metadata.max.age.ms``: how often a pattern subscription looks for new tables.
METADATA_MAX_AGE_MS_DEFAULT = 300_000

# --- readers (Consumer, Table.scan) -------------------------------------------------------

#: Kafka's consumer ``request.timeout.ms``: how long a reader retries a failing storage
#: request (a log version, a segment) before raising ``KafkaTimeoutError``.
REQUEST_TIMEOUT_MS_DEFAULT = 30_000

#: Threads fetching segments at once: object-store reads are latency bound, not CPU bound.
READ_WORKERS_DEFAULT = 16

#: A scan's segments fetched at once. Measured on the moto server (bench/README.md,
#: consume.py): 32 threads were 13-24% faster than 16 at +60 ms per request, -2 to +12% at
#: +5 and +20 ms, 64 no better than 32; memory stays bounded by ``max_bytes_in_flight``.
SCAN_WORKERS_DEFAULT = 32


# --- validators ---------------------------------------------------------------------------

#: ``validator(name, value)`` returns the value (normalised) or raises
#: ``InvalidConfigurationError`` naming ``name``.
Validator = Callable[[str, object], object]


def is_int(value: object) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_at_least(minimum: int) -> Validator:
    """An ``int`` (not a ``bool``) that is ``>= minimum``."""

    def check(name: str, value: object) -> object:
        if not is_int(value):
            raise InvalidConfigurationError(
                f"{name} must be an integer, not {type(value).__name__} {value!r:.40}"
            )
        assert isinstance(value, int)
        if value < minimum:
            raise InvalidConfigurationError(f"{name} must be >= {minimum}, got {value}")
        return value

    return check


def one_of(*choices: str) -> Validator:
    """One of the given strings."""

    def check(name: str, value: object) -> object:
        if value not in choices:
            raise InvalidConfigurationError(
                f"{name} must be one of {', '.join(choices)}; got {value!r:.40}"
            )
        return value

    return check


def boolean(name: str, value: object) -> object:
    """``True`` or ``False`` (not a truthy value of another type)."""
    if not isinstance(value, bool):
        raise InvalidConfigurationError(
            f"{name} must be True or False, not {type(value).__name__} {value!r:.40}"
        )
    return value


def non_empty_string(name: str, value: object) -> object:
    """A non-empty ``str``."""
    if not isinstance(value, str) or not value:
        raise InvalidConfigurationError(f"{name} must be a non-empty string, got {value!r:.40}")
    return value


def legal_id(name: str, value: object) -> object:
    """A group or transactional id: a non-empty ``str`` of legal characters.

    Raises:
        InvalidTableNameError: For characters outside ``[A-Za-z0-9._-]`` or too long.
    """
    non_empty_string(name, value)
    assert isinstance(value, str)
    return validate_id(name, value)


def optional(validator: Validator) -> Validator:
    """``None`` or what ``validator`` accepts."""

    def check(name: str, value: object) -> object:
        return None if value is None else validator(name, value)

    return check


def assignment_strategy(name: str, value: object) -> object:
    """An assignor name or a non-empty list of them (``range``, ``cooperative-sticky``)."""
    from txntable.groups.assignors import check_strategies

    return check_strategies(value)


def validate_arguments(rows: Mapping[str, Validator], values: Mapping[str, object]) -> None:
    """Check every argument named in ``rows`` (a constructor passes its ``locals()``).

    Raises:
        InvalidConfigurationError: Naming the first argument that is malformed.
    """
    for name, validator in rows.items():
        validator(name, values[name])


#: ``Producer.__init__`` arguments (Kafka's ranges, except that sizes must allow a record).
PRODUCER_ARGUMENTS: dict[str, Validator] = {
    "transactional_id": optional(legal_id),
    "enable_idempotence": boolean,
    "batch_size": int_at_least(0),
    "linger_ms": int_at_least(0),
    "buffer_memory": int_at_least(1),
    "max_block_ms": int_at_least(0),
    "max_request_size": int_at_least(1),
    "transaction_timeout_ms": int_at_least(1),
    "delivery_timeout_ms": int_at_least(0),
    "auto_maintenance": boolean,
}

#: ``Consumer.__init__`` arguments.
CONSUMER_ARGUMENTS: dict[str, Validator] = {
    "isolation_level": one_of("read_uncommitted", "read_committed"),
    "auto_offset_reset": one_of("earliest", "latest", "none"),
    "max_poll_records": int_at_least(1),
    "fetch_backoff_ms": int_at_least(0),
    "group_id": optional(legal_id),
    "enable_auto_commit": optional(boolean),
    "auto_commit_interval_ms": int_at_least(0),
    "group_generation": int_at_least(-1),
    "unstable_offset_timeout_ms": int_at_least(0),
    "fetch_max_bytes": int_at_least(1),
    "client_id": non_empty_string,
    "group_instance_id": optional(legal_id),
    "session_timeout_ms": int_at_least(1),
    "heartbeat_interval_ms": int_at_least(1),
    "max_poll_interval_ms": int_at_least(1),
    "partition_assignment_strategy": assignment_strategy,
    "metadata_max_age_ms": int_at_least(0),
    "consumer_timeout_ms": optional(int_at_least(0)),
    "request_timeout_ms": int_at_least(0),
}

#: ``Table.scan`` arguments (offsets and partitions are checked by the planning).
SCAN_ARGUMENTS: dict[str, Validator] = {
    "isolation_level": one_of("read_committed", "read_uncommitted"),
    "max_workers": int_at_least(1),
    "max_bytes_in_flight": int_at_least(1),
    "request_timeout_ms": int_at_least(0),
}


# --- table configuration ------------------------------------------------------------------


def _parse_int_at_least(minimum: int) -> Callable[[str], object]:
    def parse(raw: str) -> object:
        text = raw.strip()
        if not re.fullmatch(r"-?[0-9]+", text):
            raise ValueError(f"must be an integer >= {minimum}")
        value = int(text)
        if value < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return value

    return parse


def _parse_cleanup_policy(raw: str) -> object:
    policies = {p.strip() for p in raw.split(",")}
    if not policies or not policies <= {"delete", "compact"}:
        raise ValueError("must be delete, compact or compact,delete")
    return frozenset(policies)


def _parse_bool(raw: str) -> object:
    text = raw.strip().lower()
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


def _parse_ratio(raw: str) -> object:
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be a number in [0, 1]")
    return value


@dataclass(frozen=True)
class TableConfigKey:
    """One table configuration key: its default, its value parser, and whether it works.

    ``parse`` takes the stored string and returns the value, raising ``ValueError`` (with
    the rule the value breaks) for a malformed one.
    """

    name: str
    default: str
    parse: Callable[[str], object]
    doc: str
    #: ``False``: the feature is not built yet, so ``create_table`` refuses the key.
    implemented: bool = True


#: Every table configuration key txntable knows.
TABLE_CONFIG: dict[str, TableConfigKey] = {
    key.name: key
    for key in (
        TableConfigKey(
            CHECKPOINT_INTERVAL,
            str(CHECKPOINT_INTERVAL_DEFAULT),
            _parse_int_at_least(0),
            "log versions between checkpoints (0 disables them)",
        ),
        TableConfigKey(
            RETENTION_MS,
            str(RETENTION_MS_DEFAULT),
            _parse_int_at_least(-1),
            "delete records older than this (ms; -1 keeps all)",
        ),
        TableConfigKey(
            RETENTION_BYTES,
            str(RETENTION_BYTES_DEFAULT),
            _parse_int_at_least(-1),
            "delete the oldest records of a partition beyond this size (-1 keeps all)",
        ),
        TableConfigKey(
            CLEANUP_POLICY,
            CLEANUP_POLICY_DEFAULT,
            _parse_cleanup_policy,
            "delete and/or compact old records",
        ),
        TableConfigKey(
            SEGMENT_BYTES,
            str(SEGMENT_BYTES_DEFAULT),
            _parse_int_at_least(1),
            "target size of merged segments",
        ),
        TableConfigKey(
            DELETE_RETENTION_MS,
            str(DELETE_RETENTION_MS_DEFAULT),
            _parse_int_at_least(0),
            "how long compaction keeps tombstones (ms)",
        ),
        TableConfigKey(
            MIN_CLEANABLE_DIRTY_RATIO,
            str(MIN_CLEANABLE_DIRTY_RATIO_DEFAULT),
            _parse_ratio,
            "share of uncompacted bytes from which compaction runs",
        ),
        TableConfigKey(
            PRODUCER_ID_EXPIRATION_MS,
            str(PRODUCER_ID_EXPIRATION_MS_DEFAULT),
            _parse_int_at_least(1),
            "when an idle producer's state is dropped (ms)",
        ),
        TableConfigKey(
            VERSION_RETENTION_MS,
            str(VERSION_RETENTION_MS_DEFAULT),
            _parse_int_at_least(VERSION_RETENTION_MS_MIN),
            "how long old versions stay readable (time travel, ms)",
        ),
        TableConfigKey(
            MAINTENANCE_INTERVAL_MS,
            str(MAINTENANCE_INTERVAL_MS_DEFAULT),
            _parse_int_at_least(-1),
            "how often a producer checks whether maintenance is due (ms; -1 never)",
        ),
        TableConfigKey(
            MAINTENANCE_MERGE_MIN_ENTRIES,
            str(MAINTENANCE_MERGE_MIN_ENTRIES_DEFAULT),
            _parse_int_at_least(2),
            "retained entries of a partition from which a producer starts a merge",
        ),
        TableConfigKey(
            MIRROR_DELTA,
            MIRROR_DELTA_DEFAULT,
            _parse_bool,
            "publish a Delta Lake mirror of read_committed in <table>/_delta_log/",
        ),
        TableConfigKey(
            MIRROR_ICEBERG,
            MIRROR_ICEBERG_DEFAULT,
            _parse_bool,
            "publish an Iceberg mirror of read_committed in <table>/metadata/",
        ),
        TableConfigKey(
            MIRROR_INTERVAL_MS,
            str(MIRROR_INTERVAL_MS_DEFAULT),
            _parse_int_at_least(-1),
            "at most one background publish of the mirrors per this many ms (-1 never)",
        ),
    )
}


def validate_table_configuration(configuration: object) -> dict[str, str]:
    """Check a ``create_table`` configuration; return it with values as strings.

    Values may be given as ``str`` or ``int``; they are stored as strings.

    Raises:
        InvalidConfigurationError: It is not a mapping of string keys; a key is unknown
            (with the closest known one) or not implemented yet; a value is malformed.
    """
    if configuration is None:
        return {}
    if not isinstance(configuration, Mapping):
        raise InvalidConfigurationError(
            f"configuration must be a mapping of key to value, not {type(configuration).__name__}"
        )
    out: dict[str, str] = {}
    for name, value in configuration.items():
        if not isinstance(name, str):
            raise InvalidConfigurationError(f"configuration key {name!r} is not a string")
        key = TABLE_CONFIG.get(name)
        if key is None:
            close = difflib.get_close_matches(name, TABLE_CONFIG, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InvalidConfigurationError(
                f"unknown table configuration key {name!r}{hint}; known keys: "
                f"{', '.join(k for k, v in TABLE_CONFIG.items() if v.implemented)}"
            )
        if not key.implemented:
            raise InvalidConfigurationError(
                f"table configuration key {name!r} ({key.doc}) is not implemented yet: "
                "txntable would store it but not act on it, so it is refused"
            )
        if not (isinstance(value, str) or is_int(value)):
            raise InvalidConfigurationError(
                f"configuration {name} must be a string or an integer, not "
                f"{type(value).__name__}"
            )
        text = str(value)
        try:
            key.parse(text)
        except ValueError as e:
            raise InvalidConfigurationError(f"{name} {e}, got {text!r}") from None
        out[name] = text
    return out


def table_setting(configuration: Mapping[str, str], name: str) -> object:
    """The parsed value of table configuration key ``name`` (its default when unset).

    Raises:
        InvalidConfigurationError: If the stored value is malformed (a reader should warn
            and use the default: another client may have written it).
    """
    key = TABLE_CONFIG[name]
    raw = configuration.get(name, key.default)
    try:
        return key.parse(raw)
    except ValueError as e:
        raise InvalidConfigurationError(f"{name} {e}, got {raw!r}") from None
