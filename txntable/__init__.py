"""txntable: Kafka's exactly-once machinery as a table format on object storage."""

from txntable.consumer import READ_COMMITTED, READ_UNCOMMITTED, Consumer
from txntable.groups.offsets import ConsumerGroupMetadata, OffsetAndMetadata
from txntable.producer.producer import Producer
from txntable.protocol.records import ConsumerRecord, RecordMetadata, TopicPartition
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
