"""S3 (and S3-compatible) store built on boto3, with conditional writes.

``put_if_absent`` is ``PutObject`` with ``If-None-Match: *`` and ``put_if_match`` is
``PutObject`` with ``If-Match: "<etag>"``. Idempotent requests (get, head, list, delete,
plain put) are retried by botocore's ``standard`` retry mode. Conditional puts go through a
second client with botocore retries switched off: a silently retried conditional put whose
first attempt did land would come back ``412`` for our *own* write. Instead this module
retries them itself and, whenever an attempt's outcome is unknown (timeout, dropped
connection, 5xx), resolves it by reading the object back and comparing bytes.

Read-back identifies "our" write by its bytes, so two writers racing with byte-identical
payloads are indistinguishable; txntable's log and coordinator payloads carry unique ids.

Options (``storage_options``) follow pyiceberg's naming; secrets never appear in ``repr``,
log records or exception messages.
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import boto3
import pyarrow as pa
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from txntable.errors import (
    BucketNotFoundError,
    InvalidConfigurationError,
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
)
from txntable.storage.base import (
    ObjectInfo,
    Store,
    StoredObject,
    refuse_unknown_options,
    validate_key,
)
from txntable.util import now_ms

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

log = logging.getLogger(__name__)

#: Custom endpoint, e.g. ``http://127.0.0.1:9000`` (MinIO, moto); default is AWS.
S3_ENDPOINT = "s3.endpoint"
#: AWS region; default is boto3's own resolution (env, config file).
S3_REGION = "s3.region"
#: Static credentials; when absent the default boto3 credential chain is used.
S3_ACCESS_KEY_ID = "s3.access-key-id"
S3_SECRET_ACCESS_KEY = "s3.secret-access-key"
S3_SESSION_TOKEN = "s3.session-token"
#: ``"true"`` permits plain-HTTP endpoints (refused otherwise, so credentials are not
#: sent in the clear by accident).
S3_ALLOW_HTTP = "s3.allow-http"
S3_ALLOW_HTTP_DEFAULT = "false"
#: ``"path"``, ``"virtual"`` or ``"auto"``.
S3_ADDRESSING_STYLE = "s3.addressing-style"
S3_ADDRESSING_STYLE_DEFAULT = "auto"
#: Total attempts per request (first try included), for botocore and our own retries.
S3_MAX_ATTEMPTS = "s3.max-attempts"
S3_MAX_ATTEMPTS_DEFAULT = "5"
#: Seconds.
S3_CONNECT_TIMEOUT = "s3.connect-timeout"
S3_CONNECT_TIMEOUT_DEFAULT = "10"
#: Seconds to wait for a response (socket read timeout).
S3_REQUEST_TIMEOUT = "s3.request-timeout"
S3_REQUEST_TIMEOUT_DEFAULT = "60"
#: Full-jitter exponential backoff for our own retries of conditional puts.
S3_RETRY_BASE_DELAY_MS = "s3.retry-base-delay-ms"
S3_RETRY_BASE_DELAY_MS_DEFAULT = "50"
S3_RETRY_MAX_DELAY_MS = "s3.retry-max-delay-ms"
S3_RETRY_MAX_DELAY_MS_DEFAULT = "5000"
S3_MAX_POOL_CONNECTIONS = "s3.max-pool-connections"
S3_MAX_POOL_CONNECTIONS_DEFAULT = "32"

#: Every option an S3 store accepts; any other key is refused.
S3_OPTIONS = frozenset(
    {
        S3_ENDPOINT,
        S3_REGION,
        S3_ACCESS_KEY_ID,
        S3_SECRET_ACCESS_KEY,
        S3_SESSION_TOKEN,
        S3_ALLOW_HTTP,
        S3_ADDRESSING_STYLE,
        S3_MAX_ATTEMPTS,
        S3_CONNECT_TIMEOUT,
        S3_REQUEST_TIMEOUT,
        S3_RETRY_BASE_DELAY_MS,
        S3_RETRY_MAX_DELAY_MS,
        S3_MAX_POOL_CONNECTIONS,
    }
)
#: Options masked in ``repr``; the access key id is masked too (it identifies the account).
SECRET_OPTIONS = frozenset({S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN})
_MASK = "***"

#: Segment puts one ``put_data_files`` call runs at once (below botocore's default pool of
#: 10 connections).
_PARALLEL_PUTS = 8

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
# 409s that mean "a concurrent conditional request was in flight; try again": not applied.
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
    }
)


_SESSION_LOCK = threading.Lock()
_SESSION: boto3.session.Session | None = None


def _shared_session() -> boto3.session.Session:
    """One boto3 session per process: its loader caches the S3 model, so a client costs ~4ms
    instead of ~50ms. Sessions are not thread-safe; callers hold ``_SESSION_LOCK``."""
    global _SESSION
    if _SESSION is None:
        _SESSION = boto3.session.Session()
    return _SESSION


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` (or ``s3a://``) into bucket and key prefix.

    Args:
        url: The warehouse URL.

    Returns:
        ``(bucket, prefix)``; ``prefix`` has no leading or trailing ``/`` and may be empty.

    Raises:
        InvalidPathError: If the URL is not an ``s3`` URL or names no bucket.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("s3", "s3a") or parts.query or parts.fragment:
        raise InvalidPathError(f"not an s3 URL: {url!r}")
    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise InvalidPathError(f"s3 URL needs a plain bucket name: {url!r}")
    prefix = parts.path.strip("/")
    if prefix:
        validate_key(prefix)
    return bucket, prefix


def _strip_etag(etag: str) -> str:
    return etag.strip().strip('"')


def _error_info(exc: ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {}) or {}
    meta = exc.response.get("ResponseMetadata", {}) or {}
    return str(error.get("Code", "")), int(meta.get("HTTPStatusCode", 0) or 0)


def _is_transient(code: str, status: int) -> bool:
    return status >= 500 or status == 429 or code in _TRANSIENT_CODES


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise InvalidConfigurationError(f"storage option {name} must be true or false")


def _parse_number(name: str, value: str, minimum: float) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InvalidConfigurationError(f"storage option {name} must be a number") from None
    if number < minimum:
        raise InvalidConfigurationError(f"storage option {name} must be >= {minimum}")
    return number


class S3Store(Store):
    """A store rooted at ``s3://bucket/prefix``.

    Args:
        url: ``s3://bucket/prefix`` (``s3a://`` is accepted and normalised to ``s3://``).
        storage_options: ``S3_*`` options of this module (:data:`S3_OPTIONS`).

    Raises:
        InvalidPathError: If the URL is malformed, or the endpoint is plain HTTP without
            ``s3.allow-http``.
        InvalidConfigurationError: If an option is unknown or has a malformed value.
    """

    ordered_listing = True

    def __init__(self, url: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        opts = self._options
        # A typo must not fall back to a default (AWS itself, the default credential chain).
        refuse_unknown_options("S3", opts, S3_OPTIONS)

        allow_http = opts.get(S3_ALLOW_HTTP, S3_ALLOW_HTTP_DEFAULT)
        self._allow_http = _parse_bool(S3_ALLOW_HTTP, allow_http)
        self._endpoint = self._normalise_endpoint(opts.get(S3_ENDPOINT) or None)
        self._region = opts.get(S3_REGION) or None
        style = opts.get(S3_ADDRESSING_STYLE, S3_ADDRESSING_STYLE_DEFAULT).strip().lower()
        if style not in ("path", "virtual", "auto"):
            raise InvalidConfigurationError(
                f"storage option {S3_ADDRESSING_STYLE} must be path, virtual or auto"
            )
        self._addressing_style = style
        self._max_attempts = int(
            _parse_number(S3_MAX_ATTEMPTS, opts.get(S3_MAX_ATTEMPTS, S3_MAX_ATTEMPTS_DEFAULT), 1)
        )
        self._connect_timeout = _parse_number(
            S3_CONNECT_TIMEOUT, opts.get(S3_CONNECT_TIMEOUT, S3_CONNECT_TIMEOUT_DEFAULT), 0
        )
        self._request_timeout = _parse_number(
            S3_REQUEST_TIMEOUT, opts.get(S3_REQUEST_TIMEOUT, S3_REQUEST_TIMEOUT_DEFAULT), 0
        )
        self._base_delay = (
            _parse_number(
                S3_RETRY_BASE_DELAY_MS,
                opts.get(S3_RETRY_BASE_DELAY_MS, S3_RETRY_BASE_DELAY_MS_DEFAULT),
                0,
            )
            / 1000.0
        )
        self._max_delay = (
            _parse_number(
                S3_RETRY_MAX_DELAY_MS,
                opts.get(S3_RETRY_MAX_DELAY_MS, S3_RETRY_MAX_DELAY_MS_DEFAULT),
                0,
            )
            / 1000.0
        )
        pool = int(
            _parse_number(
                S3_MAX_POOL_CONNECTIONS,
                opts.get(S3_MAX_POOL_CONNECTIONS, S3_MAX_POOL_CONNECTIONS_DEFAULT),
                1,
            )
        )

        def make_client(max_attempts: int) -> Any:
            config = Config(
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                connect_timeout=self._connect_timeout,
                read_timeout=self._request_timeout,
                max_pool_connections=pool,
                s3={"addressing_style": self._addressing_style},
            )
            # Missing keys -> None -> the default credential chain.
            with _SESSION_LOCK:
                return _shared_session().client(
                    "s3",
                    region_name=self._region,
                    endpoint_url=self._endpoint,
                    aws_access_key_id=opts.get(S3_ACCESS_KEY_ID) or None,
                    aws_secret_access_key=opts.get(S3_SECRET_ACCESS_KEY) or None,
                    aws_session_token=opts.get(S3_SESSION_TOKEN) or None,
                    config=config,
                )

        #: Keys per LIST page (S3's maximum; tests lower it to exercise pagination).
        self._list_page_size = 1000
        self._client = make_client(self._max_attempts)
        # No botocore retries for conditional puts: see the module docstring.
        self._cas_client = make_client(1)

    # --- configuration ------------------------------------------------------------------

    def _normalise_endpoint(self, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        endpoint = endpoint.strip().rstrip("/")
        if "://" not in endpoint:
            endpoint = ("http://" if self._allow_http else "https://") + endpoint
        scheme = urlsplit(endpoint).scheme.lower()
        if scheme not in ("http", "https"):
            raise InvalidPathError(f"{S3_ENDPOINT} must be an http(s) URL")
        if scheme == "http" and not self._allow_http:
            raise InvalidPathError(
                f"{S3_ENDPOINT} is plain http; set {S3_ALLOW_HTTP}=true to allow it"
            )
        return endpoint

    def storage_options(self) -> dict[str, str]:
        """Return the options this store was opened with, secrets included (for executors)."""
        return dict(self._options)

    def __repr__(self) -> str:
        shown = {k: (_MASK if k in SECRET_OPTIONS else v) for k, v in self._options.items()}
        return f"S3Store(url={self.url!r}, storage_options={shown!r})"

    __str__ = __repr__

    _arrow_fs_cache: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # boto3 clients do not pickle; reopen from url + options (e.g. in a Spark executor).
        return (S3Store, (self.url, self._options))

    def close(self) -> None:
        """Close the HTTP connection pools of both clients."""
        for client in (self._client, self._cas_client):
            close = getattr(client, "close", None)
            if close is not None:
                close()

    # --- helpers ------------------------------------------------------------------------

    def _full_key(self, key: str) -> str:
        return self._base + validate_key(key)

    def _redact(self, text: str) -> str:
        """Mask each secret where it stands as a whole token (not inside a longer word:
        a one-character key must not mangle ``s3.amazonaws.com``)."""
        secrets = sorted(
            {s for s in (self._options.get(n) for n in SECRET_OPTIONS) if s}, key=len, reverse=True
        )
        for secret in secrets:
            text = re.sub(
                rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", _MASK, text
            )
        return text

    def _backoff(self, attempt: int) -> None:
        # Full jitter: spreads racing writers apart instead of retrying in lockstep.
        ceiling = min(self._max_delay, self._base_delay * (2 ** (attempt - 1)))
        time.sleep(random.uniform(0, ceiling))

    def _fail(self, op: str, key: str, exc: Exception) -> NoReturn:
        """Translate a botocore error of an idempotent request (already retried) and raise it.

        The botocore exception is not chained: its response may echo request details.
        """
        if isinstance(exc, ClientError):
            code, status = _error_info(exc)
            message = self._redact(str((exc.response.get("Error", {}) or {}).get("Message", "")))
            text = f"{op} s3://{self.bucket}/{self._base}{key}: {code or 'error'} (HTTP {status})"
            if message:
                text += f": {message}"
            if code == "NoSuchBucket":
                raise BucketNotFoundError(text) from None
            if code in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(key) from None
            if _is_transient(code, status):
                raise TransientStorageError(text) from None
            raise StorageError(text) from None
        text = f"{op} s3://{self.bucket}/{self._base}{key}: {type(exc).__name__}: "
        text += self._redact(str(exc))
        if isinstance(exc, BotoConnectionError | HTTPClientError | IncompleteReadError):
            raise TransientStorageError(text) from None
        raise StorageError(text) from None

    def _call(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (ClientError, BotoCoreError) as exc:
            self._fail(op, key, exc)

    # --- Store API ----------------------------------------------------------------------

    def get(self, key: str) -> StoredObject:
        full = self._full_key(key)
        attempt = 0
        while True:
            attempt += 1
            response = self._call(
                "GET", key, lambda: self._client.get_object(Bucket=self.bucket, Key=full)
            )
            try:
                # Body streaming errors happen after botocore's retry loop; retry them here.
                data = response["Body"].read()
            except (HTTPClientError, IncompleteReadError) as exc:
                if attempt >= self._max_attempts:
                    self._fail("GET", key, exc)
                log.debug("GET %s: body read failed (%s), retrying", key, type(exc).__name__)
                self._backoff(attempt)
                continue
            return StoredObject(data, _strip_etag(response["ETag"]))

    def put_data_file(self, key: str, data: bytes) -> None:
        """Write a segment through ``pyarrow.fs.S3FileSystem`` (what Spark executors use).

        Raises:
            TransientStorageError: The write failed and may be retried.
            StorageError: pyarrow refused it otherwise (e.g. its S3 client was finalized
                at interpreter exit).
        """
        path = self._arrow_path(key)
        try:
            with self._arrow_fs().open_output_stream(path) as out:
                out.write(data)
        except OSError as exc:
            # Plain puts are idempotent: a caller retrying a transient error is safe.
            raise TransientStorageError(
                f"PUT s3://{path}: {self._redact(str(exc))}"
            ) from None
        except pa.ArrowException as exc:
            raise StorageError(f"PUT s3://{path}: {self._redact(str(exc))}") from None

    def put_data_files(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Put several segments in parallel: a round costs one round trip, not one each.

        Raises:
            TransientStorageError: A write failed and may be retried (after every other
                write ended).
            StorageError: pyarrow refused one otherwise.
        """
        if len(items) <= 1:
            for key, data in items:
                self.put_data_file(key, data)
            return
        threads = min(len(items), _PARALLEL_PUTS)
        with ThreadPoolExecutor(threads, thread_name_prefix="txntable-s3-put") as pool:
            futures = [pool.submit(self.put_data_file, key, data) for key, data in items]
        for future in futures:
            future.result()

    def get_data_file(self, key: str) -> bytes:
        """Read a segment: one ``GetObject`` (boto3), nothing before it.

        Not through ``pyarrow.fs.S3FileSystem``: its input streams send a ``HeadObject``
        before the ``GET`` to learn the size, doubling the requests (and the latency) of
        every segment read. Large segments are read with ranged requests by
        :class:`txntable.read.reader.SegmentReader` instead.

        Raises:
            ObjectNotFoundError: If it does not exist.
            TransientStorageError: The read kept failing transiently.
        """
        return self.get(key).data

    def _arrow_path(self, key: str) -> str:
        return f"{self.bucket}/{self._full_key(key)}"

    def _arrow_fs(self) -> Any:
        # One filesystem per store: creating one sets up an AWS client.
        if self._arrow_fs_cache is None:
            self._arrow_fs_cache = self.arrow_filesystem()[0]
        return self._arrow_fs_cache

    def _head_object(self, key: str) -> dict[str, Any] | None:
        full = self._full_key(key)
        try:
            response: dict[str, Any] = self._call(
                "HEAD", key, lambda: self._client.head_object(Bucket=self.bucket, Key=full)
            )
        except ObjectNotFoundError:
            return None
        return response

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head_object(key)
        if response is None:
            return None
        return ObjectInfo(key, _strip_etag(response["ETag"]), int(response["ContentLength"]))

    def modified_ms(self, key: str) -> int | None:
        response = self._head_object(key)
        modified = None if response is None else response.get("LastModified")
        return None if modified is None else int(modified.timestamp() * 1000)

    def clock_ms(self) -> int:
        """The server's time: the ``Date`` header of a HEAD of the bucket (whole seconds).
        Without one (an emulator that sends none) this machine's clock stands in."""
        try:
            response = self._client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            self._fail("HEAD", "", exc)
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if not date:
            return now_ms()
        try:
            return int(email.utils.parsedate_to_datetime(date).timestamp() * 1000)
        except (TypeError, ValueError):
            return now_ms()

    def check_root(self) -> None:
        """One HEAD of the bucket: a 404 means it does not exist.

        Raises:
            BucketNotFoundError: The bucket does not exist.
        """
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code, status = _error_info(exc)
            if status == 404 or code in ("NoSuchBucket", "NotFound", "404"):
                raise BucketNotFoundError(
                    f"bucket {self.bucket!r} does not exist ({self.url})"
                ) from None
            # 403 and the like: credentials may read objects but not the bucket itself;
            # nothing is known, so the caller's own error stands.
        except BotoCoreError:
            pass

    def put(self, key: str, data: bytes) -> str:
        full = self._full_key(key)
        response = self._call(
            "PUT",
            key,
            lambda: self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data)),
        )
        return _strip_etag(response["ETag"])

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._conditional_put(key, bytes(data), None)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._conditional_put(key, bytes(data), _strip_etag(etag))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._base + prefix}
        if start_after is not None:
            kwargs["StartAfter"] = self._base + start_after
        return self._list(kwargs, prefix)

    def _list(self, kwargs: dict[str, Any], prefix: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        base_len = len(self._base)
        try:
            pages = paginator.paginate(
                **kwargs, PaginationConfig={"PageSize": self._list_page_size}
            )
            for page in pages:
                for entry in page.get("Contents", ()):
                    full: str = entry["Key"]
                    # Skip "directory marker" objects some tools create.
                    if not full.endswith("/"):
                        yield full[base_len:]
        except (ClientError, BotoCoreError) as exc:
            self._fail("LIST", prefix, exc)

    def list_children(self, prefix: str = "") -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        full_prefix = self._base + prefix
        names: set[str] = set()
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", ()):
                    names.add(common["Prefix"][len(full_prefix) :].rstrip("/"))
                for entry in page.get("Contents", ()):
                    name = entry["Key"][len(full_prefix) :]
                    if name:
                        names.add(name)
        except (ClientError, BotoCoreError) as exc:
            self._fail("LIST", prefix, exc)
        return iter(sorted(names))

    def delete(self, key: str) -> None:
        full = self._full_key(key)
        try:
            self._call(
                "DELETE", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=full)
            )
        except ObjectNotFoundError:
            pass

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, a thousand keys per request (missing keys are no error).

        Raises:
            TransientStorageError: A key could not be deleted (S3 reports it per key).
        """
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            request = {"Objects": [{"Key": self._full_key(k)} for k in chunk], "Quiet": True}

            def delete(request: dict[str, Any] = request) -> Any:
                return self._client.delete_objects(Bucket=self.bucket, Delete=request)

            response = self._call("DELETE", chunk[0], delete)
            failed = response.get("Errors", [])
            if failed:
                raise TransientStorageError(
                    f"DELETE s3://{self.bucket}/{failed[0].get('Key')}: "
                    f"{failed[0].get('Code')} ({len(failed)} keys not deleted)"
                )

    # --- conditional puts ---------------------------------------------------------------

    def _conditional_put(self, key: str, data: bytes, expected: str | None) -> str:
        """``If-None-Match: *`` (``expected`` is None) or ``If-Match: expected`` put.

        Retries 409 conflicts and ambiguous failures itself, bounded by ``s3.max-attempts``.
        """
        op = "put_if_absent" if expected is None else "put_if_match"
        full = self._full_key(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": data}
        if expected is None:
            kwargs["IfNoneMatch"] = "*"
        else:
            kwargs["IfMatch"] = f'"{expected}"'
        # True once an earlier attempt may have been applied: from then on a 412 may be
        # caused by our own write, so it is resolved by read-back instead of trusted.
        ambiguous = False
        last = ""
        for attempt in range(1, self._max_attempts + 1):
            if attempt > 1:
                self._backoff(attempt - 1)
            try:
                response = self._cas_client.put_object(**kwargs)
                return _strip_etag(response["ETag"])
            except ClientError as exc:
                code, status = _error_info(exc)
                last = f"{code or 'error'} (HTTP {status})"
                if status == 412 or code == "PreconditionFailed":
                    if not ambiguous:
                        if expected is None:
                            raise ObjectExistsError(key) from None
                        raise PreconditionFailedError(f"{key}: etag changed") from None
                elif code in _NOT_FOUND_CODES and expected is not None:
                    raise ObjectNotFoundError(key) from None
                elif status == 409 and code in _CONFLICT_CODES:
                    # Rejected because of a concurrent conditional write: never applied.
                    log.debug("%s %s: %s, retrying", op, key, code)
                    continue
                elif _is_transient(code, status):
                    ambiguous = True
                else:
                    self._fail(op.upper(), key, exc)
            except (EndpointConnectionError, ConnectTimeoutError) as exc:
                # No connection was made, so the request never reached the server.
                last = type(exc).__name__
                log.debug("%s %s: %s before sending, retrying", op, key, last)
                continue
            except (BotoConnectionError, HTTPClientError) as exc:
                # Read timeout, reset connection, ...: the request may have been applied.
                last = type(exc).__name__
                ambiguous = True
            except BotoCoreError as exc:
                self._fail(op.upper(), key, exc)
            log.debug("%s %s: outcome unknown (%s), reading back", op, key, last)
            resolved = self._resolve(op, key, data, expected)
            if resolved is not None:
                return resolved
        raise TransientStorageError(
            f"{op} s3://{self.bucket}/{full}: gave up after {self._max_attempts} attempts"
            f" (last: {last})" + ("; outcome unknown" if ambiguous else "")
        )

    def _resolve(self, op: str, key: str, data: bytes, expected: str | None) -> str | None:
        """Decide an ambiguous conditional put by reading the object back.

        Returns:
            The object's etag if our write is there, or ``None`` if it is safe to retry.

        Raises:
            ObjectExistsError / PreconditionFailedError: Another writer's bytes are there.
            ObjectNotFoundError: ``put_if_match`` and the object is gone.
            TransientStorageError: The read-back itself failed (outcome unknown).
        """
        try:
            current = self.get(key)
        except ObjectNotFoundError:
            if expected is None:
                return None  # Nothing landed: retrying If-None-Match is safe.
            raise
        except StorageError as exc:
            # Whatever broke the read-back, our write may or may not be there.
            raise TransientStorageError(
                f"{op} {key}: outcome unknown; read-back failed: {exc}"
            ) from None
        if expected is not None and current.etag == expected:
            return None  # Old object still in place: retrying If-Match is safe.
        if current.data == data:
            return current.etag
        if expected is None:
            raise ObjectExistsError(key)
        raise PreconditionFailedError(f"{key}: etag changed")

    # --- pyarrow ------------------------------------------------------------------------

    def arrow_filesystem(self) -> tuple[S3FileSystem, str]:
        """Return a pyarrow ``S3FileSystem`` configured like this store, and the base path.

        Returns:
            ``(filesystem, "bucket/prefix")``; join keys to the base path with ``/``.
        """
        from pyarrow import fs as pafs

        opts = self._options
        kwargs: dict[str, Any] = {
            "connect_timeout": self._connect_timeout,
            "request_timeout": self._request_timeout,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=self._max_attempts),
        }
        if opts.get(S3_ACCESS_KEY_ID):
            kwargs["access_key"] = opts[S3_ACCESS_KEY_ID]
            kwargs["secret_key"] = opts.get(S3_SECRET_ACCESS_KEY, "")
            if opts.get(S3_SESSION_TOKEN):
                kwargs["session_token"] = opts[S3_SESSION_TOKEN]
        if self._region:
            kwargs["region"] = self._region
        if self._endpoint:
            parts = urlsplit(self._endpoint)
            kwargs["scheme"] = parts.scheme
            kwargs["endpoint_override"] = parts.netloc + parts.path
        if self._addressing_style == "virtual":
            kwargs["force_virtual_addressing"] = True
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return pafs.S3FileSystem(**kwargs), base
