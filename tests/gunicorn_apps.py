"""Tiny apps for the gunicorn and uvicorn tests: each answers ``pid=<worker pid>`` so a test knows which
worker served it."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = f"pid={os.getpid()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await respond_pid(send)


async def respond_pid(send: Send) -> None:
    body = f"pid={os.getpid()}".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


WATCHED = (
    "asyncio",
    "cryptography",
    "prometheus_client",
    "tlsreload_plugins.sni",
    "tlsreload_plugins.metrics",
    "tlsreload_plugins.sources",
    "tlsreload_plugins.validation",
)
"""Modules whose presence the ``*_modules`` apps report: what a worker model does not need must not be loaded."""


OPENS_UNDER = os.environ.get("TLSTEST_OPENS_UNDER")
"""A directory (the watched files'): the ``*_modules`` apps also count the opens of paths under it in their process,
from the app's import on (before a gunicorn worker's ``post_worker_init``, which makes its reloader)."""
opened: list[str] = []


def _count_opens(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and OPENS_UNDER and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(OPENS_UNDER):
            opened.append(path)


if OPENS_UNDER:
    sys.addaudithook(_count_opens)
    # A child forked after this import (Tornado's fork_processes) counts its own opens, not its parent's.
    os.register_at_fork(after_in_child=opened.clear)


def modules_body() -> bytes:
    loaded = ",".join(m for m in WATCHED if m in sys.modules)
    return f"pid={os.getpid()} loaded={loaded} opened={len(opened)}".encode()


def wsgi_modules(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = modules_body()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi_modules(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        await asgi(scope, receive, send)
        return
    body = modules_body()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
