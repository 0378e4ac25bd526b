"""Start-up times: ``import txntable``, ``txntable --help`` and ``txntable describe``.

``import txntable`` loads the public names on first use; ``from txntable import Consumer,
Producer, Warehouse`` is what a program using the library pays (pyarrow and the library).

Each case is a fresh process (what a user waits for at the shell), run interleaved with the
baselines of the same run: the bare interpreter (``python -c pass``) and ``import pyarrow``
(the data plane's one unavoidable dependency). Prints, per case, the median wall time and
the median CPU time (user + system of the child: less moved by other processes on a loaded
machine than wall time) and the goals (issue 20: ``import txntable`` <= 0.25 s,
``txntable --help`` <= 0.3 s).

Bytecode caching is on for the children (``PYTHONDONTWRITEBYTECODE`` is dropped: an
installed package has its ``.pyc`` files), and every case runs once before timing.

Run: ``python bench/startup.py [--rounds 15] [--importtime CASE]``; ``--importtime``
prints the slowest imports of one case (``python -X importtime``), cumulative.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow as pa

from txntable import Producer, Warehouse

GOALS = {"import txntable": 0.25, "txntable --help": 0.3}

#: What a program using the library runs: ``import txntable`` alone loads the public names
#: lazily, so this is the honest cost of the library itself (pyarrow included).
LIBRARY = "from txntable import Consumer, Producer, Warehouse"


def cases(lake: str) -> dict[str, list[str]]:
    py = sys.executable
    cli = os.path.join(os.path.dirname(py), "txntable")
    return {
        "python -c pass": [py, "-c", "pass"],
        "import pyarrow": [py, "-c", "import pyarrow"],
        "import txntable": [py, "-c", "import txntable"],
        "from txntable import …": [py, "-c", LIBRARY],
        "txntable --help": [cli, "--help"],
        "txntable describe": [cli, "describe", lake, "t"],
    }


def build(lake: str) -> None:
    """A small local table: 3 partitions, one committed transaction."""
    wh = Warehouse(lake)
    wh.create_table("t", partitions=3)
    with Producer(wh, transactional_id="startup") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send_batch("t", pa.table({"key": [b"a", b"b", b"c"], "value": [b"1", b"2", b"3"]}))
        p.commit_transaction()


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def importtime(argv: list[str], env: dict[str, str], top: int = 25) -> None:
    """The slowest imports (cumulative microseconds) of one run of ``argv``."""
    if argv[0].endswith("txntable"):  # the console script: run its module instead
        argv = [sys.executable, "-c", "import sys; from txntable.cli import main; "
                "sys.exit(main(sys.argv[1:]))", *argv[1:]]  # fmt: skip
    out = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env, capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    rows = []
    for line in out.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            _, cumulative, name = line[len("import time:") :].split("|")
            rows.append((int(cumulative), name.rstrip()))
    for cumulative, name in sorted(rows, reverse=True)[:top]:
        print(f"{cumulative / 1000:9.1f} ms {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--importtime", metavar="CASE", help="e.g. 'txntable --help'")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    root = tempfile.mkdtemp(prefix="txntable-startup-")
    try:
        lake = os.path.join(root, "lake")
        build(lake)
        todo = cases(lake)
        if args.importtime:
            run(todo[args.importtime], env)
            importtime(todo[args.importtime], env)
            return
        for argv in todo.values():  # warm-up: writes the bytecode caches, fills the page cache
            run(argv, env)
        wall: dict[str, list[float]] = {n: [] for n in todo}
        cpu: dict[str, list[float]] = {n: [] for n in todo}
        for _ in range(args.rounds):
            for name, argv in todo.items():
                w, c = run(argv, env)
                wall[name].append(w)
                cpu[name].append(c)
        print(f"median of {args.rounds} interleaved rounds; load average "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"{'case':<24}{'wall s':>9}{'cpu s':>9}{'goal':>8}")
        for name in todo:
            goal = f"{GOALS[name]:.2f}" if name in GOALS else ""
            print(f"{name:<24}{statistics.median(wall[name]):>9.3f}"
                  f"{statistics.median(cpu[name]):>9.3f}{goal:>8}")  # fmt: skip
        base = statistics.median(wall["import pyarrow"])
        for name in ("import txntable", "from txntable import …", "txntable --help",
                     "txntable describe"):  # fmt: skip
            print(f"{name} / import pyarrow (wall): "
                  f"{statistics.median(wall[name]) / base:.2f}x")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
