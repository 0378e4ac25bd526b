"""A producer SIGKILLed at every step of a two-table transaction, then recovered.

``helpers/crash_txn.py`` runs a committed warm-up transaction ``t1`` and then transaction
``t2`` over tables ``ta`` and ``tb`` (3 partitions each, plus a group offset unless the
point is a ``buffered_`` one), and kills itself with a real SIGKILL at a named point. Each
crashed warehouse is made once per module and copied for every recovery variant:

* ``init``: a new producer with the same transactional id calls ``init_transactions()``;
* ``recover``: ``Warehouse.recover()`` (with ``now`` past the transaction timeout);
* ``cli``: ``python -m txntable.cli recover WAREHOUSE`` in a subprocess.

Whatever the point, afterwards: a transaction that reached PrepareCommit is visible
exactly once in both tables, any other ends aborted and invisible; no partition has an
open transaction; every partition holds exactly one marker per transaction; the
coordinator object is Complete* (recover) or Empty (init).
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from txnutil import (
    HELPERS,
    assert_no_open_transactions,
    group_log,
    markers_by_partition,
    read_all,
    run_python,
)

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import UnstableOffsetCommitError
from txntable.txn.coordinator import TransactionCoordinator, TxnMetadata, TxnState
from txntable.util import now_ms

pytestmark = pytest.mark.slow

TID = "crash-tid"
GROUP = "crash-g"
TABLES = ("ta", "tb")
PARTITIONS = 3
PER_PARTITION = 4
SOURCE_TP = TopicPartition("src", 0)
TIMEOUT_MS = 1000

#: Points where t2 reached PrepareCommit: it must roll forward.
COMMIT_POINTS = (
    "prepare_commit",
    "some_markers",
    "all_markers",
    "buffered_prepare_commit",
    "buffered_some_markers",
    "buffered_all_markers",
)
#: Points where t2 was Ongoing (registered only, or data committed): aborted by a fence.
ONGOING_POINTS = ("registered", "data_committed")
#: Points where the producer itself was aborting t2.
ABORTING_POINTS = ("prepare_abort", "some_abort_markers")
ALL_POINTS = COMMIT_POINTS + ONGOING_POINTS + ABORTING_POINTS


def values(tag: str) -> list[bytes]:
    return [
        f"{tag}-{t}-{p}-{i}".encode()
        for t in TABLES
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
    ]


@dataclass(frozen=True)
class Crash:
    point: str
    path: Path
    producer_id: int
    epoch: int

    @property
    def commits(self) -> bool:
        return self.point in COMMIT_POINTS

    @property
    def sends_offsets(self) -> bool:
        return not self.point.startswith("buffered_")


def create_tables(wh: Warehouse) -> None:
    for t in TABLES:
        wh.create_table(t, partitions=PARTITIONS)
    wh.create_table("src", partitions=1)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """``crashed(point)``: a pristine warehouse left by a producer killed at ``point``."""
    cache: dict[str, Crash] = {}

    def make(point: str) -> Crash:
        if point not in cache:
            path = tmp_path_factory.mktemp(f"crash-{point}") / "wh"
            create_tables(Warehouse(path.as_uri()))
            proc = run_python(
                [str(HELPERS / "crash_txn.py"), path.as_uri(), point, str(TIMEOUT_MS)]
            )
            assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
            info = json.loads(proc.stdout.splitlines()[0])
            cache[point] = Crash(point, path, info["producer_id"], info["epoch"])
        return cache[point]

    return make


def copy_of(crash: Crash, tmp_path: Path) -> Warehouse:
    dest = tmp_path / "copy"
    shutil.copytree(crash.path, dest)
    return Warehouse(dest.as_uri())


def load_meta(wh: Warehouse) -> TxnMetadata:
    loaded = TransactionCoordinator(wh.store).load(TID)
    assert loaded is not None
    return loaded[0]


def committed_offset(wh: Warehouse) -> int | None:
    consumer = Consumer(wh, group_id=GROUP)
    om = consumer.committed(SOURCE_TP)
    return None if om is None else om.offset


def check_outcome(wh: Warehouse, crash: Crash, extra_txns: int = 0) -> None:
    """Data, markers, LSO and group offsets after recovery from ``crash``.

    ``extra_txns`` committed transactions (tag ``t3``…) ran after the recovery.
    """
    expected = values("t1") + (values("t2") if crash.commits else [])
    for n in range(extra_txns):
        expected += values(f"t{3 + n}")
    got = Counter(read_all(wh, TABLES))
    assert got == Counter(expected), "read_committed must return each committed record once"
    assert all(c == 1 for c in got.values())

    t2_marker = "COMMIT" if crash.commits else "ABORT"
    # Fencing an Ongoing transaction aborts it under a bumped epoch.
    t2_epoch = crash.epoch + (1 if crash.point in ONGOING_POINTS else 0)
    for name in TABLES:
        table = wh.table(name)
        assert_no_open_transactions(table)
        per_partition = markers_by_partition(table.log)
        assert sorted(per_partition) == list(range(PARTITIONS))
        for p, marks in per_partition.items():
            kinds = [m.type for m in marks]
            # (For "registered", the partitions were registered without data: the fence
            # still marks them, so the old epoch is refused there from now on.)
            assert kinds == ["COMMIT", t2_marker] + ["COMMIT"] * extra_txns, (name, p, marks)
            assert marks[1].producerId == crash.producer_id
            assert marks[1].producerEpoch == t2_epoch, (name, p, marks)
            # One marker per transaction: offsets strictly increase, none written twice.
            assert len({m.offset for m in marks}) == len(marks)

    glog = group_log(wh, GROUP)
    group_markers = [m.type for m in markers_by_partition(glog).get(0, [])]
    expected_group = ["COMMIT"] + ([t2_marker] if crash.sends_offsets else [])
    assert group_markers == expected_group
    offset = 2 if crash.commits and crash.sends_offsets else 1
    assert committed_offset(wh) == offset


def check_crashed_state(wh: Warehouse, crash: Crash) -> None:
    """What the crash itself left, before anyone recovers it (looked at by a client that
    never finishes stuck transactions, so looking changes nothing)."""
    wh = Warehouse(wh.url, finish_stuck_transactions=False)
    meta = load_meta(wh)
    expected_state = {
        "registered": TxnState.ONGOING,
        "data_committed": TxnState.ONGOING,
        "prepare_abort": TxnState.PREPARE_ABORT,
        "some_abort_markers": TxnState.PREPARE_ABORT,
    }.get(crash.point, TxnState.PREPARE_COMMIT)
    assert meta.state is expected_state
    # Two tables never take the short path (issue 25.2): no intent, the data is in the logs.
    assert meta.intent == {}
    visible = Counter(read_all(wh, TABLES))
    t2_visible = {v for v in visible if v.startswith(b"t2-")}
    if crash.point in ("some_markers", "buffered_some_markers"):
        # ta's markers are in, tb's not: ta's half is visible until recovery finishes.
        assert t2_visible == {v for v in values("t2") if v.startswith(b"t2-ta-")}
    elif crash.point in ("all_markers", "buffered_all_markers"):
        assert t2_visible == set(values("t2"))
    else:
        assert t2_visible == set()
    if crash.sends_offsets and crash.point not in (
        "some_markers",
        "all_markers",
        "some_abort_markers",
    ):
        with pytest.raises(UnstableOffsetCommitError):
            committed_offset(wh)


def run_t3(wh: Warehouse, producer: Producer) -> None:
    producer.begin_transaction()
    for v in values("t3"):
        _, t, p, _ = v.decode().split("-")
        producer.send(t, value=v, partition=int(p))
    producer.commit_transaction()


def check_nothing_left_to_recover(wh: Warehouse, crash: Crash) -> None:
    """After recovery: recovering again is a no-op (no marker written twice), and a new
    instance starts from Empty with the next epoch and commits normally."""
    report = wh.recover(now=now_ms() + 3_600_000)
    assert (report.committed, report.aborted, report.timed_out) == ([], [], [])
    check_outcome(wh, crash)
    producer = Producer(wh, transactional_id=TID)
    producer.init_transactions()
    assert load_meta(wh).state is TxnState.EMPTY
    run_t3(wh, producer)
    producer.close()
    check_outcome(wh, crash, extra_txns=1)


@pytest.mark.parametrize("point", ALL_POINTS)
def test_new_producer_init_transactions_recovers(crashed, tmp_path: Path, point: str) -> None:
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    check_crashed_state(wh, crash)

    producer = Producer(wh, transactional_id=TID, transaction_timeout_ms=60_000)
    producer.init_transactions()
    meta = load_meta(wh)
    assert meta.state is TxnState.EMPTY
    assert meta.partitions == {} and meta.intent == {}
    assert (producer.producer_id, producer.producer_epoch) == (
        meta.producer_id,
        meta.producer_epoch,
    )
    assert meta.producer_id == crash.producer_id
    # The fence (Ongoing only), completing the transaction (KIP-890), the new instance.
    bumps = 3 if point in ONGOING_POINTS else 2
    assert meta.producer_epoch == crash.epoch + bumps
    check_outcome(wh, crash)

    # The new instance works, and nothing is left for a recoverer to do.
    run_t3(wh, producer)
    producer.close()
    report = wh.recover(now=now_ms() + 3_600_000)
    assert (report.committed, report.aborted, report.timed_out) == ([], [], [])
    check_outcome(wh, crash, extra_txns=1)


@pytest.mark.parametrize("point", ALL_POINTS)
def test_warehouse_recover_recovers(crashed, tmp_path: Path, point: str) -> None:
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    check_crashed_state(wh, crash)

    report = wh.recover(now=now_ms() + 3_600_000)
    if crash.commits:
        assert report.committed == [TID]
    elif point in ONGOING_POINTS:
        assert report.timed_out == [TID]
    else:
        assert report.aborted == [TID]
    meta = load_meta(wh)
    assert meta.state is (TxnState.COMPLETE_COMMIT if crash.commits else TxnState.COMPLETE_ABORT)
    assert meta.partitions == {} and meta.intent == {}
    check_outcome(wh, crash)

    # Recovering again is a no-op: no marker is written twice.
    check_nothing_left_to_recover(wh, crash)


@pytest.mark.parametrize("point", ["data_committed", "registered"])
def test_recover_leaves_ongoing_transaction_before_its_timeout(
    crashed, tmp_path: Path, point: str
) -> None:
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    meta = load_meta(wh)
    report = wh.recover(now=meta.txn_start_timestamp + TIMEOUT_MS // 2)
    assert (report.committed, report.aborted, report.timed_out) == ([], [], [])
    assert load_meta(wh) == meta
    if point == "data_committed":
        for name in TABLES:
            for p in wh.table(name).describe().partitions:
                assert p.last_stable_offset < p.high_watermark  # still pinned by t2


@pytest.mark.parametrize(
    "point", ["some_markers", "data_committed", "buffered_prepare_commit", "some_abort_markers"]
)
def test_cli_recover(crashed, tmp_path: Path, point: str) -> None:
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    meta = load_meta(wh)
    if meta.state is TxnState.ONGOING:
        # The CLI uses the wall clock: wait out the transaction timeout for real.
        wait = (meta.txn_start_timestamp + meta.timeout_ms + 50 - now_ms()) / 1000
        if wait > 0:
            time.sleep(wait)
    proc = run_python(["-m", "txntable.cli", "recover", wh.url, "--json"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    key = {
        "some_markers": "committed",
        "buffered_prepare_commit": "committed",
        "data_committed": "timed_out",
        "some_abort_markers": "aborted",
    }[point]
    assert report[key] == [TID]
    state = TxnState.COMPLETE_COMMIT if crash.commits else TxnState.COMPLETE_ABORT
    assert load_meta(wh).state is state
    check_outcome(wh, crash)


@pytest.mark.parametrize("point", ["some_markers", "buffered_prepare_commit", "data_committed"])
def test_racing_recoverers_write_each_marker_once(crashed, tmp_path: Path, point: str) -> None:
    """Several clients (own stores and handles) recover at once, plus a new instance."""
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    far = now_ms() + 3_600_000
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def recoverer() -> None:
        try:
            barrier.wait()
            Warehouse(wh.url).recover(now=far)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def new_instance() -> None:
        try:
            barrier.wait()
            p = Producer(Warehouse(wh.url), transactional_id=TID)
            p.init_transactions()
            p.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=recoverer) for _ in range(4)]
    threads.append(threading.Thread(target=new_instance))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert load_meta(wh).state is TxnState.EMPTY
    check_outcome(wh, crash)


#: Crash points that leave a prepared transaction pinning the LSO of a table (all_markers
#: has every marker in). The buffered ones pin it too: a transaction over two tables takes
#: the normal path however buffered it was (issue 25.2), so a half-marked one is never left
#: visible in one table and invisible in the other without holding the other's LSO.
PINNING_PREPARED_POINTS = (
    "prepare_commit",
    "some_markers",
    "prepare_abort",
    "some_abort_markers",
    "buffered_prepare_commit",
    "buffered_some_markers",
)


def pinned_partitions(wh: Warehouse) -> list[tuple[str, int]]:
    return [
        (name, p.partition)
        for name in TABLES
        for p in wh.table(name).describe().partitions
        if p.last_stable_offset < p.high_watermark
    ]


def log_files(wh: Warehouse) -> dict[str, bytes]:
    return {k: wh.store.get(k).data for k in wh.store.list("")}


@pytest.mark.parametrize("point", PINNING_PREPARED_POINTS)
def test_a_reader_completes_a_prepared_transaction_after_the_grace_period(
    crashed, tmp_path: Path, point: str
) -> None:
    """No recover(), no restart: a read_committed reader finishes what the SIGKILLed
    producer decided, exactly as recover() would."""
    crash = crashed(point)
    wh = copy_of(crash, tmp_path)
    untouched = log_files(wh)

    # Read-only credentials: the option turns it off, and reading writes nothing at all.
    read_only = Warehouse(wh.url, finish_stuck_transactions=False, stuck_transaction_grace_ms=0)
    assert pinned_partitions(read_only)
    read_all(read_only, TABLES)
    # Within the grace period the producer may still be finishing: left alone.
    patient = Warehouse(wh.url, stuck_transaction_grace_ms=3_600_000)
    assert pinned_partitions(patient)
    assert log_files(wh) == untouched
    assert load_meta(wh).state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    # Past it, the first poll completes the transaction: markers everywhere, LSO released.
    reader = Warehouse(wh.url, stuck_transaction_grace_ms=0)
    consumer = Consumer(reader, isolation_level="read_committed", auto_offset_reset="earliest")
    tps = [TopicPartition(t, p) for t in TABLES for p in range(PARTITIONS)]
    consumer.assign(tps)
    got = Counter(r.value for recs in consumer.poll(max_records=10_000).values() for r in recs)
    expected = values("t1") + (values("t2") if crash.commits else [])
    assert got == Counter(expected)
    consumer.close()
    meta = load_meta(wh)
    assert meta.state is (TxnState.COMPLETE_COMMIT if crash.commits else TxnState.COMPLETE_ABORT)
    assert pinned_partitions(wh) == []
    check_outcome(wh, crash)
    check_nothing_left_to_recover(wh, crash)


@pytest.mark.parametrize("point", ["prepare_commit", "prepare_abort"])
def test_describe_and_other_writers_complete_a_prepared_transaction(
    crashed, tmp_path: Path, point: str
) -> None:
    crash = crashed(point)
    # describe() on one copy.
    wh = Warehouse(copy_of(crash, tmp_path / "describe").url, stuck_transaction_grace_ms=0)
    for name in TABLES:
        parts = wh.table(name).describe().partitions
        assert all(p.last_stable_offset == p.high_watermark for p in parts), parts
    check_outcome(wh, crash)
    # A plain producer's write to one table on another copy completes the whole
    # transaction (both tables and the group log).
    wh = Warehouse(copy_of(crash, tmp_path / "writer").url, stuck_transaction_grace_ms=0)
    with Producer(wh, linger_ms=0) as producer:
        producer.send("src", value=b"unrelated").result()
        # src holds nothing of the transaction: writing there finishes nothing.
        prepared = TxnState.PREPARE_COMMIT if crash.commits else TxnState.PREPARE_ABORT
        assert load_meta(wh).state is prepared
        producer.send("ta", value=b"plain", partition=0).result()
    assert load_meta(wh).state is (
        TxnState.COMPLETE_COMMIT if crash.commits else TxnState.COMPLETE_ABORT
    )
    assert pinned_partitions(wh) == []


def test_helper_rejects_unknown_point(tmp_path: Path) -> None:
    proc = run_python([str(HELPERS / "crash_txn.py"), (tmp_path / "w").as_uri(), "nope"])
    assert proc.returncode == 2
