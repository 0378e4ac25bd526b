"""The decoder and the spec agree, strictly (issue 9, items 5-11).

Found by a reader written from ``spec/PROTOCOL.md`` alone: line splitting, blank lines,
NaN/Infinity, checkpoint names, segment columns, ``offsetCommit.offset`` and the LSO after
``delete_records``.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tableutil import RecordingStore, build_table, read_all, version0, write_batch

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import CorruptLogError, SchemaMismatchError
from txntable.layout import PRODUCER_IDS_KEY
from txntable.protocol.actions import (
    ACTION_TYPES,
    CommitInfo,
    LogStart,
    OffsetCommit,
    Protocol,
    decode_actions,
    encode_actions,
)
from txntable.protocol.records import SEGMENT_SCHEMA, encode_segment
from txntable.protocol.snapshot import checkpoint_actions, replay
from txntable.structs import ProducerRecord
from txntable.txn.coordinator import ProducerIdAllocator, TxnMetadata

MakeProducer = Callable[..., Producer]
PATH = "t/_log/00000000000000000001.json"
PROTOCOL = b'{"protocol":{"minReaderVersion":1,"minWriterVersion":1}}'


# --- 5. lines end with "\n" only ------------------------------------------------------------


@pytest.mark.parametrize("breaker", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_breaks_inside_a_string_are_data(breaker: str) -> None:
    operation = f"WRITE{breaker}x"
    line = json.dumps(
        {"commitInfo": {"commitId": "c", "operation": operation, "timestamp": 1}},
        ensure_ascii=False,  # the raw character, as a writer may produce it
    )
    assert breaker in line
    actions = decode_actions(PROTOCOL + b"\n" + line.encode() + b"\n", PATH)
    assert actions == [Protocol(1, 1), CommitInfo(1, operation, "c")]


def test_a_raw_line_break_in_a_committed_version_reads_back(wh: Warehouse) -> None:
    table = wh.create_table("t", partitions=1)
    metadata = "host\u2028a\u0085b"
    line = json.dumps(
        {"offsetCommit": {"group": "g", "table": "t", "partition": 0, "offset": 3,
                          "metadata": metadata}},
        ensure_ascii=False,
    )  # fmt: skip
    wh.store.put_if_absent(table.log.version_key(1), line.encode() + b"\n")
    snap = wh.table("t").snapshot()
    assert snap.offsets[("g", "t", 0)].metadata == metadata


# --- 6. blank means JSON whitespace ---------------------------------------------------------


@pytest.mark.parametrize("blank", ["\x0c", "\u00a0", "\x0b", "\u3000", "\x1f"])
def test_a_line_of_other_whitespace_is_not_blank(blank: str) -> None:
    with pytest.raises(CorruptLogError, match="line 2 is not valid JSON") as info:
        decode_actions(PROTOCOL + b"\n" + blank.encode() + b"\n", PATH)
    assert info.value.path == PATH


def test_json_whitespace_lines_are_blank_and_crlf_is_fine() -> None:
    data = b" \t\r\n" + PROTOCOL + b"\r\n\n" + PROTOCOL + b" \t\n"
    assert decode_actions(data, PATH) == [Protocol(1, 1), Protocol(1, 1)]


# --- 7. NaN and Infinity are not JSON ----------------------------------------------------------


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_refused_anywhere(constant: str) -> None:
    unknown_field = b'{"protocol":{"minReaderVersion":1,"minWriterVersion":1,"x":%s}}\n'
    with pytest.raises(CorruptLogError, match="not valid JSON") as info:
        decode_actions(unknown_field % constant, PATH)
    assert constant.decode() in str(info.value)
    in_a_list = b'{"protocol":{"minReaderVersion":1,"minWriterVersion":1,"x":[1,%s]}}\n'
    with pytest.raises(CorruptLogError, match="not valid JSON"):
        decode_actions(in_a_list % constant, PATH)


def test_coordinator_objects_refuse_nan(wh: Warehouse) -> None:
    with pytest.raises(CorruptLogError, match="not valid JSON"):
        TxnMetadata.from_json(b'{"version":1,"x":NaN}', "_coordinator/txn/a.json")
    wh.store.put(PRODUCER_IDS_KEY, b'{"nextBlockStart":0,"version":1,"x":Infinity}')
    with pytest.raises(CorruptLogError, match="invalid producer id block"):
        ProducerIdAllocator(wh.store, shards=1).allocate()  # shard 0: producer_ids.json


# --- 8. checkpoint names: 20 digits ------------------------------------------------------------


def test_only_twenty_digit_checkpoint_names_are_checkpoints(
    recording_store: RecordingStore,
) -> None:
    wh = Warehouse(store=recording_store)
    build_table(wh, 7, interval=5)  # a checkpoint at 5
    data = recording_store.get("cp/_log/00000000000000000005.checkpoint.json").data
    recording_store.delete("cp/_log/00000000000000000005.checkpoint.json")
    recording_store.delete("cp/_log/_last_checkpoint")
    for name in ("5", "0005", "000000000000000000005"):  # 1, 4 and 21 digits
        recording_store.put(f"cp/_log/{name}.checkpoint.json", data)
    recording_store.reset()
    snap = Warehouse(store=recording_store).table("cp").snapshot()
    assert snap.version == 7
    checkpoint_gets = [k for k in recording_store.gets if "checkpoint.json" in k]
    assert checkpoint_gets == []  # none of them was taken for version 5


# --- 9. segment columns by name ----------------------------------------------------------------


def _segment(columns: dict[str, pa.Array]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def _replace_segment(wh: Warehouse, data: bytes) -> None:
    table = wh.create_table("seg", partitions=1)
    write_batch(table, 0, [b"a", b"b"])
    entry = table.snapshot().partition(0).entries[0]
    wh.store.put(entry.path, data)  # type: ignore[union-attr]


HEADERS = pa.array([[("h", b"1")], []], SEGMENT_SCHEMA.field("headers").type)
STAMPS = pa.array([1_000, 1_001], pa.timestamp("ms", tz="UTC"))


def test_segment_columns_in_another_order_and_extra_ones(wh: Warehouse) -> None:
    _replace_segment(
        wh,
        _segment(
            {
                "extra": pa.array([1, 2]),
                "timestamp": STAMPS,
                "value": pa.array([b"a", b"b"]),
                "headers": HEADERS,
                "key": pa.array(["k", None]),  # string casts to binary
            }
        ),
    )
    assert read_all(wh, "seg", [0], "read_uncommitted") == {0: [(0, b"a"), (1, b"b")]}
    c = Consumer(wh, isolation_level="read_uncommitted")
    tp = TopicPartition("seg", 0)
    c.assign([tp])
    c.seek_to_beginning()
    first = c.poll(timeout_ms=0)[tp][0]
    assert (first.key, first.headers, first.timestamp) == (b"k", [("h", b"1")], 1_000)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"value": pa.array([b"a", b"b"]), "timestamp": STAMPS, "headers": HEADERS}, "key"),
        (
            {
                "key": pa.array([b"a", b"b"]),
                "value": pa.array([b"a", b"b"]),
                "headers": HEADERS,
                "timestamp": pa.array(["x", "y"]),
            },
            "does not match the record schema",
        ),
    ],
)
def test_segment_without_a_column_or_with_one_that_does_not_cast(
    wh: Warehouse, columns: dict[str, pa.Array], message: str
) -> None:
    _replace_segment(wh, _segment(columns))
    with pytest.raises(SchemaMismatchError, match=message):
        read_all(wh, "seg", [0], "read_uncommitted")


def test_segment_with_a_column_twice(wh: Warehouse) -> None:
    good = pq.read_table(pa.BufferReader(encode_segment([ProducerRecord(None, b"a", (), 1)])))
    twice = pa.Table.from_arrays(
        [*good.columns, good.column("value")], names=[*good.column_names, "value"]
    )
    sink = io.BytesIO()
    pq.write_table(twice, sink)
    table = wh.create_table("seg", partitions=1)
    write_batch(table, 0, [b"a"])
    entry = table.snapshot().partition(0).entries[0]
    wh.store.put(entry.path, sink.getvalue())  # type: ignore[union-attr]
    with pytest.raises(SchemaMismatchError, match="value"):
        read_all(wh, "seg", [0], "read_uncommitted")


# --- 10. checkpoint logStart field, offsetCommit.offset >= 0 -----------------------------------


def test_checkpoint_writes_log_start_in_partition_start() -> None:
    # v2 checkpoints carry the log start offset in partitionStart (spec: Checkpoints).
    snap = replay(enumerate([version0(1), [LogStart(0, 0)]]))
    snap.partitions[0].log_end_offset = 9
    snap.partitions[0].log_start_offset = 9
    lines = encode_actions(checkpoint_actions(snap)).decode().splitlines()
    assert '{"partitionStart":{"baseOffset":9,"logStartOffset":9,"partition":0}}' in lines


@pytest.mark.parametrize("offset", [-1, -5])
def test_negative_offset_commit_is_corrupt(offset: int) -> None:
    line = encode_actions([OffsetCommit("g", "t", 0, offset)])
    with pytest.raises(CorruptLogError, match="offsetCommit: negative offset"):
        decode_actions(line, PATH)
    assert decode_actions(encode_actions([OffsetCommit("g", "t", 0, 0)])) == [
        OffsetCommit("g", "t", 0, 0)
    ]


# --- 11. LSO >= log start offset ---------------------------------------------------------------


def test_lso_never_below_the_log_start_offset(wh: Warehouse, make_producer: MakeProducer) -> None:
    table = wh.create_table("t", partitions=1)
    write_batch(table, 0, [b"a", b"b"])  # offsets 0-1
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"open", partition=0)  # offset 2, open
    p.flush()
    write_batch(table, 0, [b"c", b"d", b"e"])  # offsets 3-5
    assert table.delete_records({0: 4}) == {0: 4}  # past the open transaction's first offset
    part = wh.table("t").describe().partitions[0]
    assert (part.log_start_offset, part.last_stable_offset, part.high_watermark) == (4, 4, 6)
    assert [t.first_offset for t in part.open_transactions] == [2]
    tp = TopicPartition("t", 0)
    c = Consumer(wh, isolation_level="read_committed")
    c.assign([tp])
    c.seek_to_beginning()
    assert c.beginning_offsets([tp]) == {tp: 4} and c.end_offsets([tp]) == {tp: 4}
    assert c.poll(timeout_ms=0) == {} and c.position(tp) == 4
    p.send("t", value=b"more", partition=0)  # offset 6
    p.commit_transaction()  # marker at 7
    part = wh.table("t").describe().partitions[0]
    assert (part.log_start_offset, part.last_stable_offset, part.high_watermark) == (4, 8, 8)
    assert read_all(wh, "t", [0], "read_committed") == {0: [(4, b"d"), (5, b"e"), (6, b"more")]}


# --- 12. README: poll() may return {} while positions move ---------------------------------


def test_readme_read_to_the_end_loop(wh: Warehouse, make_producer: MakeProducer) -> None:
    wh.create_table("orders", partitions=2)
    p = make_producer(wh, transactional_id="tx")
    p.init_transactions()
    for value, commit in ((b"kept", True), (b"dropped", False), (b"kept-too", True)):
        p.begin_transaction()
        p.send("orders", value=value, partition=0)
        p.flush()
        (p.commit_transaction if commit else p.abort_transaction)()
    tps = [TopicPartition("orders", p) for p in range(2)]
    c = Consumer(wh, isolation_level="read_committed")
    c.assign(tps)
    c.seek(tps[0], 2)  # the aborted batch and its marker come next, then more data
    c.seek(tps[1], 0)
    end = c.end_offsets(tps)
    assert end == {tps[0]: 6, tps[1]: 0}
    first = c.poll(timeout_ms=0, max_records=1)
    assert first[tps[0]][0].offset == 4 and c.position(tps[0]) == 5  # skipped 2 and 3
    assert c.poll(timeout_ms=0) == {} and c.position(tps[0]) == 6  # only a marker left
    # The loop README shows, from the beginning: exactly the committed records.
    c.seek_to_beginning()
    records = []
    end = c.end_offsets(tps)
    while any(c.position(tp) < end[tp] for tp in tps):
        for batch in c.poll(timeout_ms=100).values():
            records.extend(batch)
    assert [(r.offset, r.value) for r in records] == [(0, b"kept"), (4, b"kept-too")]
    assert {tp: c.position(tp) for tp in tps} == end


def test_every_action_the_spec_shows_decodes_as_it_is_written() -> None:
    # Issue 21.7: the typed-table example's commitInfo had "time" where the required field
    # is "timestamp"; a reader written from the spec would refuse its own example.
    spec = (Path(__file__).resolve().parents[2] / "spec" / "PROTOCOL.md").read_text()
    names = set(ACTION_TYPES)
    checked = 0
    for block in re.findall(r"```(?:json)?\n(.*?)```", spec, re.S):
        for line in block.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in names:
                (action,) = decode_actions(line.encode() + b"\n", "spec")
                assert encode_actions([action]) == line.encode() + b"\n", line
                checked += 1
    assert checked >= 25


@pytest.mark.parametrize(
    "element",
    [
        {"name": 1, "type": "binary"},
        {"name": "key", "type": ["binary"]},
        {"name": "key", "type": "binary", "nullable": "yes"},
        {"name": "key", "type": "binary", "children": {}},
        "key binary",
        {"type": "binary"},
    ],
)
def test_schema_elements_are_checked_not_coerced(element: object) -> None:
    # Issue 21.8: the spec said names and types were coerced (str(name), ...); the decoder
    # refuses them, which the spec now says.
    (metadata,) = [a for a in version0() if a.NAME == "metadata"]
    body = json.loads(encode_actions([metadata]))
    body["metadata"]["schema"] = [element]
    with pytest.raises(CorruptLogError, match="metadata: invalid schema"):
        decode_actions(json.dumps(body).encode() + b"\n", "v")
    # An untyped table's schema is descriptive: an empty one is accepted.
    body["metadata"]["schema"] = []
    (decoded,) = decode_actions(json.dumps(body).encode() + b"\n", "v")
    assert decoded.schema == ()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "line",
    [
        b'{"logStart":{"offset":4,"partition":0,"offset":9}}',
        b'{"logStart":{"offset":4,"partition":0},"logStart":{"offset":9,"partition":0}}',
        b'{"metadata":{"configuration":{"a":"1","a":"2"},"name":"t","partitions":1,'
        b'"tableId":"x"}}',
    ],
)
def test_a_key_twice_in_an_object_is_corrupt(line: bytes) -> None:
    # Issue 21.15: Python keeps the last value of a repeated key, other parsers the first or
    # an error; two readers of one version must never disagree, so the version is refused.
    with pytest.raises(CorruptLogError, match="appears twice"):
        decode_actions(line + b"\n", "v")


# A version is decoded by the C parser alone and its keys counted against its key ends
# (`"` then `:`); these are the texts where the count could be fooled or cannot decide.
BATCH = (
    '{"batch":{"baseOffset":0,"count":1,"partition":0,"path":"t/data/p=0/a.parquet",'
    '"size":9,"transactionalId":%s%s}}'
)


@pytest.mark.parametrize(
    ("txn_id", "extra"),
    [
        # A duplicate next to a string that opens with a colon: one key end more, one less.
        ('":x"', ',"count":2'),
        # A duplicate next to an escaped quote before a colon.
        ('"a\\":b"', ',"size":8'),
        # A duplicate with whitespace before its colon.
        ('"t"', ',"count" :2'),
        ('"t"', ',"count"\t:2'),
        # A duplicate inside a value that is not a field of the action.
        ('"t"', ',"later":{"a":1,"a":2}'),
        ('"t"', ',"later":[{"a":1},{"b":[{"c":1,"c":1}]}]'),
    ],
)
def test_a_key_twice_is_found_whatever_the_strings_around_it(txn_id: str, extra: str) -> None:
    line = (BATCH % (txn_id, extra)).encode()
    with pytest.raises(CorruptLogError, match="appears twice"):
        decode_actions(PROTOCOL + b"\n" + line + b"\n", "v")


@pytest.mark.parametrize(
    ("txn_id", "extra"),
    [
        ('":x"', ""),
        ('"a\\":b"', ""),
        ('"a\\\\"', ""),
        ('"\\u0022:"', ""),
        ('" spaced"', ""),
        ('"t"', ',"later":{"a":":","b":[{"c":"\\":"}]}'),
    ],
)
def test_strings_holding_quotes_and_colons_decode_as_written(txn_id: str, extra: str) -> None:
    line = BATCH % (txn_id, extra)
    _, batch = decode_actions(PROTOCOL + b"\n" + line.encode() + b"\n", "v")
    assert batch.transactionalId == json.loads(txn_id)  # type: ignore[union-attr]
    assert (batch.count, batch.size) == (1, 9)  # type: ignore[union-attr]


def test_whitespace_around_an_action_and_its_keys_decodes_the_same() -> None:
    compact = encode_actions([Protocol(1, 1), LogStart(0, 4)])
    spaced = b'  {"protocol" : {"minReaderVersion": 1, "minWriterVersion" :1}}\t\n' + (
        b'{ "logStart": { "offset": 4, "partition": 0 } }\n'
    )
    assert decode_actions(spaced, "v") == decode_actions(compact, "v")
    assert decode_actions(spaced, "v") == [Protocol(1, 1), LogStart(0, 4)]


def test_an_action_decoded_keeps_its_defaults_apart_from_other_actions() -> None:
    # Decoded actions are built without their __init__: a default made by a factory (a
    # metadata's configuration) must still be a new object for each.
    line = b'{"metadata":{"name":"t","partitions":1,"tableId":"x"}}\n'
    (first,) = decode_actions(line, "v")
    (second,) = decode_actions(line, "v")
    assert first.configuration == {} and first.configuration is not second.configuration  # type: ignore[union-attr]
    assert first == second and hash(first.schema) == hash(second.schema)  # type: ignore[union-attr]
    with pytest.raises(AttributeError):
        first.name = "u"  # type: ignore[misc]
