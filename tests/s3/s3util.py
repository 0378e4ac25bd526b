"""Helpers of the end-to-end S3 tests (``import s3util``; fixtures are in ``conftest.py``)."""

from __future__ import annotations

import builtins
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import storeutil

from txntable import Consumer, TopicPartition, Warehouse
from txntable.storage import CountingStore, Store
from txntable.storage.base import StoredObject
from txntable.structs import ConsumerRecord

#: Producer settings under which only ``flush``/``commit_transaction`` send anything.
MANUAL_FLUSH: dict[str, Any] = {"linger_ms": 600_000, "batch_size": 1 << 30}


@dataclass(frozen=True)
class S3Location:
    """A fresh bucket on the moto server and the options to reach it."""

    endpoint: str
    bucket: str
    url: str
    options: dict[str, str]

    def client(self) -> Any:
        """A plain boto3 client for the bucket (for inspecting raw objects)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=storeutil.TEST_REGION,
            aws_access_key_id=storeutil.TEST_ACCESS_KEY_ID,
            aws_secret_access_key=storeutil.TEST_SECRET_ACCESS_KEY,
        )

    def objects(self) -> dict[str, bytes]:
        """Every object in the bucket, key -> bytes."""
        client = self.client()
        try:
            out: dict[str, bytes] = {}
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for entry in page.get("Contents", ()):
                    key = entry["Key"]
                    out[key] = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            return out
        finally:
            client.close()


class RecordingStore(CountingStore):
    """A counting store that also records ``(kind, key)`` of every request."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.requests: list[tuple[str, str]] = []

    def reset(self) -> None:
        super().reset()
        self.requests.clear()

    def _rec(self, kind: str, key: str) -> None:
        self.requests.append((kind, key))

    def get(self, key: str) -> StoredObject:
        self._rec("GET", key)
        return super().get(key)

    def head(self, key: str) -> Any:
        self._rec("HEAD", key)
        return super().head(key)

    def put(self, key: str, data: bytes) -> str:
        self._rec("PUT", key)
        return super().put(key, data)

    def put_data_file(self, key: str, data: bytes) -> None:
        self._rec("PUT", key)  # a segment: through pyarrow.fs.S3FileSystem, one PUT
        super().put_data_file(key, data)

    def get_data_file(self, key: str) -> bytes:
        self._rec("GET", key)
        return super().get_data_file(key)

    def put_if_absent(self, key: str, data: bytes) -> str:
        self._rec("CONDITIONAL_PUT", key)
        return super().put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        self._rec("CONDITIONAL_PUT", key)
        return super().put_if_match(key, data, etag)

    def list(self, prefix: str, start_after: str | None = None) -> Any:
        self._rec("LIST", prefix)
        return super().list(prefix, start_after)

    def delete(self, key: str) -> None:
        self._rec("DELETE", key)
        super().delete(key)

    def keys(self, kind: str) -> builtins.list[str]:
        """Keys of the recorded requests of ``kind``."""
        return [k for kd, k in self.requests if kd == kind]


def drain(
    wh: Warehouse, topic: str, partitions: int, isolation_level: str
) -> tuple[dict[int, list[ConsumerRecord]], dict[int, int]]:
    """Read every partition from the beginning until a poll returns nothing.

    Returns:
        Records per partition, and the consumer's final position per partition.
    """
    consumer = Consumer(wh, isolation_level=isolation_level)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    while True:
        batch = consumer.poll(timeout_ms=0, max_records=10_000)
        if not batch:
            break
        for tp, records in batch.items():
            out[tp.partition].extend(records)
    positions = {tp.partition: consumer.position(tp) for tp in tps}
    consumer.close()
    return out, positions


def unique_secret() -> str:
    """A secret that cannot occur by accident in any object or log line."""
    return f"SECRET-{uuid.uuid4().hex}-{uuid.uuid4().hex}"
