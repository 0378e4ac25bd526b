"""Partition assignors of consumer groups (Kafka's ``partition.assignment.strategy``), pure.

An assignor maps the members of a group, each with the tables it subscribes to, and the
partition count of every subscribed table, to one set of partitions per member, every
partition of a subscribed table to exactly one member subscribed to it. Two are built in:

* ``range`` (Kafka's ``RangeAssignor``, eager): per table, the members subscribed to it in
  order get consecutive ranges, the first ``partitions % members`` one partition more.
  It ignores what members own, so a membership change may move any partition.
* ``cooperative-sticky`` (Kafka's ``CooperativeStickyAssignor``): balanced like ``range``
  across the group, but every member keeps the partitions it owns unless balance forces
  them away, so a change moves only the partitions that must move; the membership protocol
  revokes those first and assigns them a generation later (two phases, KIP-429).

Members are ordered by :func:`member_sort_key`: static members (with a
``group_instance_id``) by instance id first, then dynamic ones by member id, as Kafka does, so
a restarted static member with a new member id gets the same ``range`` partitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from txntable.errors import InvalidConfigurationError

RANGE = "range"
COOPERATIVE_STICKY = "cooperative-sticky"
#: Kafka 3's default list: range, with cooperative-sticky as the upgrade path.
ASSIGNORS_DEFAULT: tuple[str, ...] = (RANGE, COOPERATIVE_STICKY)
#: Whether an assignor's rebalances revoke only what moves (cooperative) or everything.
COOPERATIVE = {RANGE: False, COOPERATIVE_STICKY: True}

#: A partition as the assignors see it: (table, partition).
Partition = tuple[str, int]


@dataclass(frozen=True)
class MemberSubscription:
    """What an assignor knows of a member: who it is, what it reads, what it owns now."""

    member_id: str
    subscription: frozenset[str]
    group_instance_id: str | None = None
    owned: frozenset[Partition] = frozenset()


def member_sort_key(member_id: str, group_instance_id: str | None) -> tuple[int, str]:
    """Order of members in an assignment: static by instance id, then dynamic by member id."""
    return (0, group_instance_id) if group_instance_id else (1, member_id)


def check_strategies(value: object) -> tuple[str, ...]:
    """Validate ``partition_assignment_strategy``: a name or a non-empty list of names.

    Raises:
        InvalidConfigurationError: Not a known assignor name (or list of them).
    """
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise InvalidConfigurationError(
            f"partition_assignment_strategy must be an assignor name or a list of them, "
            f"not {value!r:.60}"
        )
    for name in names:
        if name not in COOPERATIVE:
            raise InvalidConfigurationError(
                f"partition_assignment_strategy: unknown assignor {name!r}; known: "
                f"{', '.join(sorted(COOPERATIVE))}"
            )
    return tuple(dict.fromkeys(names))


def select_protocol(preferences: Sequence[Sequence[str]]) -> str | None:
    """The assignor of a group from its members' preference lists (Kafka's vote).

    The candidates are the assignors every member supports; each member votes for the
    first candidate in its own list; most votes win, ties going to the candidate listed
    first by the first member. ``None`` if the members have no assignor in common.
    """
    if not preferences:
        return None
    common = set(preferences[0]).intersection(*map(set, preferences[1:]))
    if not common:
        return None
    votes = dict.fromkeys((a for a in preferences[0] if a in common), 0)
    for prefs in preferences:
        votes[next(a for a in prefs if a in common)] += 1
    return max(votes, key=lambda a: votes[a])  # max keeps the first of equal counts


def assign(
    assignor: str,
    members: Sequence[MemberSubscription],
    partitions: Mapping[str, int],
) -> dict[str, frozenset[Partition]]:
    """One set of partitions per member id (every member has an entry, maybe empty).

    Args:
        assignor: ``range`` or ``cooperative-sticky``.
        members: The group's members (any order; sorted here).
        partitions: Partition count per table; a subscribed table missing here (it does
            not exist) contributes no partitions.
    """
    ordered = sorted(members, key=lambda m: member_sort_key(m.member_id, m.group_instance_id))
    if assignor == RANGE:
        return _range(ordered, partitions)
    if assignor == COOPERATIVE_STICKY:
        return _sticky(ordered, partitions)
    raise InvalidConfigurationError(f"unknown assignor {assignor!r}")


def _range(
    members: Sequence[MemberSubscription], partitions: Mapping[str, int]
) -> dict[str, frozenset[Partition]]:
    out: dict[str, set[Partition]] = {m.member_id: set() for m in members}
    for table in sorted({t for m in members for t in m.subscription}):
        subscribed = [m.member_id for m in members if table in m.subscription]
        count = partitions.get(table, 0)
        per, extra = divmod(count, len(subscribed))
        start = 0
        for i, member_id in enumerate(subscribed):
            n = per + (1 if i < extra else 0)
            out[member_id].update((table, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def _sticky(
    members: Sequence[MemberSubscription], partitions: Mapping[str, int]
) -> dict[str, frozenset[Partition]]:
    order = {m.member_id: i for i, m in enumerate(members)}
    subs = {m.member_id: m.subscription for m in members}
    every = sorted(
        (t, p)
        for t in {t for m in members for t in m.subscription}
        for p in range(partitions.get(t, 0))
    )
    valid = set(every)
    out: dict[str, list[Partition]] = {m.member_id: [] for m in members}
    taken: set[Partition] = set()
    # 1. Keep what each member owns and may still read (the first owner in member order
    #    keeps a partition claimed twice).
    for m in members:
        for tp in sorted(m.owned):
            if tp in valid and tp[0] in m.subscription and tp not in taken:
                out[m.member_id].append(tp)
                taken.add(tp)
    # 2. Hand each unowned partition to the least-loaded member that subscribes to it.
    for tp in every:
        if tp not in taken:
            eligible = [m for m in out if tp[0] in subs[m]]
            target = min(eligible, key=lambda m: (len(out[m]), order[m]))
            out[target].append(tp)
            taken.add(tp)
    # 3. Balance: move one partition at a time from the most loaded member to a member
    #    with at least two fewer that subscribes to it. Every move is forced (the sum of
    #    squared loads falls), so only what must move moves.
    while True:
        move = _balancing_move(out, subs, order)
        if move is None:
            break
        src, dst, tp = move
        out[src].remove(tp)
        out[dst].append(tp)
    return {m: frozenset(ps) for m, ps in out.items()}


def _balancing_move(
    out: Mapping[str, list[Partition]],
    subs: Mapping[str, frozenset[str]],
    order: Mapping[str, int],
) -> tuple[str, str, Partition] | None:
    donors = sorted(out, key=lambda m: (-len(out[m]), order[m]))
    takers = sorted(out, key=lambda m: (len(out[m]), order[m]))
    for src in donors:
        for dst in takers:
            if len(out[src]) - len(out[dst]) < 2:
                break
            # The most recently added partition goes first: a member's oldest partitions
            # (what it owned longest) stay.
            for tp in reversed(out[src]):
                if tp[0] in subs[dst]:
                    return src, dst, tp
    return None
