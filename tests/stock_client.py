"""httpx as users run it without tlsreload: the client certificate loaded once, when the client is made
(``httpx.Client(verify=context)``), then one long-lived client. The same command line and output as
examples/httpx_client.py, for the tests that set the two side by side."""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import sys
import threading
import time

import httpx


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--cert", "--key", "--cacert", "--url"):
        parser.add_argument(name, required=True)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=500.0)
    parser.add_argument("--interval", type=float, default=None, help="accepted and ignored: nothing is checked")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    context = ssl.create_default_context(cafile=args.cacert)
    context.load_cert_chain(args.cert, args.key)
    with httpx.Client(verify=context, timeout=5.0) as client:
        end = time.monotonic() + args.duration
        while not stop.is_set() and time.monotonic() < end:
            line: dict[str, object] = {"t": time.time()}
            try:
                response = client.get(args.url)
                line.update(ok=response.status_code == 200, peer=response.text.strip())
            except Exception as e:
                line.update(ok=False, error=repr(e))
            print(json.dumps(line), flush=True)
            stop.wait(args.every / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
