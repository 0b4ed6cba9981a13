"""The hostile-files app (:mod:`hostile_apps`: ``/`` answers ``pid=<pid>``, ``/status``, ``/metrics``, every answer
with an ``x-worker-pid`` header) served by aiohttp, websockets or Tornado, reloading through their glue::

    python -m asyncio_server_apps aiohttp|websockets|tornado --certfile C --keyfile K --port P [--processes N]

``--processes N`` (Tornado only) serves from N processes under ``tornado.process.fork_processes``; the
parent stops its children on SIGTERM (see examples/tornado_app.py, whose lifeline this reuses). The check
interval and metrics come from ``$TLSRELOAD_INTERVAL`` and ``$TLSRELOAD_METRICS``. Log lines carry the
process id as ``[pid] [LEVEL]``, as gunicorn's do. ``aiohttp_app`` is also an app factory for gunicorn's
``aiohttp.GunicornWebWorker``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import gunicorn_apps
import hostile_apps

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def answer(path: str) -> tuple[bytes, str]:
    """The body and content type of ``GET path``."""
    route = hostile_apps.ROUTES.get(path)
    if route is None and gunicorn_apps.OPENS_UNDER:  # test_footprint's probe: the opens of the watched files too
        return gunicorn_apps.modules_body(), "text/plain"
    if route is None:
        return f"pid={os.getpid()}".encode(), "text/plain"
    produce, content_type = route
    return produce(), content_type


# --- aiohttp --------------------------------------------------------------------------------------


async def aiohttp_app() -> object:
    """An app factory (``asyncio_server_apps:aiohttp_app``)."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body, content_type = answer(request.path)
        response = web.Response(body=body, headers={"X-Worker-Pid": str(os.getpid())})
        response.content_type = content_type.split(";")[0]
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


def serve_aiohttp(options: argparse.Namespace) -> None:
    from aiohttp import web

    from tlsreload_plugins.aiohttp import reloading

    app = asyncio.run(aiohttp_app())
    context = reloading(app, options.certfile, options.keyfile, ca_certs=options.ca_certs, crl=options.crl)
    web.run_app(app, host=options.host, port=options.port, ssl_context=context, print=None, access_log=None)


# --- websockets -----------------------------------------------------------------------------------


def serve_websockets(options: argparse.Namespace) -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.datastructures import Headers
    from websockets.http11 import Request, Response

    from tlsreload_plugins.websockets import reloading

    async def echo(websocket: ServerConnection) -> None:
        async for message in websocket:
            await websocket.send(message)

    def plain_http(connection: ServerConnection, request: Request) -> Response | None:
        if "websocket" in request.headers.get("Upgrade", "").lower():
            return None
        body, content_type = answer(request.path)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close")]
        return Response(200, "OK", Headers([*headers, ("X-Worker-Pid", str(os.getpid()))]), body)

    async def main() -> None:
        stopping = stop_on_signals()
        async with (
            reloading(options.certfile, options.keyfile, ca_certs=options.ca_certs, crl=options.crl) as context,
            serve(echo, options.host, options.port, ssl=context, process_request=plain_http),
        ):
            await stopping.wait()

    logging.getLogger("websockets").setLevel(logging.WARNING)
    asyncio.run(main())


# --- Tornado --------------------------------------------------------------------------------------


def serve_tornado(options: argparse.Namespace) -> None:
    import ssl

    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application, RequestHandler

    from tlsreload_plugins.tornado import reloading

    sys.path.insert(0, str(EXAMPLES))
    from tornado_app import closed, fork_with_lifeline

    class Handle(RequestHandler):
        def get(self, path: str) -> None:
            body, content_type = answer("/" + path)
            self.set_header("Content-Type", content_type)
            self.set_header("X-Worker-Pid", str(os.getpid()))
            self.write(body)

    ssl_options: dict[str, object] = {"certfile": options.certfile, "keyfile": options.keyfile}
    if options.ca_certs:
        ssl_options.update(ca_certs=options.ca_certs, cert_reqs=ssl.CERT_REQUIRED)
    tls = reloading(ssl_options, crl=options.crl)
    sockets = bind_sockets(options.port, options.host)
    lifeline = fork_with_lifeline(options.processes) if options.processes > 1 else None
    context = tls.context(stopped=lambda: lifeline is not None and closed(lifeline))

    async def main() -> None:
        server = HTTPServer(Application([(r"/(.*)", Handle)]), ssl_options=context)
        server.add_sockets(sockets)
        stopping = stop_on_signals()
        if lifeline is not None:
            loop = asyncio.get_running_loop()
            loop.add_reader(lifeline, lambda: (loop.remove_reader(lifeline), stopping.set()))
        await stopping.wait()
        server.stop()
        await server.close_all_connections()

    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    asyncio.run(main())
    tls.close()


def stop_on_signals() -> asyncio.Event:
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    return stopping


SERVERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "aiohttp": serve_aiohttp,
    "websockets": serve_websockets,
    "tornado": serve_tornado,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--ca-certs")
    parser.add_argument("--crl", help="CRLs for the CAs of --ca-certs, in the server's own convention (a keyword)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    SERVERS[options.server](options)


if __name__ == "__main__":
    main()
