"""A service calling an mTLS gRPC server, its client certificate rotating under it.

One channel for the whole run (its connection kept, as a real service has) and one multicallable made from it once,
as a stub is: each call goes through the channel made from the newest certificate in the files, so a rotation
reaches new calls within the interval, and the replaced channel is closed once its calls are done.

    python examples/grpc_client.py --cert client.crt --key client.key --cacert ca.crt \\
        --target localhost:50051 --duration 60 --every 200

A unary call with raw bytes (no protobuf): an empty request; the response's bytes are the answer. Prints one JSON
line per call: {"t": ..., "ok": true, "peer": "<the answer>"} or "ok": false with "error".
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
from tlsreload_plugins.client.grpc import ReloadingChannel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True, help="client certificate (PEM, chain after it)")
    parser.add_argument("--key", required=True, help="its private key (PEM, no password)")
    parser.add_argument("--cacert", required=True, help="CAs that the server's certificate is verified against")
    parser.add_argument("--target", required=True, help="the server, HOST:PORT")
    parser.add_argument("--method", default="/echo.Echo/Who", help="the unary method to call")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run")
    parser.add_argument("--every", type=float, default=500.0, help="milliseconds between calls")
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks of the files")
    args = parser.parse_args()
    # Its reloads and refusals on stderr, one line each; the answers on stdout.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    identity = ClientIdentity(args.cert, args.key, cafile=args.cacert, interval=args.interval)
    with identity, ReloadingChannel(identity, args.target) as channel:
        who = channel.unary_unary(args.method)  # once, as a stub does
        end = time.monotonic() + args.duration
        while not stop.is_set() and time.monotonic() < end:
            line: dict[str, object] = {"t": time.time()}
            try:
                line.update(ok=True, peer=who(b"", timeout=5.0).decode(errors="replace").strip())
            except Exception as e:
                line.update(ok=False, error=repr(e))
            print(json.dumps(line), flush=True)
            stop.wait(args.every / 1000)  # a timed wait: the SIGTERM handler runs when this thread runs Python
    return 0


if __name__ == "__main__":
    sys.exit(main())
