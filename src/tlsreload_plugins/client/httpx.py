"""httpx glue: transports that present a :class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest
certificate, for ``httpx.Client`` (:class:`ReloadingTransport`) and ``httpx.AsyncClient``
(:class:`AsyncReloadingTransport`), and the clients made with them as httpx makes its own, proxies from the
environment included (:func:`reloading_client`, :func:`async_reloading_client`).

A transport is httpx's documented extension point. httpx fixes a transport's SSL context when it builds its
connection pool, so each generation of the identity gets a transport of its own: new requests go through the
newest, and a replaced one is closed once the responses it carries are closed, as httpx alone closes a connection
(a stream open across a change lives on). Its kept-alive connections, which would go on presenting the old
certificate, go with it. Each transport builds on a context of its own (:meth:`ClientIdentity.own_context
<tlsreload_plugins.client.identity.ClientIdentity.own_context>`): httpcore sets its ALPN list on the context at
every connection, and that must not reach another client of the same identity.

What the transports do is written once in :mod:`tlsreload_plugins.client.httpx_transports`, shared with httpx2's
glue (:mod:`tlsreload_plugins.client.httpx2`); this module puts it on httpx's classes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from types import ModuleType
from typing import Any
from urllib.request import getproxies

import httpx

from tlsreload_plugins.client.httpx_transports import (
    GLUE_NAMES,
    AsyncReleasedStream,
    AsyncReloading,
    ReleasedStream,
    SyncReloading,
    client_options,
)
from tlsreload_plugins.client.identity import ClientIdentity

__all__ = [*GLUE_NAMES]


class _Released(ReleasedStream, httpx.SyncByteStream):
    """A response's body through :class:`ReloadingTransport`: httpx takes no body but its own kind."""


class _AsyncReleased(AsyncReleasedStream, httpx.AsyncByteStream):
    """:class:`_Released` for ``httpx.AsyncClient``."""


class ReloadingTransport(SyncReloading, httpx.BaseTransport):
    """An ``httpx.Client`` transport presenting ``identity``'s newest client certificate and trusting its
    newest CA bundle.

    Requests made after a change go through a new ``httpx.HTTPTransport``; a response still being read (a stream, a
    download, server-sent events) goes on through the one it started on, as with httpx alone, and that transport is
    closed once its responses are closed.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        retire_after: seconds after a change at which responses still being read through a replaced transport are
            cut (their reads raise ``httpx.ReadError`` saying so); ``None`` (the default): never.
        **options: what ``httpx.HTTPTransport`` takes besides ``verify`` and ``cert`` (``http2``, ``limits``,
            ``retries``, ``proxy``...).

    Raises:
        TypeError: ``verify`` or ``cert`` is given (they come from the identity).

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with httpx.Client(transport=ReloadingTransport(identity)) as client:
            client.get("https://service.internal/")
    """

    library: ModuleType = httpx
    released: type[ReleasedStream] = _Released


class AsyncReloadingTransport(AsyncReloading, httpx.AsyncBaseTransport):
    """:class:`ReloadingTransport` for ``httpx.AsyncClient``. Replaced transports are closed on the event loop
    that made them (told from the checking thread with ``call_soon_threadsafe``, under asyncio; under trio at the
    next request). Its own context of the identity is built at its first request, on a worker thread.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        async with httpx.AsyncClient(transport=AsyncReloadingTransport(identity)) as client:
            await client.get("https://service.internal/")
    """

    library: ModuleType = httpx
    released: type[AsyncReleasedStream] = _AsyncReleased


# -- clients made as httpx makes its own ---------------------------------------------------------------------------


