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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

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
    "consumer_skip",  # a committed record below a live consumer's position it never returned
    "dirty_read",  # returned at or above its read's LSO, or before its transaction decided
    "no_progress",  # a worker kind that ran never did its work (commit, ack, read, ...)
    "zombie_commit",  # a zombie committed what it decided after its successor initialised
    "hung_worker",  # a worker that did not stop when asked (killed at stop)
    "worker_exit",  # a worker that gave up on an error (not fenced, not asked to stop)
)

#: What counts as progress for each worker kind (see ``no_progress``).
PROGRESS = {
    "txn": "a committed transaction",
    "idem": "an acknowledged send",
    "ctp": "a committed transaction that moved the group offsets",
    "consumer": "a record read",
    "maint": "a completed maintenance operation",
    "mw": "a committed transaction or an acknowledged send",
}

Pos = tuple[str, int, int]  # table, partition, offset
Row = tuple[int, int, str]  # partition, offset, value


class Seen(NamedTuple):
    """One record a live read_committed consumer returned."""

    table: str
    partition: int
    offset: int
    value: str
    #: The LSO of the snapshot the poll read (None: not journaled).
    lso: int | None = None
    #: When the poll had returned (journal time, seconds).
    ts: float = 0.0


@dataclass
class Txn:
    """One transaction as its client journaled it."""

    sends: list[tuple[str, str, int]] = field(default_factory=list)  # value, table, partition
    acks: dict[str, Pos] = field(default_factory=dict)
    outcome: str = "unknown"  # commit | abort | unknown (error, or no end: killed)
    #: When the client decided to commit (journaled before ``commit_transaction``).
    decided_at: float | None = None
    journal: str = ""
    #: Whether its client journaled an end (else it was killed before one).
    ended: bool = False


@dataclass(frozen=True)
class Init:
    """A producer's ``init_transactions`` returned: when, and the producer id and epoch it
    got (``None`` in journals that did not record them)."""

    ts: float
    pid: int | None = None
    epoch: int | None = None


@dataclass
class Zombie:
    """A worker the driver paused while a successor with its transactional id initialised."""

    journal: str
    successor: str


@dataclass
class History:
    """Everything the journals say."""

    txns: dict[str, Txn] = field(default_factory=dict)
    #: Idempotent values: value -> (table, partition, acknowledged offset or None).
    idem: dict[str, tuple[str, int, int | None]] = field(default_factory=dict)
    #: Per live consumer journal, the records it saw in order.
    seen: dict[str, list[Seen]] = field(default_factory=dict)
    #: Per live consumer journal, its last journaled position per (table, partition).
    positions: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    #: Per journal, describe() samples in order: (table, version, [(start, lso, hw), ...]).
    samples: dict[str, list[tuple[str, int, list[tuple[int, int, int]]]]] = field(
        default_factory=dict
    )
    #: Committed records journaled before delete_records removed them.
    deleted: list[tuple[str, int, int, str]] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    ctp_txns: Counter[str] = field(default_factory=Counter)
    #: Worker kinds that started, and per kind how much of its work it did.
    roles: set[str] = field(default_factory=set)
    progress: Counter[str] = field(default_factory=Counter)
    #: Per ``<journal>/<transactional id>``: when a producer finished ``init_transactions``.
    inits: dict[str, list[Init]] = field(default_factory=dict)
    #: Per journal: why it exited (its last exit entry).
    exits: dict[str, str] = field(default_factory=dict)
    zombies: list[Zombie] = field(default_factory=list)
    #: Workers killed because they did not stop; workers that exited on their own.
    hung: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    #: Group-commit handle id -> the journal of the process that opened it.
    committers: dict[str, str] = field(default_factory=dict)
    #: Per journal, its group-commit handles' last reported counters (rounds, helps, ...).
    gc_stats: dict[str, dict[str, int]] = field(default_factory=dict)

    def zombie_outcomes(self) -> Counter[str]:
        """How each zombie ended: ``fenced``, or its last exit reason (``none``: no exit)."""
        return Counter(self.exits.get(z.journal, "none") for z in self.zombies)


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


