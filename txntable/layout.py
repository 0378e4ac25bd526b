"""Every storage key and file name the format writes, and the validation of the names that
become part of keys (tables, groups, transactional ids). See ``spec/PROTOCOL.md``.

A warehouse holds ``<table>/_log/`` (log versions, checkpoints, ``_last_checkpoint``),
``<table>/data/<partition>/`` (segment files), ``_coordinator/`` (transaction coordinator
objects, the producer-id block) and ``_groups/<group>/`` (a group's offset log and its
``members.json``). Pure: names only, no I/O.
"""

from __future__ import annotations

import re
import uuid

from txntable.errors import InvalidTableNameError
from txntable.util import now_ms

#: Kafka's legal topic characters and length limit.
MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[A-Za-z0-9._-]+$")


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a legal table name.

    Raises:
        InvalidTableNameError: If it is empty, too long, ``.``/``..``, starts with ``_``
            (reserved for ``_coordinator`` and ``_groups``) or has a character outside
            ``[A-Za-z0-9._-]`` (so ``/`` can never escape the warehouse root).
    """
    if not isinstance(name, str) or not name:
        raise InvalidTableNameError("table name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTableNameError(f"table name longer than {MAX_NAME_LENGTH} characters")
    if name in (".", "..") or name.startswith("_") or not _LEGAL.match(name):
        raise InvalidTableNameError(
            f"illegal table name {name!r}: use [A-Za-z0-9._-], not '.', '..' or a leading '_'"
        )
    return name


def validate_id(kind: str, name: str) -> str:
    """Validate a group id or transactional id, which is embedded in a storage key."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise InvalidTableNameError(f"{kind} must be a non-empty string of at most 249 chars")
    if name in (".", "..") or not _LEGAL.match(name):
        raise InvalidTableNameError(f"illegal {kind} {name!r}: use [A-Za-z0-9._-]")
    return name


# --- the log of a table (or of a group's offsets) -----------------------------------------

LOG_DIR = "_log"
LAST_CHECKPOINT = "_last_checkpoint"
#: Name of a checkpoint object: its version zero-padded to 20 digits, as a log version's.
CHECKPOINT_NAME = re.compile(r"([0-9]{20})\.checkpoint\.json")
#: Name of part ``i`` of ``n`` of a multi-part checkpoint (Delta's naming; 10-digit i and n).
CHECKPOINT_PART_NAME = re.compile(r"([0-9]{20})\.checkpoint\.([0-9]{10})\.([0-9]{10})\.json")
#: Name of a log version object.
VERSION_NAME = re.compile(r"([0-9]{20})\.json")


def version_key(root: str, version: int) -> str:
    """Key of log version ``version`` of the log rooted at ``root``."""
    return f"{root}/{LOG_DIR}/{version:020d}.json"


def checkpoint_key(root: str, version: int, part: int = 1, parts: int = 1) -> str:
    """Key of part ``part`` of ``parts`` of the checkpoint at ``version``.

    A single-part checkpoint is ``<v>.checkpoint.json`` (readable as such by v1 readers,
    which refuse it on its protocol line); parts use Delta's multi-part naming.
    """
    if parts == 1:
        return f"{root}/{LOG_DIR}/{version:020d}.checkpoint.json"
    return f"{root}/{LOG_DIR}/{version:020d}.checkpoint.{part:010d}.{parts:010d}.json"


# --- group commit -------------------------------------------------------------------------

COMMIT_DIR = "_commit"
#: Pending intents of a log: ``<root>/_commit/intents/<13-digit ms>-<32 hex id>[.<payload>].json``.
INTENTS_DIR = f"{COMMIT_DIR}/intents"


def intents_prefix(root: str) -> str:
    """Prefix of the pending intents of the log rooted at ``root``."""
    return f"{root}/{INTENTS_DIR}/"


#: Longest name (after the last "/") of an intent key that carries its body: the file-name
#: limit of local disks (255 bytes on ext4, XFS, APFS, NTFS), so one key works on every store.
INTENT_NAME_MAX = 255
#: Longest intent key, root included, that carries its body (S3's key limit).
INTENT_KEY_MAX = 1024


def intent_key(root: str, created_ms: int, intent_id: str, payload: str | None = None) -> str:
    """Key of an intent: writer time first, so a listing is roughly first come, first served;
    then its id and, if the key stays within the limits, ``payload`` (the intent's body, so
    that a committer listing it need not read it)."""
    plain = f"{intents_prefix(root)}{created_ms:013d}-{intent_id}"
    if payload:
        key = f"{plain}.{payload}.json"
        if len(key.rsplit("/", 1)[-1]) <= INTENT_NAME_MAX and len(key.encode()) <= INTENT_KEY_MAX:
            return key
    return f"{plain}.json"


