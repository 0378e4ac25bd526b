"""A process that exits without closing its producer stops cleanly on S3 (issue 9, item 3).

pyarrow finalizes its S3 client in an ``atexit`` function; a sender thread still writing
segments after that used to escape as ``pyarrow.lib.ArrowInvalid``. Each child process
below registers a slow ``atexit`` function *before* importing txntable, so it runs last and
holds the interpreter open after pyarrow's finalizer: exactly the window in which an
unstopped sender writes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from s3util import S3Location

from txntable import Consumer, TopicPartition, Warehouse

pytestmark = [pytest.mark.s3, pytest.mark.slow]

TESTS = pathlib.Path(__file__).resolve().parents[1]

PRELUDE = """
import atexit, json, sys, time
atexit.register(time.sleep, 1.5)  # registered first, so it runs after pyarrow's finalizer
from txntable import Producer, Warehouse
url, options = sys.argv[1], json.loads(sys.argv[2])
wh = Warehouse(url, storage_options=options)
"""


def run_child(s3_location: S3Location, body: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(PRELUDE) + textwrap.dedent(body),
            s3_location.url,
            json.dumps(s3_location.options),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def committed_values(wh: Warehouse) -> list[tuple[int, bytes | None]]:
    tp = TopicPartition("t", 0)
    c = Consumer(wh, isolation_level="read_committed")
    c.assign([tp])
    c.seek_to_beginning()
    out: list[tuple[int, bytes | None]] = []
    while c.position(tp) < c.end_offsets([tp])[tp]:
        out += [(r.offset, r.value) for r in c.poll(timeout_ms=0).get(tp, [])]
    return out


def exit_cleanly(s3_location: S3Location, wh: Warehouse, body: str) -> str:
    """Create table ``t``; run ``body`` in a child that exits without closing the producer.

    Returns:
        The child's stdout followed by its stderr, once checked for untyped errors.
    """
    wh.create_table("t", partitions=1)
    result = run_child(s3_location, body)
    assert result.returncode == 0, result.stderr
    for untyped in ("Traceback", "ArrowInvalid", "Exception ignored"):
        assert untyped not in result.stderr, result.stderr
    return result.stdout + result.stderr


def test_buffered_records_at_exit_fail_typed_and_nothing_is_written(
    s3_location: S3Location, s3_wh: Warehouse
) -> None:
    output = exit_cleanly(
        s3_location,
        s3_wh,
        """
        p = Producer(wh, linger_ms=300)  # the batch would become due during shutdown
        futures = [p.send("t", value=b"%d" % i, partition=0) for i in range(10)]
        print("sent", flush=True)
        """,
    )
    assert output.startswith("sent\n")
    assert "was not closed before exit: 10 buffered records were not sent" in output
    assert committed_values(s3_wh) == []


def test_batch_in_flight_at_exit_is_finished_cleanly(
    s3_location: S3Location, s3_wh: Warehouse
) -> None:
    exit_cleanly(
        s3_location,
        s3_wh,
        """
        p = Producer(wh, linger_ms=0, batch_size=1)
        first = p.send("t", value=b"0", partition=0)
        first.result(timeout=30)  # the sender has written with pyarrow's S3 client
        futures = [p.send("t", value=b"%d" % i, partition=0) for i in range(1, 50)]
        print("sent", flush=True)
        """,
    )
    # Whatever the sender had taken when the process exited landed whole, in order; the
    # rest was never written.
    values = committed_values(s3_wh)
    assert values == [(i, b"%d" % i) for i in range(len(values))] and len(values) >= 1


def test_open_transaction_at_exit_is_left_to_its_timeout(
    s3_location: S3Location, s3_wh: Warehouse
) -> None:
    output = exit_cleanly(
        s3_location,
        s3_wh,
        """
        p = Producer(wh, transactional_id="exits", transaction_timeout_ms=1)
        p.init_transactions()
        p.begin_transaction()
        p.send("t", value=b"x", partition=0)
        p.flush()
        p.send("t", value=b"y", partition=0)
        """,
    )
    assert "producer exits was not closed before exit: 1 buffered records" in output
    part = s3_wh.table("t").describe().partitions[0]
    assert (part.high_watermark, part.last_stable_offset) == (1, 0)
    assert s3_wh.recover().timed_out == ["exits"]
    assert committed_values(s3_wh) == []


def test_segment_io_after_s3_is_finalized_is_a_typed_error(s3_location: S3Location) -> None:
    result = run_child(
        s3_location,
        """
        import pyarrow.fs
        from txntable.errors import StorageError
        wh.store.put_data_file("seg", b"x")
        pyarrow.fs.finalize_s3()
        try:
            wh.store.put_data_file("seg2", b"y")
        except StorageError as e:
            print(type(e).__name__, "finalized" in str(e))
        print(wh.store.get_data_file("seg"))  # reads use boto3, not pyarrow's client
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "StorageError True\nb'x'\n"
