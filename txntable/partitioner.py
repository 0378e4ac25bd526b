"""Kafka's default partitioner: murmur2 of the key bytes, made positive, modulo partitions.

The hash is Kafka's ``Utils.murmur2`` (seed 0x9747b28c), so a key lands in the same partition
number here as with Kafka's Java client. Records without a key stick to one partition until
a batch is sent (KIP-480's sticky partitioner).
"""

from __future__ import annotations

import random

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash, as a signed int32 like Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Chooses partitions: by key hash, or one sticky partition per table for null keys."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}

    def partition(self, table: str, key: bytes | None, num_partitions: int) -> int:
        """Partition for a record of ``table`` with ``key``."""
        if key is not None:
            return partition_for_key(key, num_partitions)
        if table not in self._sticky:
            self._sticky[table] = random.randrange(num_partitions)
        return self._sticky[table]

    def on_new_batch(self, table: str, num_partitions: int) -> None:
        """Move the sticky partition after a batch of null-key records was sent."""
        if num_partitions > 1 and table in self._sticky:
            prev = self._sticky[table]
            self._sticky[table] = random.choice([p for p in range(num_partitions) if p != prev])
