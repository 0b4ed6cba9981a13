"""Start uvicorn from Python with certificate reload: ``uvicorn.Config`` + ``uvicorn.Server``::

    python examples/programmatic_uvicorn.py --certfile tls.crt --keyfile tls.key --port 8443

Two pieces: ``ssl_context_factory=reloading_ssl_context`` makes the context uvicorn serves follow
the files, and ``reloading_certificates()`` inside the app's own lifespan checks them for exactly
as long as the app runs (``TLSReloadLifespan(app)`` around the app does the same).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from tlsreload_plugins.uvicorn import reloading_certificates, reloading_ssl_context

log = logging.getLogger("uvicorn.error")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with reloading_certificates():  # first, so checks run during slow start-up work too
        log.info("example app: startup")
        yield
        log.info("example app: shutdown")


app = FastAPI(lifespan=lifespan)


@app.get("/")
async def home() -> dict[str, int]:
    return {"pid": os.getpid()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()

    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        ssl_certfile=options.certfile,
        ssl_keyfile=options.keyfile,
        # A partial of the module-level function still pickles (needed if you pass an import string
        # with workers=N or reload=True to uvicorn.run instead).
        ssl_context_factory=functools.partial(reloading_ssl_context, interval=options.interval),
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: uvicorn.run() exits quietly too
        server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's start-up failure code, as uvicorn.run() exits


if __name__ == "__main__":
    main()
