"""The servers ``asyncio_servers_handshakes.py`` measures: aiohttp, websockets or Tornado, one process, answering
``GET /`` with :mod:`tlsbench_apps`' body (``pid=N tlsreload=0|1 ...``), stock or with the plugin::

    python benchmarks/asyncio_bench_servers.py SERVER stock|plugin --certfile C --keyfile K --port P

SERVER is ``aiohttp``, ``websockets``, ``tornado`` or ``tornado-dict``. Stock loads its pair once (aiohttp and
websockets: an ``ssl.create_default_context(Purpose.CLIENT_AUTH)`` with ``load_cert_chain``; Tornado:
``ssl_options_to_context`` of its ``ssl_options`` dictionary, called once). ``tornado-dict`` is Tornado given
the dictionary itself, as its documentation shows: Tornado then builds a context from it, reading the files,
for every connection it accepts. The plugin side is the documented one line
(``tlsreload_plugins.aiohttp.reloading``, ``.websockets.reloading``, ``.tornado.reloading``), whose
recipe builds the same context. The stock side never imports ``tlsreload_plugins`` (the answer says so).
SIGTERM stops either cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
from collections.abc import AsyncIterator

import tlsbench_apps


def stock_context(options: argparse.Namespace) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(options.certfile, options.keyfile)
    return context


async def wait_for_stop() -> None:
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    await stopping.wait()


def serve_aiohttp(options: argparse.Namespace) -> None:
    from aiohttp import web

    async def home(request: web.Request) -> web.Response:
        return web.Response(body=tlsbench_apps._body(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/", home)
    if options.side == "plugin":
        from tlsreload_plugins.aiohttp import reloading

        context = reloading(app, options.certfile, options.keyfile)
    else:
        context = stock_context(options)
    web.run_app(app, host="127.0.0.1", port=options.port, ssl_context=context, print=None, access_log=None)


def serve_websockets(options: argparse.Namespace) -> None:
    import http

    from websockets.asyncio.server import ServerConnection, serve
    from websockets.http11 import Request, Response

    async def echo(websocket: ServerConnection) -> None:
        async for message in websocket:
            await websocket.send(message)

    def plain_http(connection: ServerConnection, request: Request) -> Response:
        return connection.respond(http.HTTPStatus.OK, tlsbench_apps._body().decode())

    @contextlib.asynccontextmanager
    async def stock() -> AsyncIterator[ssl.SSLContext]:
        yield stock_context(options)

    async def main() -> None:
        if options.side == "plugin":
            from tlsreload_plugins.websockets import reloading

            tls = reloading(options.certfile, options.keyfile)
        else:
            tls = stock()
        async with tls as context, serve(echo, "127.0.0.1", options.port, ssl=context, process_request=plain_http):
            await wait_for_stop()

    asyncio.run(main())


def serve_tornado(options: argparse.Namespace) -> None:
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    class Home(RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "text/plain")
            self.write(tlsbench_apps._body())

    from tornado.netutil import ssl_options_to_context

    ssl_options = {"certfile": options.certfile, "keyfile": options.keyfile}
    context: ssl.SSLContext | dict[str, str]
    if options.side == "plugin":
        from tlsreload_plugins.tornado import reloading

        context = reloading(ssl_options).context()
    elif options.server == "tornado-dict":
        context = ssl_options  # Tornado builds a context from the dictionary for every connection
    else:
        context = ssl_options_to_context(ssl_options, server_side=True)  # the pair loaded once

    async def main() -> None:
        server = HTTPServer(Application([(r"/", Home)]), ssl_options=context)
        server.listen(options.port, "127.0.0.1")
        await wait_for_stop()
        server.stop()

    asyncio.run(main())


SERVERS = {
    "aiohttp": serve_aiohttp,
    "websockets": serve_websockets,
    "tornado": serve_tornado,
    "tornado-dict": serve_tornado,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("side", choices=("stock", "plugin"))
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    SERVERS[options.server](options)


if __name__ == "__main__":
    main()
