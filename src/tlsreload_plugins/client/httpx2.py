"""httpx2 glue: transports that present a :class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest
certificate, for ``httpx2.Client`` (:class:`ReloadingTransport`) and ``httpx2.AsyncClient``
(:class:`AsyncReloadingTransport`), and the clients made with them as httpx2 makes its own, proxies from the
environment included (:func:`reloading_client`, :func:`async_reloading_client`).

httpx2 is pydantic's fork of httpx (Python 3.11 and later), with the same transport API under its own name: the
httpx glue's transports (:mod:`tlsreload_plugins.client.httpx`) fail in an ``httpx2.Client`` with a bare
``AssertionError``, because httpx2 takes only its own request and response streams. These are the same transports,
written once in :mod:`tlsreload_plugins.client.httpx_transports`, on httpx2's classes: what the httpx glue does and
promises, this one does with httpx2 (a stream open across a change reads to its end; ``retire_after`` cuts with
``httpx2.ReadError`` saying why; a context of its own per transport). This module imports httpx2 and never httpx.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import httpx2

from tlsreload_plugins.client import httpx_transports
from tlsreload_plugins.client.identity import ClientIdentity

__all__ = [*httpx_transports.GLUE_NAMES]


class _Released(httpx_transports.ReleasedStream, httpx2.SyncByteStream):
    """A response's body through :class:`ReloadingTransport`: ``httpx2.Client`` asserts that a body is its own
    kind (the ``AssertionError`` an httpx transport meets)."""


class _AsyncReleased(httpx_transports.AsyncReleasedStream, httpx2.AsyncByteStream):
    """:class:`_Released` for ``httpx2.AsyncClient``."""


class ReloadingTransport(httpx_transports.SyncReloading, httpx2.BaseTransport):
    """An ``httpx2.Client`` transport presenting ``identity``'s newest client certificate and trusting its newest
    CA bundle: :class:`tlsreload_plugins.client.httpx.ReloadingTransport` on httpx2, its arguments and what it
    promises. Each generation of the identity goes through an ``httpx2.HTTPTransport`` of its own (``**options``
    are what that takes, ``verify`` and ``cert`` aside: ``TypeError``, the identity gives them); a replaced one is
    closed once the responses still read through it are; ``retire_after`` (seconds, default ``None``: never) cuts
    those reads with ``httpx2.ReadError`` saying so.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with httpx2.Client(transport=ReloadingTransport(identity, http2=True)) as client:
            client.get("https://service.internal/")
    """

    library: ModuleType = httpx2
    released: type[httpx_transports.ReleasedStream] = _Released


class AsyncReloadingTransport(httpx_transports.AsyncReloading, httpx2.AsyncBaseTransport):
    """:class:`ReloadingTransport` for ``httpx2.AsyncClient``: replaced transports are closed on the event loop
    that made them, and its own context of the identity is built at its first request, on a worker thread.

    Example::

        async with httpx2.AsyncClient(transport=AsyncReloadingTransport(identity)) as client:
            await client.get("https://service.internal/")
    """

    library: ModuleType = httpx2
    released: type[httpx_transports.AsyncReleasedStream] = _AsyncReleased


def environment_proxies() -> dict[str, str | None]:
    """The proxies the environment asks for, as URL patterns of httpx2's ``mounts=`` (``None``: no proxy), read by
    httpx2's own reader, the one ``httpx2.Client(trust_env=True)`` calls: its ``NO_PROXY`` rules are not httpx's
    (``*.example.com``, ``[::1]`` and IPv6 networks are its own; entries it cannot parse are dropped), and may
    change with its releases.

    Returns:
        ``{pattern: proxy URL or None}``, e.g. ``{"https://": "http://proxy:3128", "all://*.internal": None}``.

    Example::

        mounts = environment_proxies()
    """
    # httpx2 names its reader nowhere public; a copy of it would drift from the client that a user compares with.
    from httpx2._utils import get_environment_proxies

    return get_environment_proxies()


def reloading_client(identity: ClientIdentity, **options: Any) -> httpx2.Client:
    """An ``httpx2.Client`` presenting ``identity``'s newest certificate on every connection, made as
    ``httpx2.Client(**options)`` makes its own: through ``proxy=``, else through the proxies the environment names
    (with ``trust_env``, read as httpx2 reads them: :func:`environment_proxies`), each through a
    :class:`ReloadingTransport`, so that the certificate is presented through a proxy's tunnel too.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        **options: ``retire_after`` (:class:`ReloadingTransport`'s), and what ``httpx2.Client`` takes but
            ``verify``, ``cert`` and ``transport``: ``proxy``, ``mounts`` (over the proxies, as there),
            ``trust_env``, ``timeout``...; ``http1``, ``http2`` and ``limits`` reach the transports, as in httpx2.

    Returns:
        The client, closed as any ``httpx2.Client`` is (``with``, ``close()``).

    Raises:
        TypeError: ``options`` hold ``verify``, ``cert`` or ``transport``: the identity and this function give them.

    Example::

        identity = ClientIdentity("/etc/tls/client/tls.crt", "/etc/tls/client/tls.key", cafile="/etc/tls/client/ca.crt")
        with reloading_client(identity, proxy="http://proxy.internal:3128", timeout=5.0) as client:
            client.get("https://service.internal/")
    """
    return httpx2.Client(
        **httpx_transports.client_options(identity, ReloadingTransport, environment_proxies, **options)
    )


def async_reloading_client(identity: ClientIdentity, **options: Any) -> httpx2.AsyncClient:
    """:func:`reloading_client` for ``httpx2.AsyncClient``, through :class:`AsyncReloadingTransport`.

    Example::

        async with async_reloading_client(identity) as client:
            await client.get("https://service.internal/")
    """
    return httpx2.AsyncClient(
        **httpx_transports.client_options(identity, AsyncReloadingTransport, environment_proxies, **options)
    )
