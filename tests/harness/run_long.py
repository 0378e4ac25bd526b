"""The exactly-once harness, long mode: ``python tests/harness/run_long.py [options]``.

Runs the workload of :mod:`eo_driver` for ``--minutes`` on local disk (``--store local``,
under ``--workdir``, default a fresh ``/tmp/harness-*``) or on a moto S3 server in a process
of its own (``--store s3``; its conditional puts serialised, as moto's are not atomic), prints
the checker's summary as JSON and exits 1 if it found any anomaly. The summary names the
seed and the work directory; ``--seed N`` replays a run's fault schedule (which worker is
killed or paused, outages, and each worker's storage faults and workload, in order). The
work directory is deleted afterwards unless ``--keep`` or the run found an anomaly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from eo_chaos import ChaosConfig  # noqa: E402
from eo_driver import FAULT_KINDS, MANY_WRITER_FAULTS, HarnessConfig, run  # noqa: E402
from eo_moto import moto_env, moto_process  # noqa: E402


def start_spark() -> Any:
    """A local SparkSession with the txntable source (as the Spark tests build it)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import txntable_spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("txntable-harness")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    txntable_spark.register(session)
    return session


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=["local", "s3"], default="local")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--txn-workers", type=int, default=4)
    ap.add_argument("--idem-workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh one (printed)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--spark", action="store_true", help="the Spark source reads the tables too")
    ap.add_argument(
        "--writers",
        type=int,
        default=0,
        help="many writers of table hot: this many processes of --writer-threads writers; "
        "their committer is killed and paused past its lease",
    )
    ap.add_argument("--writer-threads", type=int, default=4)
    ap.add_argument("--lease-ms", type=int, default=2000, help="group-commit lease (--writers)")
    ap.add_argument(
        "--after-hot",
        type=float,
        default=0.02,
        help="written-then-failed share of log and group-commit writes (--writers)",
    )
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="harness-", dir="/tmp"))
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    print(f"harness: seed {seed}, work directory {workdir}", file=sys.stderr, flush=True)
    spark = None
    keep = args.keep
    stack = ExitStack()
    try:
        if args.spark:
            spark = start_spark()
        if args.store == "s3":
            from storeutil import create_bucket, s3_options

            os.environ.update(moto_env())
            endpoint = stack.enter_context(moto_process())
            url, options = f"s3://{create_bucket(endpoint)}/wh", s3_options(endpoint)
        else:
            url, options = str(workdir / "wh"), {}
        many: dict[str, Any] = {}
        required = FAULT_KINDS
        if args.writers:
            many = {
                "writer_procs": args.writers,
                "writer_threads": args.writer_threads,
                "group_commit": {"lease_ms": args.lease_ms},
                "chaos": ChaosConfig(after_hot=args.after_hot),
            }
            required += MANY_WRITER_FAULTS
        cfg = HarnessConfig(
            url=url,
            options=options,
            workdir=workdir,
            duration_s=args.minutes * 60,
            txn_workers=args.txn_workers,
            idem_workers=args.idem_workers,
            seed=seed,
            spark=spark,
            # Reported as faults_missing if one never happened within the run (and its cap).
            require_faults=required,
            max_duration_s=args.minutes * 60 + 300,
            **many,
        )
        report = run(cfg)
        print(json.dumps({"store": args.store, **report.summary()}, indent=2))
        keep = keep or not report.ok
        return 0 if report.ok else 1
    except BaseException:
        keep = True  # what the journals hold is how to find out
        raise
    finally:
        if spark is not None:
            spark.stop()
        stack.close()
        if keep:
            print(f"harness: journals kept in {workdir}/journals", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
