"""Consumer-group offsets as actions: planning an offset commit and reading one. Pure.

A plain offset commit is an ``offsetCommit`` action; a transactional one carries the
producer id and epoch and stays pending until that producer's marker lands in the group
log (see :mod:`txntable.groups.offsets` for the log itself).
"""

from __future__ import annotations

from txntable.errors import (
    IllegalGenerationError,
    InvalidOffsetError,
    InvalidProducerEpochError,
    OffsetMetadataTooLargeError,
    UnstableOffsetCommitError,
)
from txntable.protocol.actions import Action, CommitPlan, OffsetCommit
from txntable.protocol.snapshot import TableSnapshot
from txntable.structs import OffsetAndMetadata, TopicPartition

#: Kafka's ``offset.metadata.max.bytes`` default.
OFFSET_METADATA_MAX_BYTES_DEFAULT = 4096


def plan_offset_commit(
    snap: TableSnapshot,
    group_id: str,
    offsets: dict[TopicPartition, OffsetAndMetadata],
    generation: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    now: int = 0,
    max_metadata_bytes: int = OFFSET_METADATA_MAX_BYTES_DEFAULT,
) -> CommitPlan[None]:
    """Validate and build ``offsetCommit`` actions committed at ``now`` (pure).

    Raises:
        OffsetMetadataTooLargeError: Metadata is longer than ``max_metadata_bytes``.
        IllegalGenerationError: ``generation`` is older than one already committed.
        InvalidProducerEpochError: A transactional commit from a fenced epoch.
    """
    newest_generation = max((o.generation for o in snap.offsets.values()), default=-1)
    if generation >= 0 and generation < newest_generation:
        raise IllegalGenerationError(
            f"group {group_id}: generation {generation} is older than {newest_generation}"
        )
    if producer_id >= 0 and producer_epoch < snap.producer_epochs.get(producer_id, -1):
        raise InvalidProducerEpochError(
            f"producer {producer_id} epoch {producer_epoch} is fenced in group {group_id}"
        )
    actions: list[Action] = []
    for tp, om in sorted(offsets.items()):
        if len(om.metadata.encode()) > max_metadata_bytes:
            raise OffsetMetadataTooLargeError(
                f"offset metadata for {tp} is longer than {max_metadata_bytes} bytes"
            )
        if not isinstance(om.offset, int) or om.offset < 0:
            raise InvalidOffsetError(f"offset for {tp} must be a non-negative integer")
        actions.append(
            OffsetCommit(
                group=group_id,
                table=tp.topic,
                partition=tp.partition,
                offset=om.offset,
                metadata=om.metadata,
                producerId=producer_id,
                producerEpoch=producer_epoch,
                generation=generation,
                commitTimestamp=now,
            )
        )
    return CommitPlan(actions, None, "OFFSET_COMMIT")


def committed_offset(
    snap: TableSnapshot, group_id: str, tp: TopicPartition
) -> OffsetAndMetadata | None:
    """The group's committed offset for ``tp`` (pure).

    Raises:
        UnstableOffsetCommitError: A transactional offset commit for ``tp`` is pending.
    """
    key = (group_id, tp.topic, tp.partition)
    for pid, pending in snap.pending_offsets.items():
        if key in pending:
            raise UnstableOffsetCommitError(
                f"group {group_id}: a transactional offset commit for {tp} by producer {pid} "
                "is pending"
            )
    commit = snap.offsets.get(key)
    return None if commit is None else OffsetAndMetadata(commit.offset, commit.metadata)
