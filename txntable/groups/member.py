"""A consumer's membership in its group: the group object by CAS, and the generation fence.

The transitions are :mod:`txntable.groups.state` (pure); this module loads the group object,
applies one, and writes it back with ``put_if_match`` (``put_if_absent`` for the first
member), reloading and re-applying after a lost race, exactly like the transaction
coordinator. It also writes the generation fence to the group log
(``spec/PROTOCOL.md#generation-fence``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from txntable.errors import (
    PreconditionFailedError,
    TransientStorageError,
)
from txntable.groups.offsets import open_group_table
from txntable.groups.state import GroupState, empty_group
from txntable.layout import GENERATION_TABLE, group_object_key
from txntable.protocol.actions import Action, CommitPlan, OffsetCommit
from txntable.protocol.snapshot import TableSnapshot
from txntable.storage.base import Store
from txntable.storage.cas import load_object, put_cas
from txntable.util import now_ms

#: Attempts of one transition before giving up on a storm of concurrent writers.
MAX_CAS_ATTEMPTS = 1000


def load_group(store: Store, group_id: str) -> tuple[GroupState, str | None]:
    """The group object and its etag (``None``: no object yet, an empty group)."""
    key = group_object_key(group_id)
    obj = load_object(store, key)
    if obj is None:
        return empty_group(group_id), None
    return GroupState.from_json(obj.data, key), obj.etag


def update_group(
    store: Store, group_id: str, transition: Callable[[GroupState], GroupState]
) -> GroupState:
    """Apply ``transition`` to the group object by CAS until it wins; the state written.

    A transition that returns the state unchanged writes nothing. Errors raised by the
    transition (``UnknownMemberIdError`` and the like) propagate.

    Raises:
        PreconditionFailedError: Lost :data:`MAX_CAS_ATTEMPTS` races in a row.
    """
    key = group_object_key(group_id)
    for _ in range(MAX_CAS_ATTEMPTS):
        state, etag = load_group(store, group_id)
        new = transition(state)
        if new == state and etag is not None:
            return state
        try:
            put_cas(store, key, new.to_json(), etag)
            return new
        except PreconditionFailedError:
            pass  # another member moved first: reload and re-apply
        except TransientStorageError:
            pass  # did not land (put_cas read it back): reload and re-apply
        time.sleep(random.uniform(0, 0.01))
    raise PreconditionFailedError(f"group {group_id}: gave up after {MAX_CAS_ATTEMPTS} races")


def committed_generation(snap: TableSnapshot) -> int:
    """Highest generation among the group log's committed offsets and fences (−1: none)."""
    return max((o.generation for o in snap.offsets.values()), default=-1)


def plan_fence(
    snap: TableSnapshot, group_id: str, generation: int, member_id: str
) -> CommitPlan[None]:
    """The generation fence of ``generation``, or an empty plan if one as new is committed."""
    if committed_generation(snap) >= generation:
        return CommitPlan([], None, "GENERATION_FENCE")
    actions: list[Action] = [
        OffsetCommit(
            group=group_id,
            table=GENERATION_TABLE,
            partition=0,
            offset=generation,
            metadata=member_id,
            generation=generation,
            commitTimestamp=now_ms(),
        )
    ]
    return CommitPlan(actions, None, "GENERATION_FENCE")


def write_fence(store: Store, group_id: str, generation: int, member_id: str) -> None:
    """Commit the fence of ``generation`` to the group log unless it is already there."""
    table = open_group_table(store, group_id)
    assert table is not None
    if committed_generation(table.snapshot()) >= generation:
        return
    table.commit(lambda s: plan_fence(s, group_id, generation, member_id))
