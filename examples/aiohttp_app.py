"""aiohttp with certificate reload, in one line::

    python examples/aiohttp_app.py --certfile tls.crt --keyfile tls.key --host 127.0.0.1 --port 8443

The one line is ``ssl_context=reloading(app, certfile, keyfile)``: a context that follows the files,
checked in a daemon thread (never on aiohttp's event loop) for as long as the app runs (a
``cleanup_ctx`` entry stops the checks at shutdown). New connections get each new valid pair;
established ones keep theirs; a bad pair is logged once and the last good one keeps serving.
``--ca-certs`` asks for client certificates (mutual TLS), verified against a bundle reloaded too.
SIGTERM and SIGINT stop the app cleanly (aiohttp's ``run_app``).
"""

from __future__ import annotations

import argparse
import logging
import os

from aiohttp import web

from tlsreload_plugins import InvalidIdentity
from tlsreload_plugins.aiohttp import reloading


async def home(request: web.Request) -> web.Response:
    return web.json_response({"pid": os.getpid()})


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

    app = web.Application()
    app.router.add_get("/", home)
    try:
        ssl_context = reloading(
            app, options.certfile, options.keyfile, ca_certs=options.ca_certs, interval=options.interval
        )
    except (InvalidIdentity, ValueError) as e:
        parser.exit(1, f"cannot serve TLS: {e}\n")
    web.run_app(app, host=options.host, port=options.port, ssl_context=ssl_context)


if __name__ == "__main__":
    main()
