"""The streaming sink's identity (the query id in the checkpoint), driven without Spark."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from txntable.errors import InvalidConfigurationError
from txntable.warehouse import Warehouse
from txntable_spark.checkpoint import app_id_of_query, checkpoint_dir, read_query_id
from txntable_spark.options import parse_write_options
from txntable_spark.writer import TxnCommitMessage, TxnTableStreamWriter

SCHEMA = StructType([StructField("value", BinaryType())])


def _checkpoint(directory: Path, query_id: str | None = None) -> str:
    """A checkpoint directory as Spark leaves it when a query starts."""
    query_id = query_id or str(uuid.uuid4())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metadata").write_text(json.dumps({"id": query_id}, separators=(",", ":")))
    return query_id


def test_checkpoint_location_spellings_resolve_as_hadoop_does() -> None:
    # One location, spelled as users do; Spark qualifies every one to file:/ck/q1.
    for spelling in (
        "/ck/q1",
        "/ck/q1/",
        "file:/ck/q1",
        "file:///ck/q1",
        "file:///ck//q1/",
        "file:/ck/./x/../q1",
        "q1",
        "./q1",
        "../ck/q1",
    ):
        cwd = "/ck" if not spelling.startswith("../") else "/other"
        assert checkpoint_dir(spelling, cwd) == "/ck/q1", spelling
    # A relative path is relative to the driver's working directory, so two queries given
    # the same string in different directories have different checkpoints.
    assert checkpoint_dir("ckpt", "/a") != checkpoint_dir("ckpt", "/b")
    # Hadoop takes a path literally: no percent-decoding; a colon after a slash is no scheme.
    assert checkpoint_dir("file:///ck/a%20b", "/") == "/ck/a%20b"
    assert checkpoint_dir("ck/a:b", "/w") == "/w/ck/a:b"


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("", "must not be empty"),
        ("  ", "must not be empty"),
        ("s3a://bucket/ck", "reads only local checkpoints"),
        ("hdfs://nn:8020/ck", "reads only local checkpoints"),
        ("file://host/ck", "names a host"),
        ("file:ck", "needs an absolute path"),
    ],
)
def test_locations_the_sink_cannot_read_are_refused(location: str, message: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=message):
        checkpoint_dir(location, "/w")


def test_query_id_is_read_from_the_checkpoint_metadata(tmp_path: Path) -> None:
    query_id = _checkpoint(tmp_path / "ck")
    spellings = [str(tmp_path / "ck"), f"file:{tmp_path}/ck", f"file://{tmp_path}/ck/"]
    assert {read_query_id(s) for s in spellings} == {query_id}
    assert read_query_id("ck", cwd=str(tmp_path)) == query_id
    # Spark's file has no newline; a writer that adds one (or spaces) reads the same.
    (tmp_path / "ck" / "metadata").write_text(f'{{ "id" : "{query_id}" }}\n')
    assert read_query_id(str(tmp_path / "ck")) == query_id


def test_unreadable_metadata_is_an_error_never_a_guess(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigurationError, match="no query metadata at .*txnAppId"):
        read_query_id(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.mkdir()
    for content in (b"", b"not json", b'{"id": 7}', b'{"id": "not-a-uuid"}', b"[1]", b"\xff"):
        (bad / "metadata").write_bytes(content)
        with pytest.raises(InvalidConfigurationError, match="not Spark's query metadata"):
            read_query_id(str(bad))
    (bad / "metadata").unlink()
    (bad / "metadata").mkdir()  # unreadable as a file
    with pytest.raises(InvalidConfigurationError, match="cannot read the query metadata"):
        read_query_id(str(bad))


def _stream_writer(tmp_path: Path, extra: dict[str, str]) -> tuple[Warehouse, TxnTableStreamWriter]:
    wh = Warehouse(f"memory://sink-identity-{uuid.uuid4().hex}")
    wh.create_table("t", partitions=1)
    options = {"path": f"{wh.url}/t", **extra}
    return wh, TxnTableStreamWriter(parse_write_options(options, streaming=True), SCHEMA, options)


def test_stream_writer_app_id_is_the_query_id(tmp_path: Path) -> None:
    query_id = _checkpoint(tmp_path / "ck")
    # Spark hands the options lower-cased.
    _, writer = _stream_writer(tmp_path, {"checkpointlocation": f"file://{tmp_path}/ck"})
    assert (writer.query_id, writer.app_id) == (query_id, app_id_of_query(query_id))
    # txnAppId stays the explicit override: the checkpoint is not even read.
    _, explicit = _stream_writer(
        tmp_path, {"checkpointlocation": str(tmp_path / "none"), "txnAppId": "mine"}
    )
    assert (explicit.query_id, explicit.app_id) == (None, "mine")
    with pytest.raises(InvalidConfigurationError, match="needs option checkpointLocation"):
        _stream_writer(tmp_path, {})
    with pytest.raises(InvalidConfigurationError, match="no query metadata"):
        _stream_writer(tmp_path, {"checkpointLocation": str(tmp_path / "none")})


def test_a_task_of_another_query_is_refused_before_commit(tmp_path: Path) -> None:
    """The tasks' query id (a Spark local property) must be the one read from the
    checkpoint: a location resolved unlike Spark's is an error, and nothing lands."""
    query_id = _checkpoint(tmp_path / "ck")
    wh, writer = _stream_writer(tmp_path, {"checkpointLocation": str(tmp_path / "ck")})
    message = writer.write(iter([pa.record_batch({"value": [b"x"]})]))
    assert isinstance(message, TxnCommitMessage)
    assert message.query_id is None  # outside a Spark task: nothing to check
    message.query_id = str(uuid.uuid4())
    with pytest.raises(InvalidConfigurationError, match="resolved differently from Spark"):
        writer.commit([message], 0)
    assert wh.table("t").snapshot().version == 0
    writer.abort([message], 0)
    assert list(wh.store.list("t/data/")) == []
    ours = writer.write(iter([pa.record_batch({"value": [b"y"]})]))
    assert isinstance(ours, TxnCommitMessage)
    ours.query_id = query_id
    writer.commit([ours], 0)
    assert wh.table("t").snapshot().app_txns[app_id_of_query(query_id)].version == 0


def test_relative_location_uses_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _checkpoint(tmp_path / "a" / "ckpt")
    second = _checkpoint(tmp_path / "b" / "ckpt")
    monkeypatch.chdir(tmp_path / "a")
    assert read_query_id("ckpt") == first
    monkeypatch.chdir(tmp_path / "b")
    assert read_query_id("ckpt") == second
    assert os.getcwd() == str(tmp_path / "b")
