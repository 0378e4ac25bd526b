"""The warehouse: a root location holding tables, the coordinator and consumer groups."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from txntable import config
from txntable.actions import (
    READER_VERSION,
    WRITER_VERSION,
    Action,
    CommitInfo,
    Metadata,
    Protocol,
    encode_actions,
)
from txntable.errors import (
    InvalidConfigurationError,
    ObjectExistsError,
    TableExistsError,
    TableNotFoundError,
)
from txntable.log import Log, now_ms
from txntable.names import validate_table_name
from txntable.recovery import RecoveryReport, recover
from txntable.storage.base import Store
from txntable.table import Table, checkpoint_interval


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
    """

    def __init__(
        self,
        url: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        store: Store | None = None,
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

    def create_table(
        self, name: str, partitions: int = 1, configuration: Mapping[str, str] | None = None
    ) -> Table:
        """Create a table with the default record schema (key, value, headers, timestamp).

        Raises:
            InvalidTableNameError: If the name is illegal.
            TableExistsError: If the table exists.
        """
        validate_table_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions <= 0:
            raise InvalidConfigurationError("partitions must be a positive integer")
        checkpoint_interval(configuration or {})  # reject a bad value before it is written
        from txntable.maintenance import MaintenanceConfig

        MaintenanceConfig.parse(configuration or {})
        log = Log(self.store, name)
        actions: list[Action] = [
            Protocol(READER_VERSION, WRITER_VERSION),
            Metadata(
                tableId=str(uuid.uuid4()),
                name=name,
                partitions=partitions,
                createdTime=now_ms(),
                configuration=dict(configuration or {}),
            ),
            CommitInfo(now_ms(), "CREATE TABLE", uuid.uuid4().hex),
        ]
        try:
            self.store.put_if_absent(log.version_key(0), encode_actions(actions))
        except ObjectExistsError:
            raise TableExistsError(f"table {name!r} already exists") from None
        return Table(self.store, name, log)

    def table(self, name: str) -> Table:
        """A new handle on table ``name``.

        Raises:
            TableNotFoundError: If there is no such table.
        """
        validate_table_name(name)
        table = Table(self.store, name)
        if not table.log.exists():
            raise TableNotFoundError(f"no table {name!r} in {self.url}")
        return table

    def list_tables(self) -> list[str]:
        """Names of the warehouse's tables."""
        # One delimited listing of the root, then one HEAD per candidate: never a listing of
        # every segment in the warehouse.
        return [
            name
            for name in self.store.list_children("")
            if not name.startswith("_") and self.store.exists(f"{name}/_log/{0:020d}.json")
        ]

    def recover(
        self, now: int | None = None, timeout_ms: int = config.RECOVERY_TIMEOUT_MS_DEFAULT
    ) -> RecoveryReport:
        """Finish prepared transactions and abort timed-out ones (see :mod:`txntable.recovery`).

        Raises:
            KafkaTimeoutError: Listing the coordinator objects kept failing for ``timeout_ms``.
        """
        return recover(self.store, now=now, timeout_ms=timeout_ms)

    def __repr__(self) -> str:
        return f"Warehouse({self.url!r})"
