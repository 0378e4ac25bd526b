"""read_committed filtering (``aborted.classify_entries``) on hand-built logs. Pure, no I/O.

The random cases generate a partition log together with the ground truth (a transactional
batch is visible exactly when the marker that closes its transaction is a COMMIT), so the
oracle never uses the aborted index the function under test consumes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from tableutil import batch, snapshot_of

from txntable.protocol.aborted import classify_entries, visible_batches
from txntable.protocol.actions import (
    AbortedTxn,
    Action,
    Batch,
    Marker,
    Segment,
)
from txntable.protocol.snapshot import Entry

P1, P2, P3 = 1, 2, 3
IDEMPOTENT = 9


def marker(offset: int, pid: int, kind: str, partition: int = 0) -> Marker:
    return Marker(partition, offset, pid, 0, kind)  # type: ignore[arg-type]


def visible_offsets(entries: list[Entry], aborted: list[AbortedTxn]) -> list[int]:
    return [b.baseOffset for b in visible_batches(entries, aborted)]


# --- Kafka's FetcherTest scenarios, hand-built ------------------------------------------------

KAFKA_CASES = {
    # testReturnCommittedTransactions: two records then COMMIT.
    "committed": (
        [batch(0, 0, 2, P1, 0, 0, True), marker(2, P1, "COMMIT")],
        [],
        [0],
    ),
    # testSkippingAbortedTransactions.
    "aborted": (
        [batch(0, 0, 2, P1, 0, 0, True), marker(2, P1, "ABORT")],
        [AbortedTxn(0, P1, 0, 2, 3)],
        [],
    ),
    # testMultipleAbortMarkers: the duplicate ABORT at 3 is ignored.
    "duplicate abort marker": (
        [
            batch(0, 0, 2, P1, 0, 0, True),
            marker(2, P1, "ABORT"),
            marker(3, P1, "ABORT"),
            batch(0, 4, 2, P1, 0, 2, True),
            marker(6, P1, "COMMIT"),
        ],
        [AbortedTxn(0, P1, 0, 2, 3)],
        [4],
    ),
    # testReadCommittedWithCompactedTopic, with dense offsets: pid 3 and pid 1 commit,
    # pid 2 (whose batch sits between theirs) aborts.
    "interleaved": (
        [
            batch(0, 0, 2, P3, 0, 0, True),
            batch(0, 2, 3, P2, 0, 0, True),
            batch(0, 5, 2, P1, 0, 0, True),
            marker(7, P2, "ABORT"),
            batch(0, 8, 3, P3, 0, 2, True),
            batch(0, 11, 2, P1, 0, 2, True),
            marker(13, P3, "COMMIT"),
            marker(14, P1, "COMMIT"),
        ],
        [AbortedTxn(0, P2, 2, 7, 0)],
        [0, 5, 8, 11],
    ),
    # An aborted transaction followed by a committed one of the same producer.
    "abort then commit, same producer": (
        [
            batch(0, 0, 1, P1, 0, 0, True),
            batch(0, 1, 1, P1, 0, 1, True),
            marker(2, P1, "ABORT"),
            batch(0, 3, 1, P1, 0, 2, True),
            marker(4, P1, "COMMIT"),
        ],
        [AbortedTxn(0, P1, 0, 2, 3)],
        [3],
    ),
    # Non-transactional batches (plain and idempotent) inside an aborted range stay visible.
    "non-transactional inside aborted range": (
        [
            batch(0, 0, 1, P1, 0, 0, True),
            batch(0, 1, 2),
            batch(0, 3, 1, IDEMPOTENT, 0, 0),
            batch(0, 4, 1, P1, 0, 1, True),
            marker(5, P1, "ABORT"),
        ],
        [AbortedTxn(0, P1, 0, 5, 6)],
        [1, 3],
    ),
    # The aborted index may be given in any order (Kafka keeps it in a priority queue).
    "two aborted transactions, index unordered": (
        [
            batch(0, 0, 1, P1, 0, 0, True),
            batch(0, 1, 1, P2, 0, 0, True),
            marker(2, P1, "ABORT"),
            batch(0, 3, 1, P1, 0, 1, True),
            marker(4, P2, "ABORT"),
            marker(5, P1, "COMMIT"),
        ],
        [AbortedTxn(0, P2, 1, 4, 3), AbortedTxn(0, P1, 0, 2, 1)],
        [3],
    ),
    # A stray COMMIT marker (nothing open) changes nothing.
    "stray commit marker": (
        [marker(0, P1, "COMMIT"), batch(0, 1, 1, P1, 0, 0, True), marker(2, P1, "COMMIT")],
        [],
        [1],
    ),
    # Fetch starting in the middle of an aborted transaction: the index entry still applies.
    "range starts inside aborted transaction": (
        [batch(0, 5, 2, P1, 0, 2, True), marker(7, P1, "ABORT"), batch(0, 8, 1)],
        [AbortedTxn(0, P1, 0, 7, 8)],
        [8],
    ),
    # An index entry of a later transaction must not hide an earlier committed one.
    "aborted entry later than committed batch": (
        [
            batch(0, 0, 1, P1, 0, 0, True),
            marker(1, P1, "COMMIT"),
            batch(0, 2, 1, P1, 0, 1, True),
            marker(3, P1, "ABORT"),
        ],
        [AbortedTxn(0, P1, 2, 3, 4)],
        [0],
    ),
    # Not in Kafka: a merge rewrote the ABORT marker (3) into a merged segment while the
    # index entry stays (its transaction started before the merged range); the producer's
    # next transaction is visible all the same.
    "abort marker merged away": (
        [
            batch(0, 0, 1, P1, 0, 0, True),
            batch(0, 1, 1, IDEMPOTENT, 0, 0),
            Segment(0, 2, 4, 0, "", 0),
            batch(0, 4, 1, P1, 0, 1, True),
            marker(5, P1, "COMMIT"),
        ],
        [AbortedTxn(0, P1, 0, 3, 4)],
        [1, 2, 4],
    ),
}


@pytest.mark.parametrize("name", sorted(KAFKA_CASES))
def test_kafka_scenarios(name: str) -> None:
    entries, aborted, expected = KAFKA_CASES[name]
    classified = list(classify_entries(entries, aborted))
    assert [e for e, _ in classified] == entries  # every entry, in order
    assert all(not visible for e, visible in classified if isinstance(e, Marker))
    assert visible_offsets(entries, aborted) == expected


def test_empty_input() -> None:
    assert list(classify_entries([], [AbortedTxn(0, P1, 0, 1, 2)])) == []


# --- generated logs with ground truth ----------------------------------------------------------


@dataclass
class GeneratedLog:
    entries: list[Entry] = field(default_factory=list)
    aborted: list[AbortedTxn] = field(default_factory=list)
    truth: dict[int, bool] = field(default_factory=dict)  # batch base offset -> visible

    @property
    def end(self) -> int:
        return self.entries[-1].next_offset if self.entries else 0


def generate(seed: int, steps: int = 40) -> GeneratedLog:
    """A random single-partition log in which every transaction is closed."""
    rng = random.Random(seed)
    log = GeneratedLog()
    pids = [P1, P2, P3]
    seqs = dict.fromkeys([*pids, IDEMPOTENT], 0)
    open_txns: dict[int, tuple[int, str, list[int]]] = {}  # pid -> (first, outcome, bases)
    offset = 0

    def close(pid: int) -> None:
        nonlocal offset
        first, outcome, bases = open_txns.pop(pid)
        for base in bases:
            log.truth[base] = outcome == "COMMIT"
        log.entries.append(marker(offset, pid, outcome))
        if outcome == "ABORT":
            lso = min((f for f, _, _ in open_txns.values()), default=offset + 1)
            log.aborted.append(AbortedTxn(0, pid, first, offset, lso))
        offset += 1

    for _ in range(rng.randint(1, steps)):
        r = rng.random()
        if r < 0.45:
            pid = rng.choice(pids)
            if pid not in open_txns:
                open_txns[pid] = (offset, rng.choice(["COMMIT", "ABORT"]), [])
            count = rng.randint(1, 3)
            log.entries.append(batch(0, offset, count, pid, 0, seqs[pid], True))
            seqs[pid] += count
            open_txns[pid][2].append(offset)
            offset += count
        elif r < 0.62:
            count = rng.randint(1, 3)
            if rng.random() < 0.5:
                log.entries.append(batch(0, offset, count))
            else:
                log.entries.append(batch(0, offset, count, IDEMPOTENT, 0, seqs[IDEMPOTENT]))
                seqs[IDEMPOTENT] += count
            log.truth[offset] = True
            offset += count
        elif r < 0.92:
            if open_txns:
                close(rng.choice(sorted(open_txns)))
        else:
            idle = [pid for pid in pids if pid not in open_txns]
            if idle:  # a stray (duplicate) marker: nothing open for that producer
                log.entries.append(
                    marker(offset, rng.choice(idle), rng.choice(["COMMIT", "ABORT"]))
                )
                offset += 1
    for pid in rng.sample(sorted(open_txns), len(open_txns)):
        close(pid)
    return log


@pytest.mark.parametrize("seed", range(300))
def test_generated_log_full_range(seed: int) -> None:
    log = generate(seed)
    aborted = list(log.aborted)
    random.Random(seed).shuffle(aborted)  # order of the index must not matter
    classified = list(classify_entries(log.entries, aborted))
    assert [e for e, _ in classified] == log.entries
    for entry, visible in classified:
        if isinstance(entry, Marker):
            assert visible is False
        else:
            assert visible is log.truth[entry.baseOffset], (seed, entry)


@pytest.mark.parametrize("seed", range(150))
def test_generated_log_fetch_ranges(seed: int) -> None:
    """Fetches of arbitrary ranges, through the snapshot's range lookups, as the consumer does."""
    log = generate(seed)
    actions: list[Action] = [*log.entries, *log.aborted]
    # Aborted entries must follow their marker in the log; put each in the marker's version.
    versions: list[list[Action]] = []
    for entry in log.entries:
        versions.append([entry])
        if isinstance(entry, Marker) and entry.type == "ABORT":
            versions[-1].extend(a for a in log.aborted if a.lastOffset == entry.offset)
    assert sum(len(v) for v in versions) == len(actions)
    part = snapshot_of(*versions, partitions=1).partition(0)
    assert part.last_stable_offset == part.high_watermark == log.end
    rng = random.Random(seed + 1000)
    for _ in range(10):
        start = rng.randint(0, log.end)
        end = rng.randint(start, log.end)
        entries = list(part.entries_between(start, end))
        assert entries == [e for e in log.entries if e.baseOffset < end and e.next_offset > start]
        aborted = part.aborted_between(start, end)
        assert aborted == [a for a in log.aborted if a.lastOffset >= start and a.firstOffset < end]
        got = [b.baseOffset for b in visible_batches(entries, aborted)]
        want = [e.baseOffset for e in entries if isinstance(e, Batch) and log.truth[e.baseOffset]]
        assert got == want, (seed, start, end)
