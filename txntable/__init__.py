"""txntable: Kafka's exactly-once machinery as a table format on object storage.

The public names load on first use (PEP 562): ``import txntable`` and the ``txntable``
command line's ``--help`` do not pay for pyarrow and the whole library until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

#: Each public name and the module that defines it.
_MODULES = {
    "READ_COMMITTED": "txntable.structs",
    "READ_UNCOMMITTED": "txntable.structs",
    "Consumer": "txntable.consumer",
    "ConsumerGroupMetadata": "txntable.structs",
    "ConsumerRecord": "txntable.structs",
    "OffsetAndMetadata": "txntable.structs",
    "Producer": "txntable.producer.producer",
    "RecordMetadata": "txntable.structs",
    "Table": "txntable.table",
    "TopicPartition": "txntable.structs",
    "Warehouse": "txntable.warehouse",
}

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


def __getattr__(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULES])
