"""The warehouse: a root location holding tables, the coordinator and consumer groups."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from txntable import config
from txntable.errors import (
    InvalidArgumentTypeError,
    InvalidConfigurationError,
    ObjectExistsError,
    TableExistsError,
    TableNotFoundError,
)
from txntable.groups.describe import (
    GroupDescription,
    describe_group,
    list_groups,
)
from txntable.layout import (
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
from txntable.util import now_ms

if TYPE_CHECKING:
    from txntable.maintenance.verify import VerifyReport


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

    def list_tables(self) -> list[str]:
        """Names of the warehouse's tables."""
        # One delimited listing of the root, then one HEAD per candidate: never a listing of
        # every segment in the warehouse.
        return [
            name
            for name in self.store.list_children("")
            if not name.startswith("_") and self.store.exists(version_key(name, 0))
        ]

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

    def verify_group(
        self, group_id: str, progress: Callable[[str, int, int], None] | None = None
    ) -> VerifyReport:
        """Check a consumer group's offset log like a table's (see :meth:`Table.verify`).

        Raises:
            ObjectNotFoundError: If the group has no offset log.
        """
        from txntable.maintenance.verify import verify_log

        root = group_root(group_id)
        return verify_log(Log(self.store, root), root, False, progress, group_log=True)

    def __repr__(self) -> str:
        return f"Warehouse({self.url!r})"


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
