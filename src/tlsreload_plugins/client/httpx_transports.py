"""What the httpx glue (:mod:`tlsreload_plugins.client.httpx`) and the httpx2 glue
(:mod:`tlsreload_plugins.client.httpx2`) share: the reloading transports' logic, written once over "the library",
the ``httpx`` or ``httpx2`` module that a glue module hands in.

httpx2 is httpx's fork with the same API under another name: a transport works with one of them only, because each
client checks that a request's and a response's streams are its own library's ``SyncByteStream`` (an httpx
transport handed to an ``httpx2.Client`` fails with a bare ``AssertionError``). So each glue module defines its
classes on its library's base classes (``BaseTransport``, ``SyncByteStream``...) with the mixins here, which name no
library: a user of httpx alone never imports httpx2, nor a user of httpx2 alone httpx.

Why a transport per generation of the identity, and what a replaced one does: the httpx glue's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

import anyio

from tlsreload_plugins.client.identity import ClientIdentity, OwnContext
from tlsreload_plugins.client.pools import Pools

__all__ = [
    "GLUE_NAMES",
    "AsyncReleasedStream",
    "AsyncReloading",
    "Body",
    "ReleasedStream",
    "Streams",
    "SyncReloading",
    "client_options",
    "refuse_ssl_options",
]

T = TypeVar("T")

GLUE_NAMES = (
    "AsyncReloadingTransport",
    "ReloadingTransport",
    "async_reloading_client",
    "environment_proxies",
    "reloading_client",
)
"""What the httpx glue and the httpx2 glue each offer, under the same names: their ``__all__``."""

SSL_OPTIONS = ("verify", "cert")
"""What the identity gives a transport: refused when given to one."""

TRANSPORT_OPTIONS = ("http1", "http2", "limits")
"""What ``httpx.Client`` hands its own transports: given to ours."""


def refuse_ssl_options(options: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` when ``options`` hold ``verify`` or ``cert``: they come from the identity."""
    given = [name for name in SSL_OPTIONS if name in options]
    if given:
        raise TypeError(f"{' and '.join(given)} come from the ClientIdentity: give them to it")


def cut_reason(retire_after: float | None) -> str:
    """What a read cut by ``retire_after`` says."""
    return (
        f"the connection was closed {retire_after or 0:g} s after its client certificate was replaced "
        "(retire_after): the response was still being read"
    )


class Streams:
    """The responses in flight through each transport (their bodies not closed yet), and the transports cut: what a
    cut reaches. A cut shuts each response's socket down (from any thread: ``shutdown`` wakes a reader blocked on it,
    in a thread or on an event loop) and lets the reader fail as httpx fails on a connection closed under it; the
    transport itself is closed once those responses are closed, never under a reader. Without ``retire_after``
    nothing is ever cut, and nothing is kept (``tracking`` off: a request costs no lock here)."""

    def __init__(self, tracking: bool) -> None:
        self.tracking = tracking
        self._lock = threading.Lock()
        self._open: dict[object, set[Body]] = {}
        self._cut: set[object] = set()

    def add(self, transport: object, body: Body) -> None:
        if not self.tracking:
            return
        with self._lock:
            cut = transport in self._cut
            if not cut:
                self._open.setdefault(transport, set()).add(body)
        if cut:  # its transport was cut while the request waited for its headers
            body.cut()

    def discard(self, transport: object, body: Body) -> None:
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


class Body:
    """What a response's body shares between its sync and async forms: its socket, whether it was cut, and saying
    once that it is done. ``library``: the module whose errors a read raises (``httpx`` or ``httpx2``)."""

    def __init__(self, library: ModuleType, response: Any, done: Callable[[], Any], reason: str) -> None:
        self.library = library
        self._stream: Any = response.extensions.get("network_stream")  # its socket is asked for at a cut only
        self._done: Callable[[], Any] | None = done
        self._reason = reason
        self.was_cut: bool = False

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

    def translate(self, error: Exception) -> Exception:
        """The error a read raises: the library's own, or for a cut, its ``ReadError`` saying why."""
        return self.library.ReadError(self._reason) if self.was_cut else error

    def take_done(self) -> Callable[[], Any] | None:
        done, self._done = self._done, None
        return done


class ReleasedStream:
    """A response's body that says when it is closed (its request no longer holds its transport) and that can be
    cut. A glue module's subclass adds its library's ``SyncByteStream``, the only body its client takes."""

    def __init__(self, stream: Any, body: Body) -> None:
        self._stream = stream
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except self.body.library.TransportError as e:
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


class AsyncReleasedStream:
    """:class:`ReleasedStream` for the async clients (with the library's ``AsyncByteStream``)."""

    def __init__(self, stream: Any, body: Body) -> None:
        self._stream = stream
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except self.body.library.TransportError as e:
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


