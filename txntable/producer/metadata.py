"""What the producer knows about the tables it writes (Kafka's producer metadata): their
handles, partition counts and, for typed tables, their record layouts.

Shared by the parts: the producer checks records against it, the accumulator partitions by
it, the sender appends through its table handles, the transaction manager reads and
completes transactions through them. A table is loaded once, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from txntable.errors import TableNotFoundError
from txntable.groups.offsets import open_group_table
from txntable.layout import GROUPS_DIR
from txntable.producer.retries import Retries
from txntable.protocol.schema import TypedLayout
from txntable.table import Table
from txntable.warehouse import Warehouse

GROUP_ROOT = f"{GROUPS_DIR}/"


class ProducerMetadata:
    """Table handles, partition counts and typed layouts, loaded on first use.

    Attributes:
        partition_counts: Partition count of every table sent to (read on ``send``'s hot
            path; filled by :meth:`partition_count`).
        typed: Tables sent to that have a record schema.
    """

    def __init__(self, warehouse: Warehouse, retries: Retries) -> None:
        self.warehouse = warehouse
        self.store = warehouse.store
        self._retries = retries
        self._tables: dict[str, Table] = {}
        self._groups: dict[str, Table] = {}
        self.partition_counts: dict[str, int] = {}
        self.typed: set[str] = set()
        self._layouts: dict[str, TypedLayout] = {}
        self._converters: dict[str, dict[str, Callable[[Any], Any]]] = {}

    def table(self, name: str) -> Table:
        """The producer's handle of table ``name`` (loaded now if it is not yet).

        Raises:
            TableNotFoundError: There is no such table.
        """
        table = self._tables.get(name)
        if table is None:
            table = self.warehouse.table(name)
            table.snapshot()
            table.expect_writes()
            self._tables[name] = table  # only once loaded: a failed load is tried again
        return table

    def loaded(self, name: str) -> Table | None:
        """The producer's handle of table ``name`` if it loaded one (no I/O)."""
        return self._tables.get(name)

    def partition_count(self, topic: str) -> int:
        """``topic``'s partition count; its first call loads the table and its layout.

        Raises:
            KafkaTimeoutError: The table could not be loaded within ``max_block_ms``.
            TableNotFoundError: There is no such table.
        """
        n = self.partition_counts.get(topic)
        if n is None:
            table = self._tables.get(topic) or self.load(topic)
            layout = table.layout
            if layout is not None:
                self._converters[topic] = layout.converters()
                self._layouts[topic] = layout
                self.typed.add(topic)
            n = self.partition_counts[topic] = table.num_partitions
        return n

    def load(self, topic: str) -> Table:
        """:meth:`table`, retrying transient errors for ``max_block_ms``.

        Raises:
            KafkaTimeoutError: Storage kept failing for ``max_block_ms``.
        """
        return self._retries.blocking(f"loading table {topic}", lambda: self.table(topic))

    def offset_partition_count(self, topic: str) -> int | None:
        """A table's partition count for an offset commit, ``None`` if there is no such
        table."""
        try:
            return self.partition_count(topic)
        except TableNotFoundError:
            return None

    def layout(self, topic: str) -> TypedLayout | None:
        """The record layout of a typed table (``None``: Kafka's key/value record)."""
        return self._layouts.get(topic)

    def converters(self, topic: str) -> dict[str, Callable[[Any], Any]]:
        """Per-column value converters of a typed table's layout."""
        return self._converters[topic]

    def newer_layout(self, topic: str) -> TypedLayout | None:
        """Reload a typed table's schema (another client may have evolved it): the new
        layout if it changed, else ``None``. The caller seals records buffered under the
        older one, then :meth:`use_layout`."""
        table = self.table(topic)
        self._retries.blocking(f"loading table {topic}", table.snapshot)
        layout = table.layout
        if layout is None or layout == self._layouts.get(topic):
            return None
        return layout

    def use_layout(self, topic: str, layout: TypedLayout) -> None:
        """Check and convert ``topic``'s records with ``layout`` from now on."""
        self._converters[topic] = layout.converters()
        self._layouts[topic] = layout

    def keys(self, topic: str, rows: pa.Table) -> pa.ChunkedArray:
        """The partitioner's keys of segment rows (a typed table's come from its key
        columns)."""
        layout = self._layouts.get(topic)
        return rows.column("key") if layout is None else layout.keys(rows)

    def group_table(self, group_id: str) -> Table:
        """The offset log of consumer group ``group_id`` (created if it does not exist)."""
        table = self._groups.get(group_id)
        if table is None:
            table = open_group_table(self.store, group_id)
            assert table is not None
            table.expect_writes()
            self._groups[group_id] = table
        return table

    def log_table(self, root: str) -> Table:
        """The handle of the log at ``root``: a table, or a group's offset log
        (``_groups/<group>``). One handle per log for the producer and its coordinator:
        with two, each was a version behind the other's commits (the offsets, then the
        coordinator's marker) and lost a race to it every transaction."""
        if root.startswith(GROUP_ROOT):
            return self.group_table(root[len(GROUP_ROOT) :])
        return self.table(root)

    def close(self) -> None:
        """Close every handle: a producer committing rounds for other writers hands that
        over now."""
        for table in [*self._tables.values(), *self._groups.values()]:
            table.close()
