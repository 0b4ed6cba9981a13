"""Sanic with certificate reload, two workers under Sanic's own worker manager::

    python examples/sanic_app.py --certfile tls.crt --keyfile tls.key --host 127.0.0.1 --port 8443

The one line is ``reloading(app)``, where the app is made (each worker imports this module
too); Sanic then runs as usual: ``app.run(ssl={"cert": ..., "key": ...}, workers=2)``, or
``sanic examples.sanic_app:app --cert tls.crt --key tls.key --workers 2``. ``--certfile``, ``--keyfile``
and ``--ca-certs`` may be repeated together with ``--certfile`` for several certificates, which Sanic
chooses by server name. ``--ca-certs`` requires client certificates signed by that bundle (mutual TLS).
``GET /`` answers ``pid=<worker pid>``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sanic import Request, Sanic, text
from sanic.response import HTTPResponse

from tlsreload_plugins.sanic import reloading

app: Sanic[Any, Any] = Sanic("tlsreload_example")
reloading(app)  # interval, SNI and metrics from $TLSRELOAD_*: the workers read the same


@app.get("/")
async def index(request: Request) -> HTTPResponse:
    return text(f"pid={os.getpid()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", action="append", required=True)
    parser.add_argument("--keyfile", action="append", required=True)
    parser.add_argument("--ca-certs", help="require client certificates signed by this bundle (mutual TLS)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()
    if len(options.certfile) != len(options.keyfile):
        parser.error("give one --keyfile for each --certfile")
    if options.interval is not None:  # Sanic's workers import this module afresh: they read it from there
        os.environ["TLSRELOAD_INTERVAL"] = str(options.interval)
    certificates = [
        {"cert": cert, "key": key, **({"ca_certs": options.ca_certs} if options.ca_certs else {})}
        for cert, key in zip(options.certfile, options.keyfile, strict=True)
    ]
    ssl = certificates[0] if len(certificates) == 1 else certificates
    # Sanic stops on SIGTERM and SIGINT: its main process stops the workers, then exits.
    app.run(host=options.host, port=options.port, ssl=ssl, workers=options.workers, access_log=False)


if __name__ == "__main__":
    main()
