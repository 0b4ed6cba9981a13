"""cheroot's ``wsgi.Server`` serving hostile_apps' WSGI app directly, with tlsreload's SSL adapter, for the shared
matrix (server_kinds): ``python -m cheroot_apps --certfile C --keyfile K --port P [--ca-certs CA]``. One process;
our lines go to stderr with their level (cheroot has no logger of its own).

``--stock-cherrypy``: stock CherryPy instead (``server.ssl_module 'builtin'``, nothing of tlsreload_plugins
imported), configured as ``examples/cheroot_app.py --cherrypy`` configures it, for the tests that compare with it."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import ssl
import sys
import threading

from cheroot import wsgi

import hostile_apps


def leave(server: wsgi.Server) -> None:
    """Stop ``server`` on SIGTERM the way CherryPy's engine does, ``server.stop()`` from another thread. Not by
    raising SystemExit in the main thread: an exception delivered at any bytecode of cheroot's serve loop once left
    one of its workers waiting on the request queue for a shutdown request that never came (the stop then joined it
    forever: the stacks dumped in CI, with cheroot 11.1.2, showed it)."""

    def stop(signum: int, frame: object) -> None:
        # Where every thread is, on stderr, if the stop takes longer than the tests wait for it.
        faulthandler.dump_traceback_later(15)
        threading.Thread(target=server.stop, name="stop on SIGTERM").start()

    signal.signal(signal.SIGTERM, stop)


def stock_cherrypy(options: argparse.Namespace) -> None:
    import cherrypy

    cherrypy.tree.graft(hostile_apps.wsgi, "/")
    cherrypy.config.update(
        {
            "environment": "production",
            "log.screen": True,
            "server.socket_host": "127.0.0.1",
            "server.socket_port": options.port,
            "server.ssl_module": "builtin",
            "server.ssl_certificate": options.certfile,
            "server.ssl_private_key": options.keyfile,
        }
    )
    cherrypy.engine.signals.subscribe()  # SIGTERM; SIGINT is KeyboardInterrupt in block()
    cherrypy.engine.start()
    cherrypy.engine.block()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca-certs", help="require client certificates signed by this bundle (mutual TLS)")
    parser.add_argument("--crl", help="CRLs for the CAs of --ca-certs")
    parser.add_argument("--stock-cherrypy", action="store_true", help="stock CherryPy, cheroot's builtin adapter")
    options = parser.parse_args()
    if options.stock_cherrypy:
        stock_cherrypy(options)
        return
    from tlsreload_plugins.cheroot import ReloadingSSLAdapter
    from tlsreload_plugins.serving.start import CannotServe

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    server = wsgi.Server(("127.0.0.1", options.port), hostile_apps.wsgi)
    try:
        server.ssl_adapter = ReloadingSSLAdapter(options.certfile, options.keyfile, options.ca_certs, crl=options.crl)
        if options.ca_certs:
            server.ssl_adapter.context.verify_mode = ssl.CERT_REQUIRED
    except CannotServe:
        sys.exit(1)
    leave(server)
    try:
        server.safe_start()
    finally:
        server.ssl_adapter.close()


if __name__ == "__main__":
    main()