def environment_proxies() -> dict[str, str | None]:
    """The proxies the environment asks for, as URL patterns of httpx's ``mounts=`` (``None``: no proxy), read as
    ``httpx.Client(trust_env=True)`` reads them: ``HTTP_PROXY``, ``HTTPS_PROXY`` and ``ALL_PROXY`` (a proxy given
    without a scheme is ``http://``), and ``NO_PROXY`` (``*`` turns every proxy off; a host, a domain with or
    without its leading dot, an IP address or network, ``localhost``, or a URL pattern goes direct).

    Returns:
        ``{pattern: proxy URL or None}``, e.g. ``{"https://": "http://proxy:3128", "all://*.internal": None}``.

    Example::

        mounts = environment_proxies()
    """
    info = getproxies()
    patterns: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if info.get(scheme):
            address = info[scheme]
            patterns[f"{scheme}://"] = address if "://" in address else f"http://{address}"
    for host in (name.strip() for name in info.get("no", "").split(",")):
        if host == "*":
            return {}
        if not host:
            continue
        if "://" in host:
            patterns[host] = None
        elif _is_address(host, ipaddress.IPv4Address) or host.lower() == "localhost":
            patterns[f"all://{host}"] = None
        elif _is_address(host, ipaddress.IPv6Address):
            patterns[f"all://[{host}]"] = None
        else:  # a domain: itself and what is under it ("*internal" matches "internal" and "a.internal")
            patterns[f"all://*{host}"] = None
    return patterns


def _is_address(host: str, kind: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]) -> bool:
    try:
        kind(host.split("/")[0])
    except ValueError:
        return False
    return True


def reloading_client(
    identity: ClientIdentity,
    *,
    proxy: str | httpx.URL | httpx.Proxy | None = None,
    mounts: Mapping[str, httpx.BaseTransport | None] | None = None,
    trust_env: bool = True,
    retire_after: float | None = None,
    **options: Any,
) -> httpx.Client:
    """An ``httpx.Client`` presenting ``identity``'s newest certificate on every connection, made as
    ``httpx.Client(**options)`` makes its own: through ``proxy``, else through the proxies the environment names
    (``HTTPS_PROXY``, ``NO_PROXY``...; with ``trust_env``), each through a :class:`ReloadingTransport`, so the
    certificate is presented through a proxy's tunnel too. (An ``httpx.Client(transport=...)`` ignores the
    environment's proxies, and its ``proxy=`` would present no certificate.)

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        proxy: as ``httpx.Client``'s.
        mounts: as ``httpx.Client``'s (they win over the proxies, as there).
        trust_env: as ``httpx.Client``'s (proxies from the environment, ``.netrc``).
        retire_after: as :class:`ReloadingTransport`'s.
        **options: what ``httpx.Client`` takes besides ``verify``, ``cert`` and ``transport`` (``http2``,
            ``limits`` and ``http1`` go to the transports, as httpx does).

    Raises:
        TypeError: ``verify``, ``cert`` or ``transport`` is given.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with reloading_client(identity, http2=True, timeout=5.0) as client:
            client.get("https://service.internal/")
    """
    given: dict[str, Any] = {"proxy": proxy, "mounts": mounts, "trust_env": trust_env, "retire_after": retire_after}
    return httpx.Client(**client_options(identity, ReloadingTransport, environment_proxies, **given, **options))


def async_reloading_client(
    identity: ClientIdentity,
    *,
    proxy: str | httpx.URL | httpx.Proxy | None = None,
    mounts: Mapping[str, httpx.AsyncBaseTransport | None] | None = None,
    trust_env: bool = True,
    retire_after: float | None = None,
    **options: Any,
) -> httpx.AsyncClient:
    """:func:`reloading_client` for ``httpx.AsyncClient``, through :class:`AsyncReloadingTransport`.

    Example::

        async with async_reloading_client(identity) as client:
            await client.get("https://service.internal/")
    """
    given: dict[str, Any] = {"proxy": proxy, "mounts": mounts, "trust_env": trust_env, "retire_after": retire_after}
    made = client_options(identity, AsyncReloadingTransport, environment_proxies, **given, **options)
    return httpx.AsyncClient(**made)
