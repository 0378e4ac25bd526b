"""The txntable error hierarchy.

Every error raised on purpose by txntable derives from :class:`TxnTableError`. Names follow
Kafka's client exceptions where Kafka has one, so a Kafka user recognises them.
"""

from __future__ import annotations


class TxnTableError(Exception):
    """Root of every error raised by txntable."""


# --- storage -------------------------------------------------------------------------------


class StorageError(TxnTableError):
    """A storage request failed in a way the caller cannot fix by retrying the same request."""


class ObjectNotFoundError(StorageError):
    """The requested object does not exist."""


class PreconditionFailedError(StorageError):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


class ObjectExistsError(PreconditionFailedError):
    """``put_if_absent`` found the object already present."""


class TransientStorageError(StorageError):
    """A request whose outcome is unknown or that may succeed if retried (timeouts, 5xx, 409)."""


class BucketNotFoundError(StorageError):
    """The bucket (or container) of the warehouse does not exist."""


class InvalidPathError(TxnTableError):
    """A key or URL would escape the warehouse root or is otherwise malformed."""


class ConditionalWriteUnsupportedError(StorageError):
    """The backend cannot perform conditional writes (``put_if_absent`` / ``put_if_match``)."""


# --- log and protocol ------------------------------------------------------------------------


class CorruptLogError(TxnTableError):
    """A log version, checkpoint or coordinator object cannot be parsed or is inconsistent."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{message} ({path})" if path else message)
        self.path = path


class VersionNotFoundError(TxnTableError):
    """Time travel to a log version the table does not have (Delta's version-not-found)."""


class VersionNotAvailableError(VersionNotFoundError):
    """Time travel to a version whose log was truncated by maintenance (outside the window)."""

    def __init__(self, version: int, earliest: int) -> None:
        super().__init__(
            f"version {version} is no longer available: the log was truncated by maintenance "
            f"and the earliest readable version is {earliest}"
        )
        self.version = version
        self.earliest = earliest


class UnsupportedProtocolError(TxnTableError):
    """The table needs a reader or writer protocol version this client does not implement."""


class MissingSegmentError(TxnTableError):
    """A segment referenced by a committed batch is missing from storage."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class CommitConflictError(TxnTableError):
    """A log commit kept losing the race for the next version until retries ran out."""


class MirrorConflictError(TxnTableError):
    """The table's Delta mirror (``_delta_log/``) holds a commit, or its Iceberg mirror
    (``metadata/``) a snapshot, that no txntable publisher of this table wrote (a foreign
    writer), or belongs to another table: publishing stops."""


class MirrorUnsupportedError(TxnTableError):
    """The table cannot be mirrored as Delta reader 1 / writer 2 or Iceberg format v2 (a
    column type or a schema change that needs a newer protocol, a segment outside the
    table's directory)."""


class MirrorDependencyError(MirrorUnsupportedError):
    """Publishing the Iceberg mirror needs pyiceberg, which is not installed
    (``pip install 'txntable[iceberg]'``)."""


class SchemaMismatchError(TxnTableError):
    """Records or a segment do not match the table's record schema."""


# --- tables --------------------------------------------------------------------------------


class InvalidTableNameError(InvalidPathError):
    """A table, group or transactional id name is empty, too long or would escape the root."""


class TableNotFoundError(TxnTableError):
    """The warehouse has no table with that name."""


class TableExistsError(TxnTableError):
    """``create_table`` found a table with that name already."""


class TableInUseError(TxnTableError):
    """``drop_table`` found a transaction open on the table (its markers would have nowhere
    to go)."""


class UnknownTopicOrPartitionError(TxnTableError):
    """The partition number is outside the table's partitions."""


# --- producer ------------------------------------------------------------------------------


class ProducerFencedError(TxnTableError):
    """Another producer with the same transactional id (or a newer epoch) has taken over."""


class InvalidProducerEpochError(ProducerFencedError):
    """A batch or marker carries an epoch older than the one the log knows."""


class OutOfOrderSequenceError(TxnTableError):
    """A batch's sequence number does not follow the last one the log holds for the producer."""


class InvalidTxnStateError(TxnTableError):
    """The call is not legal in the producer's or coordinator's current transaction state."""


class RecordTooLargeError(TxnTableError):
    """A record is larger than ``max_request_size``."""


class OffsetsUnknownError(TxnTableError):
    """Records were committed, but their offsets can no longer be read back: another
    client completed their transaction, and maintenance merged their batch or expired its
    producer before this producer looked."""


class BufferExhaustedError(TxnTableError):
    """``send`` waited ``max_block_ms`` for buffer memory (Kafka's TimeoutException)."""


class KafkaTimeoutError(TxnTableError):
    """An operation did not finish within its time limit."""


class IllegalStateError(TxnTableError):
    """The client was used after ``close`` or otherwise out of order."""


class InternalError(TxnTableError):
    """An unexpected failure inside txntable: a defect, or an error of a library it calls
    that it does not map. The original exception is the ``__cause__``."""

    @classmethod
    def wrap(cls, error: BaseException) -> TxnTableError:
        """``error`` itself if it is a :class:`TxnTableError`, else an ``InternalError``
        naming it (raise it ``from error``)."""
        if isinstance(error, TxnTableError):
            return error
        wrapped = cls(f"unexpected {type(error).__name__}: {error}")
        wrapped.__cause__ = error
        return wrapped


# --- consumer and groups ---------------------------------------------------------------------


class OffsetOutOfRangeError(TxnTableError):
    """A fetch position is below the log start offset or above the high watermark."""


class OffsetMetadataTooLargeError(TxnTableError):
    """Offset commit metadata is longer than the group's limit."""


class UnstableOffsetCommitError(TxnTableError):
    """A transactional offset commit for the partition is pending (KIP-447)."""


class CommitFailedError(TxnTableError):
    """An offset commit was refused because the committer is no longer the partitions'
    owner in the group (Kafka's ``CommitFailedException``): a rebalance moved on without it."""


class IllegalGenerationError(CommitFailedError):
    """An offset commit or membership request carries a stale group generation."""


class UnknownMemberIdError(CommitFailedError):
    """The member is not (or no longer) in the group: it left or its session expired."""


class FencedInstanceIdError(CommitFailedError):
    """Another process joined with this member's ``group_instance_id`` (KIP-345)."""


class PolicyViolationError(TxnTableError):
    """A request the table's configuration forbids (Kafka's PolicyViolationException), such
    as key compaction of a table whose ``cleanup.policy`` is ``delete``."""


class InconsistentGroupProtocolError(TxnTableError):
    """A member's assignors have none in common with the group's members."""


class NoOffsetForPartitionError(TxnTableError):
    """No committed offset and ``auto_offset_reset`` is ``none``."""


# --- configuration ---------------------------------------------------------------------------


class InvalidConfigurationError(TxnTableError, ValueError):
    """An option value is unknown, malformed or out of range (Kafka's ConfigException)."""


class InvalidOffsetError(TxnTableError, ValueError):
    """An offset given by the caller is negative or otherwise not a valid position."""


class InvalidArgumentTypeError(TxnTableError, TypeError):
    """An argument of a public call has the wrong type (e.g. an ``int`` where an
    ``OffsetAndMetadata`` belongs)."""


class SerializationError(TxnTableError, TypeError):
    """A record's key, value, headers or timestamp is not of the accepted type (bytes)."""
