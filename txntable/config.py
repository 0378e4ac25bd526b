"""Configuration keys and their defaults (Kafka's names where Kafka has the setting)."""

from __future__ import annotations

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

# Table maintenance (table configuration keys; Kafka's names where Kafka has the setting)
SEGMENT_BYTES = "segment.bytes"
SEGMENT_BYTES_DEFAULT = 128 * 1024 * 1024
CLEANUP_POLICY = "cleanup.policy"
CLEANUP_POLICY_DEFAULT = "delete"
CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
RETENTION_MS = "retention.ms"
RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000
RETENTION_BYTES = "retention.bytes"
RETENTION_BYTES_DEFAULT = -1
DELETE_RETENTION_MS = "delete.retention.ms"
DELETE_RETENTION_MS_DEFAULT = 24 * 3600 * 1000
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MIN_CLEANABLE_DIRTY_RATIO_DEFAULT = 0.5
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
#: Retained entries on a partition below its LSO from which a producer starts a merge.
MAINTENANCE_MERGE_MIN_ENTRIES = "maintenance.merge.min.entries"
MAINTENANCE_MERGE_MIN_ENTRIES_DEFAULT = 1000
