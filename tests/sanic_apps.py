"""A Sanic app for the tests, run by Sanic's own command line (``python -m sanic sanic_apps:app --cert C --key K``):
hostile_apps' routes (``/`` answering ``pid=<worker pid>``, ``/status``, ``/metrics``, every answer with an
``x-worker-pid`` header), and ``/restart``, which has Sanic's worker manager restart the worker that answers
(``app.m.restart()``, Sanic's own way)."""

from __future__ import annotations

import os
from typing import Any

import prometheus_client
from sanic import Request, Sanic
from sanic.response import HTTPResponse, raw

import hostile_apps
from tlsreload_plugins.sanic import reload_certificates

app: Sanic[Any, Any] = Sanic("tlsreload_tests")
reload_certificates(app)


def answer(body: bytes, content_type: str = "text/plain") -> HTTPResponse:
    return raw(body, content_type=content_type, headers={"x-worker-pid": str(os.getpid())})


@app.get("/")
async def index(request: Request) -> HTTPResponse:
    return answer(f"pid={os.getpid()}".encode())


@app.get("/status")
async def status(request: Request) -> HTTPResponse:
    return answer(hostile_apps.status_json(), "application/json")


@app.get("/metrics")
async def metrics(request: Request) -> HTTPResponse:
    return answer(prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST)


@app.get("/restart")
async def restart(request: Request) -> HTTPResponse:
    request.app.m.restart()
    return answer(f"pid={os.getpid()} restarting".encode())
