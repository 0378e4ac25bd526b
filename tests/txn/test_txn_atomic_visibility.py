"""Atomic visibility: read_committed readers polling while transactions over 2 tables x 3
partitions commit and abort never see part of a transaction in a table."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from txnutil import all_tps, assert_no_open_transactions, markers_by_partition, read_all

from txntable import Consumer, Producer, Warehouse
from txntable.table import Table

TABLES = ("x", "y")
PARTITIONS = 3
PER_PARTITION = 3
TXNS = 12


def aborted(k: int) -> bool:
    return k % 4 == 3


def value(k: int, table: str, p: int, i: int) -> bytes:
    return f"{k}-{table}-{p}-{i}".encode()


class Progress:
    """How many transactions the writer has ended; the writer waits for the readers."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ended = 0

    def end_transaction(self, readers: list[Observations]) -> None:
        """Count one more ended transaction, then wait until every reader finished a poll
        round begun after it: each transaction meets a poll, however loaded the machine."""
        with self.cond:
            self.ended += 1
            self.cond.wait_for(
                lambda: all(o.ended_before and o.ended_before[-1] >= self.ended for o in readers),
                timeout=60,
            )


def writer(
    wh: Warehouse,
    done: threading.Event,
    errors: list[BaseException],
    progress: Progress,
    readers: list[Observations],
) -> None:
    try:
        producer = Producer(wh, transactional_id="atomic", linger_ms=3_600_000, batch_size=1 << 30)
        producer.init_transactions()
        for k in range(TXNS):
            producer.begin_transaction()
            for table in TABLES:
                for p in range(PARTITIONS):
                    for i in range(PER_PARTITION):
                        producer.send(table, value=value(k, table, p, i), partition=p)
                    if k % 2 == 0 and p == 0:
                        # Long path with partial data in the log: partition 0 of the table
                        # is committed one version before partitions 1 and 2.
                        producer.flush()
            if aborted(k):
                producer.flush()
                producer.abort_transaction()
            else:
                producer.commit_transaction()  # odd k: the short path (data + markers)
            progress.end_transaction(readers)
        producer.close()
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)
    finally:
        done.set()


@dataclass
class Observations:
    """Per poll round: transaction -> partition -> how many of its records were returned."""

    rounds: list[dict[int, dict[int, int]]] = field(default_factory=list)
    #: Per round, how many transactions the writer had ended when it began.
    ended_before: list[int] = field(default_factory=list)


def reader(
    wh: Warehouse,
    table: str,
    done: threading.Event,
    obs: Observations,
    errors: list[BaseException],
    progress: Progress,
) -> None:
    try:
        consumer = Consumer(Warehouse(wh.url), isolation_level="read_committed")
        consumer.assign(all_tps(wh, [table]))
        consumer.seek_to_beginning()
        final = False
        while True:
            with progress.cond:
                ended = progress.ended
            got = consumer.poll(max_records=1_000_000)
            round_: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
            for tp, records in got.items():
                for r in records:
                    assert r.value is not None
                    round_[int(r.value.split(b"-")[0])][tp.partition] += 1
            with progress.cond:
                obs.rounds.append(round_)
                obs.ended_before.append(ended)
                progress.cond.notify_all()
            if final:
                return
            if done.is_set():
                final = True  # one more round after the writer is done
            time.sleep(0.001)  # a tight loop, but let the writer have the GIL
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_transactions_are_visible_atomically_per_table(wh: Warehouse) -> None:
    for table in TABLES:
        wh.create_table(table, partitions=PARTITIONS)
    done = threading.Event()
    errors: list[BaseException] = []
    observations = {(t, n): Observations() for t in TABLES for n in range(1)}
    progress = Progress()
    threads = [
        threading.Thread(target=reader, args=(wh, t, done, observations[t, n], errors, progress))
        for t, n in observations
    ]
    readers = list(observations.values())
    threads.append(
        threading.Thread(target=writer, args=(Warehouse(wh.url), done, errors, progress, readers))
    )
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    committed = {k for k in range(TXNS) if not aborted(k)}
    for (table, _), obs in observations.items():
        first_round: dict[int, int] = {}
        for n, round_ in enumerate(obs.rounds):
            for k, per_partition in round_.items():
                assert k not in first_round, f"{table}: txn {k} seen in two rounds"
                first_round[k] = n
                # The round that shows any of the transaction in this table shows all of it.
                assert dict(per_partition) == {p: PER_PARTITION for p in range(PARTITIONS)}, (
                    table,
                    k,
                    dict(per_partition),
                )
        assert set(first_round) == committed  # no aborted data, every committed txn
        # Each committed transaction is returned no later than by the first poll begun
        # after its commit returned, and the writer waited for that poll before the next
        # transaction: each is first seen in a round of its own, in commit order.
        for k in committed:
            assert first_round[k] <= obs.ended_before.index(k + 1), (table, k)
        firsts = [first_round[k] for k in sorted(committed)]
        assert firsts == sorted(set(firsts)), (table, firsts)

    # Across tables: every partition of both tables carries the same outcome per txn.
    outcomes = ["ABORT" if aborted(k) else "COMMIT" for k in range(TXNS)]
    for table in TABLES:
        t = wh.table(table)
        assert_no_open_transactions(t)
        marks = markers_by_partition(t.log)
        assert {p: [m.type for m in ms] for p, ms in marks.items()} == {
            p: outcomes for p in range(PARTITIONS)
        }
    expected = [
        value(k, t, p, i)
        for k in sorted(committed)
        for t in TABLES
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
    ]
    assert sorted(read_all(wh, TABLES)) == sorted(expected)
    # read_uncommitted does see the aborted transactions' data (they really were written).
    uncommitted = read_all(wh, TABLES, "read_uncommitted")
    assert value(3, "x", 0, 0) in uncommitted


def test_reader_never_sees_a_half_marked_transaction_across_tables(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose markers reached table x but not yet y: x shows all of it, y none;
    after completion both show all of it and no partition has an ABORT for it."""
    for table in TABLES:
        wh.create_table(table, partitions=PARTITIONS)
    producer = Producer(wh, transactional_id="half", linger_ms=3_600_000, batch_size=1 << 30)
    producer.init_transactions()
    seen_between: dict[str, list[bytes | None]] = {}
    real_append = Table.append
    x_seen = threading.Event()

    def append(self, batches, markers=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        # The coordinator's own marker writes (at once, one per table): y's waits until a
        # reader looked after x's; look after each.
        if markers and self.name == "y":
            assert x_seen.wait(30)
        result = real_append(self, batches, markers, *args, **kwargs)
        if markers:
            seen_between[self.name] = read_all(Warehouse(wh.url), TABLES)
            if self.name == "x":
                x_seen.set()
        return result

    monkeypatch.setattr(Table, "append", append)
    producer.begin_transaction()
    for table in TABLES:
        for p in range(PARTITIONS):
            producer.send(table, value=value(0, table, p, 0), partition=p)
    producer.flush()
    producer.commit_transaction()

    after_x = seen_between["x"]
    assert sorted(after_x) == sorted(value(0, "x", p, 0) for p in range(PARTITIONS))
    assert sorted(seen_between["y"]) == sorted(
        value(0, t, p, 0) for t in TABLES for p in range(PARTITIONS)
    )
    for table in TABLES:
        marks = markers_by_partition(wh.table(table).log)
        assert {p: [m.type for m in ms] for p, ms in marks.items()} == {
            p: ["COMMIT"] for p in range(PARTITIONS)
        }
