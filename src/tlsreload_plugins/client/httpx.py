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
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.request import getproxies

import anyio
import httpx

from tlsreload_plugins.client.identity import ClientIdentity, OwnContext
from tlsreload_plugins.client.pools import Pools

__all__ = [
    "AsyncReloadingTransport",
    "ReloadingTransport",
    "async_reloading_client",
    "environment_proxies",
    "reloading_client",
]

T = TypeVar("T")

_SSL_OPTIONS = ("verify", "cert")


def _refuse_ssl_options(options: Mapping[str, Any]) -> None:
    given = [name for name in _SSL_OPTIONS if name in options]
    if given:
        raise TypeError(f"{' and '.join(given)} come from the ClientIdentity: give them to it")


def _cut_reason(retire_after: float | None) -> str:
    return (
        f"the connection was closed {retire_after or 0:g} s after its client certificate was replaced "
        "(retire_after): the response was still being read"
    )


class _Streams:
    """The responses in flight through each transport (their bodies not closed yet), and the transports cut: what a
    cut reaches. A cut shuts each response's socket down (from any thread: ``shutdown`` wakes a reader blocked on it,
    in a thread or on an event loop) and lets the reader fail as httpx fails on a connection closed under it; the
    transport itself is closed once those responses are closed, never under a reader. Without ``retire_after``
    nothing is ever cut, and nothing is kept (``tracking`` off: a request costs no lock here)."""

    def __init__(self, tracking: bool) -> None:
        self.tracking = tracking
        self._lock = threading.Lock()
        self._open: dict[object, set[_Body]] = {}
        self._cut: set[object] = set()

    def add(self, transport: object, body: _Body) -> None:
        if not self.tracking:
            return
        with self._lock:
            cut = transport in self._cut
            if not cut:
                self._open.setdefault(transport, set()).add(body)
        if cut:  # its transport was cut while the request waited for its headers
            body.cut()

    def discard(self, transport: object, body: _Body) -> None:
        if not self.tracking:
            return
        with self._lock:
            bodies = self._open.get(transport)
            if bodies is not None:
                bodies.discard(body)
                if not bodies:
                    del self._open[transport]

    def cut(self, transports: list[T]) -> None:
        with self._lock:
            self._cut.update(transports)
            bodies = [body for transport in transports for body in self._open.pop(transport, ())]
        for body in bodies:
            body.cut()

    def closed(self, transports: list[T]) -> None:
        if not self.tracking:
            return
        with self._lock:
            self._cut.difference_update(transports)


class _Body:
    """What a response's body shares between its sync and async forms: its socket, whether it was cut, and saying
    once that it is done."""

    def __init__(self, response: httpx.Response, done: Callable[[], Any], reason: str) -> None:
        self._stream: Any = response.extensions.get("network_stream")  # its socket is asked for at a cut only
        self._done: Callable[[], Any] | None = done
        self._reason = reason
        self.was_cut = False

    def cut(self) -> None:
        self.was_cut = True
        sock = self._stream.get_extra_info("socket") if self._stream is not None else None
        # A socket already closed says so (EBADF): nothing left to cut.
        with contextlib.suppress(OSError):
            if isinstance(sock, socket.socket):
                # socket.socket's own shutdown: an SSLSocket's would also drop its SSL object under the reader.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            elif sock is not None:  # asyncio's TransportSocket (anyio's raw socket): shutdown is what it offers
                sock.shutdown(socket.SHUT_RDWR)

    def translate(self, error: httpx.TransportError) -> httpx.TransportError:
        """The error a read raises: httpx's own, or for a cut, a ``ReadError`` saying why."""
        return httpx.ReadError(self._reason) if self.was_cut else error

    def take_done(self) -> Callable[[], Any] | None:
        done, self._done = self._done, None
        return done


class _Released(httpx.SyncByteStream):
    """A response's body that says when it is closed (its request no longer holds its transport) and that can be
    cut."""

    def __init__(self, stream: httpx.SyncByteStream, body: _Body) -> None:
        self._stream = stream
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpx.TransportError as e:
            translated = self.body.translate(e)
            if translated is e:
                raise
            raise translated from e

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            done = self.body.take_done()
            if done is not None:
                done()


class _AsyncReleased(httpx.AsyncByteStream):
    """:class:`_Released` for ``httpx.AsyncClient``."""

    def __init__(self, stream: httpx.AsyncByteStream, body: _Body) -> None:
        self._stream = stream
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except httpx.TransportError as e:
            translated = self.body.translate(e)
            if translated is e:
                raise
            raise translated from e

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            done = self.body.take_done()
            if done is not None:
                await done()


