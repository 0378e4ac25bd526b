"""Snapshot replay and log-version decoding. Pure, no I/O."""

from __future__ import annotations

import pytest
from tableutil import batch, snapshot_of, version0

from txntable.errors import (
    CorruptLogError,
    UnknownTopicOrPartitionError,
    UnsupportedProtocolError,
)
from txntable.protocol.actions import (
    INTENT_WINDOW_VERSIONS,
    AbortedTxn,
    Action,
    AppTxn,
    CommitInfo,
    IntentOutcome,
    LogStart,
    Marker,
    Metadata,
    OffsetCommit,
    PartitionStart,
    Protocol,
    decode_actions,
    encode_actions,
)
from txntable.protocol.snapshot import TableSnapshot, load_checkpoint, replay

PATH = "t/_log/00000000000000000007.json"

V1 = [batch(0, 0, 2, pid=1, epoch=0, seq=0, txn=True)]
V2 = [batch(0, 2, 1)]
V3 = [
    batch(0, 3, 1, pid=2, epoch=0, seq=0, txn=True),
    batch(1, 0, 1, pid=2, epoch=0, seq=0, txn=True),
]
V4 = [Marker(0, 4, 1, 0, "ABORT"), AbortedTxn(0, 1, 0, 4, 3)]
V5 = [Marker(0, 5, 2, 0, "COMMIT"), Marker(1, 1, 2, 0, "COMMIT")]


def test_replay_tracks_lso_ongoing_and_aborted_index() -> None:
    snap = snapshot_of(V1)
    p0, p1 = snap.partitions
    assert (snap.version, p0.high_watermark, p0.last_stable_offset, p0.ongoing) == (1, 2, 0, {1: 0})
    assert (p1.high_watermark, p1.last_stable_offset, p1.ongoing) == (0, 0, {})

    snap = snapshot_of(V1, V2, V3)
    p0, p1 = snap.partitions
    assert (p0.high_watermark, p0.last_stable_offset, p0.ongoing) == (4, 0, {1: 0, 2: 3})
    assert (p1.high_watermark, p1.last_stable_offset, p1.ongoing) == (1, 0, {2: 0})

    snap = snapshot_of(V1, V2, V3, V4)
    p0, p1 = snap.partitions
    assert (p0.high_watermark, p0.last_stable_offset, p0.ongoing) == (5, 3, {2: 3})
    assert p0.aborted == [AbortedTxn(0, 1, 0, 4, 3)]
    assert p0.aborted_between(0, 5) == [AbortedTxn(0, 1, 0, 4, 3)]
    assert p0.aborted_between(5, 6) == []

    snap = snapshot_of(V1, V2, V3, V4, V5)
    p0, p1 = snap.partitions
    assert (p0.high_watermark, p0.last_stable_offset, p0.ongoing) == (6, 6, {})
    assert (p1.high_watermark, p1.last_stable_offset, p1.ongoing) == (2, 2, {})
    assert [e.baseOffset for e in p0.entries] == [0, 2, 3, 4, 5]
    assert p0.entry_offsets == [0, 2, 3, 4, 5]
    assert snap.producer_epochs == {1: 0, 2: 0}
    assert p0.producers[1].current_txn_first_offset is None
    assert p0.producers[1].last_seq == 1
    assert p0.producers[2].last_seq == 0
    assert snap.version == 5


def test_entries_between_is_an_overlap_lookup() -> None:
    part = snapshot_of(V1, V2, V3, V4, V5).partition(0)
    assert [e.baseOffset for e in part.entries_between(1, 3)] == [0, 2]
    assert [e.baseOffset for e in part.entries_between(0, 0)] == []
    assert [e.baseOffset for e in part.entries_between(5, 6)] == [5]
    assert [e.baseOffset for e in part.entries_between(6, 10)] == []


def test_marker_epoch_bump_and_producer_state() -> None:
    snap = snapshot_of(V1, [Marker(0, 2, 1, 1, "ABORT"), AbortedTxn(0, 1, 0, 2, 3)])
    assert snap.producer_epochs[1] == 1
    entry = snap.partition(0).producers[1]
    assert entry.epoch == 1 and len(entry.batches) == 0  # a new epoch forgets the batches


