"""Harness worker processes: run as ``python eo_workers.py '<json config>'``.

Roles (``cfg["role"]``):

* ``txn``: a transactional producer (``cfg["tid"]``) writing unique values to random
  partitions of the data tables, with ``send`` and ``send_batch``, committing or aborting at
  random, sometimes stalling past a short transaction timeout;
* ``idem``: an idempotent producer;
* ``ctp``: consume-transform-produce from table ``t0`` to table ``ctp`` in transactions
  carrying the group offsets;
* ``consumer``: a read_committed consumer journaling every record it sees (``poll`` and
  ``poll_arrow`` in turn) and sampling ``describe()``;
* ``maint``: maintenance next to the writers: optimize, compact, delete_records (journaling
  what it deletes first), checkpoint, recover;
* ``mw``: many writers of one table (issue 17's group commit): ``cfg["threads"]`` threads,
  each with its own warehouse and producer on table ``hot``, the first idempotent, the
  others transactional; the process journals the group-commit handles it opens, so the
  driver can find the process holding the committer lease.

Every role writes what it did and saw to its own journal (JSON lines, one ``write`` each, so
a SIGKILL loses at most a partial last line). ``cfg["tables"]`` names the data tables a role
writes (default: ``t0``, ``t1``, ``t2``). Storage is wrapped in a
:class:`~eo_chaos.ChaosStore`; every injected fault is journaled. A role stops when the stop
file exists.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from eo_chaos import ChaosConfig, ChaosStore

from txntable import (
    Consumer,
    Producer,
    TopicPartition,
    Warehouse,
)
from txntable.errors import ProducerFencedError, TxnTableError, UnstableOffsetCommitError
from txntable.log.group_commit import GroupCommit, GroupCommitConfig
from txntable.storage import open_store
from txntable.structs import OffsetAndMetadata
from txntable.table import Table

#: Data tables and their partition counts; ``ctp`` is the consume-transform-produce output.
TABLES = {"t0": 3, "t1": 2, "t2": 2}
#: The many writers' table.
HOT_TABLE, HOT_PARTITIONS = "hot", 8
CTP_TABLE, CTP_PARTITIONS, CTP_GROUP = "ctp", 3, "ctp-group"
#: The only table whose log start maintenance moves (the checker is told what it deleted).
DELETE_TABLE = "t2"


class Journal:
    """Append-only JSON lines, one ``os.write`` per line."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        #: Called with every entry (the many-writers process counts its fenced threads).
        self.observer: Callable[[dict[str, Any]], None] | None = None

    def log(self, **entry: Any) -> None:
        entry["ts"] = round(time.time(), 3)
        os.write(self.fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        if self.observer is not None:
            self.observer(entry)


def open_warehouse(cfg: dict[str, Any], j: Journal, rate: float = 1.0) -> Warehouse:
    inner = open_store(cfg["url"], dict(cfg.get("options") or {}))
    chaos = ChaosConfig(**{**cfg["chaos"], "hot_keys": tuple(cfg["chaos"]["hot_keys"])})
    store = ChaosStore(
        inner,
        chaos.scaled(rate),
        on_fault=lambda kind, op, key: j.log(e="fault", kind=kind, op=op, key=key),
        seed=cfg["seed"],
    )
    timings = cfg.get("group_commit")
    if timings is None:
        return Warehouse(store=store)
    return Warehouse(store=store, group_commit=GroupCommitConfig(**timings))


def data_tables(cfg: dict[str, Any]) -> dict[str, int]:
    return dict(cfg.get("tables") or TABLES)


def stopping(cfg: dict[str, Any]) -> bool:
    return os.path.exists(cfg["stop_file"])


class Stopping(Exception):
    """Asked to stop while still retrying a failing start: not a failure of the worker."""


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def untyped(j: Journal, where: str, e: BaseException) -> None:
    j.log(e="untyped", where=where, err=err(e), tb=traceback.format_exc()[-2000:])


# --- transactional producer ---------------------------------------------------------------


def new_txn_producer(
    wh: Warehouse, cfg: dict[str, Any], j: Journal, rng: random.Random
) -> Producer:
    """A producer for the worker's transactional id, initialised (retried while storage fails)."""
    while True:
        p = Producer(
            wh,
            transactional_id=cfg["tid"],
            linger_ms=rng.choice([0, 5, 50]),
            transaction_timeout_ms=cfg["txn_timeout_ms"],
            delivery_timeout_ms=cfg.get("delivery_timeout_ms", 20_000),
            max_block_ms=20_000,
            auto_maintenance=False,
        )
        try:
            p.init_transactions()
            # The epoch orders instances whose initialisations overlapped (the later one
            # to return may hold the older epoch).
            j.log(e="init", tid=cfg["tid"], pid=p.producer_id, epoch=p.producer_epoch)
            return p
        except TxnTableError as e:
            j.log(e="init_error", err=err(e))
            close_quietly(p, j)
            if stopping(cfg):
                raise Stopping from e
            time.sleep(0.2)


def close_quietly(p: Producer, j: Journal) -> None:
    try:
        p.close(timeout=5)
    except TxnTableError as e:
        j.log(e="close_error", err=err(e))
    except Exception as e:
        untyped(j, "close", e)


def acks_of(futures: list[tuple[str, str, int, list[str], Any]]) -> list[list[Any]]:
    """``[value, table, partition, offset]`` of every record sent, once their futures
    resolved."""
    acks: list[list[Any]] = []
    for kind, table, part, vals, fut in futures:
        res = fut.result(timeout=60)
        if kind == "batch":
            offs = [int(o) for o in res.offsets]
            acks.extend([v, table, part, o] for v, o in zip(vals, offs, strict=True))
        else:
            acks.append([vals[0], table, part, res.offset])
    return acks


def txn_worker(cfg: dict[str, Any], j: Journal) -> None:
    rng = random.Random(cfg["seed"])
    tables = data_tables(cfg)
    wh = open_warehouse(cfg, j)
    producer = new_txn_producer(wh, cfg, j, rng)
    n = 0
    while not stopping(cfg):
        txn = f"{cfg['tid']}.{cfg['inc']}.{n}"
        n += 1
        j.log(e="begin", txn=txn)
        futures: list[tuple[str, str, int, list[str], Any]] = []
        try:
            producer.begin_transaction()
            for k in range(rng.randint(1, 4)):
                table = rng.choice(sorted(tables))
                part = rng.randrange(tables[table])
                if rng.random() < 0.3:
                    vals = [f"{txn}/{k}.{i}" for i in range(rng.randint(2, 6))]
                    j.log(e="send", txn=txn, t=table, p=part, vs=vals)
                    data = pa.table(
                        {
                            "key": pa.array([v.encode() for v in vals], pa.binary()),
                            "value": pa.array([v.encode() for v in vals], pa.binary()),
                        }
                    )
                    fut = producer.send_batch(table, data, partition=part)
                    futures.append(("batch", table, part, vals, fut))
                else:
                    v = f"{txn}/{k}"
                    j.log(e="send", txn=txn, t=table, p=part, vs=[v])
                    fut = producer.send(table, key=v.encode(), value=v.encode(), partition=part)
                    futures.append(("one", table, part, [v], fut))
                if rng.random() < 0.2:
                    producer.flush()
            if rng.random() < cfg.get("stall_rate", 0.0):
                # Past the transaction timeout: a recoverer may abort it (and fence us).
                j.log(e="stall", txn=txn)
                time.sleep(cfg["txn_timeout_ms"] / 1000 * rng.uniform(1.2, 2.5))
            if rng.random() < 0.75:
                j.log(e="deciding", txn=txn, d="commit")
                # Half the commits flush first (the acks are journaled before the commit);
                # the others commit what is still buffered, which for one table is a
                # one-log commit (CommitOneLog): the acks come with the commit.
                flush_first = rng.random() < cfg.get("flush_before_commit_rate", 0.5)
                if flush_first:
                    producer.flush()
                    j.log(e="acks", txn=txn, acks=acks_of(futures))
                producer.commit_transaction()
                if not flush_first:
                    j.log(e="acks", txn=txn, acks=acks_of(futures))
                j.log(e="end", txn=txn, outcome="commit")
            else:
                j.log(e="deciding", txn=txn, d="abort")
                producer.abort_transaction()
                j.log(e="end", txn=txn, outcome="abort")
        except TxnTableError as e:
            j.log(e="end", txn=txn, outcome="unknown", err=err(e))
            fenced = isinstance(e, ProducerFencedError)
            close_quietly(producer, j)
            if fenced and cfg.get("exit_when_fenced"):
                j.log(e="exit", why="fenced")
                return
            producer = new_txn_producer(wh, cfg, j, rng)
        except Exception as e:
            j.log(e="end", txn=txn, outcome="unknown", err=err(e))
            untyped(j, "txn", e)
            close_quietly(producer, j)
            producer = new_txn_producer(wh, cfg, j, rng)
    close_quietly(producer, j)
    j.log(e="exit", why="stop")


# --- idempotent producer --------------------------------------------------------------------


def idem_worker(cfg: dict[str, Any], j: Journal) -> None:
    rng = random.Random(cfg["seed"])
    tables = data_tables(cfg)
    wh = open_warehouse(cfg, j)
    producer = Producer(wh, linger_ms=5, delivery_timeout_ms=20_000, auto_maintenance=False)
    n = 0
    while not stopping(cfg):
        pending = []
        for _ in range(rng.randint(1, 5)):
            v = f"i{cfg['slot']}.{cfg['inc']}.{n}"
            n += 1
            table = rng.choice(sorted(tables))
            part = rng.randrange(tables[table])
            j.log(e="isend", v=v, t=table, p=part)
            try:
                if rng.random() < 0.3:
                    data = pa.table({"key": [v.encode()], "value": [v.encode()]})
                    fut = producer.send_batch(table, data, partition=part)
                    pending.append((v, table, part, fut, True))
                else:
                    fut = producer.send(table, key=v.encode(), value=v.encode(), partition=part)
                    pending.append((v, table, part, fut, False))
            except TxnTableError as e:
                j.log(e="ierr", v=v, err=err(e))
        for v, table, part, fut, batch in pending:
            try:
                res = fut.result(timeout=60)
                off = int(res.offsets[0]) if batch else res.offset
                j.log(e="iack", v=v, t=table, p=part, o=off)
            except TxnTableError as e:
                j.log(e="ierr", v=v, err=err(e))
            except Exception as e:
                j.log(e="ierr", v=v, err=err(e))
                untyped(j, "idem", e)
        time.sleep(rng.uniform(0, 0.05))
    close_quietly(producer, j)
    j.log(e="exit", why="stop")


# --- consume-transform-produce --------------------------------------------------------------


def ctp_worker(cfg: dict[str, Any], j: Journal) -> None:
    rng = random.Random(cfg["seed"])
    wh = open_warehouse(cfg, j, rate=0.5)
    cfg = {**cfg, "tid": "ctp-worker"}
    tps = [TopicPartition("t0", p) for p in range(TABLES["t0"])]

    def new_consumer() -> Consumer:
        while True:
            try:
                c = Consumer(
                    wh,
                    isolation_level="read_committed",
                    group_id=CTP_GROUP,
                    auto_offset_reset="earliest",
                    unstable_offset_timeout_ms=20_000,
                    enable_auto_commit=False,  # offsets commit with the transactions
                )
                c.assign(tps)
                for tp in tps:
                    c.position(tp)  # resolves the committed offset now
                return c
            except (TxnTableError, UnstableOffsetCommitError) as e:
                j.log(e="cerr", err=err(e))
                if stopping(cfg):
                    raise Stopping from e
                time.sleep(0.2)

    producer = new_txn_producer(wh, cfg, j, rng)
    consumer = new_consumer()
    n = 0
    while not stopping(cfg):
        txn = f"ctp.{cfg['inc']}.{n}"
        n += 1
        begun = False
        try:
            got = consumer.poll(max_records=20, timeout_ms=100)
            if not got:
                time.sleep(0.1)
                continue
            j.log(e="begin", txn=txn)
            begun = True
            producer.begin_transaction()
            offsets = {}
            for tp, records in got.items():
                for r in records:
                    assert r.value is not None
                    out = f"ctp|{tp.partition}|{r.offset}|{r.value.decode()}".encode()
                    producer.send(CTP_TABLE, key=out, value=out, partition=tp.partition)
                offsets[tp] = OffsetAndMetadata(consumer.position(tp), txn)
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            j.log(e="deciding", txn=txn, d="commit")
            producer.commit_transaction()
            j.log(e="end", txn=txn, outcome="commit")
        except TxnTableError as e:
            if begun:  # else the poll failed: no transaction to report
                j.log(e="end", txn=txn, outcome="unknown", err=err(e))
            else:
                j.log(e="cerr", err=err(e))
            close_quietly(producer, j)
            consumer.close()
            if isinstance(e, ProducerFencedError):
                j.log(e="exit", why="fenced")  # a successor owns the id (Kafka: fatal)
                return
            producer = new_txn_producer(wh, cfg, j, rng)
            consumer = new_consumer()  # back to the committed offsets
        except Exception as e:
            untyped(j, "ctp", e)
            raise
    close_quietly(producer, j)
    j.log(e="exit", why="stop")


# --- read_committed consumer and describe() sampler -----------------------------------------


def consumer_worker(cfg: dict[str, Any], j: Journal) -> None:
    wh = open_warehouse(cfg, j, rate=0.5)
    tables = {**TABLES, CTP_TABLE: CTP_PARTITIONS, **cfg.get("extra_tables", {})}
    tps = [TopicPartition(t, p) for t, n in sorted(tables.items()) for p in range(n)]
    while True:  # assigning loads the tables: retried while storage is down
        c = Consumer(wh, isolation_level="read_committed", auto_offset_reset="earliest")
        try:
            c.assign(tps)
            break
        except TxnTableError as e:
            j.log(e="rerr", err=err(e))
            c.close()
            if stopping(cfg):
                raise Stopping from e
            time.sleep(0.2)
    arrow = False
    last_describe = 0.0
    describe_every = 1.0
    handles: dict[str, Table] = {}
    # Polls of 50 records: on a slow store (the moto server behind 16 writers) a poll of
    # hundreds of segments takes tens of seconds and fails as a whole on any failed GET.
    limit = 50
    while not stopping(cfg):
        arrow = not arrow
        try:
            seen: list[list[Any]] = []
            if arrow:
                for tp, tbl in c.poll_arrow(timeout_ms=100, max_records=limit).items():
                    offs = tbl.column("offset").to_pylist()
                    vals = tbl.column("value").to_pylist()
                    seen.extend(
                        [tp.topic, tp.partition, o, v.decode()]
                        for o, v in zip(offs, vals, strict=True)
                    )
            else:
                for tp, records in c.poll(timeout_ms=100, max_records=limit).items():
                    seen.extend(
                        [tp.topic, tp.partition, r.offset, r.value.decode()] for r in records
                    )
            if seen:
                # Per partition read: the position after it (the checker requires every
                # committed record below it) and the LSO the read was bounded by.
                parts = [
                    [t, p, c.position(TopicPartition(t, p)), read_lso(c, t, p)]
                    for t, p in sorted({(t, p) for t, p, _, _ in seen})
                ]
                j.log(e="seen", arrow=arrow, recs=seen, parts=parts)
            else:
                time.sleep(0.1)
        except TxnTableError as e:
            j.log(e="rerr", err=err(e))
            time.sleep(0.1)  # storage down: retry as a Kafka consumer would, not in a spin
        except Exception as e:
            untyped(j, "poll", e)
        if time.time() - last_describe > describe_every:
            last_describe = time.time()
            for t in sorted(tables):
                try:
                    if t not in handles:  # one handle each: describe() tails its log
                        handles[t] = wh.table(t)
                    d = handles[t].describe()
                    parts = [
                        [p.log_start_offset, p.last_stable_offset, p.high_watermark]
                        for p in d.partitions
                    ]
                    j.log(e="desc", t=t, v=d.version, parts=parts)
                except TxnTableError as e:
                    j.log(e="rerr", err=err(e))
                except Exception as e:
                    untyped(j, "describe", e)
            # Sampling never takes more than a third of the consumer's time.
            describe_every = max(1.0, 2 * (time.time() - last_describe))
    c.close()
    j.log(e="exit", why="stop")


def read_lso(c: Consumer, table: str, partition: int) -> int:
    """The LSO of the snapshot the consumer's last poll read ``table`` at.

    ``poll`` refreshes each table, then reads that snapshot; nothing else refreshes the
    consumer's handles, so right after ``poll`` this is the bound the read obeyed. A public
    client has no such call (Kafka's fetch responses carry it internally), hence the
    private handle: the harness checks that no record at or above it was returned.
    """
    return c._table(table).snapshot(refresh=False).partition(partition).last_stable_offset


# --- maintenance and recovery ---------------------------------------------------------------


def maint_worker(cfg: dict[str, Any], j: Journal) -> None:
    rng = random.Random(cfg["seed"])
    wh = open_warehouse(cfg, j, rate=0.5)
    while not stopping(cfg):
        time.sleep(rng.uniform(0.2, 1.0))
        what = rng.choice(
            ["optimize", "optimize_small", "compact", "delete", "checkpoint", "recover"]
        )
        table = rng.choice([*sorted(TABLES), CTP_TABLE, *sorted(cfg.get("extra_tables", {}))])
        try:
            t = wh.table(table)
            if what == "optimize":
                r = t.optimize()
                j.log(e="maint", what=what, t=table, segments=r.segments_written)
            elif what == "optimize_small":
                r = t.optimize(target_bytes=rng.choice([200, 2000, 8000]))
                j.log(e="maint", what=what, t=table, segments=r.segments_written)
            elif what == "compact":
                # Every key is unique: compaction must keep every committed record.
                r = t.compact(ignore_cleanup_policy=True)
                j.log(e="maint", what=what, t=table, segments=r.segments_written)
            elif what == "delete":
                table = DELETE_TABLE
                delete_some(wh, j, rng)
            elif what == "checkpoint":
                t.checkpoint()
                j.log(e="maint", what=what, t=table)
            else:
                rep = wh.recover(timeout_ms=10_000)
                j.log(e="maint", what=what, report=repr(rep)[:300])
        except TxnTableError as e:
            j.log(e="merr", what=what, t=table, err=err(e))
        except Exception as e:
            untyped(j, what, e)
    j.log(e="exit", why="stop")


def delete_some(wh: Warehouse, j: Journal, rng: random.Random) -> None:
    """Move a partition of the delete table's log start forward, journaling what goes first.

    The records below the new log start (read_committed, from one pinned snapshot) are
    journaled before the call, so the checker still knows every committed record.
    """
    t = wh.table(DELETE_TABLE)
    snap = t.snapshot()
    p = rng.randrange(TABLES[DELETE_TABLE])
    part = snap.partition(p)
    start, lso = part.log_start_offset, part.last_stable_offset
    if lso <= start:
        return
    upto = rng.randint(start, start + (lso - start) // 2)
    scan = t.scan(
        starting_offsets={p: start},
        ending_offsets={p: upto},
        partitions=[p],
        version=snap.version,
    ).to_arrow()
    recs = [
        [DELETE_TABLE, p, o, v.decode()]
        for o, v in zip(scan["offset"].to_pylist(), scan["value"].to_pylist(), strict=True)
    ]
    j.log(e="deleting", t=DELETE_TABLE, p=p, upto=upto, recs=recs)
    t.delete_records({p: upto})
    j.log(e="maint", what="delete", t=DELETE_TABLE, p=p, upto=upto)


# --- many writers of one table ----------------------------------------------------------


def mw_worker(cfg: dict[str, Any], j: Journal) -> None:
    """``cfg["threads"]`` writers of the hot table, each with its own warehouse and producer.

    Thread 0 is idempotent, the others transactional (their ids ``mw<slot>-<thread>``, so a
    restarted process takes its predecessor's ids over). A thread whose producer is fenced
    ends (a successor owns its id); the process exits when every thread has ended.
    """
    fenced: list[str] = []

    def writer(i: int) -> None:
        thread_cfg = {
            **cfg,
            "tables": {HOT_TABLE: HOT_PARTITIONS},
            "seed": cfg["seed"] * 100 + i,
            "slot": f"mw{cfg['slot']}-{i}",
            "tid": f"mw{cfg['slot']}-{i}",
            "exit_when_fenced": True,
        }
        try:
            if i == 0:
                idem_worker(thread_cfg, j)
            else:
                txn_worker(thread_cfg, j)
        except Stopping:
            pass
        except Exception as e:  # a thread's failure is the process's: journal it
            untyped(j, f"mw thread {i}", e)

    def logs_fenced(entry: dict[str, Any]) -> None:
        if entry.get("e") == "exit" and entry.get("why") == "fenced":
            fenced.append(entry.get("why", ""))

    j.observer = logs_fenced
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(cfg["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every writer was fenced: a successor took over (the driver paused this process).
    j.log(e="exit", why="fenced" if len(fenced) == cfg["threads"] - 1 else "stop")


def journal_group_commits(j: Journal) -> None:
    """Journal the id of every group-commit handle this process opens (the owner named in a
    lease), and every 2 s the rounds and helps they made: instrumentation, no behaviour."""
    handles: list[GroupCommit] = []
    original = GroupCommit.__init__

    def init(self: GroupCommit, table: Any, cfg: GroupCommitConfig) -> None:
        original(self, table, cfg)
        handles.append(self)
        j.log(e="gc", id=self.id, t=table.name)

    GroupCommit.__init__ = init

    def report() -> None:
        while True:
            time.sleep(2.0)
            totals: dict[str, int] = {}
            for h in list(handles):
                for k, n in h.stats.items():
                    totals[k] = totals.get(k, 0) + n
            j.log(e="gc_stats", stats=totals)

    threading.Thread(target=report, daemon=True).start()


ROLES = {
    "txn": txn_worker,
    "idem": idem_worker,
    "ctp": ctp_worker,
    "consumer": consumer_worker,
    "maint": maint_worker,
    "mw": mw_worker,
}


def main() -> int:
    cfg = json.loads(sys.argv[1])
    j = Journal(cfg["journal"])
    j.log(e="start", role=cfg["role"], pid=os.getpid(), inc=cfg.get("inc", 0))
    journal_group_commits(j)
    try:
        ROLES[cfg["role"]](cfg, j)
    except Stopping:
        j.log(e="exit", why="stop")
    except TxnTableError as e:
        j.log(e="exit", why="error", err=err(e))
        return 3
    except Exception as e:
        untyped(j, "main", e)
        j.log(e="exit", why="untyped", err=err(e))
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
