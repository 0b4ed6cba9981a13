"""aiohttp with certificate reload, in one line::

    python examples/aiohttp_app.py --certfile tls.crt --keyfile tls.key --port 8443

aiohttp takes an ``ssl.SSLContext``: :func:`~tlsreload_plugins.fresh_context` returns one that stays
fresh, with the files checked in a daemon thread (never on aiohttp's event loop), and a ``cleanup_ctx``
entry stops the checks at shutdown. New connections get each new valid pair; established ones keep
theirs; a bad pair is logged once and the last good one keeps serving.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator

from aiohttp import web

from tlsreload_plugins import FreshContext, fresh_context


async def home(request: web.Request) -> web.Response:
    return web.json_response({"pid": os.getpid()})


def make_app(fresh: FreshContext) -> web.Application:
    async def closing(app: web.Application) -> AsyncIterator[None]:
        yield
        fresh.close()  # at shutdown: stop the checks

    app = web.Application()
    app.router.add_get("/", home)
    app.cleanup_ctx.append(closing)
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

    fresh = fresh_context(options.certfile, options.keyfile, interval=options.interval)
    web.run_app(make_app(fresh), host=options.host, port=options.port, ssl_context=fresh.context)


if __name__ == "__main__":
    main()
