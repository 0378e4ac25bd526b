"""S3Store: conditional-put retries and read-back, configuration, secrets, pyarrow access.

Fast tests use in-process moto (``mock_s3``) and replace the store's conditional-put client
method to inject failures; the racing tests talk HTTP to ``moto_server``.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import storeutil
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from storeutil import race

from txntable.errors import (
    BucketNotFoundError,
    InvalidConfigurationError,
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TableNotFoundError,
    TransientStorageError,
)
from txntable.storage import (
    CountingStore,
    LocalStore,
    MemoryStore,
    S3Store,
    open_store,
)
from txntable.storage.arrowfs import arrow_filesystem
from txntable.storage.s3 import (
    S3_ACCESS_KEY_ID,
    S3_ALLOW_HTTP,
    S3_ENDPOINT,
    S3_MAX_ATTEMPTS,
    S3_REGION,
    S3_RETRY_BASE_DELAY_MS,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
)

ACCESS_KEY = "AKIAEXAMPLEACCESSKEY"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
SESSION_TOKEN = "FwoGZXIvYXdzSESSIONTOKENVALUE"
SECRETS = (ACCESS_KEY, SECRET_KEY, SESSION_TOKEN)


def client_error(code: str, status: int, message: str = "injected") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutObject",
    )


@pytest.fixture
def mocked_store(mock_s3: None) -> Iterator[S3Store]:
    """An S3Store on in-process moto with fast retries and secrets to leak-check."""
    bucket = storeutil.create_bucket()
    store = S3Store(
        f"s3://{bucket}/wh",
        {
            S3_REGION: storeutil.TEST_REGION,
            S3_ACCESS_KEY_ID: ACCESS_KEY,
            S3_SECRET_ACCESS_KEY: SECRET_KEY,
            S3_SESSION_TOKEN: SESSION_TOKEN,
            S3_MAX_ATTEMPTS: "4",
            S3_RETRY_BASE_DELAY_MS: "1",
        },
    )
    yield store
    store.close()


class CasScript:
    """Replaces ``put_object`` of the store's conditional client with a scripted sequence.

    Each step gets the real method and the call's kwargs and returns its response or raises.
    Once the script is used up, calls go to the real method.
    """

    def __init__(self, store: S3Store, *steps: Callable[[Callable[..., Any], dict[str, Any]], Any]):
        self.real = store._cas_client.put_object
        self.steps = list(steps)
        self.calls = 0
        store._cas_client.put_object = self  # instance attribute shadows the client method

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.steps:
            return self.steps.pop(0)(self.real, kwargs)
        return self.real(**kwargs)


def count_gets(store: S3Store) -> list[int]:
    """Count read-backs by wrapping the idempotent client's get_object."""
    counter = [0]
    real = store._client.get_object

    def get_object(**kwargs: Any) -> Any:
        counter[0] += 1
        return real(**kwargs)

    store._client.get_object = get_object
    return counter


