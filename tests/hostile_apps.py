"""Apps for the hostile-files tests: ``/`` answers ``pid=<worker pid>`` (as :mod:`gunicorn_apps`), ``/status``
the JSON of this worker's reloaders' ``status()`` and ``/metrics`` prometheus_client's in-process registry.

Every response carries the worker's pid in an ``x-worker-pid`` header, so a test knows whose status it read.
The reloaders are found in whichever adapter this process runs: ``tlsreload_plugins.gunicorn.reloaders()``
(every gunicorn worker class, ``UvicornWorker`` included) and ``tlsreload_plugins.uvicorn.reloaders()``
(``tlsreload-uvicorn``). Neither adapter is imported here: one that is not loaded has no reloader.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import prometheus_client

import gunicorn_apps
from gunicorn_apps import Receive, Send


def reloaders() -> list[Any]:
    """The reloaders serving TLS in this process, from whichever server's glue runs it (every glue module
    in ``tlsreload_plugins.servers`` has ``reloaders()``)."""
    found: list[Any] = []
    for name, glue in list(sys.modules.items()):
        if name.startswith("tlsreload_plugins.servers.") and hasattr(glue, "reloaders"):
            found.extend(reloader for reloader in glue.reloaders() if reloader not in found)
    return found


def plain(value: Any) -> Any:
    """``value`` with each record in it (``Status``, its ``TLSFiles`` and ``Leaf``) as a dict."""
    if hasattr(value, "_asdict"):
        return {name: plain(item) for name, item in value._asdict().items()}
    return value


def status_json() -> bytes:
    """``{"pid": ..., "reloaders": [status, ...]}`` with each ``Status`` as a dict (datetimes as text)."""
    statuses = [plain(reloader.status()) for reloader in reloaders()]
    return json.dumps({"pid": os.getpid(), "reloaders": statuses}, default=str).encode()


ROUTES: dict[str, tuple[Callable[[], bytes], str]] = {
    "/status": (status_json, "application/json"),
    "/metrics": (prometheus_client.generate_latest, prometheus_client.CONTENT_TYPE_LATEST),
}


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    route = ROUTES.get(environ.get("PATH_INFO", "/"))
    if route is None:
        return gunicorn_apps.wsgi(environ, start_response)
    produce, content_type = route
    body = produce()
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("X-Worker-Pid", str(os.getpid()))]
    start_response("200 OK", headers)
    return [body]


async def asgi(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    route = ROUTES.get(scope.get("path", "/")) if scope["type"] == "http" else None
    if route is None:
        await gunicorn_apps.asgi(scope, receive, send)
        return
    produce, content_type = route
    body = produce()
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"x-worker-pid", str(os.getpid()).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
