"""cheroot (and CherryPy) with certificate reload::

    python examples/cheroot_app.py --certfile tls.crt --keyfile tls.key --host 127.0.0.1 --port 8443
    python examples/cheroot_app.py --cherrypy --certfile tls.crt --keyfile tls.key --port 8443

cheroot: the one line is ``server.ssl_adapter = ReloadingSSLAdapter(certfile, keyfile)``. CherryPy: import
``tlsreload_plugins.cheroot`` and set ``server.ssl_module`` to ``'tlsreload'``. ``--ca-certs`` requires client
certificates signed by that bundle (mutual TLS), reloaded too. ``GET /`` answers ``pid=<pid> serial=<serial>``:
the serial of the certificate this connection got, as cheroot's WSGI environ says (``SSL_SERVER_M_SERIAL``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from cheroot import wsgi

from tlsreload_plugins.cheroot import ReloadingSSLAdapter
from tlsreload_plugins.serving.start import CannotServe

log = logging.getLogger("example.cheroot")


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = f"pid={os.getpid()} serial={environ.get('SSL_SERVER_M_SERIAL', '-')}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


class RequireClientCertificates(ReloadingSSLAdapter):  # type: ignore[misc]
    """The reloading adapter, requiring client certificates (cheroot's way: the adapter's context's verify mode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.context.verify_mode = ssl.CERT_REQUIRED


def stop_on_signals(server: wsgi.Server) -> None:
    """On SIGTERM and SIGINT, stop ``server`` with ``server.stop()`` from another thread, as CherryPy's engine does;
    ``safe_start()`` then returns. Not by raising in the main thread: an exception that lands at the wrong bytecode of
    cheroot's serve loop can leave one of its workers waiting forever for a shutdown request, and the stop with it
    (seen with cheroot 11.1.2)."""

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.stop, name=f"stop on {signal.Signals(signum).name}").start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def serve_cheroot(options: argparse.Namespace) -> None:
    server = wsgi.Server((options.host, options.port), app)
    adapter = RequireClientCertificates if options.ca_certs else ReloadingSSLAdapter
    try:
        server.ssl_adapter = adapter(options.certfile, options.keyfile, options.ca_certs, interval=options.interval)
    except CannotServe:
        sys.exit(1)  # the adapter logged why, in one line

    stop_on_signals(server)
    log.info("serving https://%s:%d", options.host, options.port)
    try:
        server.safe_start()
    finally:
        server.ssl_adapter.close()


def serve_cherrypy(options: argparse.Namespace) -> None:
    import cheroot.server
    import cherrypy

    import tlsreload_plugins.cheroot  # registers server.ssl_module 'tlsreload'

    cheroot.server.ssl_adapters["tlsreload-mtls"] = RequireClientCertificates
    cherrypy.tree.graft(app, "/")
    cherrypy.config.update(
        {
            "environment": "production",
            "log.screen": True,
            "server.socket_host": options.host,
            "server.socket_port": options.port,
            "server.ssl_module": "tlsreload-mtls" if options.ca_certs else tlsreload_plugins.cheroot.SSL_MODULE,
            "server.ssl_certificate": options.certfile,
            "server.ssl_private_key": options.keyfile,
            "server.ssl_certificate_chain": options.ca_certs,
        }
    )
    cherrypy.engine.signals.subscribe()  # SIGTERM and SIGINT (KeyboardInterrupt in block()) stop the engine
    cherrypy.engine.start()
    cherrypy.engine.block()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--ca-certs", help="require client certificates signed by this bundle (mutual TLS)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    parser.add_argument("--cherrypy", action="store_true", help="serve with CherryPy's server.ssl_* configuration")
    options = parser.parse_args()
    if options.cherrypy:
        if options.interval is not None:  # CherryPy constructs the adapter: tlsreload's own settings come from here
            os.environ["TLSRELOAD_INTERVAL"] = str(options.interval)
        serve_cherrypy(options)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")
    serve_cheroot(options)


if __name__ == "__main__":
    main()
