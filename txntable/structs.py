"""Public value types, as kafka-python's ``structs``: what the clients take and return.

Plain immutable values with no I/O and no Arrow: partitions, records, record metadata,
committed offsets, group metadata, and the two isolation levels.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from txntable.errors import InvalidArgumentTypeError

#: Kafka's ``isolation.level``: read_committed hides aborted and still-open transactions.
IsolationLevel = Literal["read_committed", "read_uncommitted"]
READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"


Header = tuple[str, bytes | None]


#: Bytes a record costs beyond its key, value and headers (Kafka's record overhead, roughly).
RECORD_OVERHEAD = 21


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A partition of a table (a topic, in Kafka's words)."""

    topic: str
    partition: int


def check_topic_partition(tp: object, what: str = "partition") -> TopicPartition:
    """``tp`` if it is a :class:`TopicPartition`.

    Raises:
        InvalidArgumentTypeError: Otherwise (a tuple, a string, a partition number, ...).
    """
    if not isinstance(tp, TopicPartition):
        raise InvalidArgumentTypeError(
            f"{what} must be a TopicPartition, not {type(tp).__name__} {tp!r:.60}"
        )
    return tp


def check_topic_partitions(tps: object, what: str = "partitions") -> list[TopicPartition]:
    """A list of the :class:`TopicPartition` in the iterable ``tps``.

    Raises:
        InvalidArgumentTypeError: ``tps`` is a single partition, a string, not iterable, or
            holds something else.
    """
    if isinstance(tps, TopicPartition | str | bytes) or not isinstance(tps, Iterable):
        raise InvalidArgumentTypeError(
            f"{what} must be a list of TopicPartition, not {type(tps).__name__} {tps!r:.60}"
        )
    return [check_topic_partition(tp, f"each of {what}") for tp in tps]


@dataclass(frozen=True)
class ProducerRecord:
    """A record waiting in the producer."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = 0

    def size_in_bytes(self) -> int:
        """Approximate serialized size, used for batch size, buffer memory and limits."""
        size = RECORD_OVERHEAD + len(self.key or b"") + len(self.value or b"")
        for k, v in self.headers:
            size += len(k.encode()) + len(v or b"") + 2
        return size


#: ``ConsumerRecord.timestamp_type`` of a timestamp the producer set (Kafka's CreateTime).
CREATE_TIME: Final = 0


class ConsumerRecord(NamedTuple):
    """A record returned by :meth:`Consumer.poll`.

    A named tuple with kafka-python's fields in kafka-python's order (code that indexes or
    unpacks one keeps working): immutable, and cheap to build by the million.
    """

    topic: str
    partition: int
    #: Kafka's partition leader epoch; a table has no leaders: always -1 (unknown).
    leader_epoch: int
    offset: int
    #: Milliseconds since the epoch, as the producer set it (or the time it was sent).
    timestamp: int
    #: Always :data:`CREATE_TIME` (0).
    timestamp_type: int
    #: Kafka's key bytes; for a typed table the dict of its key columns (``None`` without).
    key: Any
    #: Kafka's value bytes; for a typed table the dict of the record's columns.
    value: Any
    headers: list[Header]
    #: Removed from Kafka's record format v2: always ``None``.
    checksum: None
    #: Bytes of the key and the value, -1 when null (and for a typed table's records).
    serialized_key_size: int
    serialized_value_size: int
    #: UTF-8 bytes of the header keys plus the values' bytes; -1 without headers.
    serialized_header_size: int


@dataclass(frozen=True)
class RecordMetadata:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed position: the next offset to read, and free-form metadata."""

    offset: int
    metadata: str = ""


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What a transactional producer needs of the consumer whose offsets it commits."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    #: Whether the consumer that made it auto-commits: its own commits of positions would
    #: race the transaction's (``send_offsets_to_transaction`` refuses it).
    auto_commit: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class OffsetAndTimestamp:
    """What ``offsets_for_times`` returns for a partition (Kafka's ``OffsetAndTimestamp``)."""

    offset: int
    timestamp: int
