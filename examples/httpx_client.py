"""A service calling an mTLS server with httpx, its client certificate rotating under it.

One ``httpx.Client`` for the whole run (connections kept alive, as a real service has; proxies from the
environment, as httpx's own), its transports presenting the newest certificate in the files: a rotation reaches new
connections within the interval, and kept-alive connections are replaced once their requests are done.

    python examples/httpx_client.py --cert client.crt --key client.key --cacert ca.crt \\
        --url https://localhost:8443/ --duration 60 --every 200

Prints one JSON line per request: {"t": ..., "ok": true, "peer": "<the answer>"} or "ok": false with "error".
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tlsreload_plugins.client import ClientIdentity


def options(description: str) -> argparse.Namespace:
    """The command line (examples/httpx2_client.py and the async examples take the same)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--cert", required=True, help="client certificate (PEM, chain after it)")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    parser.add_argument("--cacert", required=True, help="CAs that the server's certificate is verified against")
    parser.add_argument("--url", required=True, help="the URL to GET")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run")
    parser.add_argument("--every", type=float, default=500.0, help="milliseconds between requests")
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks of the files")
    args = parser.parse_args()
    # Its reloads and refusals on stderr, one line each; the answers on stdout.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args


def run(args: argparse.Namespace, reloading_client: Callable[..., Any]) -> int:
    """GET ``args.url`` every ``args.every`` ms through one client made by ``reloading_client`` (httpx's glue, or
    httpx2's: the same names and arguments)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    identity = ClientIdentity(args.cert, args.key, cafile=args.cacert, interval=args.interval)
    with identity, reloading_client(identity, timeout=5.0) as client:
        end = time.monotonic() + args.duration
        while not stop.is_set() and time.monotonic() < end:
            line: dict[str, object] = {"t": time.time()}
            try:
                response = client.get(args.url)
                response.raise_for_status()
                line.update(ok=True, peer=response.text.strip())
            except Exception as e:
                line.update(ok=False, error=repr(e))
            print(json.dumps(line), flush=True)
            stop.wait(args.every / 1000)
    return 0


def main() -> int:
    from tlsreload_plugins.client.httpx import reloading_client  # here: httpx2_client.py runs without httpx

    return run(options(__doc__ or ""), reloading_client)


if __name__ == "__main__":
    sys.exit(main())
