"""Consumer-group offsets: a commit log per group, ``_groups/<group>/_log``.

The group's log is a log like a table's, with one partition that only ever holds
transaction markers. A plain offset commit is an ``offsetCommit`` action. A transactional
one (``Producer.send_offsets_to_transaction``) carries the producer id and epoch and stays
pending until that producer's marker lands in the group log: COMMIT makes it the group's
offset, ABORT drops it — so a fenced or aborted producer's offsets never become visible.
While one is pending, ``committed()`` reports the partition as unstable (KIP-447).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from txntable.errors import (
    InvalidArgumentTypeError,
    InvalidOffsetError,
    ObjectExistsError,
    UnknownTopicOrPartitionError,
)
from txntable.layout import group_root
from txntable.log.log import Log
from txntable.protocol.actions import (
    CREATE_READER_VERSION,
    CREATE_WRITER_VERSION,
    Action,
    CommitInfo,
    Metadata,
    Protocol,
    encode_actions,
)
from txntable.storage.base import Store
from txntable.structs import OffsetAndMetadata, TopicPartition, check_topic_partition
from txntable.table import Table
from txntable.util import now_ms


def check_offsets(offsets: object) -> dict[TopicPartition, OffsetAndMetadata]:
    """Type-check the ``offsets`` argument of an offset commit, before any I/O.

    Raises:
        InvalidArgumentTypeError: Not a mapping of ``TopicPartition`` to
            ``OffsetAndMetadata`` (of an ``int`` offset and ``str`` metadata).
        InvalidOffsetError: An offset is negative.
    """
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentTypeError(
            "offsets must be a dict of TopicPartition to OffsetAndMetadata, not "
            f"{type(offsets).__name__}"
        )
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, om in offsets.items():
        check_topic_partition(tp, "an offsets key")
        if not isinstance(om, OffsetAndMetadata):
            raise InvalidArgumentTypeError(
                f"the offset for {tp} must be an OffsetAndMetadata, not "
                f"{type(om).__name__} {om!r:.60}"
            )
        if not isinstance(om.offset, int) or isinstance(om.offset, bool):
            raise InvalidArgumentTypeError(
                f"OffsetAndMetadata.offset for {tp} must be an int, not {type(om.offset).__name__}"
            )
        if not isinstance(om.metadata, str):
            raise InvalidArgumentTypeError(
                f"OffsetAndMetadata.metadata for {tp} must be a str, not "
                f"{type(om.metadata).__name__}"
            )
        if om.offset < 0:
            raise InvalidOffsetError(f"offset for {tp} must be a non-negative integer")
        out[tp] = om
    return out


def check_offset_targets(
    group_id: str,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
    partition_count: Callable[[str], int | None],
) -> None:
    """Refuse offsets for a table or partition that does not exist (Kafka's broker answers
    an offset commit for one with ``UNKNOWN_TOPIC_OR_PARTITION``).

    Args:
        group_id: For the message.
        offsets: Checked with :func:`check_offsets`.
        partition_count: A table's partition count, ``None`` if there is no such table.

    Raises:
        UnknownTopicOrPartitionError: Naming the first such partition; nothing is committed.
    """
    counts: dict[str, int | None] = {}
    for tp in sorted(offsets):
        if tp.topic not in counts:
            counts[tp.topic] = partition_count(tp.topic)
        n = counts[tp.topic]
        if n is None or not 0 <= tp.partition < n:
            why = f"no table {tp.topic!r}" if n is None else f"table {tp.topic} has {n} partitions"
            raise UnknownTopicOrPartitionError(
                f"group {group_id}: cannot commit an offset for {tp}: {why}"
            )


def open_group_table(store: Store, group_id: str, create: bool = True) -> Table | None:
    """The group's offset log as a one-partition table handle.

    Returns ``None`` if the group has no log yet and ``create`` is false (a read must not
    create a group).
    """
    root = group_root(group_id)
    log = Log(store, root)
    if not log.exists():
        if not create:
            return None
        actions: list[Action] = [
            Protocol(CREATE_READER_VERSION, CREATE_WRITER_VERSION),
            Metadata(str(uuid.uuid4()), root, 1, createdTime=now_ms()),
            CommitInfo(now_ms(), "CREATE GROUP", uuid.uuid4().hex),
        ]
        try:
            store.put_if_absent(log.version_key(0), encode_actions(actions))
        except ObjectExistsError:
            pass  # another member created it first; same content by construction
    return Table(store, root, log)


# --- describing groups (the CLI's ``groups``; Kafka's ListConsumerGroupOffsets) -------------


