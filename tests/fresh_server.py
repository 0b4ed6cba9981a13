"""A small TLS server on :func:`tlsreload_plugins.fresh_context` for tests/test_fresh.py: every option of
``fresh_context`` on the command line, ``GET /`` answers ``{"pid": ...}`` and ``GET /status`` the reloader's
counters. The handshake runs in each connection's thread, as in examples/http_server.py."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tlsreload_plugins import FreshContext, fresh_context


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"  # keep-alive: a client can still read the certificate of the connection

    def do_GET(self) -> None:
        status = self.server.fresh.status()
        answer: dict[str, Any] = {"pid": os.getpid()}
        if self.path == "/status":
            answer.update(
                serial=status.leaf.serial,
                checks=status.checks,
                reloads=status.reloads,
                failures=status.failures,
                last_error=status.last_error,
            )
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], fresh: FreshContext) -> None:
        self.fresh = fresh
        super().__init__(address, Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        return self.fresh.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)
        try:
            request.do_handshake()
        except OSError as e:  # ssl.SSLError included: a client refused (mTLS) ends here
            logging.getLogger("fresh_server").info("handshake with %s failed: %s", client_address, e)
            return
        request.settimeout(None)
        super().finish_request(request, client_address)


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile")
    parser.add_argument("--ca-certs")
    parser.add_argument("--password-file")
    parser.add_argument("--sni", action="append")
    parser.add_argument("--interval", type=float)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit)
    fresh = fresh_context(
        options.certfile,
        options.keyfile,
        ca_certs=options.ca_certs,
        password_file=options.password_file,
        sni=options.sni,
        interval=options.interval,
    )
    with fresh, Server(("127.0.0.1", options.port), fresh) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
