"""A service calling an mTLS server with httpx on its SPIFFE identity: the X.509 SVID and trust bundle that the
Workload API streams, kept fresh through rotations and an agent that goes away and comes back.

    SPIFFE_ENDPOINT_SOCKET=unix:///run/spire/agent.sock \\
        python examples/spiffe_httpx_client.py --url https://localhost:8443/ --duration 60 --every 200

The SVID is the client certificate, the trust domain's bundle the CAs the server's certificate is verified against
(its hostname checked as usual: the server's SVID names it as a DNS name). Prints one JSON line per request:
{"t": ..., "ok": true, "peer": "<the answer>"} or "ok": false with "error".
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.httpx import reloading_client
from tlsreload_plugins.sources.spiffe import SpiffeSource


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=None, help="the Workload API (default $SPIFFE_ENDPOINT_SOCKET)")
    parser.add_argument("--url", required=True, help="the URL to GET")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run")
    parser.add_argument("--every", type=float, default=500.0, help="milliseconds between requests")
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks of the SVID's files")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is on stdout already

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with SpiffeSource(args.socket) as source:  # waits for the first SVID
        identity = ClientIdentity.from_files(source.files, interval=args.interval)
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


if __name__ == "__main__":
    sys.exit(main())
