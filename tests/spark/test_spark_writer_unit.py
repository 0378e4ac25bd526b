"""The writers' task, commit and abort logic, driven directly (no SparkSession)."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txntable.errors import IllegalStateError, SchemaMismatchError
from txntable.producer.partitioner import partition_for_key
from txntable.protocol.actions import Batch, CommitPlan
from txntable.protocol.schema import schema_to_json
from txntable.protocol.sequencing import RoundItem, sequence_round
from txntable.read.reader import read_segment
from txntable.warehouse import Warehouse
from txntable_spark.options import parse_write_options
from txntable_spark.writer import (
    Router,
    TxnCommitMessage,
    TxnTableStreamWriter,
    TxnTableWriter,
    check_input_schema,
    plain_append,
)

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
        StructField("timestamp", TimestampType()),
    ]
)


def _setup(partitions: int = 3) -> tuple[Warehouse, dict[str, str]]:
    wh = Warehouse(f"memory://spark-writer-{uuid.uuid4().hex}")
    wh.create_table("t", partitions=partitions)
    return wh, {"path": f"{wh.url}/t"}


def _batch(
    n: int, keys: list[str | None], partitions: list[int | None] | None = None
) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
            "partition": pa.array(partitions or [None] * n, pa.int32()),
            "headers": pa.array(
                [[{"key": "h", "value": b"%d" % i}] if i % 2 else None for i in range(n)],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            "timestamp": pa.array(
                [1_000_000 * (i + 1) for i in range(n)], pa.timestamp("us", "UTC")
            ),
        }
    )


def _rows(wh: Warehouse, msg: TxnCommitMessage) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for b in msg.batches:
        out.setdefault(b.partition, []).extend(read_segment(wh.store, b.path, b.count).to_pylist())
    return out


def test_routing_and_segment_content() -> None:
    wh, options = _setup()
    writer = TxnTableWriter(parse_write_options(options), SCHEMA)
    keys = [f"k{i}" for i in range(20)] + [None] * 5
    parts: list[int | None] = [None] * 25
    parts[3] = 1  # an explicit partition wins over the key
    msg = writer.write(iter([_batch(25, keys, parts)]))
    assert isinstance(msg, TxnCommitMessage) and msg.rows == 25
    by_part = _rows(wh, msg)
    assert len(msg.batches) == len(by_part)  # one segment per table partition
    null_parts = {p for p, rows in by_part.items() for r in rows if r["key"] is None}
    assert len(null_parts) == 1  # sticky
    for p, rows in by_part.items():
        for r in rows:
            i = int(r["value"][1:])
            if i == 3:
                assert p == 1
            elif r["key"] is not None:
                assert p == partition_for_key(r["key"], 3)
            assert r["headers"] == ([{"key": "h", "value": b"%d" % i}] if i % 2 else [])
            assert r["timestamp"].timestamp() == i + 1
    writer.commit([msg])
    snap = wh.table("t").snapshot()
    assert snap.version == 1
    assert sum(p.high_watermark for p in snap.partitions) == 25


def test_router_equals_scalar_partitioner_on_random_keys() -> None:
    """The vectorised router puts every row where the scalar rule (Kafka's Java client)
    does: explicit partition first, then murmur2 of the key, then the sticky partition."""
    rng = random.Random(8)
    n = 3000
    keys = [None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 65)) for _ in range(n)]
    explicit = [rng.randrange(7) if rng.random() < 0.2 else None for _ in range(n)]
    router = Router(7, sticky=12)
    for given in (None, pa.array(explicit, pa.int32())):
        got = router.route(pa.array(keys, pa.binary()), given).tolist()
        want = [
            e
            if given is not None and e is not None
            else 12 % 7
            if k is None
            else partition_for_key(k, 7)
            for k, e in zip(keys, explicit, strict=True)
        ]
        assert got == want
    # String keys route as their UTF-8 bytes; all-null keys all go to the sticky partition.
    text = ["ключ", "k", ""]
    got = router.route(pa.array(text).cast(pa.binary()), None).tolist()
    assert got == [partition_for_key(t.encode(), 7) for t in text]
    assert router.route(pa.nulls(4, pa.binary()), None).tolist() == [5] * 4


def test_segments_split_by_size() -> None:
    wh, options = _setup(1)
    writer = TxnTableWriter(parse_write_options({**options, "maxBytesPerSegment": "1"}), SCHEMA)
    msg = writer.write(iter([_batch(3, ["a", "b", "c"]), _batch(2, ["d", "e"])]))
    assert isinstance(msg, TxnCommitMessage)
    assert [b.count for b in msg.batches] == [3, 2]


def test_abort_deletes_unless_commit_landed() -> None:
    wh, options = _setup()
    opts = parse_write_options(options)
    writer = TxnTableWriter(opts, SCHEMA)
    msg = writer.write(iter([_batch(6, [f"k{i}" for i in range(6)])]))
    assert isinstance(msg, TxnCommitMessage)
    orphan = writer.write(iter([_batch(2, ["x", "y"])]))  # a "failed attempt": no message
    assert isinstance(orphan, TxnCommitMessage)
    written = {b.path for b in msg.batches} | {b.path for b in orphan.batches}
    assert written <= set(wh.store.list("t/data/"))
    writer.abort([msg, None])
    assert set(wh.store.list("t/data/")) == set()
    assert wh.table("t").snapshot().version == 0
    # A task still running after the abort removes its own segments (every partition's).
    with pytest.raises(IllegalStateError):
        writer.write(iter([_batch(6, [f"late{i}" for i in range(6)])]))
    assert set(wh.store.list("t/data/")) == set()

    # A commit that landed (e.g. it raised after the put) is never undone by abort.
    writer = TxnTableWriter(opts, SCHEMA)
    msg = writer.write(iter([_batch(4, ["a", "b", "c", "d"])]))
    assert isinstance(msg, TxnCommitMessage)
    writer.commit([msg])
    writer.abort([msg])
    paths = {b.path for b in msg.batches}
    assert paths <= set(wh.store.list("t/data/"))
    assert wh.table("t").snapshot().version == 1


def test_commit_removes_failed_attempt_files() -> None:
    wh, options = _setup()
    writer = TxnTableWriter(parse_write_options(options), SCHEMA)
    msg = writer.write(iter([_batch(3, ["a", "b", "c"])]))
    writer.write(iter([_batch(3, ["a", "b", "c"])]))  # a retried attempt's leftover
    assert isinstance(msg, TxnCommitMessage)
    writer.commit([msg])
    snap = wh.table("t").snapshot()
    referenced = {e.path for p in snap.partitions for e in p.entries if isinstance(e, Batch)}
    assert set(wh.store.list("t/data/")) == referenced


def test_empty_job_writes_no_version() -> None:
    wh, options = _setup()
    writer = TxnTableWriter(parse_write_options(options), SCHEMA)
    msg = writer.write(iter([]))
    writer.commit([msg])
    assert wh.table("t").snapshot().version == 0


def test_stream_commit_is_idempotent_per_batch_id() -> None:
    wh, options = _setup()
    opts = parse_write_options({**options, "txnAppId": "app"}, streaming=True)
    first = TxnTableStreamWriter(opts, SCHEMA, {})
    m0 = first.write(iter([_batch(4, ["a", "b", "c", "d"])]))
    first.commit([m0], 0)
    assert first.last_result == "committed"
    # The same batch replayed after a restart: new files, same batch id -> skipped.
    replay = TxnTableStreamWriter(opts, SCHEMA, {})
    m0b = replay.write(iter([_batch(4, ["a", "b", "c", "d"])]))
    assert isinstance(m0b, TxnCommitMessage)
    replay.commit([m0b], 0)
    assert replay.last_result == "skipped"
    assert not {b.path for b in m0b.batches} & set(wh.store.list("t/data/"))
    m1 = replay.write(iter([_batch(1, ["e"])]))
    replay.commit([m1], 1)
    snap = wh.table("t").snapshot()
    assert snap.app_txns["app"].version == 1
    assert sum(p.high_watermark for p in snap.partitions) == 5
    # Another app id is independent.
    other_opts = parse_write_options({**options, "txnAppId": "other"}, streaming=True)
    other = TxnTableStreamWriter(other_opts, SCHEMA, {})
    m = other.write(iter([_batch(1, ["f"])]))
    other.commit([m], 0)
    assert other.last_result == "committed"
    # Abort of an already-recorded batch keeps files; of a new one deletes them.
    m2 = other.write(iter([_batch(1, ["g"])]))
    assert isinstance(m2, TxnCommitMessage)
    other.abort([m2], 0)
    assert {b.path for b in m2.batches} <= set(wh.store.list("t/data/"))
    other.abort([m2], 1)
    assert not {b.path for b in m2.batches} & set(wh.store.list("t/data/"))


def test_input_schema_checks() -> None:
    check_input_schema(StructType([StructField("value", StringType())]))
    with pytest.raises(SchemaMismatchError):
        check_input_schema(StructType([StructField("key", StringType())]))
    with pytest.raises(SchemaMismatchError):
        check_input_schema(StructType([StructField("value", IntegerType())]))
    with pytest.raises(SchemaMismatchError):
        check_input_schema(
            StructType([StructField("value", StringType()), StructField("timestamp", StringType())])
        )
    # Columns a record has no place for are refused, named, instead of being lost.
    with pytest.raises(SchemaMismatchError, match=r"columns \['id', 'Score'\] have no place"):
        check_input_schema(
            StructType(
                [
                    StructField("id", IntegerType()),
                    StructField("value", StringType()),
                    StructField("Score", IntegerType()),
                ]
            )
        )
    # What a txntable read returns can be written back (topic and offset are ignored).
    check_input_schema(
        StructType(
            [
                StructField("key", BinaryType()),
                StructField("value", BinaryType()),
                StructField("Topic", StringType()),
                StructField("partition", IntegerType()),
                StructField("offset", IntegerType()),
                StructField("timestamp", TimestampType()),
            ]
        )
    )


def test_batch_write_with_txn_app_id_and_version_is_idempotent() -> None:
    """Delta's txnAppId + txnVersion: a version at or below the recorded one writes nothing."""
    wh, options = _setup()

    def write(version: int, n: int) -> TxnTableWriter:
        opts = parse_write_options({**options, "txnAppId": "nightly", "txnVersion": str(version)})
        writer = TxnTableWriter(opts, SCHEMA)
        msg = writer.write(iter([_batch(n, [f"k{i}" for i in range(n)])]))
        writer.commit([msg])
        return writer

    def total() -> int:
        return sum(p.high_watermark for p in wh.table("t").snapshot().partitions)

    first = write(1, 2)
    assert (first.skipped, first.committed_version, total()) == (False, 1, 2)
    again = write(1, 2)  # the same job run twice lands once
    assert (again.skipped, again.committed_version, total()) == (True, None, 2)
    older = write(0, 3)
    assert older.skipped and total() == 2
    newer = write(2, 3)
    assert (newer.skipped, total()) == (False, 5)
    snap = wh.table("t").snapshot()
    assert snap.app_txns["nightly"].version == 2
    # Skipped jobs leave no segment behind.
    referenced = {e.path for p in snap.partitions for e in p.entries if isinstance(e, Batch)}
    assert set(wh.store.list("t/data/")) == referenced


def test_typed_commits_hold_next_to_a_concurrent_evolution_also_in_a_group_commit_round() -> None:
    """A writer holding the older schema commits its segments unchanged: directly, as a
    streaming micro-batch, and when group commit sequences its build after the evolution
    in one round (issue 26 item 4)."""
    wh = Warehouse(f"memory://spark-writer-{uuid.uuid4().hex}")
    v1 = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    table = wh.create_table("t", 1, schema=v1, key=["id"])
    options = {"path": f"{wh.url}/t"}
    df_schema = StructType([StructField("id", LongType(), False), StructField("s", StringType())])
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "s": ["a", "b"]})

    batch_writer = TxnTableWriter(parse_write_options(options), df_schema)
    stream_opts = parse_write_options({**options, "txnAppId": "q"}, streaming=True)
    stream_writer = TxnTableStreamWriter(stream_opts, df_schema, {})
    in_round = TxnTableWriter(parse_write_options(options), df_schema)
    messages = [w.write(iter([rows])) for w in (batch_writer, stream_writer, in_round)]
    assert all(isinstance(m, TxnCommitMessage) for m in messages)

    v2 = table.evolve_schema(v1.append(pa.field("note", pa.string())))
    batch_writer.commit([messages[0]])
    stream_writer.commit([messages[1]], 0)
    assert stream_writer.last_result == "committed"
    table.snapshot()
    assert table.schema == v2

    v3 = v2.append(pa.field("tag", pa.string()))

    def evolve(s: Any) -> CommitPlan[None]:
        return CommitPlan([replace(s.metadata, schema=schema_to_json(v3))], None, "SET SCHEMA")

    message = messages[2]
    assert isinstance(message, TxnCommitMessage) and in_round.typed is not None
    build = in_round.typed.commit_build(plain_append(message.batches))
    planned = sequence_round(table.snapshot(), [RoundItem(evolve), RoundItem(build)])
    assert not [r for r in planned.results if isinstance(r, Exception)]
    assert sum(isinstance(a, Batch) for a in planned.actions) == 1
