"""Encoding a segment: the producer's per-thread scratch buffer gives the same bytes as a
fresh output stream, whatever was encoded before and whatever does not fit."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from txntable.protocol import records
from txntable.protocol.records import decode_segment, encode_table, to_record_table


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    values = [rng.bytes(100) for _ in range(rows)]
    keys = [b"k%d" % i for i in range(rows)]
    return to_record_table({"key": keys, "value": values}, now=1_700_000_000_000)


def _in_new_thread(fn: object) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out[0]


def test_the_scratch_buffer_gives_the_fresh_encoding_after_a_larger_segment() -> None:
    large, small = _table(5000, 1), _table(300, 2)

    def encode_both() -> tuple[bytes, bytes, pa.Buffer]:
        return encode_table(large), encode_table(small), records._scratch.buffer

    first, second, scratch = _in_new_thread(encode_both)  # type: ignore[misc]
    assert first == records._encode_fresh(large)
    assert second == records._encode_fresh(small)  # not followed by the larger one's tail
    assert scratch.size >= large.nbytes  # one buffer, kept from the first segment
    assert decode_segment(second, "s", 300).equals(small)


def test_an_encoding_larger_than_the_scratch_buffer_is_encoded_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _table(2000, 3)
    # Room for half the data: the fixed-size writer runs out of space mid-encoding.
    monkeypatch.setattr(records, "SCRATCH_MARGIN", -(table.nbytes // 2))
    data = _in_new_thread(lambda: encode_table(table))
    assert data == records._encode_fresh(table)
    assert decode_segment(data, "s", 2000).equals(table)  # type: ignore[arg-type]


def test_a_table_above_scratch_max_leaves_no_scratch_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _table(1000, 4)
    monkeypatch.setattr(records, "SCRATCH_MAX", table.nbytes)  # the margin tips it over

    def encode() -> tuple[bytes, object]:
        return encode_table(table), getattr(records._scratch, "buffer", None)

    data, scratch = _in_new_thread(encode)  # type: ignore[misc]
    assert scratch is None
    assert data == records._encode_fresh(table)