def write_then(exc: BaseException) -> Callable[[Callable[..., Any], dict[str, Any]], Any]:
    """The request lands, but the response is lost."""

    def step(real: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        real(**kwargs)
        raise exc

    return step


def fail_with(exc: BaseException) -> Callable[[Callable[..., Any], dict[str, Any]], Any]:
    """The request does not land."""

    def step(real: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        raise exc

    return step


def timeout() -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url="https://s3.example/wh/key")


# --- configuration and secrets -------------------------------------------------------------


def test_url_parsing_and_s3a_alias(mock_s3: None) -> None:
    assert S3Store("s3a://bkt/a/b/").url == "s3://bkt/a/b"
    assert open_store("s3a://bkt/a").url == "s3://bkt/a"
    assert S3Store("s3://bkt").url == "s3://bkt"
    for bad in ["s3://", "s3:///prefix", "s3://bkt/a/../b", "gs://bkt/x", "s3://u:p@bkt/x"]:
        with pytest.raises(InvalidPathError):
            S3Store(bad)


def test_plain_http_endpoint_needs_allow_http(mock_s3: None) -> None:
    with pytest.raises(InvalidPathError, match="allow-http"):
        S3Store("s3://bkt/x", {S3_ENDPOINT: "http://127.0.0.1:9000"})
    store = S3Store("s3://bkt/x", {S3_ENDPOINT: "127.0.0.1:9000", S3_ALLOW_HTTP: "true"})
    assert store._endpoint == "http://127.0.0.1:9000"
    assert S3Store("s3://bkt/x", {S3_ENDPOINT: "minio:9000"})._endpoint == "https://minio:9000"
    with pytest.raises(InvalidConfigurationError, match="s3.max-attempts must be a number"):
        S3Store("s3://bkt/x", {S3_MAX_ATTEMPTS: "many"})


def test_secrets_masked_in_repr_but_kept_in_storage_options(mocked_store: S3Store) -> None:
    for text in (repr(mocked_store), str(mocked_store)):
        assert "***" in text
        for secret in SECRETS:
            assert secret not in text
    options = mocked_store.storage_options()
    assert options[S3_SECRET_ACCESS_KEY] == SECRET_KEY
    assert options[S3_SESSION_TOKEN] == SESSION_TOKEN
    reopened = pickle.loads(pickle.dumps(mocked_store))
    assert reopened.url == mocked_store.url
    assert reopened.storage_options() == options


def test_secrets_never_in_exception_messages(
    mocked_store: S3Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="txntable")
    echo = f"key {ACCESS_KEY} secret {SECRET_KEY} token {SESSION_TOKEN}"

    def denied(**kwargs: Any) -> Any:
        raise ClientError(
            {
                "Error": {"Code": "AccessDenied", "Message": echo},
                "ResponseMetadata": {"HTTPStatusCode": 403},
            },
            "GetObject",
        )

    mocked_store._client.get_object = denied
    errors: list[BaseException] = []
    with pytest.raises(StorageError) as info:
        mocked_store.get("k")
    assert type(info.value) is StorageError  # permanent: not transient, not not-found
    errors.append(info.value)
    CasScript(mocked_store, *[fail_with(client_error("InternalError", 500, echo))] * 4)
    with pytest.raises(TransientStorageError) as info2:
        mocked_store.put_if_absent("k", b"x")  # read-back hits `denied` as well
    errors.append(info2.value)

    for error in errors:
        assert error.__cause__ is None and error.__suppress_context__
        for secret in SECRETS:
            assert secret not in str(error) and secret not in repr(error)
    for record in caplog.records:
        for secret in SECRETS:
            assert secret not in record.getMessage()


# --- conditional puts: 409 retries and ambiguity resolution ---------------------------------


def test_409_conditional_request_conflict_is_retried(mocked_store: S3Store) -> None:
    script = CasScript(
        mocked_store,
        fail_with(client_error("ConditionalRequestConflict", 409)),
        fail_with(client_error("ConditionalRequestConflict", 409)),
    )
    gets = count_gets(mocked_store)
    etag = mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 3
    assert gets[0] == 0  # a 409 was never applied: no read-back needed
    assert mocked_store.get("_log/1.json").etag == etag


def test_409_forever_gives_up_with_transient_error(mocked_store: S3Store) -> None:
    conflict = fail_with(client_error("ConditionalRequestConflict", 409))
    script = CasScript(mocked_store, *[conflict] * 10)
    with pytest.raises(TransientStorageError, match="gave up after 4 attempts"):
        mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 4
    assert mocked_store.head("_log/1.json") is None


@pytest.mark.parametrize(
    "exc",
    [
        timeout(),
        ConnectionClosedError(endpoint_url="https://s3.example"),
        client_error("InternalError", 500),
        client_error("SlowDown", 503),
    ],
    ids=["read-timeout", "connection-closed", "500", "503"],
)
def test_ambiguous_put_if_absent_that_landed_resolves_to_success(
    mocked_store: S3Store, exc: BaseException
) -> None:
    script = CasScript(mocked_store, write_then(exc))
    etag = mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 1  # resolved by read-back, not by writing again
    assert mocked_store.head("_log/1.json") == mocked_store.head("_log/1.json")
    info = mocked_store.head("_log/1.json")
    assert info is not None and info.etag == etag


def test_ambiguous_put_if_absent_with_other_writers_bytes_is_exists_error(
    mocked_store: S3Store,
) -> None:
    def other_writer_wins(real: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        real(**{**kwargs, "Body": b"theirs"})
        raise timeout()

    script = CasScript(mocked_store, other_writer_wins)
    with pytest.raises(ObjectExistsError):
        mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 1
    assert mocked_store.get("_log/1.json").data == b"theirs"


def test_ambiguous_put_if_absent_that_did_not_land_is_retried(mocked_store: S3Store) -> None:
    script = CasScript(mocked_store, fail_with(ConnectionClosedError(endpoint_url="x")))
    gets = count_gets(mocked_store)
    etag = mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 2 and gets[0] == 1
    assert mocked_store.get("_log/1.json").etag == etag


def test_retry_that_gets_412_from_our_own_late_write_is_success(mocked_store: S3Store) -> None:
    """Attempt 1 times out and reads back nothing; it lands while attempt 2 is on its way."""

    def late_landing(real: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        real(**kwargs)  # attempt 1 finally lands ...
        return real(**kwargs)  # ... so attempt 2 gets 412 for our own bytes

    script = CasScript(mocked_store, fail_with(timeout()), late_landing)
    etag = mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 2
    assert mocked_store.get("_log/1.json").etag == etag


def test_412_without_prior_ambiguity_is_trusted(mocked_store: S3Store) -> None:
    mocked_store.put("_log/1.json", b"mine")  # same bytes, but nothing of ours was in doubt
    gets = count_gets(mocked_store)
    with pytest.raises(ObjectExistsError):
        mocked_store.put_if_absent("_log/1.json", b"mine")
    assert gets[0] == 0


def test_connect_failure_is_retried_without_read_back(mocked_store: S3Store) -> None:
    script = CasScript(mocked_store, fail_with(EndpointConnectionError(endpoint_url="x")))
    gets = count_gets(mocked_store)
    mocked_store.put_if_absent("_log/1.json", b"mine")
    assert script.calls == 2 and gets[0] == 0


def test_failed_read_back_raises_transient(mocked_store: S3Store) -> None:
    CasScript(mocked_store, write_then(timeout()))

    def unreachable(**kwargs: Any) -> Any:
        raise EndpointConnectionError(endpoint_url="x")

    mocked_store._client.get_object = unreachable
    with pytest.raises(TransientStorageError, match="outcome unknown"):
        mocked_store.put_if_absent("_log/1.json", b"mine")


def test_ambiguous_put_if_match_outcomes(mocked_store: S3Store) -> None:
    old = mocked_store.put("coord", b"v1")

    # Landed: success with the new etag, no second write.
    script = CasScript(mocked_store, write_then(timeout()))
    new = mocked_store.put_if_match("coord", b"v2", old)
    assert script.calls == 1 and new != old
    assert mocked_store.get("coord").etag == new

    # Did not land (old etag still there): retried.
    script = CasScript(mocked_store, fail_with(timeout()))
    newer = mocked_store.put_if_match("coord", b"v3", new)
    assert script.calls == 2
    assert mocked_store.get("coord").data == b"v3"

    # Another writer's swap landed instead: lost.
    def other_swaps(real: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        real(**{**kwargs, "Body": b"theirs"})
        raise timeout()

    CasScript(mocked_store, other_swaps)
    with pytest.raises(PreconditionFailedError):
        mocked_store.put_if_match("coord", b"v4", newer)
    assert mocked_store.get("coord").data == b"theirs"

    # Deleted meanwhile.
    current = mocked_store.get("coord").etag
    mocked_store.delete("coord")
    CasScript(mocked_store, fail_with(timeout()))
    with pytest.raises(ObjectNotFoundError):
        mocked_store.put_if_match("coord", b"v5", current)


def test_put_if_match_accepts_quoted_etag(mocked_store: S3Store) -> None:
    etag = mocked_store.put("coord", b"v1")
    assert mocked_store.put_if_match("coord", b"v2", f'"{etag}"')


# --- idempotent requests ----------------------------------------------------------------------


def test_get_retries_body_streaming_errors(mocked_store: S3Store) -> None:
    mocked_store.put("k", b"payload")
    real = mocked_store._client.get_object
    calls = [0]

    class BrokenBody:
        def read(self) -> bytes:
            raise ResponseStreamingError(error="connection reset")

    def flaky(**kwargs: Any) -> Any:
        calls[0] += 1
        response = real(**kwargs)
        if calls[0] == 1:
            response["Body"] = BrokenBody()
        return response

    mocked_store._client.get_object = flaky
    assert mocked_store.get("k").data == b"payload"
    assert calls[0] == 2


def test_list_paginates_strips_prefix_and_skips_markers(mocked_store: S3Store) -> None:
    mocked_store._list_page_size = 3
    keys = [f"_log/{i:05d}.json" for i in range(10)]
    for key in keys:
        mocked_store.put(key, b"x")
    raw = mocked_store._client
    raw.put_object(Bucket=mocked_store.bucket, Key="wh/_log/dir/", Body=b"")  # marker
    raw.put_object(Bucket=mocked_store.bucket, Key="other/_log/00000.json", Body=b"")
    raw.put_object(Bucket=mocked_store.bucket, Key="whx/_log/00000.json", Body=b"")
    assert list(mocked_store.list("_log/")) == keys
    assert list(mocked_store.list("_log/", start_after=keys[6])) == keys[7:]
    assert list(mocked_store.list("")) == keys


def test_store_without_prefix(mock_s3: None) -> None:
    bucket = storeutil.create_bucket()
    store = S3Store(f"s3://{bucket}", {S3_REGION: storeutil.TEST_REGION})
    store.put_if_absent("a/b", b"1")
    assert list(store.list("")) == ["a/b"]
    assert store.get("a/b").data == b"1"


def test_missing_bucket_is_storage_error(mock_s3: None) -> None:
    store = S3Store("s3://no-such-bucket-here/wh", {S3_REGION: storeutil.TEST_REGION})
    with pytest.raises(BucketNotFoundError, match="NoSuchBucket"):
        store.put("k", b"x")
    assert issubclass(BucketNotFoundError, StorageError)


def test_missing_bucket_is_not_reported_as_a_missing_table(mock_s3: None) -> None:
    from txntable import (
        Consumer,
        Producer,
        TopicPartition,
        Warehouse,
    )

    wh = Warehouse("s3://no-such-bucket-here/wh", {S3_REGION: storeutil.TEST_REGION})
    with pytest.raises(BucketNotFoundError, match="no-such-bucket-here"):
        wh.table("orders")
    with pytest.raises(BucketNotFoundError):
        wh.list_tables()
    with pytest.raises(BucketNotFoundError):
        wh.create_table("orders")
    with pytest.raises(BucketNotFoundError):
        Consumer(wh).assign([TopicPartition("orders", 0)])
    with Producer(wh) as producer, pytest.raises(BucketNotFoundError):
        producer.send("orders", value=b"v")
    # A HEAD of a missing key in a missing bucket may come back a bare 404 (no error code
    # in a body): the warehouse then asks the store about the bucket itself.
    with pytest.raises(BucketNotFoundError, match="bucket 'no-such-bucket-here' does not exist"):
        wh.store.check_root()
    # An existing bucket without the table is still "no such table".
    bucket = storeutil.create_bucket()
    S3Store(f"s3://{bucket}/wh", {S3_REGION: storeutil.TEST_REGION}).check_root()
    with pytest.raises(TableNotFoundError):
        Warehouse(f"s3://{bucket}/wh", {S3_REGION: storeutil.TEST_REGION}).table("orders")


def test_redaction_masks_whole_tokens_only(mock_s3: None) -> None:
    """A short secret is masked where it stands alone, never inside other words."""
    store = S3Store(
        "s3://bkt/wh",
        {S3_REGION: storeutil.TEST_REGION, S3_ACCESS_KEY_ID: "m", S3_SECRET_ACCESS_KEY: "a/b"},
    )
    message = "no route to bkt.s3.amazonaws.com for key m (secret a/b, Credential=m/2024)"

    def denied(**kwargs: Any) -> Any:
        raise client_error("AccessDenied", 403, message)

    store._client.get_object = denied
    with pytest.raises(StorageError) as info:
        store.get("k")
    assert type(info.value) is StorageError
    assert str(info.value).endswith(
        "no route to bkt.s3.amazonaws.com for key *** (secret ***, Credential=***/2024)"
    )


# --- against the moto server ------------------------------------------------------------------


@pytest.fixture
def slow_moto_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen moto's check-then-write window so a non-atomic conditional put would race."""
    from moto.s3.models import S3Backend

    real = S3Backend.put_object

    def slow_put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow_put_object)


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.usefixtures("slow_moto_writes")
def test_moto_server_put_if_absent_race_is_atomic(s3_store: S3Store) -> None:
    """16 writers race for each of 3 keys: one winner each, everyone else ObjectExistsError.

    Fails (several winners per round) with ``TXNTABLE_TEST_MOTO_NONATOMIC=1``.
    """
    for round_ in range(3):
        key = f"_log/{round_:05d}.json"

        def attempt(i: int, key: str = key) -> str:
            return s3_store.put_if_absent(key, b"w%d" % i)

        wins, losses = race(16, attempt)
        assert len(wins) == 1, f"{len(wins)} winners"
        assert all(isinstance(e, ObjectExistsError) for e in losses.values()), losses
        [(winner, etag)] = wins.items()
        assert s3_store.get(key).data == b"w%d" % winner
        assert s3_store.get(key).etag == etag


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.usefixtures("slow_moto_writes")
def test_moto_server_put_if_match_race_is_atomic(s3_store: S3Store) -> None:
    etag = s3_store.put("coordinator.json", b"epoch-0")
    for round_ in range(1, 4):

        def attempt(i: int, etag: str = etag, round_: int = round_) -> str:
            return s3_store.put_if_match("coordinator.json", b"epoch-%d-%d" % (round_, i), etag)

        wins, losses = race(16, attempt)
        assert len(wins) == 1, f"{len(wins)} winners"
        assert all(isinstance(e, PreconditionFailedError) for e in losses.values()), losses
        [(winner, etag)] = wins.items()
        assert s3_store.get("coordinator.json").data == b"epoch-%d-%d" % (round_, winner)


@pytest.mark.s3
@pytest.mark.slow
def test_arrow_filesystem_reads_and_writes_the_same_objects(s3_store: S3Store) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    result = arrow_filesystem(CountingStore(s3_store))  # wrappers are unwrapped
    assert result is not None
    fs, base = result
    assert base == f"{s3_store.bucket}/wh"
    table = pa.table({"offset": [0, 1, 2], "value": [b"a", b"b", b"c"]})
    pq.write_table(table, f"{base}/p0/seg-0.parquet", filesystem=fs)
    assert list(s3_store.list("p0/")) == ["p0/seg-0.parquet"]
    assert pq.read_table(pa.BufferReader(s3_store.get("p0/seg-0.parquet").data)) == table

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    s3_store.put("p0/seg-1.parquet", sink.getvalue().to_pybytes())
    assert pq.read_table(f"{base}/p0/seg-1.parquet", filesystem=fs) == table


def test_arrow_filesystem_for_local_and_memory(tmp_path: Any) -> None:
    import pyarrow.fs as pafs

    local = LocalStore(str(tmp_path / "wh"))
    result = arrow_filesystem(local)
    assert result is not None
    fs, base = result
    assert isinstance(fs, pafs.LocalFileSystem) and base == local.root
    local.put("a/b.bin", b"xyz")
    with fs.open_input_stream(f"{base}/a/b.bin") as f:
        assert f.read() == b"xyz"
    assert arrow_filesystem(MemoryStore("arrowfs-test")) is None


@pytest.mark.s3
@pytest.mark.slow
def test_data_files_go_through_pyarrow_s3_filesystem(s3_store: S3Store) -> None:
    """Segments are written with pyarrow's S3 client (as Spark executors do) and read with
    exactly one GetObject (no HeadObject before it); the bytes are the same."""
    s3_store.put_data_file("t/data/0/seg.parquet", b"PAR1...PAR1")
    assert s3_store._arrow_fs_cache is not None  # the pyarrow filesystem wrote it
    assert s3_store.get("t/data/0/seg.parquet").data == b"PAR1...PAR1"  # boto3 sees it
    sent: list[str] = []
    s3_store._client.meta.events.register(
        "before-call.s3", lambda model, **_: sent.append(model.name)
    )
    s3_store._arrow_fs_cache = None  # a read must not need pyarrow's client
    assert s3_store.get_data_file("t/data/0/seg.parquet") == b"PAR1...PAR1"
    assert sent == ["GetObject"]
    assert s3_store._arrow_fs_cache is None
    with pytest.raises(ObjectNotFoundError):
        s3_store.get_data_file("t/data/0/missing.parquet")
    counting = CountingStore(s3_store)
    counting.put_data_file("t/data/0/b.parquet", b"x")
    assert counting.get_data_file("t/data/0/b.parquet") == b"x"
    assert counting.snapshot()["PUT"] == 1 and counting.snapshot()["GET"] == 1
