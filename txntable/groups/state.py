"""Consumer-group membership as a pure state machine over the group object.

Kafka's group coordinator keeps, per group, the members, their subscriptions, the
generation and each member's assignment. Without a server that state is one object,
``_groups/<group>/members.json``, changed only by compare-and-swap (as the transaction
coordinator's objects are); this module is the object and its transitions, with no I/O:
every function takes the current state and ``now`` and returns the next state.

* **Join** adds a member (or replaces the static member with the same
  ``group_instance_id``, fencing the old process), **leave** removes one, and any
  transition first **expires** the members whose last heartbeat is older than their
  session timeout. Every membership change is a new **generation** with a new assignment.
* The assignment is computed by the assignor from the sorted member list, so it is the
  same whoever computes it. A partition whose previous owner has not yet acknowledged
  giving it up is **withheld**: nobody gets it in this generation. When its owner
  acknowledges (or leaves, or expires), the next generation hands it over — Kafka's
  two-phase cooperative rebalance (KIP-429), used for eager assignors too, so a partition
  is never read by two live members of the group at once.
* A member acknowledges (``ack``) a generation once it has applied its assignment
  (revoked what it lost, committed their offsets); only then is its ``owned`` set updated,
  and only a member's ``owned`` partitions hold back other members.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from txntable.config import MAX_POLL_INTERVAL_MS_DEFAULT, SESSION_TIMEOUT_MS_DEFAULT
from txntable.errors import (
    CorruptLogError,
    FencedInstanceIdError,
    InconsistentGroupProtocolError,
    UnknownMemberIdError,
    UnsupportedProtocolError,
)
from txntable.groups.assignors import (
    COOPERATIVE,
    MemberSubscription,
    Partition,
    assign,
    member_sort_key,
    select_protocol,
)
from txntable.protocol.actions import loads_strict

GROUP_OBJECT_VERSION = 1


@dataclass(frozen=True)
class Member:
    """One member of a group, as stored in the group object."""

    member_id: str
    group_instance_id: str | None
    #: Tables it reads (a pattern is resolved to names by the member).
    subscription: frozenset[str]
    #: Its assignors, most preferred first.
    assignors: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_heartbeat: int
    #: Partitions assigned to it in the current generation.
    assignment: frozenset[Partition] = frozenset()
    #: Partitions it may be reading: the assignment of the last generation it acknowledged.
    owned: frozenset[Partition] = frozenset()
    #: Last generation it acknowledged (−1: none yet).
    acked_generation: int = -1

    def expired(self, now: int) -> bool:
        """Whether its session timed out at ``now`` (no heartbeat for the session timeout)."""
        return now > self.last_heartbeat + self.session_timeout_ms


@dataclass(frozen=True)
class GroupState:
    """The group object: generation, assignor, members and the tables' partition counts."""

    group_id: str
    generation: int = 0
    #: Assignor chosen by the members' vote (``None`` while the group is empty).
    assignor: str | None = None
    members: Mapping[str, Member] = field(default_factory=dict)
    #: Partition count of every table some member subscribes to (as the joiners read it).
    partitions: Mapping[str, int] = field(default_factory=dict)
    last_update_timestamp: int = 0

    def member(self, member_id: str) -> Member:
        """The member with this id.

        Raises:
            UnknownMemberIdError: It is not in the group (left, expired or replaced).
        """
        m = self.members.get(member_id)
        if m is None:
            raise UnknownMemberIdError(
                f"group {self.group_id}: member {member_id} is not in generation "
                f"{self.generation} (it left, its session expired, or a static member with "
                "its group_instance_id replaced it)"
            )
        return m

    @property
    def cooperative(self) -> bool:
        """Whether the group's assignor is cooperative (revokes only what moves)."""
        return COOPERATIVE.get(self.assignor or "", False)

    def owner(self, tp: Partition) -> str | None:
        """The member that owns ``tp`` (acknowledged it), if any."""
        for m in self.members.values():
            if tp in m.owned:
                return m.member_id
        return None

    # --- encoding -----------------------------------------------------------------------

    def to_json(self) -> bytes:
        """Encode like the coordinator object: sorted keys, compact, a fresh ``writeId``."""
        return json.dumps(
            {
                "version": GROUP_OBJECT_VERSION,
                "groupId": self.group_id,
                "generation": self.generation,
                "assignor": self.assignor,
                "partitions": dict(sorted(self.partitions.items())),
                "members": [_member_to_json(m) for _, m in sorted(self.members.items())],
                "lastUpdateTimestamp": self.last_update_timestamp,
                "writeId": uuid.uuid4().hex,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def from_json(data: bytes, path: str) -> GroupState:
        """Decode the object, strictly.

        Raises:
            CorruptLogError: Not a valid group object.
            UnsupportedProtocolError: Written by a newer version of the protocol.
        """
        try:
            obj = loads_strict(data)
        except (ValueError, UnicodeDecodeError):
            raise CorruptLogError("group object is not valid JSON", path) from None
        if not isinstance(obj, dict):
            raise CorruptLogError("group object is not a JSON object", path)
        version = _get(obj, "version", int, path)
        if version > GROUP_OBJECT_VERSION:
            raise UnsupportedProtocolError(
                f"group object version {version} is newer than {GROUP_OBJECT_VERSION} ({path})"
            )
        assignor = obj.get("assignor")
        if assignor is not None and not isinstance(assignor, str):
            raise CorruptLogError("group field assignor is not a string or null", path)
        partitions = _get(obj, "partitions", dict, path)
        members = [_member_from_json(m, path) for m in _get(obj, "members", list, path)]
        return GroupState(
            group_id=_get(obj, "groupId", str, path),
            generation=_get(obj, "generation", int, path),
            assignor=assignor,
            members={m.member_id: m for m in members},
            partitions={
                str(t): _checked(n, int, f"partitions.{t}", path) for t, n in partitions.items()
            },
            last_update_timestamp=_get(obj, "lastUpdateTimestamp", int, path),
        )


def _tps_to_json(tps: Iterable[Partition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        out.setdefault(t, []).append(p)
    return out


def _tps_from_json(obj: Any, name: str, path: str) -> frozenset[Partition]:
    if not isinstance(obj, dict):
        raise CorruptLogError(f"group member field {name} is not an object", path)
    out: set[Partition] = set()
    for t, ps in obj.items():
        if not isinstance(ps, list):
            raise CorruptLogError(f"group member field {name}.{t} is not an array", path)
        out.update((str(t), _checked(p, int, f"{name}.{t}", path)) for p in ps)
    return frozenset(out)


def _member_to_json(m: Member) -> dict[str, Any]:
    return {
        "memberId": m.member_id,
        "groupInstanceId": m.group_instance_id,
        "subscription": sorted(m.subscription),
        "assignors": list(m.assignors),
        "sessionTimeoutMs": m.session_timeout_ms,
        "rebalanceTimeoutMs": m.rebalance_timeout_ms,
        "lastHeartbeat": m.last_heartbeat,
        "assignment": _tps_to_json(m.assignment),
        "owned": _tps_to_json(m.owned),
        "ackedGeneration": m.acked_generation,
    }


def _member_from_json(obj: Any, path: str) -> Member:
    if not isinstance(obj, dict):
        raise CorruptLogError("group member is not an object", path)
    instance = obj.get("groupInstanceId")
    if instance is not None and not isinstance(instance, str):
        raise CorruptLogError("group member field groupInstanceId is not a string", path)
    return Member(
        member_id=_get(obj, "memberId", str, path),
        group_instance_id=instance,
        subscription=frozenset(
            _checked(t, str, "subscription", path) for t in _get(obj, "subscription", list, path)
        ),
        assignors=tuple(
            _checked(a, str, "assignors", path) for a in _get(obj, "assignors", list, path)
        ),
        session_timeout_ms=_get(obj, "sessionTimeoutMs", int, path),
        rebalance_timeout_ms=_get(obj, "rebalanceTimeoutMs", int, path),
        last_heartbeat=_get(obj, "lastHeartbeat", int, path),
        assignment=_tps_from_json(obj.get("assignment", {}), "assignment", path),
        owned=_tps_from_json(obj.get("owned", {}), "owned", path),
        acked_generation=_get(obj, "ackedGeneration", int, path),
    )


def _checked(value: Any, kind: type, name: str, path: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptLogError(f"group field {name} has invalid value {value!r:.60}", path)
    return value


def _get(obj: dict[str, Any], name: str, kind: type, path: str) -> Any:
    if name not in obj:
        raise CorruptLogError(f"group object misses field {name}", path)
    return _checked(obj[name], kind, name, path)


# --- transitions ------------------------------------------------------------------------------


def target_assignment(state: GroupState) -> dict[str, frozenset[Partition]]:
    """What the assignor gives each member now, before withholding (pure)."""
    if not state.members or state.assignor is None:
        return {}
    subs = [
        MemberSubscription(
            m.member_id,
            m.subscription,
            m.group_instance_id,
            # Stickiness counts what a member was last given, acknowledged or not: a
            # withheld partition is in nobody's assignment and so goes where it is free.
            m.assignment | m.owned,
        )
        for m in state.members.values()
    ]
    return assign(state.assignor, subs, state.partitions)


def _withheld(
    state: GroupState, target: Mapping[str, frozenset[Partition]]
) -> dict[str, frozenset[Partition]]:
    """The target minus partitions another member still owns (not yet acknowledged away)."""
    owners: dict[Partition, str] = {}
    for m in state.members.values():
        for tp in m.owned:
            owners.setdefault(tp, m.member_id)
    return {
        mid: frozenset(tp for tp in tps if owners.get(tp, mid) == mid)
        for mid, tps in target.items()
    }


def rebalance(state: GroupState, now: int) -> GroupState:
    """A new generation: choose the assignor, assign, withhold what is still owned elsewhere.

    Raises:
        InconsistentGroupProtocolError: The members have no assignor in common.
    """
    ordered = sorted(
        state.members.values(), key=lambda m: member_sort_key(m.member_id, m.group_instance_id)
    )
    assignor = select_protocol([m.assignors for m in ordered]) if ordered else None
    if ordered and assignor is None:
        raise InconsistentGroupProtocolError(
            f"group {state.group_id}: the members' assignors have none in common: "
            + "; ".join(f"{m.member_id}: {list(m.assignors)}" for m in ordered)
        )
    state = replace(state, assignor=assignor)
    given = _withheld(state, target_assignment(state))
    members = {
        mid: replace(m, assignment=given.get(mid, frozenset())) for mid, m in state.members.items()
    }
    return replace(
        state, generation=state.generation + 1, members=members, last_update_timestamp=now
    )


def expire(state: GroupState, now: int) -> GroupState:
    """Remove members whose session timed out; a new generation if any was removed."""
    alive = {mid: m for mid, m in state.members.items() if not m.expired(now)}
    if len(alive) == len(state.members):
        return state
    return rebalance(replace(state, members=alive), now)


def join(
    state: GroupState,
    member_id: str,
    subscription: Iterable[str],
    assignors: Iterable[str],
    partitions: Mapping[str, int],
    now: int,
    session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT,
    rebalance_timeout_ms: int = MAX_POLL_INTERVAL_MS_DEFAULT,
    group_instance_id: str | None = None,
) -> GroupState:
    """Add ``member_id`` (or update its subscription); always a new generation.

    A static member (``group_instance_id``) replaces the member with the same instance id:
    the new member id takes over its assignment, so a restart within the session timeout
    keeps its partitions, and the generation still moves so the old process is fenced.

    Raises:
        InconsistentGroupProtocolError: No assignor in common with the other members.
    """
    # Expired members go in the same generation (one rebalance, not two).
    members = {mid: m for mid, m in state.members.items() if not m.expired(now)}
    previous = members.get(member_id)
    if group_instance_id is not None:
        for mid, m in list(members.items()):
            if m.group_instance_id == group_instance_id and mid != member_id:
                previous = members.pop(mid)
    member = Member(
        member_id=member_id,
        group_instance_id=group_instance_id,
        subscription=frozenset(subscription),
        assignors=tuple(assignors),
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        last_heartbeat=now,
        # A static member's new process inherits the assignment (sticky) but owns nothing
        # until it acknowledges; the same member re-joining keeps what it owns.
        assignment=previous.assignment if previous else frozenset(),
        owned=previous.owned if previous and previous.member_id == member_id else frozenset(),
        acked_generation=previous.acked_generation
        if previous and previous.member_id == member_id
        else -1,
    )
    members[member_id] = member
    counts = dict(state.partitions)
    counts.update(partitions)
    wanted = {t for m in members.values() for t in m.subscription}
    counts = {t: n for t, n in counts.items() if t in wanted}
    return rebalance(replace(state, members=members, partitions=counts), now)


def leave(state: GroupState, member_id: str, now: int) -> GroupState:
    """Remove ``member_id`` (Kafka's LeaveGroup); a new generation. Unknown ids are a no-op."""
    alive = {mid: m for mid, m in state.members.items() if mid != member_id and not m.expired(now)}
    if len(alive) == len(state.members):
        return state
    return rebalance(replace(state, members=alive), now)


def heartbeat(
    state: GroupState, member_id: str, now: int, instance_id: str | None = None
) -> GroupState:
    """Record a heartbeat of ``member_id`` and expire the members whose session timed out.

    Raises:
        UnknownMemberIdError: The member is not in the group (its session expired first,
            or it left): its partitions are lost.
        FencedInstanceIdError: A newer process with its ``group_instance_id`` replaced it.
    """
    m = _check_member(state, member_id, instance_id)
    members = dict(state.members)
    members[member_id] = replace(m, last_heartbeat=now)
    return expire(replace(state, members=members), now)


def _check_member(state: GroupState, member_id: str, instance_id: str | None) -> Member:
    # A member whose session timed out but that nobody removed yet is still a member: no
    # one else was given its partitions (every transition expires members first).
    m = state.members.get(member_id)
    if m is not None:
        return m
    if instance_id is not None and any(
        o.group_instance_id == instance_id for o in state.members.values()
    ):
        raise FencedInstanceIdError(
            f"group {state.group_id}: another process joined as group_instance_id "
            f"{instance_id!r}; member {member_id} is fenced"
        )
    return state.member(member_id)  # raises UnknownMemberIdError


def ack(
    state: GroupState, member_id: str, generation: int, now: int, instance_id: str | None = None
) -> GroupState:
    """``member_id`` applied its assignment of ``generation`` (a heartbeat too).

    Its ``owned`` becomes that assignment. If this frees a partition that was withheld from
    its new owner, the next generation hands it over. An ack of a generation that is not
    the current one changes only the heartbeat (the member must look again).

    Raises:
        UnknownMemberIdError: As :func:`heartbeat`.
        FencedInstanceIdError: As :func:`heartbeat`.
    """
    m = _check_member(state, member_id, instance_id)
    members = dict(state.members)
    if generation == state.generation:
        members[member_id] = replace(
            m, last_heartbeat=now, owned=m.assignment, acked_generation=generation
        )
    else:
        members[member_id] = replace(m, last_heartbeat=now)
    state = expire(replace(state, members=members), now)
    if state.generation == generation and has_withheld(state):
        given = _withheld(state, target_assignment(state))
        if any(given[mid] != mm.assignment for mid, mm in state.members.items()):
            state = rebalance(state, now)
    return state


def has_withheld(state: GroupState) -> bool:
    """Whether some target partition is assigned to nobody in this generation."""
    given = {tp for m in state.members.values() for tp in m.assignment}
    target = {tp for tps in target_assignment(state).values() for tp in tps}
    return bool(target - given)


def stable(state: GroupState) -> bool:
    """Every member acknowledged the current generation and nothing is withheld."""
    return not has_withheld(state) and all(
        m.acked_generation == state.generation for m in state.members.values()
    )


def empty_group(group_id: str) -> GroupState:
    """The state of a group that has no object yet."""
    return GroupState(group_id)
