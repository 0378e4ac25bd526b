"""Records and their Parquet segments.

A segment holds one producer batch of one partition: columns ``key``, ``value``,
``headers`` and ``timestamp`` (the default record schema). Offsets are not stored; a reader
computes them as the batch's base offset plus the row index. A merged segment (protocol v2,
written by maintenance) has an ``offset`` column first, because its records keep their
offsets with gaps where records were dropped.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial
from itertools import pairwise, repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txntable.errors import (
    CorruptLogError,
    SchemaMismatchError,
    SerializationError,
)
from txntable.structs import (
    CREATE_TIME,
    RECORD_OVERHEAD,
    ConsumerRecord,
    Header,
    ProducerRecord,
)

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())])
SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("item", HEADER_TYPE, nullable=False))),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    ]
)

#: A merged segment (protocol v2) carries each record's offset explicitly, first.
OFFSET_COLUMN = "offset"
MERGED_SEGMENT_SCHEMA = pa.schema(
    [pa.field(OFFSET_COLUMN, pa.int64(), nullable=False), *SEGMENT_SCHEMA]
)

#: What every reader returns (``Table.scan``, the Arrow poll, the Spark source): the segment
#: columns plus topic, partition and offset, in the column order of Spark's Kafka source.
#: Topic, partition, offset, timestamp and headers are never null (no headers: an empty list).
READ_HEADER_STRUCT = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)
READ_HEADERS = pa.list_(pa.field("element", READ_HEADER_STRUCT, nullable=False))
READ_TIMESTAMP = pa.timestamp("us", tz="UTC")
READ_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", READ_TIMESTAMP, nullable=False),
        pa.field("headers", READ_HEADERS, nullable=False),
    ]
)
#: :data:`READ_SCHEMA` without ``headers`` (readers asked not to include them).
READ_SCHEMA_NO_HEADERS = READ_SCHEMA.remove(READ_SCHEMA.get_field_index("headers"))


HEADERS_TYPE = SEGMENT_SCHEMA.field("headers").type
TIMESTAMP_TYPE = SEGMENT_SCHEMA.field("timestamp").type
_COLUMNS = tuple(SEGMENT_SCHEMA.names)


def encode_segment(records: list[ProducerRecord]) -> bytes:
    """Encode one batch of records as a Parquet segment."""
    table = pa.table(
        {
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records], HEADERS_TYPE
            ),
            "timestamp": pa.array([r.timestamp for r in records], TIMESTAMP_TYPE),
        },
        schema=SEGMENT_SCHEMA,
    )
    return encode_table(table)


def encode_table(
    table: pa.Table, scratch: pa.Buffer | None = None, samples: dict[str, bool] | None = None
) -> bytes:
    """Encode a table in :data:`SEGMENT_SCHEMA` (or :data:`MERGED_SEGMENT_SCHEMA`) as Parquet.

    zstd, but ``key`` and ``value`` only where a sample shows it pays (see
    :func:`_compression`); no dictionary encoding or statistics for them: they are mostly
    distinct, readers never filter on them, and both cost a pass over every byte.

    Args:
        table: The rows.
        scratch: Mutable memory to encode into, kept by the caller from one table to the
            next (:func:`encoding_room` bytes): a fresh output stream grows by doubling
            into memory the allocator may just have returned to the OS, and faulting it in
            again costs. An encoding that does not fit is made afresh.
        samples: Whether zstd pays for each sampled column, as decided for other segments
            cut from the same rows (a ``send_batch`` call's 8 partitions: one sample per
            column, not one per segment, which cost ~9% of such a call's time); a column
            it lacks is sampled here and the decision added.
    """
    if scratch is not None:
        sink = pa.FixedSizeBufferWriter(scratch)
        try:
            _write_parquet(table, sink, samples)
        except OSError:  # larger than the buffer: encoded afresh below
            pass
        else:
            return scratch.slice(0, sink.tell()).to_pybytes()
    return _encode_fresh(table, samples)


def encoding_room(table: pa.Table) -> int:
    """Bytes a scratch buffer needs to encode ``table`` with :func:`encode_table`: its size
    and a margin (footer, page headers, lengths of binary values: the encoding of
    incompressible data is a little larger than the data)."""
    return table.nbytes + (1 << 20)


def _encode_fresh(table: pa.Table, samples: dict[str, bool] | None = None) -> bytes:
    sink = pa.BufferOutputStream()  # Arrow memory, not a Python buffer grown by realloc
    _write_parquet(table, sink, samples)
    return sink.getvalue().to_pybytes()


#: zstd's saving on a sample of a ``key`` or ``value`` column below which the column is
#: stored uncompressed: random or already-compressed payloads (encrypted, images, Avro with
#: its own codec) shrink by ~1% and take twice as long to encode compressed.
MIN_COMPRESSION_SAVING = 0.1
#: Bytes of such a column that are sampled; a column with fewer is compressed (it is small).
COMPRESSION_SAMPLE_BYTES = 16 * 1024
#: Columns whose compression is decided on a sample of their bytes.
_SAMPLED_COLUMNS = ("key", "value")
_ZSTD = pa.Codec("zstd")  # the level the Parquet writer uses


def _write_parquet(
    table: pa.Table, sink: pa.NativeFile, samples: dict[str, bool] | None = None
) -> None:
    leaves = _leaf_paths(table.schema)
    pq.write_table(
        table,
        sink,
        compression=_compression(table, leaves, samples),
        use_dictionary=[p for p in leaves if p == "timestamp" or _is_header_key(p)],
        write_statistics=["timestamp", OFFSET_COLUMN],  # offsets: a merged segment's
    )


def _compression(
    table: pa.Table, leaves: tuple[str, ...], samples: dict[str, bool] | None = None
) -> str | dict[str, str]:
    """zstd, except for the sampled columns it would not shrink (stored uncompressed);
    ``samples``: the decisions already made for the same rows (see :func:`encode_table`)."""
    plain = []
    for name in _SAMPLED_COLUMNS:
        if name not in table.column_names:
            continue
        pays = None if samples is None else samples.get(name)
        if pays is None:
            pays = _compression_pays(table.column(name))
            if pays is not None and samples is not None:
                samples[name] = pays
        if pays is False:
            plain.append(name)
    if not plain:
        return "zstd"
    codecs = dict.fromkeys(leaves, "zstd")  # a column missing from the map is not compressed
    codecs.update(dict.fromkeys(plain, "none"))
    return codecs


def _compression_pays(column: pa.ChunkedArray) -> bool | None:
    """Whether zstd saves at least :data:`MIN_COMPRESSION_SAVING` on the column's first
    :data:`COMPRESSION_SAMPLE_BYTES`; ``None`` (no sample: compressed) for a column with
    fewer, or not binary."""
    sample = _leading_bytes(column, COMPRESSION_SAMPLE_BYTES)
    if sample is None:
        return None
    return _ZSTD.compress(sample).size <= (1 - MIN_COMPRESSION_SAVING) * len(sample)


def _leading_bytes(column: pa.ChunkedArray, size: int) -> pa.Buffer | bytes | None:
    """The first ``size`` bytes of a binary or string column's values (a view when one
    chunk holds them); None if it has fewer, or is of another type."""
    kind = column.type
    width: np.dtype[Any]
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        width = np.dtype(np.int32)
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        width = np.dtype(np.int64)
    else:
        return None
    if column.nbytes < size:  # its values are fewer bytes still (a small transaction's)
        return None
    pieces: list[pa.Buffer] = []
    wanted = size
    for chunk in column.chunks:
        if not len(chunk):
            continue
        offsets, data = chunk.buffers()[1:3]
        first, last = np.frombuffer(
            offsets, dtype=width, count=len(chunk) + 1, offset=chunk.offset * width.itemsize
        )[[0, -1]]
        take = min(int(last - first), wanted)
        if take:
            pieces.append(data.slice(int(first), take))
            wanted -= take
        if not wanted:
            return pieces[0] if len(pieces) == 1 else b"".join(p.to_pybytes() for p in pieces)
    return None


@lru_cache(maxsize=16)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet column paths of ``schema``'s leaves (``headers.list.element.key``: the
    names Parquet gives nested columns, which its per-column options take)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    parquet_schema = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return tuple(parquet_schema.column(i).path for i in range(len(parquet_schema)))


def _is_header_key(path: str) -> bool:
    return path.startswith("headers.") and path.endswith(".key")


def empty_headers(n: int) -> pa.Array:
    """A headers column of ``n`` empty lists (what a record sent without headers holds)."""
    offsets = pa.py_buffer(np.zeros(n + 1, dtype=np.int32).tobytes())
    return pa.ListArray.from_buffers(HEADERS_TYPE, n, [None, offsets], children=[_no_headers()])


@lru_cache(maxsize=1)
def _no_headers() -> pa.Array:
    """The (shared, immutable) child of :func:`empty_headers`: building it was most of the
    column's cost, paid at every seal. Made on first use: ``pa.array`` imports pandas."""
    return pa.array([], HEADERS_TYPE.value_type)


