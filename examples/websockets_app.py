"""A websockets echo server with certificate reload::

    python examples/websockets_app.py --certfile tls.crt --keyfile tls.key --host 127.0.0.1 --port 8443

The one line is ``async with reloading(certfile, keyfile) as ssl_context`` around websockets'
``serve(..., ssl=ssl_context)``: the files are read off the event loop, then checked in a daemon thread
while the block runs. Every new connection gets the newest valid certificate; an open websocket keeps
its TLS session for as long as it stays open. ``wss://HOST:PORT/`` echoes every message; a plain HTTP
``GET /`` (no websocket upgrade) is answered ``200`` with this process's pid. ``--ca-certs`` asks for
client certificates (mutual TLS), verified against a bundle reloaded too. SIGTERM and SIGINT close the
server cleanly: open websockets get a close frame (1001, going away).
"""

from __future__ import annotations

import argparse
import asyncio
import http
import logging
import os
import signal

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from tlsreload_plugins import InvalidIdentity
from tlsreload_plugins.websockets import reloading


async def echo(websocket: ServerConnection) -> None:
    async for message in websocket:
        await websocket.send(message)


def plain_http(connection: ServerConnection, request: Request) -> Response | None:
    """Answer a request that does not ask for a websocket (a health check, a browser) with 200."""
    if "websocket" in request.headers.get("Upgrade", "").lower():
        return None  # the opening handshake goes on
    return connection.respond(http.HTTPStatus.OK, f"pid={os.getpid()}\n")


async def serve_until_stopped(options: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    async with (
        reloading(options.certfile, options.keyfile, ca_certs=options.ca_certs, interval=options.interval) as context,
        serve(echo, options.host, options.port, ssl=context, process_request=plain_http),
    ):
        logging.getLogger("websockets_app").info("serving wss://%s:%s/", options.host, options.port)
        await stopping.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--ca-certs", help="require client certificates signed by these CAs (mutual TLS)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection
    try:
        asyncio.run(serve_until_stopped(options))
    except (InvalidIdentity, ValueError) as e:
        parser.exit(1, f"cannot serve TLS: {e}\n")


if __name__ == "__main__":
    main()
