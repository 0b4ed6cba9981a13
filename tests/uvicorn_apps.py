"""ASGI apps for the uvicorn tests. Each answers ``pid=<serving pid>`` so a test knows which worker served it.

Run as a script, it serves one of them through ``uvicorn.run(..., ssl_context_factory=reloading_ssl_context)``
(the programmatic way without the drop-in)::

    python tests/uvicorn_apps.py APP_NAME PORT CERTFILE KEYFILE [--lifespan-grace SECONDS] [--ca-certs CA [--crl CRL]]

``--ca-certs`` requires client certificates of that bundle (``ssl_cert_reqs=ssl.CERT_REQUIRED``); ``--crl`` hands
the factory its CRL file as a program does, ``functools.partial(reloading_ssl_context, crl=CRL)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from gunicorn_apps import asgi, respond_pid
from tlsreload_plugins.uvicorn import TLSReloadLifespan

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

log = logging.getLogger("uvicorn.error")


def _checking() -> bool:
    """Whether tlsreload's ticker task runs on this loop."""
    return any(task.get_name() == "tlsreload" and not task.done() for task in asyncio.all_tasks())


plain = asgi
"""A bare ASGI app that speaks the lifespan protocol."""


class H11WithALPN(H11Protocol):
    """uvicorn's h11 protocol naming its ALPN protocols, as uvicorn's HTTP/2 protocol classes do: uvicorn's default
    factory then sets them on the context it builds (``uvicorn.config.Config.load``)."""

    alpn_protocols: ClassVar[list[str]] = ["http/1.1"]


async def no_lifespan(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """A bare ASGI app that refuses the lifespan protocol, as Django's ASGIHandler does."""
    if scope["type"] != "http":
        raise ValueError(f"this app can only handle HTTP connections, not {scope['type']}")
    await respond_pid(send)


@contextlib.asynccontextmanager
async def _own_lifespan(app: Any) -> AsyncIterator[None]:
    name = type(app).__name__
    log.info("%s app: own startup (tlsreload checking: %s)", name, _checking())
    yield
    log.info("%s app: own shutdown (tlsreload checking: %s)", name, _checking())


async def _home(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"pid={os.getpid()}")


starlette_app = Starlette(routes=[Route("/", _home)], lifespan=_own_lifespan)
"""A Starlette app with its own lifespan, the extension added as middleware."""
starlette_app.add_middleware(TLSReloadLifespan)

_fastapi = FastAPI(lifespan=_own_lifespan)
_fastapi.add_api_route("/", _home)
fastapi_app = TLSReloadLifespan(_fastapi)
"""A FastAPI app with its own lifespan, wrapped by the extension."""

unwrapped_app = Starlette(routes=[Route("/", _home)], lifespan=_own_lifespan)
"""A Starlette app with its own lifespan and no extension."""


if __name__ == "__main__":
    import argparse
    import functools
    import ssl

    import uvicorn

    import tlsreload_plugins.uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("app")
    parser.add_argument("port", type=int)
    parser.add_argument("certfile")
    parser.add_argument("keyfile")
    parser.add_argument("--lifespan-grace", type=float)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--ca-certs")
    parser.add_argument("--crl")
    options = parser.parse_args()
    if options.lifespan_grace is not None:
        tlsreload_plugins.uvicorn.LIFESPAN_GRACE = options.lifespan_grace
    factory = tlsreload_plugins.uvicorn.reloading_ssl_context
    if options.crl:
        factory = functools.partial(factory, crl=options.crl)
    mtls = {"ssl_ca_certs": options.ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED} if options.ca_certs else {}
    uvicorn.run(
        globals()[options.app],
        host="127.0.0.1",
        port=options.port,
        ssl_certfile=options.certfile,
        ssl_keyfile=options.keyfile,
        ssl_context_factory=factory,
        log_level=options.log_level,
        **mtls,
    )