class SyncReloading:
    """The logic of a sync reloading transport: a glue module's ``ReloadingTransport`` is this and its library's
    ``BaseTransport``, and names the library (``library``) and its body class (``released``)."""

    library: ModuleType
    """``httpx`` or ``httpx2``: whose ``HTTPTransport`` carries the requests."""
    released: type[ReleasedStream]
    """:class:`ReleasedStream` with the library's ``SyncByteStream``."""

    def __init__(self, identity: ClientIdentity, *, retire_after: float | None = None, **options: Any) -> None:
        refuse_ssl_options(options)
        self.identity = identity
        self._own = identity.own_context()
        self._options = options
        self._reason = cut_reason(retire_after)
        self._streams = Streams(tracking=retire_after is not None)
        self._pools: Pools[Any] = Pools(self._make, retire_after)
        self._pools.follow(identity, self._close_all, self._streams.cut)

    def _make(self, generation: int) -> Any:
        return self.library.HTTPTransport(verify=self._own.context, **self._options)

    def handle_request(self, request: Any) -> Any:
        transport, to_close = self._pools.acquire(self._own.generation)
        self._close_all(to_close)
        try:
            response = transport.handle_request(request)
        except BaseException:
            self._close_all(self._pools.release(transport))
            raise
        stream = response.stream
        assert isinstance(stream, self.library.SyncByteStream)

        def done() -> None:
            self._streams.discard(transport, body)
            self._close_all(self._pools.release(transport))

        body = Body(self.library, response, done, self._reason)
        response.stream = self.released(stream, body)
        self._streams.add(transport, body)
        return response

    def _close_all(self, transports: list[Any]) -> None:
        self._streams.closed(transports)
        for transport in transports:
            transport.close()

    def close(self) -> None:
        """Close every transport and their connections. As the library's own transport, it still works after: the
        next request connects again."""
        self._close_all(self._pools.clear())

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (responses still open on them)."""
        return self._pools.retired


class AsyncReloading:
    """:class:`SyncReloading` for the async clients (with the library's ``AsyncBaseTransport``). Replaced
    transports are closed on the event loop that made them (told from the checking thread with
    ``call_soon_threadsafe``, under asyncio; under trio at the next request). Its own context of the identity is
    built at its first request, on a worker thread."""

    library: ModuleType
    """``httpx`` or ``httpx2``: whose ``AsyncHTTPTransport`` carries the requests."""
    released: type[AsyncReleasedStream]
    """:class:`AsyncReleasedStream` with the library's ``AsyncByteStream``."""

    def __init__(self, identity: ClientIdentity, *, retire_after: float | None = None, **options: Any) -> None:
        refuse_ssl_options(options)
        self.identity = identity
        self._own: OwnContext | None = None  # built on a worker thread at the first request: never on the loop
        self._options = options
        self._reason = cut_reason(retire_after)
        self._streams = Streams(tracking=retire_after is not None)
        self._pools: Pools[Any] = Pools(self._make, retire_after)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._pending: list[Any] = []
        self._pending_lock = threading.Lock()  # the checking thread adds, the loop takes
        self._pools.follow(identity, self._close_soon, self._streams.cut)

    def _make(self, generation: int) -> Any:
        assert self._own is not None  # _own_context() came first
        return self.library.AsyncHTTPTransport(verify=self._own.context, **self._options)

    async def _own_context(self) -> OwnContext:
        """This transport's own context of the identity, made at its first request on a worker thread: building
        one reads its CA bundle (the system's takes tens of milliseconds), which must not stall the event loop."""
        own = self._own
        if own is None:
            made = await anyio.to_thread.run_sync(self.identity.own_context)
            own = self._own = self._own or made  # two first requests at once: one context kept
        return own

    def _close_soon(self, transports: list[Any]) -> None:
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

    def _take_pending(self) -> list[Any]:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        return pending

    def _close_on_loop(self, transports: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._aclose_all(transports))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _aclose_all(self, transports: list[Any]) -> None:
        self._streams.closed(transports)
        for transport in transports:
            await transport.aclose()

    async def handle_async_request(self, request: Any) -> Any:
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
        assert isinstance(stream, self.library.AsyncByteStream)

        async def done() -> None:
            self._streams.discard(transport, body)
            await self._aclose_all(self._pools.release(transport))

        body = Body(self.library, response, done, self._reason)
        response.stream = self.released(stream, body)
        self._streams.add(transport, body)
        return response

    async def aclose(self) -> None:
        """Close every transport and their connections. As the library's own transport, it still works after."""
        await self._aclose_all([*self._take_pending(), *self._pools.clear()])

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (responses still open on them)."""
        return self._pools.retired


def client_options(
    identity: ClientIdentity,
    transport_class: type[SyncReloading] | type[AsyncReloading],
    proxies: Callable[[], Mapping[str, str | None]],
    *,
    proxy: Any = None,
    mounts: Mapping[str, Any] | None = None,
    trust_env: bool = True,
    retire_after: float | None = None,
    **options: Any,
) -> dict[str, Any]:
    """What a ``Client`` (``AsyncClient``) of the library is given so that it routes as it would route its own: a
    ``transport_class`` for direct requests, one more per proxy (``proxy``, else with ``trust_env`` the
    environment's, read by ``proxies``: ``{URL pattern: proxy URL, or None for no proxy}``), ``None`` where
    ``NO_PROXY`` sends a request direct, the caller's mounts over them.

    Raises:
        TypeError: ``options`` hold ``verify``, ``cert`` or ``transport``.
    """
    refuse_ssl_options(options)
    if "transport" in options:
        raise TypeError(f"transport: the client makes its own ({transport_class.__name__}); mount others with mounts=")
    wanted = {name: options.pop(name) for name in TRANSPORT_OPTIONS if name in options}

    def transport(**extra: Any) -> Any:
        return transport_class(identity, retire_after=retire_after, trust_env=trust_env, **wanted, **extra)

    patterns: Mapping[str, str | None] = {"all://": proxy} if proxy is not None else proxies() if trust_env else {}
    routes: dict[str, Any] = {
        pattern: None if address is None else transport(proxy=address) for pattern, address in patterns.items()
    }
    routes.update(mounts or {})
    return {"transport": transport(), "mounts": routes, "trust_env": trust_env, **wanted, **options}
