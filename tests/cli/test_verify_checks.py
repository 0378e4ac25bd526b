"""The invariant checks of ``txntable verify``, as pure functions of hand-built versions.

Each test plants one violation in an otherwise valid history and asserts the exact list of
violations found (rule and location): the planted one, and nothing it would drag along.
"""

from __future__ import annotations

import contextlib
import io
import time
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txntable import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import InvalidTxnStateError, ProducerFencedError, TxnTableError
from txntable.maintenance.verify import (
    RULES,
    LogChecker,
    Violation,
    check_segment,
    compare_snapshots,
    transaction_over,
)
from txntable.protocol.actions import (
    AbortedTxn,
    Action,
    AppTxn,
    Batch,
    CommitInfo,
    LogStart,
    Marker,
    Metadata,
    OffsetCommit,
    Protocol,
)
from txntable.protocol.records import encode_segment
from txntable.protocol.snapshot import checkpoint_actions, load_checkpoint
from txntable.storage import MemoryStore
from txntable.structs import ProducerRecord
from txntable.txn.coordinator import TxnMetadata, TxnState
from txntable.util import now_ms

T = "t"


def info() -> CommitInfo:
    return CommitInfo(1_700_000_000_000, "WRITE", uuid.uuid4().hex)


def v0(partitions: int = 2) -> list[Action]:
    return [
        Protocol(1, 1),
        Metadata("id-t", T, partitions),
        CommitInfo(1_700_000_000_000, "CREATE TABLE", uuid.uuid4().hex),
    ]


def batch(
    p: int,
    base: int,
    count: int = 1,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    txn: bool = False,
) -> Batch:
    return Batch(
        p,
        base,
        count,
        f"{T}/data/{p}/{uuid.uuid4().hex}.parquet",
        100,
        pid,
        epoch,
        seq,
        txn,
        transactionalId="tx" if txn else None,
    )


def marker(p: int, offset: int, pid: int, epoch: int, kind: str = "COMMIT") -> Marker:
    return Marker(p, offset, pid, epoch, kind)  # type: ignore[arg-type]


Found = list[tuple[str, int | None, int | None, int | None]]


def run(*versions: list[Action], partitions: int = 2) -> Found:
    """Check version 0 then ``versions`` as 1, 2, …; (rule, version, partition, offset)."""
    checker = LogChecker(T)
    for v, actions in enumerate([v0(partitions), *versions]):
        checker.apply_version(v, actions)
    return [(x.rule, x.version, x.partition, x.offset) for x in checker.finish()]


def good_history() -> list[list[Action]]:
    """Idempotent writes, a committed and an aborted transaction, one still open."""
    return [
        [batch(0, 0, 2, pid=1, epoch=0, seq=0), info()],  # 1: idempotent 0-1
        [batch(0, 2, 3, pid=7, epoch=0, seq=0, txn=True), info()],  # 2: txn 7 at 2-4
        [batch(1, 0, 2, pid=8, epoch=0, seq=0, txn=True), info()],  # 3: txn 8 at p1 0-1
        [marker(0, 5, 7, 0), info()],  # 4: commit txn 7 at 5
        [
            marker(1, 2, 8, 0, "ABORT"),
            AbortedTxn(1, 8, 0, 2, 3),
            info(),
        ],  # 5: abort txn 8
        [batch(0, 6, 1, pid=1, epoch=0, seq=2), info()],  # 6: idempotent continues
        [batch(1, 3, 1, pid=7, epoch=1, seq=0, txn=True), info()],  # 7: txn 7, epoch 1, open
    ]


def test_a_valid_history_has_no_violation() -> None:
    assert run(*good_history()) == []


def test_every_rule_is_documented() -> None:
    assert all(sev in ("error", "warning") and text for sev, text in RULES.values())


def test_offset_gap_is_reported_once_and_checking_goes_on() -> None:
    h = good_history()
    h[5] = [batch(0, 8, 1, pid=1, epoch=0, seq=2), info()]  # offsets 6..7 missing
    h[6] = [batch(1, 3, 1, pid=7, epoch=1, seq=0, txn=True), info()]
    h.append([batch(0, 9, 1), info()])  # continues after the gap: not reported again
    assert run(*h) == [("offsets.gap", 6, 0, 8)]


