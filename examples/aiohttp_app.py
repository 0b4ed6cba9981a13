"""aiohttp with certificate reload, using only the core API::

    python examples/aiohttp_app.py --certfile tls.crt --keyfile tls.key --port 8443

aiohttp takes an ``ssl.SSLContext``: hand it ``reloader.context`` once, and let an
:class:`~tlsreload_plugins.AsyncioDriver` check the files on aiohttp's own event loop for as long as
the app runs (a ``cleanup_ctx`` entry starts it before the first request and stops it at shutdown).
New connections get each new valid pair; established ones keep theirs; a bad pair is logged and the
last good one keeps serving.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from tlsreload_plugins import AsyncioDriver, Reloader


def context_recipe(certfile: str, keyfile: str) -> ssl.SSLContext:
    """How this server builds its context; the reloader calls it again for every new pair."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


async def home(request: web.Request) -> web.Response:
    return web.json_response({"pid": os.getpid()})


def make_app(reloader: Reloader) -> web.Application:
    async def checking(app: web.Application) -> AsyncIterator[None]:
        async with AsyncioDriver(reloader):
            yield

    app = web.Application()
    app.router.add_get("/", home)
    app.cleanup_ctx.append(checking)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")

    reloader = Reloader(
        options.certfile,
        options.keyfile,
        recipe=lambda: context_recipe(options.certfile, options.keyfile),
        interval=options.interval,
    )
    web.run_app(make_app(reloader), host=options.host, port=options.port, ssl_context=reloader.context)


if __name__ == "__main__":
    main()
