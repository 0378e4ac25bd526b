"""Group commit's sequencing: a round is a pure function of (snapshot, intents).

The central property: sequencing a round of operations into one version gives every
operation exactly the outcome (offsets, or the error that refuses it) and the table exactly
the state that committing them one by one, one version each, in the same order gives.
Plus: an intent is decided at most once, whoever sequences it and however late; the window
bounds when it may be; the snapshot sequenced on is never changed; the decided intents
survive checkpoints.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txntable.errors import (
    CorruptLogError,
    TxnTableError,
    UnsupportedProtocolError,
)
from txntable.layout import intent_id_of, intent_key, intent_key_parts
from txntable.protocol.actions import (
    GROUP_COMMIT_WRITER_VERSION,
    INTENT_WINDOW_VERSIONS,
    Action,
    AppTxn,
    CommitInfo,
    CommitPlan,
    Metadata,
    Protocol,
    decode_actions,
    encode_actions,
)
from txntable.protocol.append import PendingBatch, PendingMarker
from txntable.protocol.sequencing import (
    INTENT_KEY_DICTIONARY,
    AppendOp,
    Intent,
    OffsetCommitOp,
    RoundItem,
    RoundPlan,
    eligible,
    sequence_round,
)
from txntable.protocol.snapshot import TableSnapshot, checkpoint_actions, load_checkpoint

NOW = 1_700_000_000_000


def new_table(partitions: int = 2) -> TableSnapshot:
    snap = TableSnapshot()
    snap.apply(
        0,
        [
            Protocol(1, 1),
            Metadata("id", "t", partitions),
            CommitInfo(NOW, "CREATE TABLE", uuid.uuid4().hex),
        ],
    )
    return snap


def batch(
    partition: int,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    count: int = 1,
    transactional: bool = False,
) -> PendingBatch:
    return PendingBatch(
        partition,
        f"t/data/{partition}/{uuid.uuid4().hex}.parquet",
        count,
        100,
        pid,
        epoch,
        seq,
        transactional,
        NOW,
        NOW,
        "tid" if transactional else None,
    )


def intent(op: Any, base: int) -> Intent:
    return Intent(uuid.uuid4().hex, base, op, None, NOW)


def items_of(intents: list[Intent]) -> list[RoundItem]:
    return [RoundItem.of_intent(i, NOW) for i in intents]


def commit_round(snap: TableSnapshot, plan: RoundPlan) -> None:
    """Apply a round's version to ``snap``, as a committer whose put landed does."""
    info = CommitInfo(NOW, plan.operation, uuid.uuid4().hex, intents=tuple(plan.outcomes))
    # Through the codec: what is replayed is what a reader decodes.
    snap.apply(snap.version + 1, decode_actions(encode_actions([*plan.actions, info])))


def state(snap: TableSnapshot) -> list[Action]:
    """The snapshot's state without provenance (commit times, decided intents)."""
    return [
        a
        for a in checkpoint_actions(snap)
        if not isinstance(a, CommitInfo) and not isinstance(a, Protocol)
    ]


def serially(snap: TableSnapshot, ops: list[AppendOp | OffsetCommitOp]) -> list[Any]:
    """Commit each operation alone, one version each: outcome per operation."""
    out: list[Any] = []
    for op in ops:
        try:
            plan = op.plan(snap, NOW)
        except TxnTableError as e:
            out.append(type(e).__name__)
            continue
        out.append(_result(plan))
        if plan.actions:
            info = CommitInfo(NOW, plan.operation, uuid.uuid4().hex)
            snap.apply(snap.version + 1, decode_actions(encode_actions([*plan.actions, info])))
    return out


def _result(plan: CommitPlan[Any]) -> Any:
    r = plan.result
    if r is None:
        return None
    return (tuple(r.base_offsets), tuple(sorted(r.marker_offsets.items())))


def outcomes(plan: RoundPlan) -> list[Any]:
    return [
        type(r).__name__ if isinstance(r, TxnTableError) else None if r is None else _result(r)
        for r in plan.results
    ]


# --- examples -------------------------------------------------------------------------