def journal_name(role: str, slot: int, inc: int) -> str:
    return f"{role}-{slot}-{inc}"


class JournalReader:
    """Folds the journals of a directory into a :class:`History`, incrementally.

    :meth:`feed` reads the complete lines appended since the last call (the driver calls it
    while the run goes on, to see whether it has done enough work, without reading the
    whole history again); ``final=True`` also drops what a killed process left of a line.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.history = History()
        self._offsets: dict[Path, int] = {}

    def feed(self, final: bool = False) -> History:
        for path in sorted(self.directory.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            complete = data.rfind(b"\n") + 1
            self._offsets[path] = start + (len(data) if final else complete)
            for line in data[:complete].splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line a killed process left half written, then more
                fold(self.history, path.stem, entry)
        return self.history


def load_journals(directory: Path) -> History:
    return JournalReader(directory).feed(final=True)


def fold(h: History, name: str, e: dict[str, Any]) -> None:
    """Add one journal entry of journal ``name`` (``<role>-<slot>-<inc>``) to ``h``."""
    kind = e["e"]
    role = name.split("-", 1)[0]
    if kind == "fault":
        h.faults[f"store_{e['kind']}" if e["kind"] != "outage" else "outage_seen"] += 1
        if e["kind"] == "after":  # ambiguous writes of the keys that decide commits
            for part, what in (("/_log/", "log"), ("/_commit/", "commit")):
                if part in e["key"]:
                    h.faults[f"store_after_{what}"] += 1
    elif kind == "driver_fault":
        h.faults[e["kind"]] += 1
        if e["kind"] == "zombie":
            h.zombies.append(
                Zombie(
                    journal_name(e["role"], e["slot"], e["inc"]),
                    journal_name(e["role"], e["slot"], e["inc"] + 1),
                )
            )
    elif kind == "stuck_at_stop":
        h.hung.append(e["journal"])
    elif kind == "exited":
        h.exited.append(e["journal"])
    elif kind == "untyped":
        h.untyped.append(f"{name}: {e['where']}: {e['err']}")
    elif kind == "start":
        h.roles.add(role)
    elif kind == "init":
        init = Init(e["ts"], e.get("pid"), e.get("epoch"))
        h.inits.setdefault(f"{name}/{e.get('tid', '')}", []).append(init)
    elif kind == "exit":
        h.exits[name] = e["why"]
    elif kind == "maint":
        h.progress["maint"] += 1
    elif kind == "gc":
        h.committers[e["id"]] = name
    elif kind == "gc_stats":
        h.gc_stats[name] = e["stats"]
    elif role == "ctp":
        if kind == "end":
            h.ctp_txns[e["outcome"]] += 1
            if e["outcome"] == "commit":
                h.progress["ctp"] += 1
    elif kind == "begin":
        h.txns[e["txn"]] = Txn(journal=name)
    elif kind == "send":
        txn = h.txns[e["txn"]]
        txn.sends.extend((v, e["t"], e["p"]) for v in e["vs"])
    elif kind == "deciding":
        if e["d"] == "commit":
            h.txns[e["txn"]].decided_at = e["ts"]
    elif kind == "acks":
        txn = h.txns[e["txn"]]
        for v, t, p, o in e["acks"]:
            txn.acks[v] = (t, p, o)
    elif kind == "end":
        txn = h.txns[e["txn"]]
        txn.outcome, txn.ended = e["outcome"], True
        if e["outcome"] == "commit":
            h.progress[role] += 1
    elif kind == "stall":
        h.faults["txn_stall"] += 1
    elif kind == "isend":
        h.idem[e["v"]] = (e["t"], e["p"], None)
    elif kind == "iack":
        h.idem[e["v"]] = (e["t"], e["p"], e["o"])
        h.progress[role] += 1
    elif kind == "seen":
        bounds = {(t, p): lso for t, p, _, lso in e.get("parts", ())}
        recs = [Seen(t, p, o, v, bounds.get((t, p)), e["ts"]) for t, p, o, v in e["recs"]]
        h.seen.setdefault(name, []).extend(recs)
        positions = h.positions.setdefault(name, {})
        for t, p, pos, _ in e.get("parts", ()):
            positions[(t, p)] = pos
        h.progress["consumer"] += len(recs)
    elif kind == "desc":
        parts = [tuple(x) for x in e["parts"]]
        h.samples.setdefault(name, []).append((e["t"], e["v"], parts))
    elif kind == "deleting":
        h.deleted.extend(tuple(r) for r in e["recs"])


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
        # A CTP output is the same value in every attempt at its input (an attempt that
        # aborted after its data reached the log, then the retry): at most one committed.
        if len(ps) > 1 and len(visible.get(v, ())) <= 1 and not v.startswith("ctp|"):
            r.add("duplicate", f"{v} read_uncommitted at {sorted(ps)}")

    check_live_consumers(r, h, final, visible)

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
        elif txn.decided_at is None and vis:
            # Killed or failed before it asked to commit: only an abort may follow.
            r.add("aborted_read", f"{name}: never asked to commit, yet {vis[:3]} read_committed")
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
        owner = h.txns.get(v.rsplit("/", 1)[0])
        if (
            owner is None
            or owner.outcome == "commit"
            or any(x in visible for x, _, _ in owner.sends)
        ):
            r.add("rc_not_ru_minus_aborted", f"{v} at {sorted(ps)} read_uncommitted only")
    for v, ps in rc.items():
        if v not in ru:
            r.add("rc_not_ru_minus_aborted", f"{v} at {sorted(ps)} read_committed only")

    # Idempotent producer: acknowledged values present once, at their offset.
    idem_acked = idem_err = 0
    for v, (t, p, acked) in h.idem.items():
        if acked is None:
            idem_err += 1
            continue
        idem_acked += 1
        if v not in visible:
            r.add("lost_write", f"idempotent {v} acknowledged at {t}[{p}]@{acked}, missing")
        elif (t, p, acked) not in visible[v]:
            r.add("offset_mismatch", f"idempotent {v} acked at {acked}, read at {visible[v]}")

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
    check_workers(r, h, final)
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
        "zombies": dict(h.zombie_outcomes()),
        "unknown_share": {
            "transactions": _share(outcomes["unknown"], len(h.txns)),
            "ctp_transactions": _share(h.ctp_txns["unknown"], sum(h.ctp_txns.values())),
        },
        "progress": dict(sorted(h.progress.items())),
        # Killed after deciding to commit, before its end: between intent and ack.
        "killed_while_committing": sum(
            1 for t in h.txns.values() if t.decided_at is not None and not t.ended
        ),
        "group_commit": dict(sum((Counter(s) for s in h.gc_stats.values()), Counter())),
        "records_read_committed": sum(len(x["rc_poll"]) for x in final.reads.values()),
        "records_deleted": len(h.deleted),
        "readers": sorted({name for reads in final.reads.values() for name in reads}),
    }
    return r


def _share(part: int, whole: int) -> float:
    return round(part / whole, 3) if whole else 0.0


def check_live_consumers(r: Report, h: History, final: Final, visible: dict[str, set[Pos]]) -> None:
    """What each live read_committed consumer returned, against the final tables.

    Offsets increase per partition; every record returned is committed at that offset in
    the end (else aborted or lost), was below the LSO of the snapshot its poll read and was
    returned no earlier than its client decided to commit it (else a dirty read); and every
    committed record below the consumer's last journaled position was returned (else a
    skip), except those ``delete_records`` removed, which a consumer may miss.
    """
    deleted = {(t, p, o) for t, p, o, _ in h.deleted}
    committed: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for table, reads in final.reads.items():
        for p, o, v in reads["rc_poll"]:
            committed[(table, p)].append((o, v))
    for name, recs in h.seen.items():
        last: dict[tuple[str, int], int] = {}
        returned: set[Pos] = set()
        for t, p, o, v, lso, ts in recs:
            returned.add((t, p, o))
            if o <= last.get((t, p), -1):
                r.add("non_monotonic", f"{name}: {t}[{p}] {o} after {last[(t, p)]}")
            last[(t, p)] = o
            txn = h.txns.get(v.rsplit("/", 1)[0])
            if v not in visible:
                kind = (
                    "aborted_read" if txn is not None and txn.outcome == "abort" else "lost_write"
                )
                r.add(kind, f"{name} saw {v} at {t}[{p}]@{o} read_committed; not there at the end")
            elif (t, p, o) not in visible[v]:
                r.add("offset_mismatch", f"{name} saw {v} at {t}[{p}]@{o}, final {visible[v]}")
            if lso is not None and o >= lso:
                r.add("dirty_read", f"{name} saw {v} at {t}[{p}]@{o}, its read's LSO {lso}")
            # Journal times are rounded to the millisecond: a margin of one keeps it sound.
            elif txn is not None and (txn.decided_at is None or ts + 0.001 < txn.decided_at):
                r.add("dirty_read", f"{name} saw {v} at {ts}, committed at {txn.decided_at}")
        for (t, p), position in h.positions.get(name, {}).items():
            for o, v in committed.get((t, p), ()):
                if o < position and (t, p, o) not in returned and (t, p, o) not in deleted:
                    r.add("consumer_skip", f"{name}: {t}[{p}]@{o} ({v}) below {position}")


def outranks(mine: list[Init], theirs: list[Init], at: float) -> bool:
    """Whether the latest of ``mine`` before ``at`` got a newer epoch of the same producer id
    than every one of ``theirs`` before ``at``: initialisations that overlapped (a zombie
    resumed while its successor initialised) are ordered by the coordinator's CAS, not by
    when each returned — the one that fenced its tables longer returns later, older."""
    own = [i for i in mine if i.ts <= at]
    other = [i for i in theirs if i.ts <= at]
    if not own or not other:
        return False
    latest = max(own, key=lambda i: i.ts)
    if latest.epoch is None:
        return False
    return all(
        o.pid == latest.pid and o.epoch is not None and o.epoch < latest.epoch for o in other
    )


def check_workers(r: Report, h: History, final: Final) -> None:
    """Every kind of worker made progress; zombies were fenced; none hung or gave up."""
    for role in sorted(h.roles):
        moved = role != "ctp" or any(o > 0 for o in final.ctp_committed.values())
        if role in PROGRESS and (not h.progress[role] or not moved):
            r.add("no_progress", f"{role}: never {PROGRESS[role]}")
    for z in h.zombies:
        for name, txn in h.txns.items():
            if txn.journal != z.journal or txn.outcome != "commit" or txn.decided_at is None:
                continue
            tid = name.rsplit(".", 2)[0]  # <transactional id>.<incarnation>.<n>
            successor = h.inits.get(f"{z.successor}/{tid}")
            if not successor:
                continue  # killed before it initialised: nothing fenced the zombie
            fenced_at = successor[0].ts
            # A zombie that initialised again after its successor owns the id again (its
            # journal's times are rounded to the millisecond: an init and the decision of
            # its first transaction can share one).
            again = h.inits.get(f"{z.journal}/{tid}", [])
            retook = any(fenced_at < i.ts <= txn.decided_at for i in again)
            if txn.decided_at > fenced_at and not retook and not outranks(
                again, successor, txn.decided_at
            ):
                r.add(
                    "zombie_commit",
                    f"{name} of zombie {z.journal} decided at {txn.decided_at}, "
                    f"after {z.successor} initialised at {fenced_at}",
                )
    for journal in h.hung:
        r.add("hung_worker", f"{journal} did not stop when asked: killed")
    exited = set(h.exited)
    for journal, why in sorted(h.exits.items()):
        if why not in ("fenced", "stop"):
            r.add("worker_exit", f"{journal} exited: {why}")
            exited.discard(journal)
    for journal in sorted(exited - set(h.exits)):
        r.add("worker_exit", f"{journal} exited with no exit journaled")


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
