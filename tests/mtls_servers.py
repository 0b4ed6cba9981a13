"""mTLS servers for the client tests: each requires a client certificate, answers with the serial of the one it
saw, and re-reads its own files (certificate, key, client-CA bundle) for every new connection, so that what the
test writes is what the next handshake gets, with no reloader of ours in between.

``python tests/mtls_servers.py http --cert C --key K --client-ca CA --port P``: HTTP/1.1 with keep-alive; ``GET``
answers the client certificate's serial (``openssl x509 -serial``'s form) and a newline; ``GET /?until=PATH`` sends the
serial, then holds the newline back until the file PATH exists (at most a minute): a response in flight, its
connection lent meanwhile, for as long as the test wants. ``GET /redirect`` answers ``302`` to ``/``, and
``GET /status/404`` answers ``404``; ``POST`` reads the whole body and answers the serial and its length.
``python tests/mtls_servers.py grpc ...``: gRPC, ``/echo.Echo/Who`` (raw bytes, no protobuf) answers the same;
``/echo.Echo/Held`` (unary) answers it once the file named by the request exists, and ``/echo.Echo/Twice`` (unary
to stream) answers it at once and again once that file exists: calls that stay in flight as long as a test wants.
Each writes ``ready`` on a line once it listens; SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cryptography import x509

from tlsreload_plugins.identity import serial_hex


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """A new context from the files as they are now (a connection's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=read(client_ca).decode())
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def serial_of_der(der: bytes) -> str:
    return serial_hex(x509.load_der_x509_certificate(der).serial_number)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's pooled connection keeps its certificate
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK wait between them

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/redirect":
            self._answer(302, b"", location="/")
            return
        if path == "/status/404":
            self._answer(404, b"not found\n")
            return
        der = self.connection.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        body = (serial_of_der(der) if der else "none").encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:  # the client asked for it: say so, or it may reuse a connection being closed
            self.send_header("Connection", "close")
        self.end_headers()
        until = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("until")
        if until:
            self.wfile.write(body[:-1])
            self.wfile.flush()
            deadline = time.monotonic() + 60
            while not os.path.exists(until[0]) and time.monotonic() < deadline:
                time.sleep(0.02)  # this connection's own thread: others are answered meanwhile
            body = body[-1:]
        self.wfile.write(body)

    def do_POST(self) -> None:
        """An upload: the whole body read (an answer sent before it would race the client still sending it), then
        the serial and the number of bytes received."""
        length = int(self.headers.get("Content-Length") or 0)
        received = 0
        while received < length:
            chunk = self.rfile.read(min(65536, length - received))
            if not chunk:
                break
            received += len(chunk)
        der = self.connection.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        self._answer(200, f"{serial_of_der(der) if der else 'none'} {received}\n".encode())

    def _answer(self, status: int, body: bytes, location: str | None = None) -> None:
        """A whole answer of its own (a redirect, an error status), the connection kept alive as for the rest."""
        self.send_response(status)
        if location is not None:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    files: tuple[str, str, str]

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        # In the connection's thread: the handshake never holds up accepting others.
        request.settimeout(30)
        try:
            tls = server_context(*self.files).wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            request.close()
            return
        super().finish_request(tls, client_address)


def serve_http(args: argparse.Namespace, stop: threading.Event) -> None:
    server = _Server(("127.0.0.1", args.port), _Handler)
    server.files = (args.cert, args.key, args.client_ca)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    print("ready", flush=True)
    stop.wait()
    server.shutdown()


def serve_grpc(args: argparse.Namespace, stop: threading.Event) -> None:
    import grpc

    def configuration() -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(read(args.key), read(args.cert))], root_certificates=read(args.client_ca)
        )

    def who(request: bytes, context: Any) -> bytes:
        pem = context.auth_context().get("x509_pem_cert", [b""])[0]
        return serial_hex(x509.load_pem_x509_certificate(pem).serial_number).encode() if pem else b"none"

    def released(path: bytes, context: Any) -> None:
        """Return once the file at ``path`` exists (or the call ends, or 60 s pass)."""
        ended = threading.Event()
        context.add_callback(ended.set)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and not ended.is_set() and time.monotonic() < deadline:
            ended.wait(0.02)

    def held(request: bytes, context: Any) -> bytes:
        released(request, context)
        return who(request, context)

    def twice(request: bytes, context: Any) -> Iterator[bytes]:
        yield who(request, context)
        released(request, context)
        yield who(request, context)

    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    handlers = {
        "Who": grpc.unary_unary_rpc_method_handler(who),
        "Held": grpc.unary_unary_rpc_method_handler(held),
        "Twice": grpc.unary_stream_rpc_method_handler(twice),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", handlers),))
    # The fetcher runs for every new connection: it returns the files as they are now.
    credentials = grpc.dynamic_ssl_server_credentials(
        configuration(), configuration, require_client_authentication=True
    )
    server.add_secure_port(f"127.0.0.1:{args.port}", credentials)
    server.start()
    print("ready", flush=True)
    while not stop.wait(0.5):  # a timed wait: the signal handler runs in this thread
        pass
    server.stop(1).wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["http", "grpc"])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    (serve_grpc if args.kind == "grpc" else serve_http)(args, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
