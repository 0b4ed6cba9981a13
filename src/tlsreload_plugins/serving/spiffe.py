"""A server's identity from SPIFFE's Workload API, started the same way by every glue: :func:`start_source`.

The glue starts the source once, from the process that starts the workers (gunicorn's arbiter, uvicorn's
supervisor), before any worker, in a child process of its own
(:class:`~tlsreload_plugins.sources.source_process.SourceProcess`: the process that forks workers runs no thread).
Its files become the server's certificate, key and client-CA settings; the workers take them (and the last good
store) like any files, and watch its figures (:mod:`tlsreload_plugins.sources.source_watch`). A worker therefore
never starts before the first SVID arrived: the server does not start without one. The expiry warning needs no
setting of its own: unless set, it is the last sixth of each certificate's lifetime (10 minutes of an hour's SVID).
"""

from __future__ import annotations

from collections.abc import Collection

from tlsreload_plugins.serving.start import CannotServe
from tlsreload_plugins.sources.source_process import SourceProcess, SourceProcessFailed
from tlsreload_plugins.sources.spiffe import resolve_endpoint

__all__ = ["start_source"]


def start_source(
    spiffe: str,
    *,
    spiffe_id: str | None = None,
    federation: bool | Collection[str] = False,
    timeout: float | None = None,
) -> SourceProcess:
    """Start a :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource` in a process of its own and wait for the
    first SVID.

    Args:
        spiffe: the Workload API's address; ``""``: ``$SPIFFE_ENDPOINT_SOCKET``'s (as
            :func:`~tlsreload_plugins.settings.resolve_spiffe` returns it).
        spiffe_id: the SVID to serve (default: the Workload API's first).
        federation: the federated trust domains whose bundles are trusted too (``True``: all).
        timeout: seconds to wait for the first SVID (default the source's).

    Returns:
        The running source process: hand its ``files`` to the server, close it when the server stops.

    Raises:
        CannotServe: no address, grpcio missing, or no SVID in time: one sentence naming the socket.

    Example: ``with exit_if_cannot_serve(3): source = start_source(resolve_spiffe(None) or "")``.
    """
    try:
        endpoint = resolve_endpoint(spiffe or None)  # a bad address is said at once, before a process starts
        return SourceProcess(endpoint, spiffe_id=spiffe_id, federation=federation, timeout=timeout)
    except (ValueError, SourceProcessFailed) as e:
        raise CannotServe(f"cannot serve TLS from SPIFFE: {e}") from None
