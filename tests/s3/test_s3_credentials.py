"""Credentials given as storage options never reach storage, a repr, a log line or an error."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from s3util import S3Location, drain, unique_secret

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import BucketNotFoundError
from txntable.storage import CountingStore, S3Store, open_store
from txntable.storage.s3 import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN
from txntable.structs import OffsetAndMetadata

pytestmark = [pytest.mark.s3, pytest.mark.slow]


@pytest.fixture
def secret_options(s3_location: S3Location) -> dict[str, str]:
    """The location's options with unique, unmistakable credentials (moto accepts any)."""
    return {
        **s3_location.options,
        S3_ACCESS_KEY_ID: "AKID" + unique_secret(),
        S3_SECRET_ACCESS_KEY: unique_secret(),
        S3_SESSION_TOKEN: unique_secret(),
    }


def secrets_of(options: dict[str, str]) -> list[str]:
    return [options[k] for k in (S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN)]


def test_credentials_are_never_written_to_the_bucket_or_logged(
    s3_location: S3Location,
    secret_options: dict[str, str],
    make_producer: Callable[..., Producer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wh = Warehouse(s3_location.url, storage_options=secret_options)
    wh.create_table("in", partitions=2)
    wh.create_table("out", partitions=1)

    # Everything that writes: data, log versions, markers, aborted-txn index, coordinator
    # objects, producer id blocks, group offsets (plain and transactional), a checkpoint.
    p = make_producer(wh, transactional_id="etl")
    p.init_transactions()
    p.begin_transaction()
    p.send("in", value=b"a", partition=0)
    p.send("in", value=b"b", partition=1)
    p.commit_transaction()
    p.begin_transaction()
    p.send("in", value=b"c", partition=0)
    p.flush()
    p.abort_transaction()
    idem = make_producer(wh)
    idem.send("in", value=b"d", partition=1).result()

    c = Consumer(
        wh,
        group_id="g",
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    c.assign([TopicPartition("in", 0)])
    assert [r.value for r in c.poll(timeout_ms=1000)[TopicPartition("in", 0)]] == [b"a"]
    c.commit()
    p.begin_transaction()
    p.send("out", value=b"transformed", partition=0)
    p.send_offsets_to_transaction(
        {TopicPartition("in", 1): OffsetAndMetadata(1)}, c.group_metadata()
    )
    p.commit_transaction()
    c.close()
    wh.table("in").log.write_checkpoint(wh.table("in").snapshot())
    wh.recover()
    assert [r.value for r in drain(wh, "out", 1, "read_committed")[0][0]] == [b"transformed"]

    objects = s3_location.objects()
    kinds = {k.split("/", 2)[1] for k in objects}
    assert {"in", "out", "_coordinator", "_groups"} <= kinds
    assert any(k.endswith(".checkpoint.json") for k in objects)
    assert any(k.startswith("wh/_coordinator/txn/") for k in objects)
    for secret in secrets_of(secret_options):
        for key, data in objects.items():
            assert secret.encode() not in data, f"credential written into {key}"
            assert secret not in key

    # No credential in any log record of txntable. The secret key is in no log record at
    # all; botocore's own DEBUG logs do show the access key id (credential scope) and the
    # session token (a request header), which is botocore's business, not ours.
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.split(".")[0] == "txntable")
    everything = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    for secret in secrets_of(secret_options):
        assert secret not in ours
    assert secret_options[S3_SECRET_ACCESS_KEY] not in everything
    wh.store.close()


def test_credentials_never_appear_in_repr_or_errors(
    s3_location: S3Location, secret_options: dict[str, str]
) -> None:
    wh = Warehouse(s3_location.url, storage_options=secret_options)
    counted = Warehouse(store=CountingStore(open_store(s3_location.url, secret_options)))
    store = wh.store
    assert isinstance(store, S3Store)
    shown = [repr(wh), str(wh), repr(store), str(store), repr(counted), repr(counted.store)]
    shown += [repr(wh.create_table("t", partitions=1)), repr(wh.table("t").describe())]
    for text in shown:
        for secret in secrets_of(secret_options):
            assert secret not in text, text
    assert "***" in repr(store)
    assert s3_location.url in repr(store)
    assert repr(wh) == f"Warehouse({s3_location.url!r})"

    # An error from S3 (no such bucket) names the object, not the credentials.
    missing = Warehouse("s3://no-such-bucket-txntable/wh", storage_options=secret_options)
    with pytest.raises(BucketNotFoundError) as info:
        missing.create_table("t")
    text = f"{info.value!r} {info.value}"
    assert "no-such-bucket-txntable" in text
    for secret in secrets_of(secret_options):
        assert secret not in text
    for w in (wh, counted, missing):
        w.store.close()