def test_a_round_places_writers_one_after_the_other() -> None:
    snap = new_table()
    a = intent(AppendOp((batch(0, pid=1, epoch=0, seq=0, count=3),)), 0)
    b = intent(AppendOp((batch(0, pid=2, epoch=0, seq=0, count=2),)), 0)
    c = intent(AppendOp((batch(1, count=4),)), 0)
    plan = sequence_round(snap, items_of([a, b, c]))
    assert outcomes(plan) == [((0,), ()), ((3,), ()), ((0,), ())]
    assert [o.id for o in plan.outcomes] == [a.id, b.id, c.id]
    assert all(o.error is None and o.version == 1 for o in plan.outcomes)
    commit_round(snap, plan)
    assert snap.partition(0).log_end_offset == 5
    assert snap.partition(1).log_end_offset == 4
    assert set(snap.intents) == {a.id, b.id, c.id}


def test_a_refused_intent_leaves_nothing_and_does_not_stop_the_others() -> None:
    snap = new_table()
    first = sequence_round(snap, items_of([intent(AppendOp((batch(0, 7, 1, 0),)), 0)]))
    commit_round(snap, first)  # producer 7 is at epoch 1 now
    zombie = intent(AppendOp((batch(0, 7, 0, 0, count=5),)), 1)
    gap = intent(AppendOp((batch(0, 7, 1, 5),)), 1)
    ok = intent(AppendOp((batch(0, 8, 0, 0, count=2),)), 1)
    plan = sequence_round(snap, items_of([zombie, gap, ok]))
    assert outcomes(plan) == [
        "InvalidProducerEpochError",
        "OutOfOrderSequenceError",
        ((1,), ()),
    ]
    assert [(o.error, o.id) for o in plan.outcomes] == [
        ("InvalidProducerEpochError", zombie.id),
        ("OutOfOrderSequenceError", gap.id),
        (None, ok.id),
    ]
    assert "epoch 0" in plan.outcomes[0].message
    commit_round(snap, plan)
    assert snap.partition(0).log_end_offset == 3


def test_a_later_intent_of_a_round_sees_the_earlier_ones() -> None:
    """Data and its COMMIT marker from two intents of one round; then a duplicate retry
    of the data gets the original offset, in the same round."""
    snap = new_table()
    data = batch(1, pid=4, epoch=2, seq=0, count=2, transactional=True)
    first = intent(AppendOp((data,)), 0)
    marker = intent(AppendOp((), (PendingMarker(1, 4, 2, "COMMIT"),)), 0)
    retry = intent(AppendOp((data,)), 0)
    plan = sequence_round(snap, items_of([first, marker, retry]))
    assert outcomes(plan) == [((0,), ()), ((), ((1, 2),)), ((0,), ())]
    commit_round(snap, plan)
    part = snap.partition(1)
    assert part.last_stable_offset == part.high_watermark == 3
    assert not part.ongoing


def test_an_intent_seen_twice_is_decided_once() -> None:
    snap = new_table()
    it = intent(AppendOp((batch(0, count=2),)), 0)  # not idempotent: only the id protects it
    plan = sequence_round(snap, items_of([it, it]))
    assert outcomes(plan) == [((0,), ()), None]
    assert [o.id for o in plan.outcomes] == [it.id]
    commit_round(snap, plan)
    again = sequence_round(snap, items_of([it]))  # a zombie committer lists it again
    assert again.empty and again.results == [None]


def test_the_window_bounds_when_an_intent_may_be_decided() -> None:
    snap = new_table()
    for _ in range(INTENT_WINDOW_VERSIONS + 5):
        commit_round(snap, sequence_round(snap, items_of([intent(AppendOp((batch(0),)), 0)])))
    n = snap.version + 1
    on_edge = intent(AppendOp((batch(1),)), n - INTENT_WINDOW_VERSIONS)
    too_old = intent(AppendOp((batch(1),)), n - INTENT_WINDOW_VERSIONS - 1)
    future = intent(AppendOp((batch(1),)), n)
    assert eligible(on_edge, snap) and not eligible(too_old, snap)
    assert not eligible(future, snap)
    plan = sequence_round(snap, items_of([too_old, future, on_edge]))
    assert outcomes(plan) == [None, None, ((0,), ())]


