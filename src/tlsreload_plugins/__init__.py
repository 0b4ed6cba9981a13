"""Keep TLS certificates fresh inside running gunicorn and uvicorn servers.

The core (this package's top level) knows no server. Give :class:`Reloader` the files and a
recipe that builds the server's context, hand :attr:`Reloader.context` to the server, and
drive checks with :class:`ThreadDriver` or :class:`AsyncioDriver`::

    reloader = Reloader("tls.crt", "tls.key", recipe=build_my_context)
    server = make_server(ssl_context=reloader.context)
    with ThreadDriver(reloader):
        server.serve_forever()

The adapters live in :mod:`tlsreload_plugins.gunicorn` and :mod:`tlsreload_plugins.uvicorn`.
"""

from .drivers import AsyncioDriver, ThreadDriver
from .identity import InvalidIdentity, Leaf, NotServable, ReloadError, TLSFiles
from .reloader import Outcome, Reloader, Status
from .sni import SNIIdentities

__all__ = [
    "AsyncioDriver",
    "InvalidIdentity",
    "Leaf",
    "NotServable",
    "Outcome",
    "ReloadError",
    "Reloader",
    "SNIIdentities",
    "Status",
    "TLSFiles",
    "ThreadDriver",
]
__version__ = "0.1.0"
