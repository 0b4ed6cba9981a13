"""A server's identity from SPIFFE's Workload API, started the same way by every glue: :func:`start_source`.

The glue starts the source once, in the process that starts the workers (gunicorn's arbiter, uvicorn's
supervisor), before any worker: its files become the server's certificate, key and client-CA settings, and the
workers take them (and the last good store) like any files. A worker therefore never starts before the first SVID
arrived: the server does not start without one. The expiry warning needs no setting of its own: unless set, it is
the last sixth of each certificate's lifetime (10 minutes of an hour's SVID).
"""

from __future__ import annotations

from collections.abc import Collection

from tlsreload_plugins.serving.start import CannotServe
from tlsreload_plugins.sources.spiffe import NoSVID, SpiffeSource

__all__ = ["start_source"]


def start_source(
    spiffe: str,
    *,
    spiffe_id: str | None = None,
    federation: bool | Collection[str] = False,
    timeout: float | None = None,
) -> SpiffeSource:
    """Start a :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource` and wait for the first SVID.

    Args:
        spiffe: the Workload API's address; ``""``: ``$SPIFFE_ENDPOINT_SOCKET``'s (as
            :func:`~tlsreload_plugins.settings.resolve_spiffe` returns it).
        spiffe_id: the SVID to serve (default: the Workload API's first).
        federation: the federated trust domains whose bundles are trusted too (``True``: all).
        timeout: seconds to wait for the first SVID (default the source's).

    Returns:
        The running source: hand its ``files`` to the server, close it when the server stops.

    Raises:
        CannotServe: no address, grpcio missing, or no SVID in time: one sentence naming the socket.

    Example: ``with exit_if_cannot_serve(3): source = start_source(resolve_spiffe(None) or "")``.
    """
    try:
        return SpiffeSource(spiffe or None, spiffe_id=spiffe_id, federation=federation, timeout=timeout)
    except (ValueError, ImportError, NoSVID) as e:
        raise CannotServe(f"cannot serve TLS from SPIFFE: {e}") from None