def test_a_decided_intent_is_remembered_while_it_could_be_decided() -> None:
    """Whoever sequences it, however late: never decided twice (the pruning and the
    eligibility rule meet exactly)."""
    snap = new_table()
    it = intent(AppendOp((batch(0),)), 0)
    commit_round(snap, sequence_round(snap, items_of([it])))
    filler = AppendOp((batch(1),))
    for _ in range(INTENT_WINDOW_VERSIONS + 3):
        plan = sequence_round(snap, items_of([it, intent(filler, snap.version)]))
        assert plan.results[0] is None, f"decided again at version {snap.version + 1}"
        commit_round(snap, plan)
    assert it.id not in snap.intents  # forgotten once it can no longer be decided
    assert snap.partition(0).log_end_offset == 1


def test_sequencing_never_changes_the_snapshot() -> None:
    snap = new_table()
    commit_round(snap, sequence_round(snap, items_of([intent(AppendOp((batch(0, 1, 0, 0),)), 0)])))
    before = checkpoint_actions(snap)
    version = snap.version
    plan = sequence_round(
        snap,
        items_of(
            [
                intent(AppendOp((batch(0, 1, 0, 1, transactional=True),)), 1),
                intent(AppendOp((batch(1, 2, 0, 0),), (PendingMarker(0, 1, 0, "ABORT"),)), 1),
            ]
        ),
    )
    assert plan.actions
    assert checkpoint_actions(snap) == before and snap.version == version


def test_decided_intents_survive_a_checkpoint() -> None:
    snap = new_table()
    a, b = intent(AppendOp((batch(0),)), 0), intent(AppendOp((batch(1),)), 0)
    commit_round(snap, sequence_round(snap, items_of([a, b])))
    cp = decode_actions(encode_actions(checkpoint_actions(snap)))
    loaded = load_checkpoint(snap.version, cp, state=True)
    assert loaded.intents == snap.intents
    assert sequence_round(loaded, items_of([a])).results == [None]


def test_the_first_round_with_intents_raises_the_writer_version() -> None:
    snap = new_table()
    local = RoundItem(lambda s: AppendOp((batch(0),)).plan(s, NOW))
    assert not any(isinstance(a, Protocol) for a in sequence_round(snap, [local]).actions)
    plan = sequence_round(snap, items_of([intent(AppendOp((batch(0),)), 0)]))
    assert plan.actions[0] == Protocol(1, GROUP_COMMIT_WRITER_VERSION)
    commit_round(snap, plan)
    assert snap.protocol == Protocol(1, GROUP_COMMIT_WRITER_VERSION)
    later = sequence_round(snap, items_of([intent(AppendOp((batch(0),)), 1)]))
    assert not any(isinstance(a, Protocol) for a in later.actions)


def test_offset_commits_are_intents_too() -> None:
    group = TableSnapshot()
    group.apply(
        0, [Protocol(1, 1), Metadata("g", "_groups/g", 1), CommitInfo(NOW, "CREATE GROUP", "x")]
    )
    old = intent(OffsetCommitOp("g", (("t", 0, 5, ""),), generation=3), 0)
    new = intent(OffsetCommitOp("g", (("t", 0, 9, "m"),), generation=4), 0)
    stale = intent(OffsetCommitOp("g", (("t", 0, 2, ""),), generation=3), 0)
    plan = sequence_round(group, items_of([old, new, stale]))
    assert outcomes(plan) == [None, None, "IllegalGenerationError"]
    commit_round(group, plan)
    assert group.offsets[("g", "t", 0)].offset == 9


# --- the property ---------------------------------------------------------------------

PIDS = (1, 2, 3)


