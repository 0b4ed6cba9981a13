"""A server's identity from SPIFFE's Workload API, started the same way by every glue: :func:`start_source`.

The glue starts the source once, in the process that starts the workers (gunicorn's arbiter, uvicorn's
supervisor), before any worker: its files become the server's certificate, key and client-CA settings, and the
workers take them (and the last good store) like any files. A worker therefore never starts before the first SVID
arrived: the server does not start without one. The expiry warning, unless set, becomes
:data:`~tlsreload_plugins.sources.spiffe.SVID_EXPIRY_WARNING_DAYS` (``$TLSRELOAD_EXPIRY_WARNING_DAYS``, which workers
inherit).
"""

from __future__ import annotations

import os

from tlsreload_plugins.serving.start import CannotServe
from tlsreload_plugins.settings import EXPIRY_WARNING_ENV
from tlsreload_plugins.sources.spiffe import SVID_EXPIRY_WARNING_DAYS, NoSVID, SpiffeSource

__all__ = ["start_source"]


def start_source(spiffe: str, *, timeout: float | None = None) -> SpiffeSource:
    """Start a :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource` and wait for the first SVID.

    Args:
        spiffe: the Workload API's address; ``""``: ``$SPIFFE_ENDPOINT_SOCKET``'s (as
            :func:`~tlsreload_plugins.settings.resolve_spiffe` returns it).
        timeout: seconds to wait for the first SVID (default the source's).

    Returns:
        The running source: hand its ``files`` to the server, close it when the server stops.

    Raises:
        CannotServe: no address, grpcio missing, or no SVID in time: one sentence naming the socket.

    Example: ``with exit_if_cannot_serve(3): source = start_source(resolve_spiffe(None) or "")``.
    """
    # SVIDs live hours, not months: the expiry warning of files (14 days) would fire on every one. Set before any
    # reloader reads it, in the process that starts the workers, which inherit it; one set by the user stays.
    os.environ.setdefault(EXPIRY_WARNING_ENV, repr(SVID_EXPIRY_WARNING_DAYS))
    try:
        return SpiffeSource(spiffe or None, timeout=timeout)
    except (ValueError, ImportError, NoSVID) as e:
        raise CannotServe(f"cannot serve TLS from SPIFFE: {e}") from None
