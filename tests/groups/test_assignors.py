"""The assignors, pure: Kafka's range layout, and cooperative-sticky moving only what must move.

Properties over random groups (members, subscriptions, partition counts, what each member
owns): every partition of a subscribed table goes to exactly one member subscribed to it;
range is Kafka's layout; cooperative-sticky is balanced and revokes the minimum.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txntable.errors import InvalidConfigurationError
from txntable.groups.assignors import (
    COOPERATIVE_STICKY,
    RANGE,
    MemberSubscription,
    Partition,
    assign,
    check_strategies,
    select_protocol,
)

TABLES = ("a", "b", "c")


def _check_valid(
    members: list[MemberSubscription],
    counts: dict[str, int],
    out: dict[str, frozenset[Partition]],
) -> None:
    assert set(out) == {m.member_id for m in members}
    subscribed = {t for m in members for t in m.subscription}
    every = [(t, p) for t in subscribed for p in range(counts.get(t, 0))]
    given_out = [tp for tps in out.values() for tp in tps]
    assert sorted(given_out) == sorted(every)  # each exactly once
    subs = {m.member_id: m.subscription for m in members}
    for mid, tps in out.items():
        assert all(t in subs[mid] for t, _ in tps)


def test_range_is_kafkas_layout() -> None:
    members = [
        MemberSubscription("m-c", frozenset({"a", "b"})),
        MemberSubscription("m-a", frozenset({"a", "b"})),
        MemberSubscription("m-b", frozenset({"a"})),
    ]
    out = assign(RANGE, members, {"a": 7, "b": 3})
    # Table a: 3 members, 7 partitions -> 3, 2, 2 in member order; table b: 2 members.
    assert out == {
        "m-a": frozenset({("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)}),
        "m-b": frozenset({("a", 3), ("a", 4)}),
        "m-c": frozenset({("a", 5), ("a", 6), ("b", 2)}),
    }


def test_range_orders_static_members_by_instance_id() -> None:
    # A restarted static member gets a new member id; its instance id keeps its place.
    first = [
        MemberSubscription("zzz", frozenset({"a"}), "host-1"),
        MemberSubscription("aaa", frozenset({"a"}), "host-2"),
    ]
    out = assign(RANGE, first, {"a": 4})
    assert out["zzz"] == {("a", 0), ("a", 1)}
    restarted = [first[0], MemberSubscription("000", frozenset({"a"}), "host-2")]
    assert assign(RANGE, restarted, {"a": 4})["000"] == out["aaa"]


def test_sticky_new_member_takes_one_from_each() -> None:
    owned = {"m1": {0, 1, 2}, "m2": {3, 4, 5}}
    members = [
        MemberSubscription(m, frozenset({"a"}), owned=frozenset(("a", p) for p in ps))
        for m, ps in owned.items()
    ] + [MemberSubscription("m3", frozenset({"a"}))]
    out = assign(COOPERATIVE_STICKY, members, {"a": 6})
    assert out["m1"] < members[0].owned and len(out["m1"]) == 2
    assert out["m2"] < members[1].owned and len(out["m2"]) == 2
    assert out["m3"] == (members[0].owned - out["m1"]) | (members[1].owned - out["m2"])


def test_sticky_member_leaving_moves_only_its_partitions() -> None:
    owned = {"m1": {0, 1}, "m2": {2, 3}}  # m3 (4, 5) left
    members = [
        MemberSubscription(m, frozenset({"a"}), owned=frozenset(("a", p) for p in ps))
        for m, ps in owned.items()
    ]
    out = assign(COOPERATIVE_STICKY, members, {"a": 6})
    assert out["m1"] > members[0].owned and out["m2"] > members[1].owned
    assert out["m1"] | out["m2"] == {("a", p) for p in range(6)}


@st.composite
def groups(draw: st.DrawFn, uniform: bool) -> tuple[list[MemberSubscription], dict[str, int]]:
    counts = {t: draw(st.integers(0, 9)) for t in TABLES}
    n = draw(st.integers(1, 6))
    common = frozenset(draw(st.sets(st.sampled_from(TABLES), min_size=1)))
    every = [(t, p) for t in TABLES for p in range(counts[t] + 2)]  # some no longer exist
    members = []
    free = list(every)
    for i in range(n):
        subs = common if uniform else frozenset(draw(st.sets(st.sampled_from(TABLES), min_size=1)))
        mine = draw(st.sets(st.sampled_from(free), max_size=6)) if free else set()
        free = [tp for tp in free if tp not in mine]
        iid = draw(st.none() | st.sampled_from(["i1", "i2", "i3"]))
        if iid in {m.group_instance_id for m in members}:
            iid = None
        members.append(MemberSubscription(f"m{i:02d}", subs, iid, frozenset(mine)))
    return draw(st.permutations(members)), counts


@settings(max_examples=150, deadline=None)
@given(groups(uniform=False))
def test_range_valid_and_balanced_per_table(
    group: tuple[list[MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    out = assign(RANGE, members, counts)
    _check_valid(members, counts, out)
    for t in TABLES:
        loads = [
            len([tp for tp in out[m.member_id] if tp[0] == t])
            for m in members
            if t in m.subscription
        ]
        if loads:
            assert max(loads) - min(loads) <= 1


@settings(max_examples=150, deadline=None)
@given(groups(uniform=True))
def test_sticky_uniform_balanced_and_minimal_moves(
    group: tuple[list[MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    out = assign(COOPERATIVE_STICKY, members, counts)
    _check_valid(members, counts, out)
    assert assign(COOPERATIVE_STICKY, list(reversed(members)), counts) == out  # deterministic
    loads = [len(tps) for tps in out.values()]
    assert max(loads) - min(loads) <= 1
    subscribed = next(iter(members)).subscription
    total = sum(counts[t] for t in subscribed)
    lo, extra = divmod(total, len(members))
    hi = lo + (1 if extra else 0)
    # What each member may keep: its valid owned partitions, at most one per partition.
    kept_possible = {
        m.member_id: {tp for tp in m.owned if tp[0] in subscribed and tp[1] < counts[tp[0]]}
        for m in members
    }
    capped = [min(len(v), hi) for v in kept_possible.values()]
    at_hi = sum(1 for c in capped if c == hi and hi > lo)
    minimal = sum(len(v) - c for v, c in zip(kept_possible.values(), capped, strict=True))
    if hi > lo:
        minimal += max(0, at_hi - extra)
    revoked = sum(len(kept_possible[m] - out[m]) for m in out)
    assert revoked == minimal


@settings(max_examples=150, deadline=None)
@given(groups(uniform=False))
def test_sticky_general_valid_and_no_forced_move_left(
    group: tuple[list[MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    out = assign(COOPERATIVE_STICKY, members, counts)
    _check_valid(members, counts, out)
    subs = {m.member_id: m.subscription for m in members}
    for a in out:
        for b in out:
            if len(out[a]) - len(out[b]) >= 2:
                assert not any(t in subs[b] for t, _ in out[a])


def test_protocol_vote_and_strategy_check() -> None:
    assert (
        select_protocol([["range", "cooperative-sticky"], ["cooperative-sticky", "range"]])
        == "range"
    )
    assert (
        select_protocol([["cooperative-sticky"], ["range", "cooperative-sticky"]])
        == "cooperative-sticky"
    )
    assert select_protocol([["range"], ["cooperative-sticky"]]) is None
    assert check_strategies("range") == ("range",)
    for bad in ("roundrobin", [], 3, ["range", "sticky"]):
        try:
            check_strategies(bad)
        except InvalidConfigurationError as e:
            assert "partition_assignment_strategy" in str(e)
        else:
            raise AssertionError(bad)
