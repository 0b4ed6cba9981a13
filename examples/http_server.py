"""The standard library's ``http.server`` with certificate reload, in one line::

    python examples/http_server.py --certfile tls.crt --keyfile tls.key --port 8443

``with fresh_context(certfile, keyfile) as context:`` gives the ``ssl.SSLContext`` every accepted
connection is wrapped with, and checks the files in a daemon thread until the block ends. The handshake
runs in the connection's own thread (``do_handshake_on_connect=False``), so a slow or silent client
never holds up ``accept``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tlsreload_plugins import fresh_context

HANDSHAKE_TIMEOUT = 10.0

log = logging.getLogger("example.http_server")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext) -> None:
        self.context = context
        super().__init__(address, Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        # In the connection's thread: the handshake, then the request.
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            request.do_handshake()
        except (OSError, ssl.SSLError) as e:
            log.debug("handshake with %s failed: %s", client_address, e)
            return
        request.settimeout(None)
        super().finish_request(request, client_address)


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)  # SIGTERM: leave serve_forever, close the socket, stop the checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")

    signal.signal(signal.SIGTERM, _exit)
    with (
        fresh_context(options.certfile, options.keyfile, interval=options.interval) as context,
        TLSServer((options.host, options.port), context) as server,
    ):
        log.info("serving https://%s:%d", options.host, options.port)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C
            server.serve_forever()


if __name__ == "__main__":
    main()
