"""txntable: Kafka's exactly-once machinery as a table format on object storage."""

from txntable.consumer import Consumer
from txntable.producer.producer import Producer
from txntable.structs import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from txntable.table import Table
from txntable.warehouse import Warehouse

__all__ = [
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "OffsetAndMetadata",
    "Producer",
    "RecordMetadata",
    "Table",
    "TopicPartition",
    "Warehouse",
]
__version__ = "0.1.0"
