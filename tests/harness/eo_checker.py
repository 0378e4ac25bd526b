"""The harness checker: what the journals say every client saw, against the final tables.

:func:`load_journals` folds the workers' journals into a :class:`History`; :func:`collect`
reads the final state of every table with every reader (``Consumer.poll``,
``Consumer.poll_arrow``, ``Table.scan``; read_committed and read_uncommitted), the group
offsets of the consume-transform-produce worker and ``verify()``; :func:`check` compares
them and counts anomalies by class. Pure functions of those two structures, so a test can
plant each anomaly class in them and see it reported.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txntable import Consumer, TopicPartition, Warehouse

#: Every anomaly class the checker counts (all must be zero).
ANOMALIES = (
    "aborted_read",  # a value of an aborted transaction returned read_committed
    "lost_write",  # a committed transactional or acknowledged idempotent value missing
    "duplicate",  # one value at two positions, or one position returned twice by a reader
    "torn",  # a transaction partly visible
    "offset_mismatch",  # acknowledged / seen / read_uncommitted offset != final offset
    "reader_disagreement",  # poll, poll_arrow and Table.scan differ
    "rc_not_ru_minus_aborted",  # read_committed != read_uncommitted minus aborted
    "non_monotonic",  # offsets going back in a read or a live consumer
    "lso_regression",  # LSO, HW or log start going back between describe() samples
    "lso_above_hw",  # LSO > HW, or LSO < log start
    "ctp_skip",  # an input record below the committed group offset with no output
    "ctp_repeat",  # an input record with several outputs, or output past the group offset
    "ctp_phantom",  # an output whose input is not a committed record
    "untyped_error",  # an exception outside the TxnTableError hierarchy
    "verify_error",  # Table.verify() found a protocol violation
)

Pos = tuple[str, int, int]  # table, partition, offset
Row = tuple[int, int, str]  # partition, offset, value


@dataclass
class Txn:
    """One transaction as its client journaled it."""

    sends: list[tuple[str, str, int]] = field(default_factory=list)  # value, table, partition
    acks: dict[str, Pos] = field(default_factory=dict)
    outcome: str = "unknown"  # commit | abort | unknown (error, or no end: killed)


@dataclass
class History:
    """Everything the journals say."""

    txns: dict[str, Txn] = field(default_factory=dict)
    #: Idempotent values: value -> (table, partition, acknowledged offset or None).
    idem: dict[str, tuple[str, int, int | None]] = field(default_factory=dict)
    #: Per live consumer journal, the records it saw in order: (table, partition, offset, value).
    seen: dict[str, list[tuple[str, int, int, str]]] = field(default_factory=dict)
    #: Per journal, describe() samples in order: (table, version, [(start, lso, hw), ...]).
    samples: dict[str, list[tuple[str, int, list[tuple[int, int, int]]]]] = field(
        default_factory=dict
    )
    #: Committed records journaled before delete_records removed them.
    deleted: list[tuple[str, int, int, str]] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    ctp_txns: Counter[str] = field(default_factory=Counter)


@dataclass
class Final:
    """The final tables, read every way: per table, per reader, a list of (p, offset, value)."""

    reads: dict[str, dict[str, list[tuple[int, int, str]]]] = field(default_factory=dict)
    #: Per table, per partition: (log start, LSO, HW).
    offsets: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    #: CTP group committed offsets per input partition.
    ctp_committed: dict[int, int] = field(default_factory=dict)
    verify_errors: list[str] = field(default_factory=list)


@dataclass
class Report:
    anomalies: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    stats: dict[str, Any] = field(default_factory=dict)

    def add(self, kind: str, detail: str) -> None:
        assert kind in ANOMALIES, kind
        self.anomalies[kind] += 1
        if len(self.examples[kind]) < 5:
            self.examples[kind].append(detail)

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())

    def summary(self) -> dict[str, Any]:
        return {
            "anomalies": {k: self.anomalies.get(k, 0) for k in ANOMALIES},
            "examples": {k: v for k, v in self.examples.items() if v},
            **self.stats,
        }


# --- journals --------------------------------------------------------------------------------


def read_lines(path: Path) -> Iterable[dict[str, Any]]:
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue  # the partial last line of a killed process


def load_journals(directory: Path) -> History:
    h = History()
    for path in sorted(directory.glob("*.jsonl")):
        name = path.stem
        ctp = name.startswith("ctp")
        for e in read_lines(path):
            kind = e["e"]
            if kind == "fault":
                h.faults[f"store_{e['kind']}" if e["kind"] != "outage" else "outage_seen"] += 1
            elif kind == "driver_fault":
                h.faults[e["kind"]] += 1
            elif kind == "untyped":
                h.untyped.append(f"{name}: {e['where']}: {e['err']}")
            elif ctp:
                if kind == "end":
                    h.ctp_txns[e["outcome"]] += 1
            elif kind == "begin":
                h.txns[e["txn"]] = Txn()
            elif kind == "send":
                txn = h.txns[e["txn"]]
                txn.sends.extend((v, e["t"], e["p"]) for v in e["vs"])
            elif kind == "acks":
                txn = h.txns[e["txn"]]
                for v, t, p, o in e["acks"]:
                    txn.acks[v] = (t, p, o)
            elif kind == "end":
                h.txns[e["txn"]].outcome = e["outcome"]
            elif kind == "stall":
                h.faults["txn_stall"] += 1
            elif kind == "isend":
                h.idem[e["v"]] = (e["t"], e["p"], None)
            elif kind == "iack":
                h.idem[e["v"]] = (e["t"], e["p"], e["o"])
            elif kind == "seen":
                h.seen.setdefault(name, []).extend(tuple(r) for r in e["recs"])  # type: ignore[misc]
            elif kind == "desc":
                parts = [tuple(x) for x in e["parts"]]
                h.samples.setdefault(name, []).append((e["t"], e["v"], parts))  # type: ignore[arg-type]
            elif kind == "deleting":
                h.deleted.extend(tuple(r) for r in e["recs"])  # type: ignore[misc]
    return h


# --- final state -----------------------------------------------------------------------------


def _drain(
    wh: Warehouse, table: str, parts: int, level: str, arrow: bool
) -> list[tuple[int, int, str]]:
    tps = [TopicPartition(table, p) for p in range(parts)]
    c = Consumer(wh, isolation_level=level, auto_offset_reset="earliest")
    out: list[tuple[int, int, str]] = []
    try:
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)
        for _ in range(100_000):
            if all(c.position(tp) >= ends[tp] for tp in tps):
                break
            if arrow:
                for tp, tbl in c.poll_arrow(timeout_ms=0, max_records=1000).items():
                    offs = tbl.column("offset").to_pylist()
                    vals = tbl.column("value").to_pylist()
                    out.extend(
                        (tp.partition, o, v.decode()) for o, v in zip(offs, vals, strict=True)
                    )
            else:
                for tp, records in c.poll(timeout_ms=0, max_records=1000).items():
                    out.extend((tp.partition, r.offset, r.value.decode()) for r in records)
        else:
            raise AssertionError(f"{table}: consumer never reached the end offsets")
    finally:
        c.close()
    return sorted(out)


def _scan(wh: Warehouse, table: str, level: str) -> list[tuple[int, int, str]]:
    t = wh.table(table).scan(isolation_level=level).to_arrow()
    return sorted(
        zip(
            t["partition"].to_pylist(),
            t["offset"].to_pylist(),
            [v.decode() for v in t["value"].to_pylist()],
            strict=True,
        )
    )


def _spark(spark: Any, url: str, options: dict[str, str], table: str, level: str) -> list[Row]:
    reader = spark.read.format("txntable").option("isolation.level", level)
    for k, v in options.items():
        reader = reader.option(f"storage.{k}", v)
    rows = reader.load(f"{url.rstrip('/')}/{table}").select("partition", "offset", "value")
    return sorted((r[0], r[1], bytes(r[2]).decode()) for r in rows.collect())


def collect(
    wh: Warehouse,
    tables: dict[str, int],
    ctp_group: str | None = None,
    spark: Any = None,
    options: dict[str, str] | None = None,
) -> Final:
    """Read every table every way (call once nothing writes any more).

    With ``spark`` (a SparkSession with the txntable source registered), the Spark source
    reads each table too.
    """
    final = Final()
    for table, parts in sorted(tables.items()):
        final.reads[table] = {
            "rc_poll": _drain(wh, table, parts, "read_committed", arrow=False),
            "rc_arrow": _drain(wh, table, parts, "read_committed", arrow=True),
            "rc_scan": _scan(wh, table, "read_committed"),
            "ru_poll": _drain(wh, table, parts, "read_uncommitted", arrow=False),
            "ru_scan": _scan(wh, table, "read_uncommitted"),
        }
        if spark is not None:
            for short, level in (("rc", "read_committed"), ("ru", "read_uncommitted")):
                final.reads[table][f"{short}_spark"] = _spark(
                    spark, wh.url, options or {}, table, level
                )
        d = wh.table(table).describe()
        final.offsets[table] = [
            (p.log_start_offset, p.last_stable_offset, p.high_watermark) for p in d.partitions
        ]
        report = wh.table(table).verify()
        final.verify_errors.extend(f"{table}: {v}" for v in report.errors)
    if ctp_group is not None:
        c = Consumer(wh, group_id=ctp_group, isolation_level="read_committed")
        for p in range(tables.get("t0", 0)):
            committed = c.committed(TopicPartition("t0", p))
            final.ctp_committed[p] = committed.offset if committed is not None else 0
        c.close()
    return final


# --- the checks ------------------------------------------------------------------------------


def check(h: History, final: Final, ctp_table: str | None = None) -> Report:
    r = Report()
    # Readers agree, in order, with no position twice and offsets increasing per partition.
    for table, reads in final.reads.items():
        pairs = [(f"{n[:2]}_poll", n) for n in reads if not n.endswith("_poll")]
        for a, b in pairs:
            if reads[a] != reads[b]:
                diff = set(reads[a]) ^ set(reads[b])
                r.add("reader_disagreement", f"{table}: {a} != {b}: {sorted(diff)[:3]}")
        for name, rows in reads.items():
            seen_pos: set[tuple[int, int]] = set()
            for p, o, v in rows:
                if (p, o) in seen_pos:
                    r.add("duplicate", f"{table} {name} returned {p}@{o} twice ({v})")
                seen_pos.add((p, o))
    for table, parts in final.offsets.items():
        for p, (start, lso, hw) in enumerate(parts):
            if lso > hw or lso < start:
                r.add("lso_above_hw", f"{table}[{p}] final start {start} LSO {lso} HW {hw}")

    # Where each value is, read_committed (final reads plus what delete_records removed).
    rc: dict[str, set[Pos]] = defaultdict(set)
    ru: dict[str, set[Pos]] = defaultdict(set)
    for table, reads in final.reads.items():
        for p, o, v in reads["rc_poll"]:
            rc[v].add((table, p, o))
        for p, o, v in reads["ru_poll"]:
            ru[v].add((table, p, o))
    deleted: dict[str, set[Pos]] = defaultdict(set)
    for t, p, o, v in h.deleted:
        deleted[v].add((t, p, o))
    visible: dict[str, set[Pos]] = defaultdict(set)
    for v, ps in rc.items():
        visible[v] |= ps
    for v, ps in deleted.items():
        visible[v] |= ps
    for v, ps in visible.items():
        if len(ps) > 1:
            r.add("duplicate", f"{v} at {sorted(ps)}")
    for v, ps in ru.items():
        if len(ps) > 1 and len(visible.get(v, ())) <= 1:
            r.add("duplicate", f"{v} read_uncommitted at {sorted(ps)}")

    # Live consumers: increasing offsets per partition, nothing aborted, same offsets.
    for name, recs in h.seen.items():
        last: dict[tuple[str, int], int] = {}
        for t, p, o, v in recs:
            if o <= last.get((t, p), -1):
                r.add("non_monotonic", f"{name}: {t}[{p}] {o} after {last[(t, p)]}")
            last[(t, p)] = o
            if v not in visible:
                txn = h.txns.get(v.rsplit("/", 1)[0])
                kind = (
                    "aborted_read" if txn is not None and txn.outcome == "abort" else "lost_write"
                )
                r.add(kind, f"{name} saw {v} at {t}[{p}]@{o} read_committed; not there at the end")
            elif (t, p, o) not in visible[v]:
                r.add("offset_mismatch", f"{name} saw {v} at {t}[{p}]@{o}, final {visible[v]}")

    # Transactions: aborted invisible, committed wholly visible, never torn.
    outcomes: Counter[str] = Counter()
    for name, txn in h.txns.items():
        vals = [v for v, _, _ in txn.sends]
        vis = [v for v in vals if v in visible]
        if txn.outcome == "unknown":
            outcomes["unknown_then_" + ("visible" if vis else "invisible")] += 1
        outcomes[txn.outcome] += 1
        if txn.outcome == "abort" and vis:
            r.add("aborted_read", f"{name}: aborted, yet {vis[:3]} read_committed")
        elif txn.outcome == "commit" and len(vis) < len(vals):
            missing = [v for v in vals if v not in visible]
            r.add("lost_write", f"{name}: committed, {missing[:3]} missing")
        elif vis and len(vis) < len(vals):
            r.add("torn", f"{name} ({txn.outcome}): {len(vis)} of {len(vals)} visible")
        for v, (t, p, o) in txn.acks.items():
            if v in visible and (t, p, o) not in visible[v]:
                r.add("offset_mismatch", f"{v} acknowledged at {t}[{p}]@{o}, read at {visible[v]}")
        for v in vals:
            if v in ru and v in rc and ru[v] != rc[v]:
                r.add("offset_mismatch", f"{v} read_committed {rc[v]}, read_uncommitted {ru[v]}")
    # read_committed == read_uncommitted minus aborted data.
    for v, ps in ru.items():
        if v in rc or v.startswith("ctp|"):  # CTP outputs: checked by check_ctp
            continue
        txn_name = v.rsplit("/", 1)[0]
        txn = h.txns.get(txn_name)
        if txn is None or txn.outcome == "commit" or any(x in visible for x, _, _ in txn.sends):
            r.add("rc_not_ru_minus_aborted", f"{v} at {sorted(ps)} read_uncommitted only")
    for v, ps in rc.items():
        if v not in ru:
            r.add("rc_not_ru_minus_aborted", f"{v} at {sorted(ps)} read_committed only")

    # Idempotent producer: acknowledged values present once, at their offset.
    idem_acked = idem_err = 0
    for v, (t, p, o) in h.idem.items():
        if o is None:
            idem_err += 1
            continue
        idem_acked += 1
        if v not in visible:
            r.add("lost_write", f"idempotent {v} acknowledged at {t}[{p}]@{o}, missing")
        elif (t, p, o) not in visible[v]:
            r.add("offset_mismatch", f"idempotent {v} acknowledged at {o}, read at {visible[v]}")

    # describe() samples: LSO, HW, log start never go back; start <= LSO <= HW.
    for name, samples in h.samples.items():
        prev: dict[tuple[str, int], tuple[int, int, int]] = {}
        for t, _, parts in samples:
            for p, (start, lso, hw) in enumerate(parts):
                if lso > hw or lso < start:
                    r.add("lso_above_hw", f"{name}: {t}[{p}] start {start} LSO {lso} HW {hw}")
                before = prev.get((t, p))
                if before is not None and any(
                    x < y for x, y in zip((start, lso, hw), before, strict=True)
                ):
                    r.add("lso_regression", f"{name}: {t}[{p}] {before} -> {(start, lso, hw)}")
                prev[(t, p)] = (start, lso, hw)

    if ctp_table is not None and ctp_table in final.reads:
        check_ctp(r, final, ctp_table)
    for u in h.untyped:
        r.add("untyped_error", u)
    for e in final.verify_errors:
        r.add("verify_error", e)
    r.stats = {
        "transactions": dict(outcomes),
        "transactions_total": len(h.txns),
        "ctp_transactions": dict(h.ctp_txns),
        "idempotent": {"acknowledged": idem_acked, "not_acknowledged": idem_err},
        "faults": dict(sorted(h.faults.items())),
        "records_read_committed": sum(len(x["rc_poll"]) for x in final.reads.values()),
        "records_deleted": len(h.deleted),
        "readers": sorted({name for reads in final.reads.values() for name in reads}),
    }
    return r


def check_ctp(r: Report, final: Final, ctp_table: str) -> None:
    """Each committed input record below the group's committed offset: exactly one output."""
    inputs = {(p, o): v for p, o, v in final.reads["t0"]["rc_poll"]}
    outputs: Counter[tuple[int, int]] = Counter()
    for _, _, v in final.reads[ctp_table]["rc_poll"]:
        _, p_s, o_s, value = v.split("|", 3)
        key = (int(p_s), int(o_s))
        outputs[key] += 1
        if inputs.get(key) != value:
            r.add("ctp_phantom", f"output {v}: input at {key} is {inputs.get(key)!r}")
        elif key[1] >= final.ctp_committed.get(key[0], 0):
            r.add("ctp_repeat", f"output {v} past committed offset {final.ctp_committed[key[0]]}")
    for (p, o), v in inputs.items():
        if o < final.ctp_committed.get(p, 0):
            n = outputs.get((p, o), 0)
            if n == 0:
                r.add("ctp_skip", f"input {v} at t0[{p}]@{o} has no output")
            elif n > 1:
                r.add("ctp_repeat", f"input {v} at t0[{p}]@{o} has {n} outputs")
