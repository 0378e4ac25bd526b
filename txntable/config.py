"""Configuration keys and their defaults (Kafka's names where Kafka has the setting)."""

from __future__ import annotations

from txntable.errors import InvalidConfigurationError


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1.

    Raises:
        InvalidConfigurationError: Otherwise, naming the option.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfigurationError(f"{name} must be an integer >= 1, not {value!r}")
    return value

# Log
COMMIT_MAX_ATTEMPTS_DEFAULT = 50
COMMIT_BACKOFF_MS_DEFAULT = 5
COMMIT_BACKOFF_MAX_MS_DEFAULT = 500
CHECKPOINT_INTERVAL = "checkpoint.interval"
CHECKPOINT_INTERVAL_DEFAULT = 100

# Producer
BATCH_SIZE_DEFAULT = 16384
LINGER_MS_DEFAULT = 5
BUFFER_MEMORY_DEFAULT = 32 * 1024 * 1024
MAX_BLOCK_MS_DEFAULT = 60_000
MAX_REQUEST_SIZE_DEFAULT = 1024 * 1024
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
PRODUCER_ID_BLOCK_SIZE_DEFAULT = 1000

# Recovery
#: How long ``recover()`` retries transient storage errors (of its listing, and per id).
RECOVERY_TIMEOUT_MS_DEFAULT = 60_000

# Consumer
MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BACKOFF_MS_DEFAULT = 20
#: Kafka's ``fetch.max.bytes``: segment bytes a consumer fetches ahead of its positions.
FETCH_MAX_BYTES_DEFAULT = 52_428_800

# Readers (Consumer, Table.scan)
#: Threads fetching segments at once: object-store reads are latency bound, not CPU bound.
READ_WORKERS_DEFAULT = 16
