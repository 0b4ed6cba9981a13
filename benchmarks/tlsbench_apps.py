"""The tiny apps the benchmark servers serve: WSGI and ASGI, both answering ``pid=N tlsreload=0|1 ...``.

The pid tells the benchmark which worker answered (rotation latency needs every worker);
``tlsreload`` says whether the plugin is loaded in that worker, so a run can prove that the
"plugin" server really runs the plugin and the "stock" server really does not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

WATCHED_MODULES = ("prometheus_client", "asyncio", "cryptography")
"""Modules whose presence in the worker each answer reports (``prometheus_client=0|1 ...``): what the
memory benchmark names as the cause of a worker's size."""


def _body() -> bytes:
    loaded = int("tlsreload_plugins" in sys.modules)
    watched = " ".join(f"{name}={int(name in sys.modules)}" for name in WATCHED_MODULES)
    return f"pid={os.getpid()} tlsreload={loaded} {watched}\n".encode()


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = _body()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = _body()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
