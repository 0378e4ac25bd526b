"""Kafka's default partitioner: murmur2 of the key bytes, made positive, modulo partitions.

The hash is Kafka's ``Utils.murmur2`` (seed 0x9747b28c), so a key lands in the same partition
number here as with Kafka's Java client. Records without a key stick to one partition until
a batch is sent (KIP-480's sticky partitioner).
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

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


def murmur2_array(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`murmur2` of every key of a binary Arrow array, vectorised (int32; 0 where null).

    Keys are grouped by length; each group is a ``(rows, length)`` byte matrix hashed one
    4-byte block column at a time with wrapping ``uint32`` arithmetic, so the Python work is
    per distinct key length, not per key.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out.view(np.int32)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, keys.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if keys.null_count:
        valid = np.asarray(keys.is_valid())
        rows = np.flatnonzero(valid)
        starts, lengths = starts[rows], lengths[rows]
        if not rows.size:  # every key null: nothing to hash (and no length to take)
            return out.view(np.int32)
    else:
        rows = None
    first = int(lengths[0]) if len(lengths) else 0
    if len(lengths) and (lengths == first).all():
        groups: list[tuple[int, np.ndarray | None]] = [(first, None)]
    else:
        # A stable sort of the lengths puts each length's rows together, in order.
        narrow = lengths.astype(np.uint16) if lengths.max() < 1 << 16 else lengths
        order = np.argsort(narrow, kind="stable")  # a radix sort for 16-bit lengths
        sorted_lengths = lengths[order]
        cuts = np.flatnonzero(np.diff(sorted_lengths)) + 1
        groups = [
            (int(sorted_lengths[a]), order[a:b])
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True)
        ]
    hashed = np.empty(len(lengths), dtype=np.uint32)
    for length, members in groups:
        group_starts = starts if members is None else starts[members]
        if length and group_starts.size and (
            np.diff(group_starts) == length
        ).all():  # contiguous keys (the usual case): a zero-copy reshape
            s0 = int(group_starts[0])
            matrix = data[s0 : s0 + length * group_starts.size].reshape(-1, length)
        elif length:
            # One row copy per key from a strided window view (no per-byte index array).
            windows = np.lib.stride_tricks.sliding_window_view(data, length)
            matrix = windows[group_starts]
        else:
            matrix = np.zeros((group_starts.size, 0), np.uint8)
        group_hash = _murmur2_fixed(matrix, length)
        if members is None:
            hashed = group_hash
        else:
            hashed[members] = group_hash
    if rows is None:
        out = hashed
    else:
        out[rows] = hashed
    return out.view(np.int32)


def _murmur2_fixed(matrix: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of each row of a ``(rows, length)`` uint8 matrix, as uint32."""
    m = np.uint32(_M)
    h = np.full(matrix.shape[0], (_SEED ^ length) & _MASK, dtype=np.uint32)
    n4 = length // 4
    if n4:
        blocks = np.ascontiguousarray(matrix[:, : n4 * 4]).view("<u4")
        for j in range(n4):
            k = blocks[:, j] * m
            k ^= k >> np.uint32(24)
            k *= m
            h *= m
            h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= matrix[:, tail + 2].astype(np.uint32) << np.uint32(16)
    if rest >= 2:
        h ^= matrix[:, tail + 1].astype(np.uint32) << np.uint32(8)
    if rest >= 1:
        h ^= matrix[:, tail].astype(np.uint32)
        h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """:func:`partition_for_key` of every key, vectorised (int32; -1 where the key is null)."""
    hashed = murmur2_array(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)
    out = (hashed % np.uint32(num_partitions)).astype(np.int32)
    if keys.null_count:
        valid = keys.is_valid()
        if isinstance(valid, pa.ChunkedArray):
            valid = valid.combine_chunks()
        out[~np.asarray(valid)] = -1
    return out


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

    def partitions(self, table: str, runs: int, num_partitions: int) -> list[int]:
        """Partitions for ``runs`` consecutive batches of null-key records of ``table``.

        The current sticky partition first, then a different one for each further batch;
        the last stays sticky.
        """
        out = [self.partition(table, None, num_partitions)]
        for _ in range(runs - 1):
            self.on_new_batch(table, num_partitions)
            out.append(self._sticky[table])
        return out

    def on_new_batch(self, table: str, num_partitions: int) -> None:
        """Move the sticky partition after a batch of null-key records was sent."""
        if num_partitions > 1 and table in self._sticky:
            prev = self._sticky[table]
            self._sticky[table] = random.choice([p for p in range(num_partitions) if p != prev])