def test_offset_overlap_is_reported_and_the_entry_not_applied() -> None:
    h = good_history()
    h[5] = [batch(0, 5, 1, pid=1, epoch=0, seq=2), info()]  # offset 5 is the COMMIT marker
    h.append([batch(0, 6, 1), info()])  # the log end offset stayed 6
    assert run(*h) == [("offsets.overlap", 6, 0, 5)]


def test_abort_marker_without_its_aborted_index_entry() -> None:
    h = good_history()
    h[4] = [marker(1, 2, 8, 0, "ABORT"), info()]
    assert run(*h) == [("aborted.missing", 5, 1, 2)]


def test_aborted_entry_with_the_wrong_first_offset() -> None:
    h = good_history()
    h[4] = [marker(1, 2, 8, 0, "ABORT"), AbortedTxn(1, 8, 1, 2, 3), info()]
    assert run(*h) == [("aborted.mismatch", 5, 1, 2)]


def test_aborted_entry_not_after_its_marker() -> None:
    h = good_history()
    h[4] = [marker(1, 2, 8, 0, "ABORT"), AbortedTxn(1, 8, 0, 2, 3), info()]
    h[5] = [batch(0, 6, 1, pid=1, epoch=0, seq=2), AbortedTxn(0, 1, 0, 6, 7), info()]
    assert run(*h) == [("aborted.orphan", 6, 0, 6)]


def test_aborted_last_stable_offset_is_a_warning() -> None:
    h = good_history()
    h[4] = [marker(1, 2, 8, 0, "ABORT"), AbortedTxn(1, 8, 0, 2, 2), info()]
    found = run(*h)
    assert found == [("aborted.last-stable-offset", 5, 1, 2)]
    assert RULES["aborted.last-stable-offset"][0] == "warning"


def test_sequence_gap() -> None:
    h = good_history()
    h[5] = [batch(0, 6, 1, pid=1, epoch=0, seq=3), info()]  # expected 2
    assert run(*h) == [("producer.sequence", 6, 0, 6)]


def test_duplicate_batch_written_twice() -> None:
    h = good_history()
    h[5] = [batch(0, 6, 2, pid=1, epoch=0, seq=0), info()]  # sequences 0..1 again
    assert run(*h) == [("producer.duplicate", 6, 0, 6)]


def test_epoch_going_back_for_a_batch_and_a_marker() -> None:
    h = good_history()
    h.append([batch(0, 7, 1, pid=7, epoch=0, seq=0, txn=True), info()])  # table has epoch 1
    h.append([marker(1, 4, 7, 0), info()])
    assert run(*h) == [
        ("producer.fenced-epoch", 8, 0, 7),
        ("producer.fenced-epoch", 9, 1, 4),
    ]


def test_marker_that_closes_nothing() -> None:
    h = good_history()
    h.append([marker(0, 7, 8, 0), info()])  # producer 8 has nothing open on partition 0
    assert run(*h) == [("marker.no-open-transaction", 8, 0, 7)]


def test_fence_marker_on_a_partition_without_data_is_valid() -> None:
    # Writer requirement 8c: an ABORT of a new epoch where the producer wrote nothing.
    h = good_history()
    # Both partitions in one version: the rules are evaluated against the version before, so
    # the first marker's epoch does not make the second one old.
    h.append(
        [
            marker(0, 7, 7, 2, "ABORT"),
            AbortedTxn(0, 7, 7, 7, 8),
            marker(1, 4, 7, 2, "ABORT"),
            AbortedTxn(1, 7, 3, 4, 5),
            info(),
        ]
    )
    assert run(*h) == []


def test_new_epoch_while_the_old_transaction_is_open() -> None:
    h = good_history()
    h.append([batch(1, 4, 1, pid=7, epoch=2, seq=0, txn=True), info()])
    assert run(*h) == [("txn.not-closed", 8, 1, 4)]


