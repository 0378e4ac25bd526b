"""Listing and describing consumer groups (Kafka's ListGroups / DescribeGroups): a read-only
view of a group's offset log, its membership object and the lag on every table it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from txntable.groups.member import load_group
from txntable.groups.offsets import open_group_table
from txntable.layout import GENERATION_TABLE, GROUPS_DIR, version_key
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage.base import Store
from txntable.table import Table


@dataclass(frozen=True)
class GroupOffset:
    """A group's position on one table partition, with the partition's offsets and lag."""

    table: str
    partition: int
    #: Committed offset (None if the only commit is a pending transactional one).
    offset: int | None
    metadata: str
    generation: int
    commit_timestamp: int
    #: Producer whose transactional offset commit is pending (KIP-447: unstable), if any.
    pending_producer_id: int | None
    #: The partition's offsets now; None if the table or partition does not exist.
    log_start_offset: int | None
    high_watermark: int | None
    last_stable_offset: int | None

    @property
    def lag(self) -> int | None:
        """Records between the committed offset and the high watermark (Kafka's lag)."""
        if self.offset is None or self.high_watermark is None:
            return None
        return max(self.high_watermark - self.offset, 0)


@dataclass(frozen=True)
class GroupMemberDescription:
    """One member of a group, from the group object (``spec/PROTOCOL.md#group-object``)."""

    member_id: str
    group_instance_id: str | None
    subscription: tuple[str, ...]
    #: Partitions assigned to it in the current generation, as ``(table, partition)``.
    assignment: tuple[tuple[str, int], ...]
    #: Partitions it acknowledged (may be reading).
    owned: tuple[tuple[str, int], ...]
    acked_generation: int
    last_heartbeat: int
    session_timeout_ms: int


@dataclass(frozen=True)
class GroupDescription:
    """What :func:`describe_group` returns: the group log's version, every position, and
    the membership (generation, assignor, members; generation 0 and none without one)."""

    group_id: str
    version: int
    offsets: tuple[GroupOffset, ...]
    generation: int = 0
    assignor: str | None = None
    members: tuple[GroupMemberDescription, ...] = ()


def list_groups(store: Store) -> list[str]:
    """Ids of the groups that have an offset log (one delimited listing plus a HEAD each)."""
    return [
        g
        for g in store.list_children(f"{GROUPS_DIR}/")
        if store.exists(version_key(f"{GROUPS_DIR}/{g}", 0))
    ]


def describe_group(store: Store, group_id: str) -> GroupDescription | None:
    """Committed and pending offsets of a group, with lag; ``None`` if it has no log.

    Reads the group log and the snapshot of every table it has offsets for; never creates
    anything.
    """
    state, etag = load_group(store, group_id)
    members = tuple(
        GroupMemberDescription(
            m.member_id,
            m.group_instance_id,
            tuple(sorted(m.subscription)),
            tuple(sorted(m.assignment)),
            tuple(sorted(m.owned)),
            m.acked_generation,
            m.last_heartbeat,
            m.session_timeout_ms,
        )
        for _, m in sorted(state.members.items())
    )
    group = open_group_table(store, group_id, create=False)
    if group is None:
        if etag is None:
            return None
        return GroupDescription(group_id, -1, (), state.generation, state.assignor, members)
    snap = group.snapshot()
    pending: dict[tuple[str, str, int], int] = {}
    for pid, commits in snap.pending_offsets.items():
        for key in commits:
            pending[key] = pid
    tables: dict[str, TableSnapshot | None] = {}
    out = []
    for key in sorted(set(snap.offsets) | set(pending)):
        _, table, partition = key
        if table == GENERATION_TABLE:
            continue  # a generation fence, not a position
        if table not in tables:
            handle = Table(store, table)
            tables[table] = handle.snapshot() if handle.log.exists() else None
        tsnap = tables[table]
        part = tsnap.partitions[partition] if tsnap and partition < tsnap.num_partitions else None
        commit = snap.offsets.get(key)
        out.append(
            GroupOffset(
                table=table,
                partition=partition,
                offset=commit.offset if commit else None,
                metadata=commit.metadata if commit else "",
                generation=commit.generation if commit else -1,
                commit_timestamp=commit.commitTimestamp if commit else 0,
                pending_producer_id=pending.get(key),
                log_start_offset=part.log_start_offset if part else None,
                high_watermark=part.high_watermark if part else None,
                last_stable_offset=part.last_stable_offset if part else None,
            )
        )
    return GroupDescription(
        group_id, snap.version, tuple(out), state.generation, state.assignor, members
    )