def test_log_start_is_clamped_to_the_log_end() -> None:
    snap = snapshot_of(V1, [LogStart(0, 1)], [LogStart(0, 0)], [LogStart(0, 99)])
    assert snap.partition(0).log_start_offset == 2  # never backwards, never past the LEO


def test_transactional_offsets_wait_for_the_commit_marker() -> None:
    pending = OffsetCommit("g", "t", 0, 7, producerId=1, producerEpoch=0)
    snap = snapshot_of(V1, [pending])
    assert snap.offsets == {} and snap.pending_offsets == {1: {("g", "t", 0): pending}}
    snap = snapshot_of(V1, [pending], [Marker(0, 2, 1, 0, "COMMIT")])
    assert snap.offsets == {("g", "t", 0): pending} and snap.pending_offsets == {}
    snap = snapshot_of(V1, [pending], [Marker(0, 2, 1, 0, "ABORT"), AbortedTxn(0, 1, 0, 2, 3)])
    assert snap.offsets == {} and snap.pending_offsets == {}


def test_unknown_partition_lookup() -> None:
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 2"):
        snapshot_of().partition(2)


@pytest.mark.parametrize(
    ("bad_version", "message"),
    [
        ([batch(0, 3)], "does not continue the log end offset 2"),  # offset gap
        ([batch(0, 1)], "does not continue the log end offset 2"),  # overlap
        ([Marker(0, 5, 1, 0, "COMMIT")], "does not continue"),
        ([batch(2, 0)], "partition 2"),
        ([Metadata("id-t", "t", 1)], "reduces the number of partitions"),
        ([AbortedTxn(0, 1, 0, 5, 6), AbortedTxn(0, 2, 0, 4, 5)], "out of order"),
    ],
)
def test_inconsistent_version_is_corrupt(bad_version: list[Action], message: str) -> None:
    snap = snapshot_of(V1)
    with pytest.raises(CorruptLogError, match=message) as info:
        snap.apply(2, bad_version, PATH)
    assert info.value.path == PATH
    assert PATH in str(info.value)
    assert snap.version == 1


def test_version_gap_is_corrupt() -> None:
    snap = snapshot_of(V1)
    with pytest.raises(CorruptLogError, match="version 3 does not follow 1") as info:
        snap.apply(3, V2, PATH)
    assert info.value.path == PATH
    with pytest.raises(CorruptLogError, match="does not follow"):
        replay([(0, version0()), (2, V2)])
    with pytest.raises(CorruptLogError, match="does not follow"):
        replay([(1, version0())])


def test_version_zero_needs_protocol_and_metadata() -> None:
    with pytest.raises(CorruptLogError, match="no protocol or metadata"):
        TableSnapshot().apply(0, [Protocol(1, 1)], PATH)
    with pytest.raises(CorruptLogError, match="no protocol or metadata"):
        TableSnapshot().apply(0, [Metadata("id", "t", 1)], PATH)


def test_future_protocol_in_replay() -> None:
    with pytest.raises(UnsupportedProtocolError, match="reader version 99"):
        snapshot_of([Protocol(99, 99)])


# --- decoding --------------------------------------------------------------------------------

ALL_ACTIONS: list[Action] = [
    Protocol(1, 1),
    Metadata("id", "t", 3, configuration={"a": "b"}, createdTime=5),
    batch(0, 0, 3, pid=4, epoch=2, seq=7, txn=True),
    Marker(0, 3, 4, 2, "ABORT", coordinatorEpoch=1, timestamp=9),
    AbortedTxn(0, 4, 0, 3, 4),
    OffsetCommit("g", "t", 0, 3, metadata="m", producerId=4, producerEpoch=2, generation=1),
    AppTxn("app", 3, 10),
    LogStart(0, 1),
    CommitInfo(123, "WRITE", "abc", transactionalId="tx"),
    CommitInfo(123, "WRITE", "abc", transactionalId=None),
]


