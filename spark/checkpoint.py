"""The streaming sink's identity: the id of the query, which Spark keeps in its checkpoint.

Spark writes ``<checkpointLocation>/metadata`` (``{"id": "<uuid>"}``) when a query first
starts and keeps it across restarts; a deleted checkpoint gives the next query a new id. So
the query id is exactly the identity the sink's idempotency needs (Delta's streaming sink
keys its ``txn`` on it): a restarted query skips the batches it already wrote, a query
started over writes all of its batches. The checkpoint path string is no identity: one
query may spell it several ways and two queries may share it.

Spark hands the sink its options, not the query id, so the driver reads the metadata when
the writer is created, from the location Spark resolved: the ``checkpointLocation`` string
qualified as Hadoop's ``Path`` does (``/x``, ``file:/x`` and ``file:///x`` are one location;
a relative path is relative to the driver JVM's working directory, which the data source's
Python worker on the driver inherits). Tasks of a micro-batch see the query id as a Spark
local property; they report it and the driver checks it against the one it read, so a
location resolved differently from Spark's is an error, never a wrong id.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import uuid
from collections.abc import Mapping

from txntable.errors import InvalidConfigurationError

from .session import task_property

__all__ = [
    "QUERY_ID_PROPERTY",
    "app_id_of_query",
    "checkpoint_dir",
    "checkpoint_option",
    "read_query_id",
    "task_query_id",
]

#: The Spark local property a streaming query's tasks carry its id in
#: (``StreamExecution.QUERY_ID_KEY``).
QUERY_ID_PROPERTY = "sql.streaming.queryId"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)


def checkpoint_option(options: Mapping[str, str]) -> str | None:
    """The ``checkpointLocation`` option (Spark lower-cases option names), if set."""
    value = {k.lower(): v for k, v in options.items()}.get("checkpointlocation")
    return value if value else None


def checkpoint_dir(location: str, cwd: str) -> str:
    """The local directory Spark keeps the checkpoint ``location`` in.

    As Hadoop's ``new Path(location)`` qualified against the local file system: an optional
    ``file:`` scheme with an empty authority, repeated slashes collapsed, ``.`` and ``..``
    resolved, a trailing slash dropped, a relative path joined to ``cwd``. No
    percent-decoding: Hadoop takes the path of a string literally.

    Raises:
        InvalidConfigurationError: Empty, another scheme (the sink reads only local
            checkpoints), or a ``file:`` URL with a host.
    """
    path = location.strip()
    if not path:
        raise InvalidConfigurationError("checkpointLocation must not be empty")
    match = _SCHEME.match(path)
    # A colon after the first slash is part of a path, not a scheme (Hadoop's rule).
    if match is not None and "/" not in path[: match.end(1)]:
        scheme, rest = match.group(1).lower(), match.group(2)
        if scheme != "file":
            raise InvalidConfigurationError(
                f"the txntable streaming sink reads the query id from the checkpoint, and "
                f"reads only local checkpoints, not {location!r}: set option txnAppId "
                "(an id unique to this query, kept across its restarts)"
            )
        if rest.startswith("//"):
            host, _, tail = rest[2:].partition("/")
            if host:
                raise InvalidConfigurationError(
                    f"checkpointLocation {location!r} names a host; the txntable streaming "
                    "sink reads only local checkpoints: set option txnAppId"
                )
            rest = "/" + tail
        if not rest.startswith("/"):
            raise InvalidConfigurationError(
                f"checkpointLocation {location!r}: a file: URL needs an absolute path"
            )
        path = rest
    path = re.sub("/+", "/", path)
    if not path.startswith("/"):
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path)


def read_query_id(location: str, cwd: str | None = None) -> str:
    """The id of the query whose checkpoint is ``location`` (``cwd``: the driver's working
    directory, for a relative location; default the current one).

    Raises:
        InvalidConfigurationError: The location is not a local checkpoint, or its metadata
            is missing or not Spark's (the message says why; the sink never guesses).
    """
    directory = checkpoint_dir(location, os.getcwd() if cwd is None else cwd)
    path = posixpath.join(directory, "metadata")
    hint = (
        "the txntable streaming sink keys its exactly-once commits on the query id Spark "
        "keeps there; or set option txnAppId"
    )
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024)
    except FileNotFoundError:
        raise InvalidConfigurationError(
            f"no query metadata at {path} (checkpointLocation {location!r}): {hint}"
        ) from None
    except OSError as e:
        raise InvalidConfigurationError(
            f"cannot read the query metadata {path} (checkpointLocation {location!r}): "
            f"{e}; {hint}"
        ) from e
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        doc = None
    query_id = doc.get("id") if isinstance(doc, dict) else None
    if isinstance(query_id, str):
        try:
            return str(uuid.UUID(query_id))
        except ValueError:
            pass
    raise InvalidConfigurationError(
        f"{path} is not Spark's query metadata ({{\"id\": \"<uuid>\"}}): is "
        "checkpointLocation the directory of this query's checkpoint?"
    )


def app_id_of_query(query_id: str) -> str:
    """The ``appTxn`` id of a streaming query's micro-batches."""
    return f"spark-query-{query_id}"


def task_query_id() -> str | None:
    """The id of the streaming query the current Spark task runs for (``None`` outside a
    task, or when Spark did not set it)."""
    return task_property(QUERY_ID_PROPERTY)
