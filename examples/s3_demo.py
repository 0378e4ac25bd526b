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

from demo import run_scenario  # examples/demo.py: the same scenario on local disk

from txntable import Warehouse
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
    run_scenario(wh)
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