@st.composite
def operations(draw: st.DrawFn) -> AppendOp | OffsetCommitOp:
    """Appends of idempotent/transactional/plain batches and markers, with sequences that
    are sometimes right, sometimes duplicates or gaps, epochs sometimes stale."""
    batches = []
    for partition in draw(st.sets(st.integers(0, 1), max_size=2)):
        if draw(st.booleans()):
            batches.append(batch(partition, count=draw(st.integers(1, 3))))
            continue
        pid = draw(st.sampled_from(PIDS))
        batches.append(
            batch(
                partition,
                pid,
                draw(st.integers(0, 2)),
                draw(st.integers(0, 6)),
                draw(st.integers(1, 3)),
                draw(st.booleans()),
            )
        )
    markers = [
        PendingMarker(
            draw(st.integers(0, 1)),
            draw(st.sampled_from(PIDS)),
            draw(st.integers(0, 2)),
            draw(st.sampled_from(["COMMIT", "ABORT"])),
        )
        for _ in range(draw(st.integers(0, 1)))
    ]
    # One batch per (partition, producer): a second one is refused, tested above.
    return AppendOp(tuple(batches), tuple(markers))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(rounds=st.lists(st.lists(operations(), min_size=1, max_size=6), min_size=1, max_size=5))
def test_a_round_is_its_operations_committed_one_by_one(
    rounds: list[list[AppendOp | OffsetCommitOp]],
) -> None:
    grouped, serial = new_table(), new_table()
    for ops in rounds:
        intents = [intent(op, grouped.version) for op in ops]
        plan = sequence_round(grouped, items_of(intents))
        expected = serially(serial, ops)
        assert outcomes(plan) == expected
        assert [o.id for o in plan.outcomes] == [i.id for i in intents]
        assert [o.error for o in plan.outcomes] == [
            e if isinstance(e, str) else None for e in expected
        ]
        # What was planned on the fork is what replaying the version gives.
        assert state(plan.state) == state(_replayed(grouped, plan))
        commit_round(grouped, plan)
        assert state(grouped) == state(serial)
        # Sequenced again (a zombie committer), nothing is decided twice.
        again = sequence_round(grouped, items_of(intents))
        assert again.empty


def _replayed(snap: TableSnapshot, plan: RoundPlan) -> TableSnapshot:
    copy = load_checkpoint(
        snap.version, decode_actions(encode_actions(checkpoint_actions(snap))), state=True
    )
    commit_round(copy, plan)
    return copy


# --- the intent object ------------------------------------------------------------------


def test_an_intent_round_trips_through_its_json() -> None:
    op = AppendOp(
        (batch(0, 3, 1, 4, 2, True), batch(1)),
        (PendingMarker(1, 3, 1, "ABORT", 0),),
        None,
    )
    it = Intent(uuid.uuid4().hex, 17, op, "tid", NOW)
    assert Intent.from_json(it.to_json(), "k") == it
    offsets = OffsetCommitOp("g", (("t", 1, 5, "meta"),), 2, 9, 1)
    it2 = Intent(uuid.uuid4().hex, 3, offsets, None, NOW)
    assert Intent.from_json(it2.to_json(), "k") == it2


@settings(max_examples=200, deadline=None)
@given(
    op=operations(),
    base=st.integers(0, 2**62),
    tid=st.none() | st.text(max_size=40),
    app=st.booleans(),
)
def test_an_intent_round_trips_through_its_key_payload(
    op: AppendOp, base: int, tid: str | None, app: bool
) -> None:
    if app:
        op = AppendOp(op.batches, op.markers, AppTxn("spark-job-é", 7, NOW))
    it = Intent(uuid.uuid4().hex, base, op, tid, NOW)
    payload = it.key_payload()
    assert re.fullmatch(r"[A-Za-z0-9_-]+", payload)
    assert Intent.from_key_payload(payload, it.id, NOW, "k") == it
    offsets = OffsetCommitOp("g", (("t", 1, 5, "meta"), ("u", 0, 1, "")), 2, 9, 1)
    it2 = Intent(uuid.uuid4().hex, base, offsets, tid, NOW)
    assert Intent.from_key_payload(it2.key_payload(), it2.id, NOW, "k") == it2


def test_a_small_intent_fits_in_its_key() -> None:
    """The common intent (one batch and its commit marker) fits a 255-byte file name, so a
    committer listing it reads nothing more."""
    b = PendingBatch(4, f"orders/data/partition=4/{NOW}-{uuid.uuid4().hex}.parquet", 10,
                     1509, 3000, 0, 30, True, NOW, NOW, "orders-writer-3")
    op = AppendOp((b,), (PendingMarker(4, 3000, 0, "COMMIT", 0),))
    it = Intent(uuid.uuid4().hex, 48_211, op, "orders-writer-3", NOW)
    key = intent_key("orders", NOW, it.id, it.key_payload())
    name = key.rsplit("/", 1)[-1]
    assert len(name) <= 255 and name.count(".") == 2
    assert intent_key_parts(key) == (NOW, it.id, it.key_payload())
    assert intent_id_of(key) == it.id