def intent_key_parts(key: str) -> tuple[int, str, str | None] | None:
    """``(createdMs, id, payload or None)`` of an intent key, or ``None`` for another name."""
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".json"):
        return None
    head, _, payload = name[:-5].partition(".")
    created, sep, intent_id = head.partition("-")
    if not sep or not (created.isascii() and created.isdigit()) or "-" in intent_id:
        return None
    return int(created), intent_id, payload or None


def intent_id_of(key: str) -> str | None:
    """The intent id an intent key names, or ``None`` for another name."""
    parts = intent_key_parts(key)
    return None if parts is None else parts[1]


def lease_key(root: str) -> str:
    """Key of the committer lease of the log rooted at ``root`` (CAS)."""
    return f"{root}/{COMMIT_DIR}/lease.json"


def outcomes_key(root: str) -> str:
    """Key of the outcome record of the log rooted at ``root`` (CAS; a hint)."""
    return f"{root}/{COMMIT_DIR}/outcomes.json"


def sweep_key(root: str) -> str:
    """Key of the time of the last sweep for decided, unfinished transactions naming the
    table at ``root`` (CAS; only decides which writer sweeps)."""
    return f"{root}/{COMMIT_DIR}/sweep.json"


# --- segment files ------------------------------------------------------------------------

_DATED = re.compile(r"(?:^|-)(\d{13})-[0-9a-f]{32}\.parquet$")


def data_dir(table: str, partition: int | None = None) -> str:
    """Prefix of ``table``'s segment files (of one ``partition``, or of all).

    A partition's directory is hive-style, ``data/partition=<p>/``: readers of the Delta
    mirror that take partition values from paths (Polars) see them. Writers before the
    mirror used ``data/<p>/`` (:func:`segment_dirs`); readers take a batch's path as given.
    """
    return f"{table}/data/" if partition is None else f"{table}/data/partition={partition}/"


def segment_dirs(table: str, partition: int) -> tuple[str, str]:
    """Every directory a segment of ``partition`` may lie in: hive-style, then the
    ``data/<p>/`` of writers before the Delta mirror."""
    return data_dir(table, partition), f"{table}/data/{partition}/"


def segment_key(table: str, partition: int, file_name: str) -> str:
    """Key of segment file ``file_name`` of ``partition`` of ``table``."""
    return f"{data_dir(table, partition)}{file_name}"


def spark_abort_key(table: str, write_id: str) -> str:
    """Key marking a Spark batch write job as aborted (its tasks still running clean up)."""
    return f"{table}/_spark_aborted/{write_id}"


def new_segment_name(prefix: str = "") -> str:
    """A unique segment file name that records its creation time: ``<prefix><ms>-<uuid>``."""
    return f"{prefix}{now_ms():013d}-{uuid.uuid4().hex}.parquet"


def segment_created_ms(name: str) -> int | None:
    """Creation time encoded by :func:`new_segment_name`, or ``None`` for other names."""
    match = _DATED.search(name.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


# --- the transaction coordinator ----------------------------------------------------------

COORDINATOR_DIR = "_coordinator"
PRODUCER_IDS_KEY = f"{COORDINATOR_DIR}/producer_ids.json"
#: Producer-id shards: shard 0 is PRODUCER_IDS_KEY (its ids start at 0, as before shards);
#: shard k >= 1 hands out ids from k * PRODUCER_ID_SHARD_SPAN.
PRODUCER_ID_SHARDS = 64
PRODUCER_ID_SHARD_SPAN = 2**40


def producer_ids_key(shard: int) -> str:
    """Key of producer-id shard ``shard`` (0: the original block object)."""
    if shard == 0:
        return PRODUCER_IDS_KEY
    return f"{COORDINATOR_DIR}/producer_ids-{shard}.json"
TXN_DIR = f"{COORDINATOR_DIR}/txn/"


def txn_key(transactional_id: str) -> str:
    """Key of the coordinator object of ``transactional_id``."""
    return f"{TXN_DIR}{validate_id('transactional id', transactional_id)}.json"


# --- consumer groups ----------------------------------------------------------------------

GROUPS_DIR = "_groups"
#: The ``table`` of a generation fence in the group log (never a legal table name).
GENERATION_TABLE = "_generation"


def group_root(group_id: str) -> str:
    """Log root of a group: ``_groups/<group>``."""
    return f"{GROUPS_DIR}/{validate_id('group id', group_id)}"


def group_object_key(group_id: str) -> str:
    """Key of the group object: ``_groups/<group>/members.json``."""
    return f"{group_root(group_id)}/members.json"