def test_commit_info_missing_duplicated_or_reused() -> None:
    h = good_history()
    h[0] = [h[0][0]]
    h[1] = [h[1][0], info(), info()]
    h[2] = [h[2][0], replace(info(), commitId=h[3][-1].commitId)]  # type: ignore[union-attr]
    assert run(*h) == [
        ("commit-info.missing", 1, None, None),
        ("commit-info.missing", 2, None, None),
        ("commit-info.duplicate-id", 4, None, None),
    ]


def test_batch_paths_partitions_and_producers() -> None:
    h = good_history()
    bad_path = replace(batch(0, 7, 1), path="elsewhere/x.parquet")
    reused = replace(batch(1, 4, 1), path=h[2][0].path)  # type: ignore[union-attr]
    h.append([bad_path, info()])
    h.append([reused, batch(5, 0, 1), info()])
    h.append([batch(0, 8, 1, pid=3, epoch=0, seq=0), batch(0, 9, 1, pid=3, epoch=0, seq=1),
              info()])
    assert run(*h) == [
        ("batch.path", 8, 0, 7),
        ("batch.path-reused", 9, 1, 4),
        ("partition.unknown", 9, 5, None),
        ("append.two-batches", 10, 0, 9),
    ]


def test_log_start_offsets_commits_app_txns_metadata() -> None:
    h = good_history()
    h.append([LogStart(0, 99), info()])
    h.append([OffsetCommit("g", T, 0, 3), info()])
    h.append([AppTxn("app", 5), info()])
    h.append([AppTxn("app", 5), info()])
    h.append([Metadata("id-t", T, 1), info()])
    assert run(*h) == [
        ("log-start.above-high-watermark", 8, 0, 99),
        ("offset-commit.in-table", 9, None, None),
        ("app-txn.not-increasing", 11, None, None),
        ("metadata.partitions-shrink", 12, None, None),
    ]


def test_a_transactional_batch_needs_a_producer_and_an_id() -> None:
    h = good_history()
    h.append([replace(batch(0, 7, 1), transactional=True), info()])
    h.append([replace(batch(0, 8, 1, pid=4, epoch=0, seq=0, txn=True), transactionalId=None),
              info()])
    assert run(*h) == [
        ("batch.transactional-without-producer", 8, 0, 7),
        ("batch.transactional-id", 8, 0, 7),
        ("batch.transactional-id", 9, 0, 8),
    ]


def test_group_log_rules() -> None:
    checker = LogChecker("_groups/g", group_log=True)
    versions: list[list[Action]] = [
        [Protocol(1, 1), Metadata("id-g", "_groups/g", 1), info()],
        [OffsetCommit("g", T, 0, 4, producerId=7, producerEpoch=0), info()],
        [marker(0, 0, 7, 0), info()],  # (b) closes pending offset commits
        [OffsetCommit("g", T, 0, 5), info()],  # plain commit
        [batch(0, 1, 1), info()],  # no batches in a group log
    ]
    for v, actions in enumerate(versions):
        checker.apply_version(v, actions)
    assert [(x.rule, x.version) for x in checker.finish()] == [("group.batch", 4)]
    assert checker.snapshot.offsets[("g", T, 0)].offset == 5


def test_checkpoint_that_differs_from_the_replay() -> None:
    checker = LogChecker(T)
    for v, actions in enumerate([v0(), *good_history()]):
        checker.apply_version(v, actions)
    snap = checker.snapshot
    good = load_checkpoint(snap.version, checkpoint_actions(snap), state=True)
    assert compare_snapshots(snap.version, snap, good) == []
    dropped = [a for a in checkpoint_actions(snap) if not isinstance(a, AbortedTxn)]
    bad = load_checkpoint(snap.version, dropped, state=True)
    assert compare_snapshots(snap.version, snap, bad) == [
        Violation(
            "checkpoint.mismatch",
            f"checkpoint at version {snap.version}: aborted differs from the log's replay",
            snap.version,
            1,
        ),
        Violation(
            "checkpoint.mismatch",
            f"checkpoint at version {snap.version}: aborted last offsets differs from the "
            "log's replay",
            snap.version,
            1,
        ),
    ]


