"""The S3 demo: produce, abort, commit and read back over ``s3://``, no cloud account needed.

Run it with ``python examples/s3_demo.py``. It starts moto's S3 server on 127.0.0.1 (a free
port) in this process, creates a bucket with boto3, and runs the same scenario as
``examples/demo.py`` against ``s3://<bucket>/lake``: one committed transaction, one aborted
transaction, some idempotent records, one transaction left open, then what each isolation
level returns with the high watermark (HW) and last stable offset (LSO) per partition.
Finally it stops the server. Nothing leaves the machine.

To run against MinIO or AWS instead, point ``STORAGE_OPTIONS`` at it (see README,
"S3 and MinIO"). moto's conditional puts are not atomic under concurrent writers (it checks,
then writes), which does not matter for this single-writer demo; real S3 and MinIO are.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

from txntable import Consumer, Producer, TopicPartition, Warehouse
from txntable.storage.s3 import (
    S3_ACCESS_KEY_ID,
    S3_ADDRESSING_STYLE,
    S3_ALLOW_HTTP,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
)

REGION = "us-east-1"
#: moto accepts any credentials; these are placeholders, never real ones.
ACCESS_KEY_ID = "demo-access-key"
SECRET_ACCESS_KEY = "demo-secret-key"


def keep_loopback_off_proxies() -> None:
    """Make sure an HTTP(S)_PROXY in the environment is not used for 127.0.0.1."""
    for var in ("NO_PROXY", "no_proxy"):
        current = os.environ.get(var, "")
        os.environ[var] = ",".join(x for x in (current, "127.0.0.1", "localhost") if x)


def run(endpoint: str) -> None:
    import boto3

    bucket = f"txntable-demo-{uuid.uuid4().hex[:8]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    client.create_bucket(Bucket=bucket)
    client.close()
    print(f"created bucket {bucket}")

    storage_options = {
        S3_ENDPOINT: endpoint,  # "s3.endpoint"
        S3_REGION: REGION,  # "s3.region"
        S3_ACCESS_KEY_ID: ACCESS_KEY_ID,  # "s3.access-key-id"
        S3_SECRET_ACCESS_KEY: SECRET_ACCESS_KEY,  # "s3.secret-access-key"
        S3_ALLOW_HTTP: "true",  # "s3.allow-http": the local server speaks plain HTTP
        S3_ADDRESSING_STYLE: "path",  # "s3.addressing-style": http://host:port/bucket/key
    }
    wh = Warehouse(f"s3://{bucket}/lake", storage_options=storage_options)
    print(f"store: {wh.store!r}")  # credentials are masked
    wh.create_table("orders", partitions=2)
    print(f"warehouse {wh.url}: created table 'orders' with 2 partitions")

    txn = Producer(wh, transactional_id="demo-etl")
    txn.init_transactions()

    txn.begin_transaction()
    for i in range(3):
        txn.send("orders", key=b"user-%d" % i, value=b"order %d (committed)" % i, partition=0)
    txn.commit_transaction()
    print("committed a transaction of 3 records")

    txn.begin_transaction()
    txn.send("orders", key=b"user-9", value=b"order 9 (aborted)", partition=0)
    txn.flush()  # the record is in the log now: read_uncommitted sees it
    txn.abort_transaction()
    print("aborted a transaction of 1 record (flushed to the log first)")

    plain = Producer(wh, enable_idempotence=True)
    for i in range(2):
        plain.send("orders", key=b"k", value=b"idempotent %d" % i, partition=1)
    plain.flush()
    print("wrote 2 idempotent records to partition 1")

    txn.begin_transaction()
    txn.send("orders", value=b"still open", partition=1).result()
    print("left a transaction open on partition 1 (holds the LSO back)")
    plain.send("orders", value=b"after the open txn", partition=1).result()

    def print_offsets() -> None:
        for p in wh.table("orders").describe().partitions:
            opens = ", ".join(
                f"pid {t.producer_id} from {t.first_offset}" for t in p.open_transactions
            )
            print(
                f"partition {p.partition}: log start {p.log_start_offset}, "
                f"HW {p.high_watermark}, LSO {p.last_stable_offset}, "
                f"open transactions: [{opens}]"
            )

    print_offsets()
    tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
    for level in ("read_committed", "read_uncommitted"):
        consumer = Consumer(wh, isolation_level=level)
        consumer.assign(tps)
        consumer.seek_to_beginning()
        print(f"\n{level}:")
        for tp, records in sorted(consumer.poll(timeout_ms=500).items()):
            for r in records:
                print(f"  {tp.topic}[{tp.partition}] offset {r.offset}: {r.value!r}")
        ends = consumer.end_offsets(tps)
        print(
            "  positions:",
            {tp.partition: consumer.position(tp) for tp in tps},
            "end offsets:",
            {tp.partition: ends[tp] for tp in tps},
        )
        consumer.close()

    txn.commit_transaction()
    print("\ncommitted the open transaction; partition 1 is now stable:")
    print_offsets()
    txn.close()
    plain.close()
    wh.store.close()


def main() -> int:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("this demo needs moto's server: pip install 'moto[server]'", file=sys.stderr)
        return 1
    keep_loopback_off_proxies()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        print(f"started moto S3 server at {endpoint}")
        run(endpoint)
    finally:
        server.stop()
        print("stopped the moto S3 server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