def test_encode_decode_round_trip() -> None:
    data = encode_actions(ALL_ACTIONS)
    assert data.endswith(b"\n") and data.count(b"\n") == len(ALL_ACTIONS)
    assert decode_actions(data, PATH) == ALL_ACTIONS


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty or truncated"),
        (b"\n", "holds no actions"),
        (b'{"protocol":{"minReaderVersion":1,"minWriterVersion":1}}', "truncated"),
        (b'{"protocol":{"minReaderVersion":1,"minWriter\n', "not valid JSON"),
        (b"\xff\xfe\n", "not UTF-8"),
        (b"[1, 2]\n", "not a one-key action object"),
        (b'{"a": 1, "b": 2}\n', "not a one-key action object"),
        (b'{"frobnicate": {}}\n', "unknown action 'frobnicate'"),
        (b'{"protocol": 3}\n', "body is not an object"),
        (b'{"protocol":{"minReaderVersion":1}}\n', "missing required field minWriterVersion"),
        (b'{"protocol":{"minReaderVersion":true,"minWriterVersion":1}}\n', "invalid value"),
        (
            b'{"batch":{"partition":0,"baseOffset":"0","count":1,"path":"p","size":1}}\n',
            "field baseOffset",
        ),
        (
            b'{"batch":{"partition":0,"baseOffset":0,"count":0,"path":"p","size":1}}\n',
            "empty batch",
        ),
        (
            b'{"marker":{"partition":0,"offset":0,"producerId":1,"producerEpoch":0,'
            b'"type":"MAYBE"}}\n',
            "field type",
        ),
        (
            b'{"abortedTxn":{"partition":0,"producerId":1,"firstOffset":5,"lastOffset":4,'
            b'"lastStableOffset":5}}\n',
            "after lastOffset",
        ),
        (
            b'{"metadata":{"tableId":"i","name":"t","partitions":0}}\n',
            "partitions must be positive",
        ),
        (b'{"metadata":{"tableId":"i","name":"t","partitions":1,"schema":[{}]}}\n', "schema"),
    ],
)
def test_decode_rejects_damage(data: bytes, message: str) -> None:
    with pytest.raises(CorruptLogError, match=message) as info:
        decode_actions(data, PATH)
    assert info.value.path == PATH and PATH in str(info.value)


def test_decode_future_protocol() -> None:
    data = b'{"protocol":{"minReaderVersion":99,"minWriterVersion":99}}\n'
    with pytest.raises(UnsupportedProtocolError, match="reader version 99"):
        decode_actions(data, PATH)
    # A newer writer version alone does not stop readers.
    assert decode_actions(b'{"protocol":{"minReaderVersion":1,"minWriterVersion":7}}\n') == [
        Protocol(1, 7)
    ]


def test_a_marker_creates_a_producer_entry_with_the_defaults() -> None:
    # Issue 21.14: a fencing marker on a partition the producer never wrote to creates its
    # entry there; lastTimestamp stays 0 (only batches raise it), coordinatorEpoch is the
    # marker's (from -1), and nothing is open.
    snap = snapshot_of(
        [batch(0, 0, 2, pid=9, epoch=3, seq=0, txn=True)],
        [Marker(0, 2, 9, 4, "ABORT", timestamp=77), Marker(1, 0, 9, 4, "ABORT", timestamp=77)],
    )
    fresh = snap.partition(1).producers[9]
    assert (fresh.epoch, list(fresh.batches), fresh.current_txn_first_offset) == (4, [], None)
    assert (fresh.coordinator_epoch, fresh.last_timestamp) == (0, 0)
    wrote = snap.partition(0).producers[9]
    assert (wrote.epoch, list(wrote.batches)) == (4, [])  # a higher epoch clears the batches
    assert snap.partition(0).ongoing == {} and snap.producer_epochs == {9: 4}


@pytest.mark.parametrize(
    ("first", "later"),
    [((3, 3), (2, 2)), ((2, 2), (1, 1)), ((3, 3), (3, 2)), ((2, 2), (1, 2))],
)
def test_a_protocol_never_goes_down(first: tuple[int, int], later: tuple[int, int]) -> None:
    # Issue 21.9: a protocol action lowering a typed table's reader version was accepted, so
    # a v2 reader would then misread typed segments (and a v1 reader a truncated log).
    with pytest.raises(CorruptLogError, match="lowers"):
        replay(enumerate([[Protocol(*first), version0()[1]], [Protocol(*later)]]))
    raised = replay(enumerate([[Protocol(*later), version0()[1]], [Protocol(*first)]]))
    assert raised.protocol == Protocol(*first)