# --- segments ---------------------------------------------------------------------------------


def segment(n: int = 3, ts: int = 1000) -> tuple[Batch, bytes]:
    data = encode_segment([ProducerRecord(b"k", b"v%d" % i, (), ts + i) for i in range(n)])
    b = Batch(0, 0, n, f"{T}/data/0/s.parquet", len(data), minTimestamp=ts, maxTimestamp=ts + n - 1)
    return b, data


def rules(found: list[Violation]) -> list[str]:
    return [v.rule for v in found]


def test_a_matching_segment_passes() -> None:
    b, data = segment()
    assert check_segment(b, data) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("missing", ["segment.missing"]),
        ("count", ["segment.mismatch"]),
        ("size", ["segment.size"]),
        ("timestamps", ["segment.timestamps"]),
        ("not-parquet", ["segment.size", "segment.corrupt"]),
        ("schema", ["segment.size", "segment.mismatch"]),
    ],
)
def test_a_segment_that_does_not_match_its_batch(change: str, expected: list[str]) -> None:
    b, data = segment()
    got: bytes | None = data
    if change == "missing":
        got = None
    elif change == "count":
        b = replace(b, count=4)
    elif change == "size":
        b = replace(b, size=b.size + 1)
    elif change == "timestamps":
        b = replace(b, maxTimestamp=b.maxTimestamp + 1)
    elif change == "not-parquet":
        got = b"not parquet at all"
    else:
        sink = io.BytesIO()
        pq.write_table(pa.table({"value": pa.array([1, 2, 3])}), sink)
        got = sink.getvalue()
    found = check_segment(b, got)
    assert rules(found) == expected
    assert all(v.path == b.path and v.partition == 0 for v in found)


