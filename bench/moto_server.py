"""A moto S3 server with atomic conditional puts, in its own process (used by bench/writers.py).

    python bench/moto_server.py [--latency-ms MS]   # prints the endpoint URL on its first line

moto (5.2) checks ``If-None-Match`` / ``If-Match`` and then writes, with no lock, so two
racing conditional PUTs can both succeed — which would let two writers both win one log
version. The tests serialise moto's PutObject handler with a lock in their own process
(``tests/storeutil.make_moto_conditional_puts_atomic``); a benchmark runs the server in a
process of its own (so that the server's CPU is not the writers'), so the lock has to live
in that process: this launcher wraps the handler, then serves. It stops when its standard
input is closed (the benchmark closes it, or dies).

``--latency-ms`` delays every request by that much in the server, as an object store's round
trip would: unlike a client-side wrapper (``LatencyStore``), it also delays the requests
pyarrow's own S3 client makes (large segments' ranged reads, segment writes).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
import time
from typing import Any

from moto import server as moto_server
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer


def make_puts_atomic() -> None:
    """Serialise PutObject so that its condition check and its write are one step."""
    lock = threading.Lock()
    original = S3Response.put_object

    @functools.wraps(original)
    def put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(self, *args, **kwargs)

    S3Response.put_object = put_object  # type: ignore[method-assign]


def add_latency(latency_ms: float) -> None:
    """Delay every request by ``latency_ms`` before the server handles it."""
    dispatcher = moto_server.DomainDispatcherApplication
    original = dispatcher.__call__

    def delayed(self: Any, environ: Any, start_response: Any) -> Any:
        time.sleep(latency_ms / 1000)
        return original(self, environ, start_response)

    dispatcher.__call__ = delayed  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    make_puts_atomic()
    if args.latency_ms > 0:
        add_latency(args.latency_ms)
    # The server logs every request (412s included) to stderr: keep the bench output clean.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"http://{host}:{port}", flush=True)
    try:
        sys.stdin.read()  # until the parent closes the pipe
    finally:
        server.stop()


if __name__ == "__main__":
    main()
