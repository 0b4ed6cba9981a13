"""A Sanic app for the tests, run by Sanic's own command line (``python -m sanic sanic_apps:app --cert C --key K``):
hostile_apps' routes (``/`` answering ``pid=<worker pid>``, ``/status``, ``/metrics``, every answer with an
``x-worker-pid`` header), and ``/restart``, which has Sanic's worker manager restart the worker that answers
(``app.m.restart()``, Sanic's own way). ``python -m sanic_apps --cert C --key K --ca-certs CA --port P`` runs the
same app with ``app.run(ssl={..., "ca_certs": CA}, workers=2)`` (``--cert`` and ``--key`` repeated: a list of
certificates, chosen by server name): Sanic's command line takes no client-CA bundle."""

from __future__ import annotations

import argparse
import os
from typing import Any

import prometheus_client
from sanic import Request, Sanic
from sanic.response import HTTPResponse, raw

import hostile_apps
from tlsreload_plugins.sanic import reloading

app: Sanic[Any, Any] = Sanic("tlsreload_tests")
reloading(app)


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", action="append", required=True, help="repeated: a list, chosen by server name")
    parser.add_argument("--key", action="append", required=True)
    parser.add_argument("--ca-certs", required=True)
    parser.add_argument("--crl", help="CRLs for the CAs of --ca-certs: tlsreload's key beside them")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    entries = [
        {"cert": c, "key": k, "ca_certs": options.ca_certs, **({"crl": options.crl} if options.crl else {})}
        for c, k in zip(options.cert, options.key, strict=True)
    ]
    ssl = entries[0] if len(entries) == 1 else entries
    app.run(host="127.0.0.1", port=options.port, ssl=ssl, workers=options.workers, access_log=False)


if __name__ == "__main__":
    main()