# --- histories written by the library verify clean ----------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 1), st.integers(0, 1), st.booleans()),
        st.tuples(st.sampled_from(["commit", "abort", "offsets", "fence"]), st.integers(0, 1)),
        st.tuples(st.just("idempotent"), st.integers(0, 1)),
        st.tuples(st.sampled_from(["recover", "delete", "checkpoint"]), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_histories_written_by_the_library_verify_clean(ops: list[tuple[Any, ...]]) -> None:
    """Transactions committed, aborted, fenced, timed out (recovered), offsets committed in
    transactions, idempotent writes, delete-records and checkpoints: no violation."""
    url = f"memory://verify-{uuid.uuid4().hex}"
    wh = Warehouse(url)
    made: list[Producer] = []
    try:
        wh.create_table(T, partitions=2, configuration={"checkpoint.interval": "3"})
        manual = {"linger_ms": 600_000, "batch_size": 1 << 30}

        def fresh(i: int) -> Producer:
            p = Producer(wh, transactional_id=f"tx{i}", **manual)  # type: ignore[arg-type]
            made.append(p)
            p.init_transactions()
            return p

        clients = [fresh(0), fresh(1)]
        idempotent = Producer(wh, **manual)  # type: ignore[arg-type]
        made.append(idempotent)
        for op in ops:
            kind, i = op[0], op[1]
            c = clients[i]
            try:
                if kind == "send":
                    if c.txn is not None and c.txn.state.name == "READY":
                        c.begin_transaction()
                    c.send(T, value=b"v", partition=op[2])
                    if op[3]:
                        c.flush()  # lands now: the commit takes the long path
                elif kind in ("commit", "abort") and c.txn is not None:
                    if c.txn.state.name == "IN_TRANSACTION":
                        (c.commit_transaction if kind == "commit" else c.abort_transaction)()
                elif kind == "offsets" and c.txn is not None:
                    if c.txn.state.name == "IN_TRANSACTION":
                        c.send_offsets_to_transaction(
                            {TopicPartition(T, 0): OffsetAndMetadata(1)},
                            ConsumerGroupMetadata("g"),
                        )
                elif kind == "fence":
                    clients[i] = fresh(i)  # the old instance's transaction is aborted
                elif kind == "idempotent":
                    idempotent.send(T, value=b"i", partition=i)
                    idempotent.flush()
                elif kind == "recover":
                    wh.recover(now=now_ms() + 3_600_000)  # every open transaction timed out
                elif kind == "delete":
                    wh.table(T).delete_records({i: -1})
                else:
                    wh.table(T).checkpoint()
            except (ProducerFencedError, InvalidTxnStateError):
                clients[i] = fresh(i)
        idempotent.close()
        report = wh.table(T).verify()
        assert report.errors == []
        # A fenced producer's refused append leaves its segment unreferenced, newer than
        # the tip: segment.after-tip says so (a warning: it cannot tell that from a deleted
        # newest version).
        assert {w.rule for w in report.warnings} <= {"lso.below-log-start", "segment.after-tip"}
        if "g" in wh.list_groups():
            assert wh.verify_group("g").errors == []
    finally:
        for p in made:
            with contextlib.suppress(TxnTableError):  # fenced instances may refuse to abort
                p.close(timeout=10)
        MemoryStore.drop(url.removeprefix("memory://"))


# --- a deleted newest version (issue 19.12) -----------------------------------------------------


def test_a_deleted_newest_version_is_flagged_where_it_can_be() -> None:
    url = f"memory://verify-{uuid.uuid4().hex}"
    wh = Warehouse(url)
    try:
        wh.create_table(T, partitions=2)
        with Producer(wh, transactional_id="tx") as p:
            p.init_transactions()
            p.begin_transaction()
            p.send(T, value=b"v", partition=1)
            p.flush()  # version 1: the data, open
            p.commit_transaction()  # version 2: the COMMIT marker; the object CompleteCommit
        log = wh.table(T).log
        assert wh.table(T).verify().ok
        wh.store.delete(log.version_key(2))
        report = wh.table(T).verify()
        assert [(v.rule, v.version, v.partition, v.offset) for v in report.errors] == [
            ("txn.marker-missing", 1, 1, 0)
        ]
        assert "CompleteCommit" in report.errors[0].message
        # An append whose version was deleted leaves a segment newer than the tip.
        time.sleep(0.01)  # segment names carry ms: one strictly after the tip's commit
        with Producer(wh) as idem:
            idem.send(T, value=b"i", partition=0).get(timeout=10)
        assert [w.rule for w in wh.table(T).verify().warnings] == []
        wh.store.delete(log.version_key(2))
        found = wh.table(T).verify()
        assert [(w.rule, w.version) for w in found.warnings] == [("segment.after-tip", 1)]
        assert [e.rule for e in found.errors] == ["txn.marker-missing"]
    finally:
        MemoryStore.drop(url.removeprefix("memory://"))


def test_which_coordinator_states_prove_a_transaction_complete() -> None:
    def meta(state: TxnState, pid: int, epoch: int, last: tuple[int, int] = (-1, -1)) -> Any:
        return TxnMetadata("tx", pid, epoch, state, 60_000, last_producer_id=last[0],
                           last_producer_epoch=last[1])

    # The transaction of producer 7 at epoch 3.
    assert not transaction_over(meta(TxnState.ONGOING, 7, 3), 7, 3)
    assert not transaction_over(meta(TxnState.PREPARE_COMMIT, 7, 3), 7, 3)
    assert transaction_over(meta(TxnState.COMPLETE_COMMIT, 7, 4, (7, 3)), 7, 3)
    assert transaction_over(meta(TxnState.ONGOING, 7, 4), 7, 3)  # the next one runs
    # A fencing abort of epoch 3 runs at 4 and may still be writing its markers.
    assert not transaction_over(meta(TxnState.PREPARE_ABORT, 7, 4), 7, 3)
    assert transaction_over(meta(TxnState.COMPLETE_ABORT, 7, 5, (7, 4)), 7, 3)
    # Rotated to a new id when completing: the old id's markers are written.
    assert transaction_over(meta(TxnState.COMPLETE_COMMIT, 8, 0, (7, 32766)), 7, 32766)
    assert not transaction_over(meta(TxnState.ONGOING, 8, 0), 7, 3)  # proves nothing
