"""The warehouse: a root location holding tables, the coordinator and consumer groups."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from txntable import config
from txntable.errors import (
    CorruptLogError,
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    ObjectExistsError,
    TableExistsError,
    TableInUseError,
    TableNotFoundError,
)
from txntable.groups.describe import (
    GroupDescription,
    describe_group,
    list_groups,
)
from txntable.layout import (
    LOG_DIR,
    group_root,
    validate_table_name,
    version_key,
)
from txntable.log.group_commit import GroupCommitConfig
from txntable.log.log import Log
from txntable.protocol.actions import (
    CREATE_READER_VERSION,
    CREATE_WRITER_VERSION,
    DEFAULT_RECORD_SCHEMA,
    Action,
    CommitInfo,
    Metadata,
    Protocol,
    encode_actions,
)
from txntable.protocol.schema import TYPED_PROTOCOL_VERSION, normalize_schema, schema_to_json
from txntable.storage.base import Store
from txntable.table import Table
from txntable.txn.coordinator import TransactionCoordinator, TransactionListing
from txntable.txn.recovery import RecoveryReport, StuckTransactionFinisher, recover
from txntable.util import Progress, now_ms

if TYPE_CHECKING:
    from txntable.maintenance.verify import VerifyReport

#: Objects deleted per request when a table is dropped (S3's DeleteObjects takes 1000).
_DELETE_CHUNK = 1000


class Warehouse:
    """A warehouse of tables at ``url``.

    Args:
        url: ``file:///path`` or a plain path (local disk, the default), ``memory://name``,
            ``s3://bucket/prefix``.
        storage_options: Backend options (endpoint, region, credentials, …); an option the
            backend does not know is refused (see
            :func:`~txntable.storage.storage_option_names`).
        store: A store to use instead of opening ``url`` (e.g. a counting or fault-injecting
            wrapper).
        finish_stuck_transactions: Whether readers and writers of this warehouse complete
            a PrepareCommit / PrepareAbort that a dead producer left pinning a table's LSO
            (after ``stuck_transaction_grace_ms``), and producers abort other producers'
            transactions past their timeout. Set it to false for credentials that may only
            read: nothing is then written on a reader's behalf, and stuck transactions wait
            for ``recover()`` or their producer's restart.
        stuck_transaction_grace_ms: How long a prepared transaction is left to its
            producer before others complete it.
        group_commit: Whether many writers of one table commit in rounds (group commit:
            intents, one committer per round), or each commit races alone; a
            :class:`~txntable.log.group_commit.GroupCommitConfig` sets its timings.
    """

    def __init__(
        self,
        url: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        store: Store | None = None,
        finish_stuck_transactions: bool = config.FINISH_STUCK_TRANSACTIONS_DEFAULT,
        stuck_transaction_grace_ms: int = config.STUCK_TRANSACTION_GRACE_MS_DEFAULT,
        group_commit: bool | GroupCommitConfig = config.GROUP_COMMIT_DEFAULT,
    ) -> None:
        if store is not None and storage_options:
            raise InvalidConfigurationError(
                "storage_options configure the store opened from a url; a given store is "
                "used as it is"
            )
        if store is None:
            if url is None:
                raise InvalidConfigurationError("Warehouse needs a url or a store")
            from txntable.storage import open_store

            store = open_store(url, dict(storage_options or {}))
        self.store = store
        self.url = url or store.url
        self.storage_options = dict(storage_options or {})
        self.finish_stuck_transactions = finish_stuck_transactions
        self.stuck_transaction_grace_ms = stuck_transaction_grace_ms
        if isinstance(group_commit, bool):
            group_commit = GroupCommitConfig(enabled=group_commit)
        elif not isinstance(group_commit, GroupCommitConfig):
            raise InvalidConfigurationError(
                "group_commit must be a bool or a GroupCommitConfig, not "
                f"{type(group_commit).__name__}"
            )
        #: How tables opened through this warehouse commit (see txntable.log.group_commit).
        self.group_commit = group_commit
        self._finisher: StuckTransactionFinisher | None = None
        self._finisher_lock = threading.Lock()

    def _reader_finisher(self) -> StuckTransactionFinisher | None:
        """The finisher the warehouse's table handles share (``None`` when turned off)."""
        if not self.finish_stuck_transactions:
            return None
        with self._finisher_lock:
            if self._finisher is None:
                from txntable.txn.coordinator import TransactionCoordinator

                # Readers only complete decided (prepared) transactions; aborting expired
                # ones is left to writers, which Kafka's coordinator plays here.
                self._finisher = StuckTransactionFinisher(
                    TransactionCoordinator(self.store),
                    grace_ms=self.stuck_transaction_grace_ms,
                    abort_expired=False,
                    recheck_ms=max(1000, self.stuck_transaction_grace_ms),
                )
            return self._finisher

    def create_table(
        self,
        name: str,
        partitions: int = 1,
        configuration: Mapping[str, str] | None = None,
        schema: pa.Schema | None = None,
        key: Sequence[str] | str | None = None,
    ) -> Table:
        """Create a table: Kafka's record (key, value, headers, timestamp), or with
        ``schema`` a typed table of the user's columns (protocol v3,
        :mod:`txntable.protocol.schema`).

        Args:
            name: The table name (Kafka's topic rules, no leading ``_``).
            partitions: Number of partitions.
            configuration: Table configuration (see :data:`txntable.config.TABLE_CONFIG`),
                values as strings or integers.
            schema: The record schema of a typed table (a ``pyarrow.Schema`` of allowed
                types; ``partition``, ``offset`` and ``timestamp`` are reserved names).
            key: Key columns of a typed table (string, binary or integer columns): the
                partitioner hashes them, key compaction keeps the newest record per key.

        Raises:
            InvalidTableNameError: If the name is illegal.
            InvalidConfigurationError: If a configuration key is unknown or not implemented
                yet, or a value is malformed; ``key`` without ``schema``.
            SchemaMismatchError: ``schema`` has a type not allowed, a reserved, empty or
                repeated name, or ``key`` names no key-able column.
            TableExistsError: If the table exists.
            CorruptLogError: The table's log directory is not empty but has no version 0
                (a table whose version 0 was deleted): creating over it would splice the old
                versions onto the new table.
        """
        validate_table_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions <= 0:
            raise InvalidConfigurationError("partitions must be a positive integer")
        # Unknown keys, malformed values and features not built yet are refused here,
        # before anything is written.
        settings = config.validate_table_configuration(configuration)
        keys = (key,) if isinstance(key, str) else tuple(key or ())
        if keys and schema is None:
            raise InvalidConfigurationError("key columns need a schema (a typed table)")
        typed = schema is not None
        fields = DEFAULT_RECORD_SCHEMA
        version = (CREATE_READER_VERSION, CREATE_WRITER_VERSION)
        if schema is not None:
            fields = schema_to_json(normalize_schema(schema, keys))
            version = (TYPED_PROTOCOL_VERSION, TYPED_PROTOCOL_VERSION)
        log = Log(self.store, name)
        leftover = first_log_key(self.store, name)
        if leftover is not None:
            if self.store.exists(log.version_key(0)):
                raise TableExistsError(f"table {name!r} already exists")
            # Not TableExistsError: by the spec there is no table here (``table()`` says so),
            # but a damaged one whose versions 1.. a new version 0 would adopt.
            raise CorruptLogError(
                f"cannot create table {name!r}: its log still holds {leftover} but no version "
                "0 (version 0 was deleted); restore it from a backup, or delete "
                f"{name}/ to start afresh",
                log.version_key(0),
            )
        actions: list[Action] = [
            Protocol(*version),
            Metadata(
                tableId=str(uuid.uuid4()),
                name=name,
                partitions=partitions,
                schema=fields,
                createdTime=now_ms(),
                configuration=settings,
                typed=typed,
                keyColumns=keys,
            ),
            CommitInfo(now_ms(), "CREATE TABLE", uuid.uuid4().hex),
        ]
        try:
            self.store.put_if_absent(log.version_key(0), encode_actions(actions))
        except ObjectExistsError:
            raise TableExistsError(f"table {name!r} already exists") from None
        return Table(
            self.store,
            name,
            log,
            finisher=self._reader_finisher(),
            group_commit=self.group_commit,
        )

    def table(self, name: str) -> Table:
        """A new handle on table ``name``.

        Raises:
            TableNotFoundError: If there is no such table.
            BucketNotFoundError: If the warehouse's bucket does not exist.
        """
        validate_table_name(name)
        table = Table(
            self.store, name, finisher=self._reader_finisher(), group_commit=self.group_commit
        )
        if not table.log.exists():
            self.store.check_root()  # a missing bucket is reported as such
            raise TableNotFoundError(f"no table {name!r} in {self.url}")
        return table

    def drop_table(self, name: str, progress: Progress | None = None) -> int:
        """Delete table ``name``: its log, its segments, everything stored under it (Kafka's
        DeleteTopics; Delta's DROP TABLE of a managed table).

        Version 0 goes first, so the table is gone at once for every new handle and for
        :meth:`list_tables`; then every other object under the table's folder. A drop that
        stopped part-way (a folder without version 0) is finished by calling it again.
        Consumer groups keep their committed offsets for the table.

        Args:
            progress: Called with ``("delete", objects deleted, objects to delete)``.

        Returns:
            The number of objects deleted.

        Raises:
            TableNotFoundError: Nothing is stored under ``name``.
            TableInUseError: A transaction is open on the table: finish it first
                (``recover()`` or its timeout); nothing is deleted.
        """
        validate_table_name(name)
        log = Log(self.store, name)
        deleted = 0
        if log.exists():
            snap = Table(self.store, name, log).snapshot()
            opened = sorted({t for p in snap.partitions for t in p.open_transaction_ids()})
            if any(p.ongoing for p in snap.partitions):
                raise TableInUseError(
                    f"table {name!r} has open transactions ({', '.join(opened) or 'no ids'}): "
                    "they must end (recover(), or their timeout) before it is dropped"
                )
            self.store.delete(log.version_key(0))
            deleted = 1
        keys = list(self.store.list(f"{name}/"))
        if not keys and not deleted:
            self.store.check_root()  # a missing bucket is reported as such
            raise TableNotFoundError(f"no table {name!r} in {self.url}")
        for start in range(0, len(keys), _DELETE_CHUNK):
            chunk = keys[start : start + _DELETE_CHUNK]
            self.store.delete_many(chunk)
            if progress is not None:
                progress("delete", start + len(chunk), len(keys))
        self.store.prune(f"{name}/")
        return deleted + len(keys)

    def list_tables(self) -> list[str]:
        """Names of the warehouse's tables."""
        # One delimited listing of the root, then one HEAD per candidate: never a listing of
        # every segment in the warehouse.
        return [
            name
            for name in self.store.list_children("")
            if not name.startswith("_") and self.store.exists(version_key(name, 0))
        ]

    def orphaned_logs(self) -> list[str]:
        """Names whose log directory holds objects but no version 0: tables whose version 0
        was deleted, which :meth:`list_tables` does not list (:meth:`verify_table` reports
        them). One delimited listing of the root, one HEAD per name, and one listing of the
        log directory of each name without version 0."""
        return [
            name
            for name in self.store.list_children("")
            if not name.startswith("_")
            and not self.store.exists(version_key(name, 0))
            and first_log_key(self.store, name) is not None
        ]

    def verify_table(
        self,
        name: str,
        segments: bool = True,
        progress: Progress | None = None,
    ) -> VerifyReport:
        """Check table ``name``'s log (see :meth:`Table.verify`), also when its version 0 is
        gone (a damaged table :meth:`table` refuses to open).

        Raises:
            TableNotFoundError: If its log directory is empty.
        """
        from txntable.maintenance.verify import verify_log

        validate_table_name(name)
        log = Log(self.store, name)
        if first_log_key(self.store, name) is None:
            self.store.check_root()
            raise TableNotFoundError(f"no table {name!r} in {self.url}")
        return verify_log(log, name, segments=segments, progress=progress)

    def recover(
        self, now: int | None = None, timeout_ms: int = config.RECOVERY_TIMEOUT_MS_DEFAULT
    ) -> RecoveryReport:
        """Finish prepared transactions and abort timed-out ones (see :mod:`txntable.txn.recovery`).

        Raises:
            KafkaTimeoutError: Listing the coordinator objects kept failing for ``timeout_ms``.
        """
        return recover(self.store, now=now, timeout_ms=timeout_ms)

    def describe_transactions(self) -> list[TransactionListing]:
        """The coordinator state of every transactional id (one LIST, one GET per id)."""
        return TransactionCoordinator(self.store).describe_all()

    def list_groups(self) -> list[str]:
        """Ids of the consumer groups that have committed offsets."""
        return list_groups(self.store)

    def describe_group(self, group_id: str) -> GroupDescription | None:
        """A group's committed and pending offsets with lag; ``None`` if it has none."""
        return describe_group(self.store, group_id)

    def verify_group(self, group_id: str, progress: Progress | None = None) -> VerifyReport:
        """Check a consumer group's offset log like a table's (see :meth:`Table.verify`).

        Raises:
            ObjectNotFoundError: If the group has no offset log.
        """
        from txntable.maintenance.verify import verify_log

        root = group_root(group_id)
        return verify_log(Log(self.store, root), root, False, progress, group_log=True)

    def __repr__(self) -> str:
        return f"Warehouse({self.url!r})"


def first_log_key(store: Store, root: str) -> str | None:
    """Some object of ``root``'s log directory (``None`` when it is empty): one listing,
    stopped at its first key."""
    return next(iter(store.list(f"{root}/{LOG_DIR}/")), None)


def require_warehouse(warehouse: object) -> Warehouse:
    """``warehouse`` if it is a :class:`Warehouse` (what clients are constructed with).

    Raises:
        InvalidArgumentTypeError: Otherwise (a URL string, a store, ...).
    """
    if not isinstance(warehouse, Warehouse):
        raise InvalidArgumentTypeError(
            f"warehouse must be a Warehouse, not {type(warehouse).__name__} (open one with "
            "Warehouse(url))"
        )
    return warehouse
