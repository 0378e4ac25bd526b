"""Encoding a segment into a caller's scratch buffer gives the bytes of a fresh encoding,
whatever the buffer held before, and a table that does not fit is encoded afresh."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from txntable.protocol import records
from txntable.protocol.records import decode_segment, encode_table, encoding_room, to_record_table


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    values = [rng.bytes(100) for _ in range(rows)]
    keys = [b"k%d" % i for i in range(rows)]
    return to_record_table({"key": keys, "value": values}, now=1_700_000_000_000)


def test_a_reused_scratch_buffer_gives_the_fresh_encoding_after_a_larger_table() -> None:
    large, small = _table(5000, 1), _table(300, 2)
    scratch = pa.allocate_buffer(encoding_room(large))
    first = encode_table(large, scratch)
    second = encode_table(small, scratch)
    assert first == records._encode_fresh(large)
    assert second == records._encode_fresh(small)  # not followed by the larger one's tail
    assert decode_segment(second, "s", 300).equals(small)


def test_a_table_larger_than_the_scratch_buffer_is_encoded_afresh() -> None:
    table = _table(2000, 3)
    scratch = pa.allocate_buffer(table.nbytes // 2)  # runs out of room mid-encoding
    data = encode_table(table, scratch)
    assert data == records._encode_fresh(table)
    assert decode_segment(data, "s", 2000).equals(table)