def record_sizes(table: pa.Table) -> np.ndarray:
    """Every row's :meth:`ProducerRecord.size_in_bytes`, vectorised (int64).

    Args:
        table: Records in :data:`SEGMENT_SCHEMA`.
    """
    sizes = np.full(table.num_rows, RECORD_OVERHEAD, dtype=np.int64)
    for name in ("key", "value"):
        sizes += binary_lengths(table.column(name))
    headers = table.column("headers")
    if headers.num_chunks and any(len(c.values) for c in headers.chunks):
        at = 0
        for chunk in headers.chunks:
            sizes[at : at + len(chunk)] += _header_sizes(chunk)
            at += len(chunk)
    return sizes


def binary_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Byte length of every value of a binary column (0 where null)."""
    lengths = [_chunk_lengths(c) for c in column.chunks]
    if len(lengths) == 1:
        return lengths[0]
    return np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


def _chunk_lengths(chunk: pa.Array) -> np.ndarray:
    # From the offsets where nothing is null: the compute kernels' dispatch cost more than
    # the work for a small transaction's batch (two calls per column, every seal).
    kind = chunk.type
    width = _OFFSET_WIDTHS.get(kind)
    if width is None or chunk.null_count or len(chunk) == 0:
        return np.asarray(pc.binary_length(chunk).fill_null(0), dtype=np.int64)
    offsets = np.frombuffer(
        chunk.buffers()[1], dtype=width, count=len(chunk) + 1, offset=chunk.offset * width.itemsize
    )
    return np.diff(offsets).astype(np.int64, copy=False)


#: Offset width of the variable-length types whose lengths are read from their offsets.
_OFFSET_WIDTHS: dict[pa.DataType, np.dtype[Any]] = {
    pa.binary(): np.dtype(np.int32),
    pa.string(): np.dtype(np.int32),
    pa.large_binary(): np.dtype(np.int64),
    pa.large_string(): np.dtype(np.int64),
}


def _header_sizes(headers: pa.ListArray) -> np.ndarray:
    """Per row: sum over its headers of ``len(key as UTF-8) + len(value) + 2``."""
    entries = headers.values  # every entry of the child array; offsets index into it
    keys = np.asarray(pc.binary_length(entries.field("key")).fill_null(0), dtype=np.int64)
    values = np.asarray(pc.binary_length(entries.field("value")).fill_null(0), dtype=np.int64)
    cumulative = np.concatenate([[0], np.cumsum(keys + values + 2)])
    offsets = np.asarray(headers.offsets, dtype=np.int64)
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


def as_arrow_table(data: object) -> pa.Table:
    """What ``send_batch`` was given as an Arrow table: a ``Table``, a ``RecordBatch``, a
    pandas DataFrame (its index is not a column: a filtered frame's index would otherwise
    become ``__index_level_0__``) or anything else ``pyarrow.table()`` takes.

    Raises:
        SerializationError: Not tabular.
    """
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    # Looked up only if the caller imported pandas already. While another thread imports it
    # for the first time (pyarrow does, converting a Python list: the producer's sender)
    # the module is in sys.modules without its names yet, and the caller holds no frame.
    frame_type = getattr(sys.modules.get("pandas"), "DataFrame", None)
    try:
        if frame_type is not None and isinstance(data, frame_type):
            return pa.Table.from_pandas(data, preserve_index=False)
        return pa.table(data)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise SerializationError(f"send_batch data is not a table of records: {e}") from None


def to_record_table(data: object, now: int) -> pa.Table:
    """Turn what ``Producer.send_batch`` was given into records in :data:`SEGMENT_SCHEMA`.

    Accepts a ``pyarrow.Table`` or ``RecordBatch`` or anything ``pyarrow.table()`` takes (a
    pandas DataFrame, a dict of columns). ``value`` is required; ``key`` (absent: null keys),
    ``headers`` (absent or null: no headers) and ``timestamp`` (absent or null: ``now``) are
    optional. Binary columns may be any Arrow binary type; a timestamp may be an Arrow
    timestamp (truncated to milliseconds, naive ones taken as UTC) or integer milliseconds.

    Raises:
        SerializationError: The data is not tabular, a column is unknown, ``value`` is
            missing, or a column has a type that is not accepted (the error names it), as
            ``send`` refuses a key or value that is not bytes.
    """
    table = as_arrow_table(data)
    names = table.column_names
    unknown = [n for n in names if n not in _COLUMNS]
    if unknown or len(set(names)) != len(names):
        what = f"unknown column {unknown[0]!r}" if unknown else "duplicate column names"
        raise SerializationError(f"send_batch: {what}; the columns are {list(_COLUMNS)}")
    if "value" not in names:
        raise SerializationError("send_batch: column 'value' is missing")
    n = table.num_rows
    columns = {
        "key": _binary_column(table, "key", n),
        "value": _binary_column(table, "value", n),
        "headers": _headers_column(table, n),
        "timestamp": timestamp_column(table, n, now),
    }
    return pa.table(columns, schema=SEGMENT_SCHEMA)


def _binary_column(table: pa.Table, name: str, n: int) -> pa.ChunkedArray:
    if name not in table.column_names:
        return pa.chunked_array([pa.nulls(n, pa.binary())])
    column = table.column(name)
    t = column.type
    if t == pa.binary():
        return column
    if pa.types.is_null(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or (
        hasattr(pa.types, "is_binary_view") and pa.types.is_binary_view(t)
    ):
        try:
            return column.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SerializationError(f"send_batch: column {name!r} of type {t}: {e}") from None
    raise SerializationError(
        f"send_batch: column {name!r} must be binary (bytes or null), not {t}"
    )


def _headers_column(table: pa.Table, n: int) -> pa.ChunkedArray:
    if "headers" not in table.column_names:
        return pa.chunked_array([empty_headers(n)])
    column = table.column("headers")
    if column.type != HEADERS_TYPE:
        try:
            column = column.cast(HEADERS_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SerializationError(
                f"send_batch: column 'headers' must be {HEADERS_TYPE}, not {column.type} ({e})"
            ) from None
    chunks = []
    for chunk in column.chunks:
        entries = chunk.values
        if entries.null_count or entries.field("key").null_count:
            raise SerializationError("send_batch: column 'headers' holds a null header or key")
        if chunk.null_count:  # no headers, as send(headers=None) writes it: an empty list
            chunk = pa.ListArray.from_arrays(chunk.offsets, entries, type=HEADERS_TYPE)
        chunks.append(chunk)
    return pa.chunked_array(chunks, HEADERS_TYPE)


def timestamp_column(
    table: pa.Table, n: int, now: int, what: str = "send_batch"
) -> pa.ChunkedArray:
    """A batch's ``timestamp`` column as Kafka's milliseconds (``now`` where absent or null).

    Raises:
        SerializationError: the column is not a timestamp or integer, or is negative.
    """
    if "timestamp" not in table.column_names:
        return pa.chunked_array([pa.array(np.full(n, now, dtype=np.int64), TIMESTAMP_TYPE)])
    column = table.column("timestamp")
    t = column.type
    if pa.types.is_timestamp(t):
        unit_ms = {"s": 1000, "ms": 1, "us": 1, "ns": 1}[t.unit]
        ints = column.cast(pa.int64())
        if t.unit in ("us", "ns"):  # truncate to Kafka's milliseconds
            ints = pc.divide(ints, 1000 if t.unit == "us" else 1_000_000)
        elif unit_ms != 1:
            ints = pc.multiply(ints, unit_ms)
    elif pa.types.is_integer(t) or pa.types.is_null(t):
        ints = column.cast(pa.int64())
    else:
        raise SerializationError(
            f"{what}: column 'timestamp' must be a timestamp or integer milliseconds, not {t}"
        )
    if ints.null_count:
        ints = ints.fill_null(now)
    if len(ints) and pc.min(ints).as_py() < 0:
        raise SerializationError(f"{what}: column 'timestamp' holds a negative timestamp")
    return ints.cast(TIMESTAMP_TYPE)


def decode_segment(
    data: bytes, path: str, expected_count: int, merged: bool = False
) -> pa.Table:
    """Decode a Parquet segment and check it against its batch.

    Raises:
        CorruptLogError: If the bytes are not a readable Parquet file.
        SchemaMismatchError: If its schema or row count does not match the batch.
    """
    try:
        # ParquetFile, not read_table: the dataset reader refuses a file with a column
        # name twice, which is valid Parquet (and a schema mismatch, reported below).
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptLogError(f"segment is not readable Parquet ({e})", path) from None
    return check_segment(table, path, expected_count, merged)


def check_segment(
    table: pa.Table, path: str, expected_count: int, merged: bool = False
) -> pa.Table:
    """Check a decoded segment's schema and row count against its batch (or segment) action.

    Columns are taken by name and cast to the segment schema (``merged``: the merged-segment
    schema, with its offset column): their order is free and columns of other names are
    ignored (the spec's "any Parquet file that casts").

    Raises:
        SchemaMismatchError: A segment column is missing, present twice or does not cast,
            or the row count differs from the batch's.
    """
    schema = MERGED_SEGMENT_SCHEMA if merged else SEGMENT_SCHEMA
    if not table.schema.equals(schema):
        try:
            table = table.select(schema.names).cast(schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise SchemaMismatchError(
                f"segment {path} does not match the record schema: {e}"
            ) from None
    if table.num_rows != expected_count:
        raise SchemaMismatchError(
            f"segment {path} has {table.num_rows} records, its batch says {expected_count}"
        )
    return table


def merged_offsets(table: pa.Table, path: str, base_offset: int, end_offset: int) -> np.ndarray:
    """The offset column of a decoded merged segment, checked against its action.

    Readers find rows by offset (a binary search), so the column must be what the spec
    says: strictly increasing, inside ``[base_offset, end_offset)``.

    Raises:
        SchemaMismatchError: If it is not.
    """
    column = table.column(OFFSET_COLUMN)
    offsets = (
        column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()
    )
    if len(offsets) and (
        offsets[0] < base_offset
        or offsets[-1] >= end_offset
        or not bool(np.all(offsets[1:] > offsets[:-1]))
    ):
        raise SchemaMismatchError(
            f"segment {path}: offsets are not strictly increasing inside "
            f"[{base_offset}, {end_offset})"
        )
    return offsets


def rows_to_records(
    rows: pa.Table, offsets: list[int], topic: str, partition: int
) -> list[ConsumerRecord]:
    """Turn segment rows of one partition, with their offsets, into consumer records.

    Vectorised: each column is converted to Python once (``to_pylist``) and the records are
    built by one ``map`` over the columns; headers are rebuilt from the flattened key and
    value columns, and skipped entirely when no row has any.
    """
    # Every record (a tuple holding a headers list) is tracked by the cyclic GC, which would
    # otherwise run many times while thousands of them are built and all still referenced,
    # each pass walking the ones made so far: pausing it halves the cost of a poll. Nothing
    # built here can form a cycle.
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        keys = rows.column("key").to_pylist()
        values = rows.column("value").to_pylist()
        stamps = rows.column("timestamp").cast(pa.int64()).to_pylist()  # epoch milliseconds
        headers = _headers_to_python(rows.column("headers"))
        sizes = (
            _serialized_sizes(rows.column("key")),
            _serialized_sizes(rows.column("value")),
            _serialized_header_sizes(rows.column("headers")),
        )
        return build_records(topic, partition, offsets, stamps, keys, values, headers, sizes)
    finally:
        if was_enabled:
            gc.enable()


# tuple.__new__ over zipped columns builds each record in C, without a Python-level call.
_new_record = partial(tuple.__new__, ConsumerRecord)


def build_records(
    topic: str,
    partition: int,
    offsets: Sequence[int],
    stamps: list[int],
    keys: list[Any],
    values: list[Any],
    headers: Iterable[list[Header]],
    sizes: tuple[Iterable[int], Iterable[int], Iterable[int]],
) -> list[ConsumerRecord]:
    """Consumer records of one partition from their fields as columns (Python lists), in
    kafka-python's field order; ``sizes``: the serialized key, value and header sizes."""
    n = len(offsets)
    columns = zip(
        repeat(topic, n),
        repeat(partition, n),
        repeat(NO_LEADER_EPOCH, n),
        offsets,
        stamps,
        repeat(CREATE_TIME, n),
        keys,
        values,
        headers,
        repeat(None, n),
        *sizes,
        strict=True,
    )
    return list(map(_new_record, columns))

#: ``ConsumerRecord.leader_epoch``: a table has no partition leaders (Kafka's "unknown").
NO_LEADER_EPOCH = -1


def _serialized_sizes(column: pa.ChunkedArray) -> list[int]:
    """Bytes of each binary value, -1 for a null (kafka-python's serialized sizes)."""
    sizes: list[int] = pc.binary_length(column).fill_null(-1).to_pylist()
    return sizes


def _serialized_header_sizes(column: pa.ChunkedArray) -> list[int]:
    """Per record, the UTF-8 bytes of its header keys plus its values' bytes; -1 without
    headers (kafka-python's ``serialized_header_size``)."""
    out: list[int] = []
    for chunk in column.chunks:
        if chunk.null_count:  # a null list may still span child entries: make it empty
            chunk = pc.if_else(pc.is_null(chunk), pa.scalar([], chunk.type), chunk)
        if len(chunk.flatten()) == 0:
            out.extend(repeat(-1, len(chunk)))
            continue
        entries = chunk.values  # every entry of the child array; offsets index into it
        keys = np.asarray(pc.binary_length(entries.field("key")).fill_null(0), dtype=np.int64)
        values = np.asarray(pc.binary_length(entries.field("value")).fill_null(0), np.int64)
        cumulative = np.concatenate([[0], np.cumsum(keys + values)])
        offsets = np.asarray(chunk.offsets, dtype=np.int64)
        sizes = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
        out.extend(np.where(offsets[1:] > offsets[:-1], sizes, -1).tolist())
    return out


def _headers_to_python(column: pa.ChunkedArray) -> list[list[Header]]:
    out: list[list[Header]] = []
    for chunk in column.chunks:
        if chunk.null_count:  # a null list may still span child entries: make it empty
            chunk = pc.if_else(pc.is_null(chunk), pa.scalar([], chunk.type), chunk)
        flat = chunk.flatten()
        if len(flat) == 0:
            out.extend([] for _ in range(len(chunk)))
            continue
        keys = flat.field("key").to_pylist()
        pairs = list(zip(keys, flat.field("value").to_pylist(), strict=True))
        bounds = chunk.offsets.to_pylist()
        base = bounds[0]
        out.extend(pairs[a - base : b - base] for a, b in pairwise(bounds))
    return out
