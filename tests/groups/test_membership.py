"""Membership transitions, pure: generations, expiry, static members, two-phase handover.

A random schedule of joins, leaves, heartbeats, acknowledgements and clock jumps drives
the group object; after every step no partition is owned (acknowledged) by two members,
assignments are disjoint and never include a partition another member owns, the
generation moves on every membership change, and the object survives a JSON round trip.
Acknowledging everything then always reaches a stable group whose assignment is the
assignor's target.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txntable.errors import (
    CorruptLogError,
    FencedInstanceIdError,
    InconsistentGroupProtocolError,
    UnknownMemberIdError,
)
from txntable.groups.state import (
    GroupState,
    ack,
    empty_group,
    heartbeat,
    join,
    leave,
    stable,
    target_assignment,
)

T = "orders"
ALL = frozenset((T, p) for p in range(6))


def _join(
    s: GroupState, mid: str, now: int, assignor: str = "cooperative-sticky", **kw: object
) -> GroupState:
    return join(s, mid, [T], [assignor], {T: 6}, now, session_timeout_ms=1000, **kw)  # type: ignore[arg-type]


def _settle(s: GroupState, now: int) -> GroupState:
    for _ in range(10):
        if stable(s):
            return s
        for mid in sorted(s.members):
            if mid in s.members:  # an ack expires the members whose session timed out
                s = ack(s, mid, s.generation, now)
    raise AssertionError("did not settle")


def _check_invariants(s: GroupState) -> None:
    owned = [tp for m in s.members.values() for tp in m.owned]
    assert len(owned) == len(set(owned))
    given_ = [tp for m in s.members.values() for tp in m.assignment]
    assert len(given_) == len(set(given_))
    for m in s.members.values():
        for o in s.members.values():
            if o.member_id != m.member_id:
                assert not (m.assignment & o.owned)
    assert GroupState.from_json(s.to_json(), "x") == s


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_three_members_two_each_and_cooperative_two_phases(assignor: str) -> None:
    s = empty_group("g")
    for i, mid in enumerate(["a", "b", "c"]):
        s = _settle(_join(s, mid, i, assignor), i)
    assert {m: len(x.owned) for m, x in s.members.items()} == {"a": 2, "b": 2, "c": 2}
    before = {m: x.owned for m, x in s.members.items()}
    g = s.generation
    s = _join(s, "d", 10, assignor)  # phase 1: d gets only what nobody owns
    assert s.generation == g + 1
    assert s.members["d"].assignment == frozenset()
    revoked = {m: before[m] - s.members[m].assignment for m in before}
    moving = frozenset().union(*revoked.values())
    if assignor == "cooperative-sticky":
        assert sorted(len(r) for r in revoked.values()) == [0, 0, 1]  # only what must move
    for m in ["a", "b", "c"]:
        s = ack(s, m, g + 1, 11)
    assert s.generation == g + 2  # phase 2: the revoked partitions are handed over
    assert s.members["d"].assignment == moving and len(moving) >= 1
    s = _settle(s, 12)
    assert sorted(len(x.owned) for x in s.members.values()) == [1, 1, 2, 2]
    _check_invariants(s)


def test_expired_member_loses_partitions_and_unknown_member() -> None:
    s = empty_group("g")
    for i, mid in enumerate(["a", "b", "c"]):
        s = _settle(_join(s, mid, i), i)
    g = s.generation
    dead = s.members["c"].owned
    s = heartbeat(heartbeat(s, "a", 900), "b", 900)
    assert s.generation == g  # nobody expired yet (c's session ends at 1002)
    s = heartbeat(s, "a", 1500)
    assert "c" not in s.members and s.generation == g + 1
    # c owned nothing anybody else owns, so its partitions move at once.
    assert dead <= s.members["a"].assignment | s.members["b"].assignment
    with pytest.raises(UnknownMemberIdError):
        heartbeat(s, "c", 1600)
    with pytest.raises(UnknownMemberIdError):
        ack(s, "c", s.generation, 1600)


def test_static_member_restart_keeps_partitions_and_fences_the_old_process() -> None:
    s = empty_group("g")
    for i, (mid, iid) in enumerate([("a1", "host-a"), ("b1", "host-b"), ("c1", "host-c")]):
        s = _settle(_join(s, mid, i, "range", group_instance_id=iid), i)
    before = s.members["b1"].owned
    g = s.generation
    # host-b restarts within its session: new member id, same partitions, new generation.
    s = _join(s, "b2", 500, "range", group_instance_id="host-b")
    assert "b1" not in s.members and s.generation == g + 1
    assert s.members["b2"].assignment == before
    assert s.members["a1"].assignment == s.members["a1"].owned  # nothing moved for others
    with pytest.raises(FencedInstanceIdError):
        heartbeat(s, "b1", 600, instance_id="host-b")


def test_leave_and_protocol_mismatch() -> None:
    s = _settle(_join(_join(empty_group("g"), "a", 0), "b", 0), 0)
    s = _settle(leave(s, "b", 1), 1)
    assert s.members["a"].owned == ALL
    assert leave(s, "zzz", 2) == s
    with pytest.raises(InconsistentGroupProtocolError):
        _join(s, "c", 3, "range")


def test_decoding_is_strict() -> None:
    s = _settle(_join(empty_group("g"), "a", 0), 0)
    assert GroupState.from_json(s.to_json(), "k") == s
    for bad in (
        b"[]",
        b"{",
        b'{"version":1}',
        s.to_json().replace(b'"generation":', b'"generation":"x","g":'),
    ):
        with pytest.raises(CorruptLogError):
            GroupState.from_json(bad, "k")


OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "leave", "hb", "ack", "ack-old", "tick"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([None, "s1", "s2"]),
        st.sampled_from(["range", "cooperative-sticky"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from(["range", "cooperative-sticky"]))
def test_random_schedules_keep_invariants(
    ops: list[tuple[str, str, str | None, str]], assignor: str
) -> None:
    s = empty_group("g")
    now = 0
    for op, mid, iid, _ in ops:
        g = s.generation
        try:
            if op == "join":
                old = {m.member_id for m in s.members.values()}
                s = join(s, mid, [T], [assignor], {T: 6}, now, 1000, group_instance_id=iid)
                assert s.generation == g + 1
                assert mid in s.members and (
                    iid is None or sum(m.group_instance_id == iid for m in s.members.values()) == 1
                )
                assert old - set(s.members) <= {m for m in old if m != mid}
            elif op == "leave":
                was = mid in s.members
                s = leave(s, mid, now)
                assert mid not in s.members and (s.generation > g or not was)
            elif op == "hb":
                s = heartbeat(s, mid, now)
            elif op in ("ack", "ack-old"):
                s = ack(s, mid, s.generation - (1 if op == "ack-old" else 0), now)
            else:
                now += 600
        except (UnknownMemberIdError, FencedInstanceIdError):
            assert mid not in s.members
        assert s.generation >= g
        _check_invariants(s)
    s = _settle(s, now)
    target = target_assignment(s)
    assert {m: x.owned for m, x in s.members.items()} == target
    if s.members:
        assert frozenset().union(*target.values()) == ALL