class ReloadingTransport(httpx.BaseTransport):
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

    def __init__(self, identity: ClientIdentity, *, retire_after: float | None = None, **options: Any) -> None:
        _refuse_ssl_options(options)
        self.identity = identity
        self._own = identity.own_context()
        self._options = options
        self._reason = _cut_reason(retire_after)
        self._streams = _Streams(tracking=retire_after is not None)
        self._pools: Pools[httpx.HTTPTransport] = Pools(self._make, retire_after)
        self._pools.follow(identity, self._close_all, self._streams.cut)

    def _make(self, generation: int) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(verify=self._own.context, **self._options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        transport, to_close = self._pools.acquire(self._own.generation)
        self._close_all(to_close)
        try:
            response = transport.handle_request(request)
        except BaseException:
            self._close_all(self._pools.release(transport))
            raise
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)

        def done() -> None:
            self._streams.discard(transport, body)
            self._close_all(self._pools.release(transport))

        body = _Body(response, done, self._reason)
        response.stream = _Released(stream, body)
        self._streams.add(transport, body)
        return response

    def _close_all(self, transports: list[httpx.HTTPTransport]) -> None:
        self._streams.closed(transports)
        for transport in transports:
            transport.close()

    def close(self) -> None:
        """Close every transport and their connections. As httpx's own transport, it still works after: the next
        request connects again."""
        self._close_all(self._pools.clear())

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (responses still open on them)."""
        return self._pools.retired


class AsyncReloadingTransport(httpx.AsyncBaseTransport):
    """:class:`ReloadingTransport` for ``httpx.AsyncClient``. Replaced transports are closed on the event loop
    that made them (told from the checking thread with ``call_soon_threadsafe``, under asyncio; under trio at the
    next request). Its own context of the identity is built at its first request, on a worker thread.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        async with httpx.AsyncClient(transport=AsyncReloadingTransport(identity)) as client:
            await client.get("https://service.internal/")
    """

    def __init__(self, identity: ClientIdentity, *, retire_after: float | None = None, **options: Any) -> None:
        _refuse_ssl_options(options)
        self.identity = identity
        self._own: OwnContext | None = None  # built on a worker thread at the first request: never on the loop
        self._options = options
        self._reason = _cut_reason(retire_after)
        self._streams = _Streams(tracking=retire_after is not None)
        self._pools: Pools[httpx.AsyncHTTPTransport] = Pools(self._make, retire_after)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._pending: list[httpx.AsyncHTTPTransport] = []
        self._pending_lock = threading.Lock()  # the checking thread adds, the loop takes
        self._pools.follow(identity, self._close_soon, self._streams.cut)

    def _make(self, generation: int) -> httpx.AsyncHTTPTransport:
        assert self._own is not None  # _own_context() came first
        return httpx.AsyncHTTPTransport(verify=self._own.context, **self._options)

    async def _own_context(self) -> OwnContext:
        """This transport's own context of the identity, made at its first request on a worker thread: building
        one reads its CA bundle (the system's takes tens of milliseconds), which must not stall the event loop."""
        own = self._own
        if own is None:
            made = await anyio.to_thread.run_sync(self.identity.own_context)
            own = self._own = self._own or made  # two first requests at once: one context kept
        return own

    def _close_soon(self, transports: list[httpx.AsyncHTTPTransport]) -> None:
        """From the checking thread: close ``transports`` on their loop (else at the next request)."""
        if not transports:
            return
        loop = self._loop
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("no loop")
            loop.call_soon_threadsafe(self._close_on_loop, transports)
        except RuntimeError:  # no asyncio loop (trio), or it closed meanwhile: at the next request
            with self._pending_lock:
                self._pending.extend(transports)

    def _take_pending(self) -> list[httpx.AsyncHTTPTransport]:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        return pending

    def _close_on_loop(self, transports: list[httpx.AsyncHTTPTransport]) -> None:
        task = asyncio.get_running_loop().create_task(self._aclose_all(transports))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _aclose_all(self, transports: list[httpx.AsyncHTTPTransport]) -> None:
        self._streams.closed(transports)
        for transport in transports:
            await transport.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._loop is None:
            with contextlib.suppress(RuntimeError):  # trio: replaced transports are closed at requests
                self._loop = asyncio.get_running_loop()
        own = self._own or await self._own_context()
        pending = self._take_pending()
        transport, to_close = self._pools.acquire(own.generation)
        await self._aclose_all([*pending, *to_close])
        try:
            response = await transport.handle_async_request(request)
        except BaseException:
            await self._aclose_all(self._pools.release(transport))
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)

        async def done() -> None:
            self._streams.discard(transport, body)
            await self._aclose_all(self._pools.release(transport))

        body = _Body(response, done, self._reason)
        response.stream = _AsyncReleased(stream, body)
        self._streams.add(transport, body)
        return response

    async def aclose(self) -> None:
        """Close every transport and their connections. As httpx's own transport, it still works after."""
        await self._aclose_all([*self._take_pending(), *self._pools.clear()])

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (responses still open on them)."""
        return self._pools.retired


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


def _proxy_patterns(proxy: Any, trust_env: bool) -> dict[str, Any]:
    if proxy is not None:
        return {"all://": proxy}
    return environment_proxies() if trust_env else {}


_TRANSPORT_OPTIONS = ("http1", "http2", "limits")
"""What ``httpx.Client`` hands its own transports: given to ours."""


def _client_options(
    identity: ClientIdentity,
    transport_class: type[ReloadingTransport] | type[AsyncReloadingTransport],
    proxy: Any,
    mounts: Mapping[str, Any] | None,
    trust_env: bool,
    retire_after: float | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    """What ``httpx.Client`` (``AsyncClient``) is given so that it routes as it would route its own: our transport
    for direct requests, one more per proxy (the environment's where none is given), ``None`` where ``NO_PROXY``
    sends a request direct, the caller's mounts over them."""
    _refuse_ssl_options(options)
    if "transport" in options:
        raise TypeError(f"transport: the client makes its own ({transport_class.__name__}); mount others with mounts=")
    wanted = {name: options.pop(name) for name in _TRANSPORT_OPTIONS if name in options}

    def transport(**extra: Any) -> Any:
        return transport_class(identity, retire_after=retire_after, trust_env=trust_env, **wanted, **extra)

    routes: dict[str, Any] = {
        pattern: None if address is None else transport(proxy=address)
        for pattern, address in _proxy_patterns(proxy, trust_env).items()
    }
    routes.update(mounts or {})
    return {"transport": transport(), "mounts": routes, "trust_env": trust_env, **wanted, **options}


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
    return httpx.Client(
        **_client_options(identity, ReloadingTransport, proxy, mounts, trust_env, retire_after, options)
    )


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
    options = _client_options(identity, AsyncReloadingTransport, proxy, mounts, trust_env, retire_after, options)
    return httpx.AsyncClient(**options)