def test_an_intent_too_large_for_its_key_gets_a_plain_key() -> None:
    op = AppendOp(tuple(batch(p % 2, 1, 0, p, 1, True) for p in range(8)))
    it = Intent(uuid.uuid4().hex, 1, op, "orders-writer-3", NOW)
    key = intent_key("t", NOW, it.id, it.key_payload())
    assert key == f"t/_commit/intents/{NOW:013d}-{it.id}.json"
    assert intent_key_parts(key) == (NOW, it.id, None)
    assert intent_key_parts("t/_commit/intents/x.json") is None
    assert intent_key_parts(f"t/_commit/intents/{NOW}-{it.id}.tmp") is None


def test_the_key_dictionary_is_the_one_the_spec_gives() -> None:
    """A client written from the spec must inflate our keys: its dictionary is ours."""
    spec = (Path(__file__).parents[2] / "spec" / "PROTOCOL.md").read_text()
    section = spec[spec.index("**Key payload.**") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n"))]
    assert block.encode("ascii") == INTENT_KEY_DICTIONARY


def _deflated(body: bytes) -> str:
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY,
                               INTENT_KEY_DICTIONARY)
    return base64.urlsafe_b64encode(deflate.compress(body) + deflate.flush()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ("not*base64", CorruptLogError),
        ("AAAA", CorruptLogError),  # not a DEFLATE stream of a body
        (_deflated(b'{"baseVersion":1'), CorruptLogError),  # truncated JSON
        (_deflated(b"[1]"), CorruptLogError),
        (_deflated(b'{"baseVersion":1,"id":"%s","op":{"append":{"batches":[],"markers":[]}},'
                   b'"transactionalId":null,"version":1}' % (b"a" * 32)), CorruptLogError),
        (_deflated(b'{"baseVersion":1,"op":{"append":{"batches":[],"markers":[]}},'
                   b'"transactionalId":null,"version":2}'), UnsupportedProtocolError),
        (_deflated(b'{"baseVersion":1,"op":{},"version":1,"x":"' + b"a" * 70_000 + b'"}'),
         CorruptLogError),  # inflates past 64 KiB
    ],
)
def test_a_damaged_key_payload_is_a_typed_error(payload: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        Intent.from_key_payload(payload, uuid.uuid4().hex, NOW, "t/_commit/intents/k.json")
    good = Intent(uuid.uuid4().hex, 1, AppendOp(), None, NOW).key_payload()
    data = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)) + b"\x00\x01"
    trailing = base64.urlsafe_b64encode(data).decode().rstrip("=")
    with pytest.raises(CorruptLogError, match="one whole DEFLATE stream"):
        Intent.from_key_payload(trailing, uuid.uuid4().hex, NOW, "k")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda o: o.pop("baseVersion"), CorruptLogError),
        (lambda o: o.update(id="not-hex"), CorruptLogError),
        (lambda o: o.update(baseVersion=True), CorruptLogError),
        (lambda o: o.update(op={"delete": {}}), CorruptLogError),
        (lambda o: o.update(op={"append": {"batches": [{}], "markers": []}}), CorruptLogError),
        (lambda o: o["op"]["append"]["markers"].append({"partition": 0, "producerId": 1,
                                                        "producerEpoch": 0, "type": "MAYBE",
                                                        "coordinatorEpoch": 0}),
         CorruptLogError),
        (lambda o: o.update(version=2), UnsupportedProtocolError),
    ],
)
def test_a_damaged_intent_is_a_typed_error(change: Any, error: type[Exception]) -> None:
    it = Intent(uuid.uuid4().hex, 1, AppendOp((batch(0),)), None, NOW)
    body = json.loads(it.to_json())
    change(body)
    with pytest.raises(error):
        Intent.from_json(json.dumps(body).encode(), "t/_commit/intents/x.json")
