"""A FastAPI app to run with the drop-in command, which reloads its certificate in every worker::

    tlsreload-uvicorn fastapi_app:app --app-dir examples --host 0.0.0.0 --port 8443 \\
        --ssl-certfile /etc/tls/tls.crt --ssl-keyfile /etc/tls/tls.key --workers 2

The app itself needs nothing from tlsreload: the command wraps it with the lifespan extension.
``/tls`` shows what this worker serves, from :func:`tlsreload_plugins.uvicorn.reloaders`
(a readiness probe can alert on ``last_error``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from tlsreload_plugins.uvicorn import reloaders

log = logging.getLogger("uvicorn.error")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    log.info("example app: startup")  # open database pools and the like here
    yield
    log.info("example app: shutdown")


app = FastAPI(lifespan=lifespan)


@app.get("/")
async def home() -> dict[str, Any]:
    return {"pid": os.getpid()}


@app.get("/tls")
async def tls() -> list[dict[str, Any]]:
    return [
        {
            "certfile": status.files.certfile,
            "serial": status.leaf.serial,
            "not_after": status.leaf.not_after.isoformat(),
            "reloads": status.reloads,
            "last_error": status.last_error,
        }
        for status in (reloader.status() for reloader in reloaders())
    ]
