"""A typed table: columns instead of key/value bytes, written and read exactly once.

Creates an ``orders`` table with a record schema keyed by customer, writes a transaction of
dicts and an Arrow batch, evolves the schema (a new nullable column), writes with it, and
reads everything back: one column with ``Table.scan(columns=...)`` (only that column is
read from the segments) and whole records as dicts with the consumer.

Run: ``python examples/typed_table.py [warehouse path]`` (default: a temp directory).
"""

from __future__ import annotations

import sys
import tempfile
from decimal import Decimal

import pyarrow as pa

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="typed-example-")
    wh = Warehouse(root)
    schema = pa.schema(
        [
            pa.field("order_id", pa.int64(), nullable=False),
            ("customer", pa.string()),
            ("amount", pa.decimal128(12, 2)),
            ("items", pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int32())]))),
        ]
    )
    orders = wh.create_table("orders", partitions=2, schema=schema, key=["customer"])

    with Producer(wh, transactional_id="orders-writer") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", {"order_id": 1, "customer": "ada", "amount": Decimal("9.50"),
                                 "items": [{"sku": "tea", "qty": 2}]})  # fmt: skip
        producer.send_batch(
            "orders",
            {"order_id": [2, 3], "customer": ["bob", "ada"], "amount": [Decimal("3"), None]},
        )
        producer.commit_transaction()

    orders.evolve_schema(schema.append(pa.field("coupon", pa.string())))
    with Producer(wh) as producer:
        producer.send("orders", {"order_id": 4, "customer": "cy", "coupon": "WELCOME"})

    print(orders.scan(columns=["customer", "partition", "offset"]).to_arrow().to_pandas())
    consumer = Consumer(wh, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("orders", p) for p in range(2)])
    for tp, records in sorted(consumer.poll(timeout_ms=1000).items()):
        for r in records:
            print(tp.partition, r.offset, r.value)
    consumer.close()


if __name__ == "__main__":
    main()
