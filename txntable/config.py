"""Configuration keys and their defaults (Kafka's names where Kafka has the setting)."""

from __future__ import annotations

# Log
COMMIT_MAX_ATTEMPTS_DEFAULT = 50
COMMIT_BACKOFF_MS_DEFAULT = 5
COMMIT_BACKOFF_MAX_MS_DEFAULT = 500
CHECKPOINT_INTERVAL = "checkpoint.interval"
CHECKPOINT_INTERVAL_DEFAULT = 100
#: How often (ms) a long-lived handle confirms with one LIST that the version its refresh
#: stopped at is the newest one (a deleted version is otherwise invisible to a refresh).
LOG_GAP_CHECK_INTERVAL_MS_DEFAULT = 60_000

# Producer
BATCH_SIZE_DEFAULT = 16384
LINGER_MS_DEFAULT = 5
BUFFER_MEMORY_DEFAULT = 32 * 1024 * 1024
MAX_BLOCK_MS_DEFAULT = 60_000
MAX_REQUEST_SIZE_DEFAULT = 1024 * 1024
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
#: How long a PrepareCommit / PrepareAbort is left to its producer before any reader or
#: writer that sees it pinning a table's LSO completes it (the decision is durable).
STUCK_TRANSACTION_GRACE_MS_DEFAULT = 10_000
#: Whether a client finishes transactions dead producers left stuck (False for clients
#: with read-only credentials; then only ``recover`` and the producers' own restarts do).
FINISH_STUCK_TRANSACTIONS_DEFAULT = True
PRODUCER_ID_BLOCK_SIZE_DEFAULT = 1000

# Consumer
MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BACKOFF_MS_DEFAULT = 20
