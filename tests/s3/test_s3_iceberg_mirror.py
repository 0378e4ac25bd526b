"""The Iceberg mirror on S3 (the moto server, over HTTP): published through the S3 store,
read back by pyiceberg's own S3 FileIO from the ``s3://`` locations the metadata names."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import storeutil
from s3util import S3Location

from txntable import Producer, Warehouse

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_the_iceberg_mirror_on_s3_reads_as_read_committed(
    s3_wh: Warehouse, s3_location: S3Location, make_producer: Callable[..., Producer]
) -> None:
    from pyiceberg.table import StaticTable

    s3_wh.create_table("events", partitions=2, configuration={"mirror.interval.ms": -1})
    p = make_producer(s3_wh, transactional_id="writer")
    p.init_transactions()
    for t in range(4):
        p.begin_transaction()
        for i in range(6):
            p.send("events", value=b"%s:%d-%d" % (b"A" if t == 2 else b"C", t, i),
                   partition=i % 2)
        p.flush()
        if t == 2:
            p.abort_transaction()
        else:
            p.commit_transaction()
    table = s3_wh.table("events")
    report = table.publish(["iceberg"]).iceberg
    assert report is not None and report.metadata_version == 1
    metadata = f"s3://{s3_location.bucket}/wh/events/metadata/v1.metadata.json"
    assert "wh/events/metadata/v1.metadata.json" in s3_location.objects()
    mirror = StaticTable.from_metadata(
        metadata,
        properties={
            "s3.endpoint": s3_location.endpoint,
            "s3.region": storeutil.TEST_REGION,
            "s3.access-key-id": storeutil.TEST_ACCESS_KEY_ID,
            "s3.secret-access-key": storeutil.TEST_SECRET_ACCESS_KEY,
        },
    )
    got = mirror.scan().to_arrow()
    assert sorted(got["value"].to_pylist()) == sorted(
        table.scan().to_arrow()["value"].to_pylist()
    )
    assert got.num_rows == 18 and not [v for v in got["value"].to_pylist() if v[:2] == b"A:"]
    assert sorted(set(got["partition"].to_pylist())) == [0, 1]
