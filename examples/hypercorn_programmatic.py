"""Serve an ASGI app with hypercorn from Python, reloading certificates: ``ReloadingConfig`` + ``serve``::

    python examples/hypercorn_programmatic.py --certfile tls.crt --keyfile tls.key --port 8443
    python examples/hypercorn_programmatic.py --certfile tls.crt --keyfile tls.key --loop trio

``ReloadingConfig`` is ``hypercorn.config.Config`` whose ``create_ssl_context()`` follows the files:
build it as any hypercorn Config (attributes, ``from_toml``, ``from_mapping``), then hand it to
``hypercorn.asyncio.serve`` or ``hypercorn.trio.serve``. Checks run from the serving loop, in a
worker thread, until the loop ends. SIGINT or SIGTERM stop the server gracefully under both loops.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.asyncio
import hypercorn.trio

from tlsreload_plugins.hypercorn import ReloadingConfig

log = logging.getLogger("hypercorn.error")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Answers ``{"pid": <serving pid>}``; logs its lifespan."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                log.info("example app: startup")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                log.info("example app: shutdown")
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = json.dumps({"pid": os.getpid()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _until_stop_signal_trio() -> None:
    # hypercorn.trio.serve installs no signal handlers (hypercorn.asyncio.serve does).
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--ca-certs", help="client CA bundle: clients must present a certificate it signed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    parser.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio")
    options = parser.parse_args()

    config = ReloadingConfig()
    config.bind = [f"{options.host}:{options.port}"]
    config.certfile, config.keyfile = options.certfile, options.keyfile
    if options.ca_certs:
        config.ca_certs = options.ca_certs
        config.verify_mode = ssl.CERT_REQUIRED
    config.tls_reload_interval = options.interval
    config.check_tls_files()  # unusable files: one error line and exit 1, before serving anything

    if options.loop == "trio":
        import trio

        trio.run(functools.partial(hypercorn.trio.serve, app, config, shutdown_trigger=_until_stop_signal_trio))
    else:
        asyncio.run(hypercorn.asyncio.serve(app, config))


if __name__ == "__main__":
    main()