def test_a_partition_started_twice_in_a_checkpoint_is_corrupt() -> None:
    # Issue 21.15: the second partitionStart of an empty partition silently replaced the
    # first one's log start offset.
    head = [Protocol(2, 2), version0(1)[1]]
    one = load_checkpoint(4, [*head, PartitionStart(0, 0, 0)], "cp", state=True)
    assert one.partition(0).log_start_offset == 0
    with pytest.raises(CorruptLogError, match="two partitionStart"):
        load_checkpoint(4, [*head, PartitionStart(0, 0, 0), PartitionStart(0, 5, 0)], "cp", True)


def test_decided_intents_are_kept_exactly_while_inside_the_window() -> None:
    """After version v, the decided intents with baseVersion >= v - W are kept and no other
    (a fork forgets its own without changing the snapshot it came from; an intent recorded
    twice, by a checkpoint and a version, is forgotten once)."""
    window = INTENT_WINDOW_VERSIONS
    decided: list[IntentOutcome] = []
    snap = snapshot_of()
    fork = None
    for v in range(1, 3 * window):
        # Bases spread over the window, some as old as it allows, in no particular order.
        outcomes = [
            IntentOutcome(f"{v}-{i}", max(0, v - 1 - (i * 37 + v) % window), v) for i in range(5)
        ]
        if v == 2 * window:
            outcomes.append(decided[-1])  # recorded again
        decided.extend(outcomes)
        snap.apply(v, [CommitInfo(v, "WRITE", f"c{v}", intents=tuple(outcomes))])
        expected = {o.id: o for o in decided if o.baseVersion >= v - window}
        assert snap.intents == expected, v
        if v == window + 10:
            fork = snap.fork()
    assert fork is not None and fork.version == window + 10
    kept = dict(fork.intents)
    for v in range(window + 11, window + 31):
        fork.apply(v, [CommitInfo(v, "WRITE", f"f{v}", intents=())])
    assert fork.intents == {k: o for k, o in kept.items() if o.baseVersion >= 30}
    assert 0 < len(fork.intents) < len(kept)


def test_a_fork_copies_a_producer_entry_only_when_it_changes_it() -> None:
    """A round's fork shares a partition's producer entries with its snapshot and copies
    each one before its first change: the snapshot never sees the fork's changes, and
    producers the fork does not touch are not copied (hundreds per partition at W=256)."""
    snap = snapshot_of(
        [batch(0, 0, 2, pid=1, epoch=0, seq=0, txn=True)],
        [batch(0, 2, 1, pid=2, epoch=0, seq=0)],
        [Marker(0, 3, 1, 0, "COMMIT")],
    )
    before = snap.partition(0).producers
    one, two = before[1], before[2]
    one_was = (one.epoch, list(one.batches), one.current_txn_first_offset)
    fork = snap.fork()
    fork.apply(4, [batch(0, 4, 3, pid=1, epoch=0, seq=2, txn=True)])
    fork.apply(5, [batch(0, 7, 1, pid=1, epoch=0, seq=5, txn=True)])
    fork.apply(6, [Marker(0, 8, 1, 1, "ABORT")])  # a bumped epoch clears the batches
    changed = fork.partition(0).producers
    assert changed[2] is two  # untouched: shared
    assert changed[1] is not one
    assert (changed[1].epoch, list(changed[1].batches)) == (1, [])
    assert changed[1].coordinator_epoch == 0
    # The snapshot the fork came from is as it was.
    assert snap.partition(0).producers[1] is one
    assert (one.epoch, list(one.batches), one.current_txn_first_offset) == one_was
    assert snap.version == 3 and snap.partition(0).log_end_offset == 4
    # A producer the fork creates is the fork's alone.
    fork.apply(7, [batch(0, 9, 1, pid=3, epoch=0, seq=0, txn=True)])
    assert 3 in fork.partition(0).producers and 3 not in snap.partition(0).producers
    # The snapshot itself still changes its own entries in place.
    snap.apply(4, [batch(0, 4, 1, pid=2, epoch=0, seq=1)])
    assert snap.partition(0).producers[2] is two and two.last_seq == 1
