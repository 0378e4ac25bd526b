"""Kafka's default partitioner: murmur2 against Kafka's own test vectors. Pure."""

from __future__ import annotations

import pytest

from txntable.producer.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# Kafka's UtilsTest.testMurmur2.
VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), sorted(VECTORS.items()))
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "hashed"), sorted(VECTORS.items()))
@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 12, 100])
def test_partition_for_key(key: bytes, hashed: int, partitions: int) -> None:
    positive = hashed + 2**31 if hashed < 0 else hashed  # Java's hash & 0x7fffffff
    assert partition_for_key(key, partitions) == positive % partitions


def test_known_partitions() -> None:
    assert [partition_for_key(k, 3) for k in sorted(VECTORS)] == [0, 2, 2, 0, 0, 2]
    assert partition_for_key(b"21", 100) == 40
    assert partition_for_key(b"abc", 7) == 4


def test_hash_range() -> None:
    for i in range(2000):
        h = murmur2(str(i).encode())
        assert -(2**31) <= h < 2**31
        assert 0 <= to_positive(h) < 2**31
    assert to_positive(-1) == 2**31 - 1 and to_positive(-(2**31)) == 0


def test_sticky_partitioner() -> None:
    sp = StickyPartitioner()
    first = sp.partition("t", None, 4)
    assert all(sp.partition("t", None, 4) == first for _ in range(10))
    assert sp.partition("t", b"21", 100) == 40  # keyed records ignore stickiness
    seen = {first}
    for _ in range(20):
        sp.on_new_batch("t", 4)
        nxt = sp.partition("t", None, 4)
        assert nxt != first
        first = nxt
        seen.add(nxt)
    assert len(seen) > 1
    single = StickyPartitioner()
    assert single.partition("u", None, 1) == 0
    single.on_new_batch("u", 1)
    assert single.partition("u", None, 1) == 0


def test_vectorised_murmur2_equals_the_scalar_one() -> None:
    import random

    import pyarrow as pa

    from txntable.producer.partitioner import murmur2_array, partitions_for_keys

    rng = random.Random(20260801)
    keys: list[bytes | None] = [
        rng.randbytes(rng.randrange(65)) for _ in range(5000)
    ] + [None, b"", None] + sorted(VECTORS)
    array = pa.array(keys, pa.binary())
    expected = [murmur2(k) if k is not None else 0 for k in keys]
    assert murmur2_array(array).tolist() == expected
    assert murmur2_array(array.slice(1234, 777)).tolist() == expected[1234:2011]
    assert murmur2_array(pa.chunked_array([array[:10], array[10:]])).tolist() == expected
    for key, hashed in VECTORS.items():  # Kafka's vectors through the vectorised path
        assert murmur2_array(pa.array([key] * 3, pa.binary())).tolist() == [hashed] * 3
    for partitions in (1, 3, 8, 100):
        got = partitions_for_keys(array, partitions).tolist()
        assert got == [partition_for_key(k, partitions) if k is not None else -1 for k in keys]
    same_length = [rng.randbytes(16) for _ in range(3000)]  # the contiguous fast path
    assert murmur2_array(pa.array(same_length, pa.binary())).tolist() == [
        murmur2(k) for k in same_length
    ]
    assert murmur2_array(pa.array([], pa.binary())).tolist() == []
