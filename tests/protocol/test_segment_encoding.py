"""Encoding a segment into a caller's scratch buffer gives the bytes of a fresh encoding,
whatever the buffer held before, and a table that does not fit is encoded afresh; key and
value columns are compressed only where a sample of them shrinks, every other column always."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txntable.protocol import records
from txntable.protocol.records import (
    COMPRESSION_SAMPLE_BYTES,
    MERGED_SEGMENT_SCHEMA,
    decode_segment,
    encode_table,
    encoding_room,
    to_record_table,
)


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


def _text_values(rows: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        json.dumps({"user": int(u), "event": "page_view", "path": f"/items/{int(u) % 97}"}).encode()
        for u in rng.integers(0, 1 << 20, rows)
    ]


def _codecs(data: bytes) -> dict[str, str]:
    group = pq.read_metadata(pa.BufferReader(data)).row_group(0)
    columns = [group.column(i) for i in range(group.num_columns)]
    return {c.path_in_schema: c.compression for c in columns}


def test_random_values_are_stored_uncompressed_and_every_other_column_with_zstd() -> None:
    table = _table(5000, 4)  # 100 random bytes per value; keys b"k0".. compress well
    data = encode_table(table)
    assert _codecs(data) == {
        "key": "ZSTD",
        "value": "UNCOMPRESSED",
        "headers.list.element.key": "ZSTD",
        "headers.list.element.value": "ZSTD",
        "timestamp": "ZSTD",
    }
    assert decode_segment(data, "s", 5000).equals(table)


def test_text_values_are_compressed_and_random_keys_are_not() -> None:
    rng = np.random.default_rng(5)
    keys = [rng.bytes(16) for _ in range(5000)]
    table = to_record_table({"key": keys, "value": _text_values(5000, 5)}, now=1_700_000_000_000)
    data = encode_table(table)
    codecs = _codecs(data)
    assert (codecs["key"], codecs["value"]) == ("UNCOMPRESSED", "ZSTD")
    assert len(data) < table.column("value").nbytes / 2
    assert decode_segment(data, "s", 5000).equals(table)


def test_a_column_smaller_than_the_sample_is_compressed() -> None:
    rows = COMPRESSION_SAMPLE_BYTES // 100 - 1  # random values, just under the sample
    assert _codecs(encode_table(_table(rows, 6)))["value"] == "ZSTD"
    assert _codecs(encode_table(_table(rows + 2, 6)))["value"] == "UNCOMPRESSED"


def test_decisions_given_for_the_same_rows_are_taken_without_a_sample_and_new_ones_added() -> None:
    random_rows = _table(5000, 9)  # keys b"k0".. compress, 100 random bytes per value do not
    samples: dict[str, bool] = {}
    assert _codecs(encode_table(random_rows, None, samples))["value"] == "UNCOMPRESSED"
    assert samples == {"key": True, "value": False}
    # Text given with those decisions keeps them (a send_batch call's other segments).
    text = to_record_table(
        {"key": [b"k"] * 3000, "value": _text_values(3000, 10)}, now=1_700_000_000_000
    )
    assert _codecs(encode_table(text, None, samples))["value"] == "UNCOMPRESSED"
    assert _codecs(encode_table(text, None, {}))["value"] == "ZSTD"
    # A column too small to sample decides nothing for the segments after it.
    small: dict[str, bool] = {}
    encode_table(_table(COMPRESSION_SAMPLE_BYTES // 100 - 1, 11), None, small)
    assert small == {}


def test_the_sample_is_the_slice_given_across_chunks_not_the_buffers_beneath() -> None:
    text = to_record_table(
        {"key": [b"k"] * 3000, "value": _text_values(3000, 7)}, now=1_700_000_000_000
    )
    random = _table(3000, 8)
    # The random rows alone, as many small chunks whose buffers start with the text rows.
    mixed = pa.concat_tables([text, random]).combine_chunks()
    sliced = pa.Table.from_batches(mixed.slice(3000).to_batches(max_chunksize=50))
    assert sliced.column("value").num_chunks == 60
    data = encode_table(sliced)
    assert _codecs(data)["value"] == "UNCOMPRESSED"
    assert decode_segment(data, "s", 3000).equals(random)
    # and the text rows alone, sliced from a buffer that continues with random bytes
    assert _codecs(encode_table(mixed.slice(0, 3000)))["value"] == "ZSTD"


def test_header_keys_and_timestamps_are_dictionary_encoded_keys_and_values_are_not() -> None:
    n = 2000
    table = to_record_table(
        {
            "key": [b"k%d" % i for i in range(n)],
            "value": [b"v"] * n,
            "headers": [
                [{"key": "trace-id", "value": b"%d" % i}, {"key": "source", "value": b"app"}]
                for i in range(n)
            ],
        },
        now=1_700_000_000_000,
    )
    group = pq.read_metadata(pa.BufferReader(encode_table(table))).row_group(0)
    dictionary = {
        group.column(i).path_in_schema
        for i in range(group.num_columns)
        if "RLE_DICTIONARY" in group.column(i).encodings
    }
    assert dictionary == {"headers.list.element.key", "timestamp"}


def test_a_merged_segment_keeps_zstd_and_statistics_on_its_offsets() -> None:
    plain = _table(5000, 9)
    offsets = pa.array(np.arange(100, 100 + 2 * 5000, 2), pa.int64())
    merged = pa.Table.from_arrays([offsets, *plain.columns], schema=MERGED_SEGMENT_SCHEMA)
    data = encode_table(merged)
    codecs = _codecs(data)
    assert (codecs["offset"], codecs["value"], codecs["timestamp"]) == (
        "ZSTD",
        "UNCOMPRESSED",
        "ZSTD",
    )
    stats = pq.read_metadata(pa.BufferReader(data)).row_group(0).column(0).statistics
    assert (stats.min, stats.max) == (100, 100 + 2 * 4999)
    assert decode_segment(data, "s", 5000, merged=True).equals(merged)


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_value_lengths_are_read_right_from_sliced_chunks_with_and_without_nulls(
    kind: pa.DataType,
) -> None:
    # The lengths come from the offsets where a chunk has no null: a slice's offsets start
    # at its own first row, and a null (whose offsets may differ) counts 0.
    text = ["", "a", "bcd", "efghij", "k" * 40, "lm"]
    raw = text if kind in (pa.string(), pa.large_string()) else [t.encode() for t in text]
    whole = pa.array(raw, kind)
    with_null = pa.array([raw[3], None, raw[4]], kind)
    column = pa.chunked_array(
        [whole.slice(2, 3), pa.array([], kind), whole.slice(0, 1), with_null], type=kind
    )
    got = records.binary_lengths(column)
    assert got.dtype == np.int64
    assert got.tolist() == [3, 6, 40, 0, 6, 0, 40]
    assert records.binary_lengths(pa.chunked_array([], type=kind)).tolist() == []
