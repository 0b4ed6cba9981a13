"""A plain threaded TLS server kept fresh by the reload core: what the tests run as a subprocess.

    python tests/tls_server.py --cert C --key K [--ca CA] [--password P] [--interval S] [--status FILE]

Logs go to stderr (so the ``tlsreload_plugins`` lines can be checked), the port goes on stdout's
first line. Each connection: handshake, write ``b"ok\\n"``, close. SIGTERM stops it with exit 0.
An invalid pair at start-up exits 2 with one line on stderr and no traceback.

The tests also import :func:`make_recipe` and :func:`serving` to run the same server in-process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socketserver
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from tlsreload_plugins import InvalidIdentity, Outcome, Reloader, Status, ThreadDriver

HOST = "127.0.0.1"


def make_recipe(
    cert: str, key: str | None, ca: str | None = None, password: str | None = None
) -> Callable[[], ssl.SSLContext]:
    """The context a small server would build: the pair, and client certificates required when ``ca`` is given."""

    def recipe() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key, password)
        if ca:
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    return recipe


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        context: ssl.SSLContext = self.server.context  # type: ignore[attr-defined]
        self.request.settimeout(10)
        with context.wrap_socket(self.request, server_side=True) as tls:
            tls.sendall(b"ok\n")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__((HOST, 0), _Handler)
        self.context = context

    def handle_error(self, request: object, client_address: object) -> None:
        # Refused handshakes are part of the tests (old client CA, TLS 1.2 client): not log noise.
        pass


@contextmanager
def serving(context: ssl.SSLContext) -> Iterator[int]:
    """Serve ``context`` in a background thread for the ``with`` block; yields the port."""
    server = _Server(context)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _status_writer(path: str) -> Callable[[Outcome, Status], None]:
    # Written atomically after every check, so a test can count checks without timing them.
    def write(outcome: Outcome, status: Status) -> None:
        data = {
            "outcome": outcome.value,
            "checks": status.checks,
            "reloads": status.reloads,
            "failures": status.failures,
            "last_error": status.last_error,
            "serial": status.leaf.serial,
        }
        tmp = f"{path}.tmp"
        Path(tmp).write_text(json.dumps(data))
        os.replace(tmp, path)

    return write


def _stop_on_sigterm() -> threading.Event:
    # The handler only sets a flag. Under gevent it runs in whichever greenlet is current (often the
    # reloader's), where raising SystemExit would end only that greenlet and blocking is not allowed.
    stopping = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, handler)
    return stopping


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key")
    parser.add_argument("--ca", help="client-CA bundle: client certificates are then required")
    parser.add_argument("--password")
    parser.add_argument("--interval", type=float)
    parser.add_argument("--status", help="write the reloader's status as JSON to this file after every check")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        reloader = Reloader(
            args.cert,
            args.key,
            recipe=make_recipe(args.cert, args.key, args.ca, args.password),
            ca_certs=args.ca,
            password=args.password,
            interval=args.interval,
            on_check=_status_writer(args.status) if args.status else None,
        )
    except (InvalidIdentity, ValueError) as e:
        print(f"tls_server: cannot start: {e}", file=sys.stderr)
        return 2

    server = _Server(reloader.context)
    server.timeout = 0.1  # how often the loop looks at the SIGTERM flag
    stopping = _stop_on_sigterm()
    with ThreadDriver(reloader):  # logs its start line before the port is printed: ready means ready
        print(server.server_address[1], flush=True)
        while not stopping.is_set():
            server.handle_request()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
