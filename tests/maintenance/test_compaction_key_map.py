"""Key compaction's offset map lives in Arrow columns, not in a Python object per key.

The map (latest offset per key, Kafka's cleaner's ``OffsetMap``) is folded by a hash
group-by every ``KEY_MAP_FOLD_ROWS`` rows, and the rewrite keeps a record iff its offset is
in the map's sorted offsets. Checked here against a plain dict over random histories with
null keys, tombstones and many folds (the map folded every few rows, segments compacted
again and again), and for memory: compacting 200,000 distinct keys allocates no Python
object per key.
"""

from __future__ import annotations

import random
import tracemalloc
import uuid

import numpy as np
import pytest

from txntable import Consumer, TopicPartition, Warehouse
from txntable.maintenance.merge import Compaction, latest_offsets, plan_groups
from txntable.protocol.append import PendingBatch
from txntable.protocol.records import encode_segment
from txntable.structs import ProducerRecord
from txntable.table import Table

DAY = 86_400_000
TP = TopicPartition("t", 0)


def write(table: Table, records: list[tuple[bytes | None, bytes | None]]) -> None:
    """Commit ``records`` (key, value) as one idempotent-free batch on partition 0."""
    data = encode_segment([ProducerRecord(k, v, (), 1_000) for k, v in records])
    path = table.segment_key(0, f"{uuid.uuid4().hex}.parquet")
    table.store.put(path, data)
    table.append(
        [PendingBatch(partition=0, path=path, count=len(records), size=len(data),
                      min_timestamp=1_000, max_timestamp=1_000)]
    )


def read_all(wh: Warehouse) -> list[tuple[int, bytes | None, bytes | None]]:
    c = Consumer(wh, auto_offset_reset="earliest")
    c.assign([TP])
    end = c.end_offsets([TP])[TP]
    out = []
    while c.position(TP) < end:
        out += [(r.offset, r.key, r.value) for r in c.poll(max_records=100_000).get(TP, [])]
    c.close()
    return out


def expected_after_compaction(
    rows: list[tuple[int, bytes | None, bytes | None]], drop_tombstones: bool
) -> list[tuple[int, bytes | None, bytes | None]]:
    latest = {k: o for o, k, _ in rows if k is not None}
    return [
        (o, k, v)
        for o, k, v in rows
        if (k is None or latest[k] == o) and not (drop_tombstones and k is not None and v is None)
    ]


def test_keeps_answers_membership_in_the_sorted_offsets() -> None:
    c = Compaction(np.array([3, 7, 8, 20], dtype=np.int64), 0, 0)
    assert c.keeps(np.array([1, 3, 4, 7, 8, 9], dtype=np.int64)).tolist() == [
        False, True, False, True, True, False
    ]
    assert c.keeps(np.array([21, 30], dtype=np.int64)).tolist() == [False, False]
    assert c.keeps(np.array([], dtype=np.int64)).tolist() == []
    assert Compaction(np.zeros(0, np.int64), 0, 0).keeps(np.array([5])).tolist() == [False]


@pytest.mark.parametrize("seed", range(6))
def test_many_folds_null_keys_tombstones_and_recompaction_match_a_dict(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # fold after every segment
    monkeypatch.setattr("txntable.maintenance.merge.KEY_MAP_FOLD_ROWS", 3)
    rng = random.Random(seed)
    wh = Warehouse(f"memory://keymap-{uuid.uuid4().hex}")
    table = wh.create_table(
        "t", partitions=1,
        configuration={"cleanup.policy": "compact", "segment.bytes": str(rng.choice([1, 4000]))},
    )
    now = 10 * DAY
    for round_ in range(4):
        for _ in range(rng.randint(1, 6)):
            write(table, [
                (
                    None if rng.random() < 0.2 else f"k{rng.randrange(12)}".encode(),
                    None if rng.random() < 0.25 else f"v{round_}-{rng.random():.6f}".encode(),
                )
                for _ in range(rng.randint(1, 8))
            ])
        before = read_all(wh)
        snap = wh.table("t").snapshot()
        runs = plan_groups(snap.partition(0), 1 << 30, rewrite_all=True)
        reference = sorted(
            o for o in {k: o for o, k, _ in before if k is not None}.values()
        )
        assert latest_offsets(wh.store, runs).tolist() == reference
        table.compact(now=now)
        # Tombstones are first kept (their horizon is now + delete.retention.ms).
        assert read_all(wh) == expected_after_compaction(before, drop_tombstones=False)
    # Past the horizon of every tombstone, compacting again drops them (null keys stay).
    before = read_all(wh)
    table.compact(now=now + DAY)
    after = read_all(wh)
    assert after == expected_after_compaction(before, drop_tombstones=True)
    assert [r for r in after if r[1] is None] == [r for r in before if r[1] is None]


def test_the_key_map_of_200k_keys_holds_no_python_object_per_key() -> None:
    wh = Warehouse(f"memory://keymap-big-{uuid.uuid4().hex}")
    table = wh.create_table("t", partitions=1, configuration={"cleanup.policy": "compact"})
    n, per = 200_000, 50_000
    for start in range(0, n, per):
        write(table, [(f"key-{i:012d}".encode(), b"v") for i in range(start, start + per)])
    write(table, [(f"key-{i:012d}".encode(), b"w") for i in range(0, n, 2)])
    runs = plan_groups(wh.table("t").snapshot().partition(0), 1 << 30, rewrite_all=True)
    tracemalloc.start()
    try:
        offsets = latest_offsets(wh.store, runs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(offsets) == n
    # Odd keys at their first offsets, even keys at the batch that rewrote them.
    assert offsets[0] == 1 and offsets[n // 2 - 1] == n - 1 and offsets[-1] == n + n // 2 - 1
    # A dict of 200k 16-byte keys to ints takes ~30 MB of Python objects; the Arrow map's
    # buffers are not Python objects (tracemalloc sees only the bookkeeping).
    assert peak < 4 << 20, peak
