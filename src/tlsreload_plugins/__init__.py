"""Keep TLS certificates fresh inside running Python servers.

For any server that takes an :class:`ssl.SSLContext`, one line: :func:`fresh_context` validates the
files, returns a :class:`FreshContext` whose ``.context`` the server is given once, and checks the
files in a daemon thread until it is closed::

    with fresh_context("tls.crt", "tls.key") as context:
        web.run_app(app, ssl_context=context)

The core underneath knows no server. Give :class:`Reloader` the files and a recipe that builds the
server's context, hand :attr:`Reloader.context` to the server, and drive checks with
:class:`ThreadDriver` or :class:`AsyncioDriver`::

    reloader = Reloader("tls.crt", "tls.key", recipe=build_my_context)
    server = make_server(ssl_context=reloader.context)
    with ThreadDriver(reloader):
        server.serve_forever()

The adapters, one per server, live in :mod:`tlsreload_plugins.gunicorn`, :mod:`tlsreload_plugins.uvicorn`,
:mod:`tlsreload_plugins.hypercorn` and the other ``tlsreload_plugins.<server>`` modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tlsreload_plugins.drivers import AsyncioDriver, ThreadDriver
    from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError
    from tlsreload_plugins.files import TLSFiles
    from tlsreload_plugins.fresh import FreshContext, fresh_context
    from tlsreload_plugins.identity import Leaf
    from tlsreload_plugins.outcome import Outcome, Status
    from tlsreload_plugins.reloader import Reloader
    from tlsreload_plugins.sni.identities import SNIIdentities

__all__ = [
    "AsyncioDriver",
    "FreshContext",
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
    "fresh_context",
]
__version__ = "0.1.0"

_HOMES = {
    "AsyncioDriver": "drivers",
    "ThreadDriver": "drivers",
    "InvalidIdentity": "errors",
    "NotServable": "errors",
    "ReloadError": "errors",
    "TLSFiles": "files",
    "FreshContext": "fresh",
    "fresh_context": "fresh",
    "Leaf": "identity",
    "Outcome": "outcome",
    "Status": "outcome",
    "Reloader": "reloader",
    "SNIIdentities": "sni.identities",
}
"""The module each public name lives in. They load on first use: importing any part of the package (a server's
glue in a worker) imports this file, which would otherwise load every topic, the SNI machinery and the metrics
included, into processes that use none of them."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562), then kept here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
