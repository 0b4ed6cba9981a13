"""httpx glue: transports that present a :class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest
certificate, for ``httpx.Client`` (:class:`ReloadingTransport`) and ``httpx.AsyncClient``
(:class:`AsyncReloadingTransport`).

A transport is httpx's documented extension point. httpx fixes a transport's SSL context when it builds its
connection pool, so each generation of the identity gets a transport of its own: new requests go through the
newest, and a replaced one is closed once the requests it carries are done (at the latest ``retire_after``
seconds after the change). Its kept-alive connections, which would go on presenting the old certificate, go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

from tlsreload_plugins.client.identity import ClientIdentity
from tlsreload_plugins.client.pools import DEFAULT_RETIRE_AFTER, Pools

__all__ = ["AsyncReloadingTransport", "ReloadingTransport"]


class _Released(httpx.SyncByteStream):
    """A response's body that says when it is closed: its request no longer holds its pool."""

    def __init__(self, stream: httpx.SyncByteStream, done: Callable[[], None]) -> None:
        self._stream = stream
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


class _AsyncReleased(httpx.AsyncByteStream):
    """:class:`_Released` for ``httpx.AsyncClient``."""

    def __init__(self, stream: httpx.AsyncByteStream, done: Callable[[], Any]) -> None:
        self._stream = stream
        self._done: Callable[[], Any] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            done, self._done = self._done, None
            if done is not None:
                await done()


class ReloadingTransport(httpx.BaseTransport):
    """An ``httpx.Client`` transport presenting ``identity``'s newest client certificate and trusting its
    newest CA bundle.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        retire_after: seconds after a change at which a replaced transport is closed even with requests in
            flight (``None``: only once they are done).
        **options: what ``httpx.HTTPTransport`` takes besides ``verify`` and ``cert`` (``http2``, ``limits``,
            ``retries``, ``proxy``...).

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with httpx.Client(transport=ReloadingTransport(identity)) as client:
            client.get("https://service.internal/")
    """

    def __init__(
        self, identity: ClientIdentity, *, retire_after: float | None = DEFAULT_RETIRE_AFTER, **options: Any
    ) -> None:
        if "verify" in options or "cert" in options:
            raise TypeError("verify and cert come from the ClientIdentity: give them to it")
        self.identity = identity
        self._options = options
        self._pools: Pools[httpx.HTTPTransport] = Pools(self._make, retire_after)
        self._unsubscribe = self._pools.follow(identity, _close_all)

    def _make(self, generation: int) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(verify=self.identity.context, **self._options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        transport, to_close = self._pools.acquire(self.identity.generation)
        _close_all(to_close)
        try:
            response = transport.handle_request(request)
        except BaseException:
            _close_all(self._pools.release(transport))
            raise
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        response.stream = _Released(stream, lambda: _close_all(self._pools.release(transport)))
        return response

    def close(self) -> None:
        self._unsubscribe()
        _close_all(self._pools.close())

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (requests still in flight on them)."""
        return self._pools.retired


def _close_all(transports: list[httpx.HTTPTransport]) -> None:
    for transport in transports:
        transport.close()


class AsyncReloadingTransport(httpx.AsyncBaseTransport):
    """:class:`ReloadingTransport` for ``httpx.AsyncClient``. Replaced transports are closed on the event loop
    that made them (told from the checking thread with ``call_soon_threadsafe``, under asyncio; under trio at the
    next request).

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        async with httpx.AsyncClient(transport=AsyncReloadingTransport(identity)) as client:
            await client.get("https://service.internal/")
    """

    def __init__(
        self, identity: ClientIdentity, *, retire_after: float | None = DEFAULT_RETIRE_AFTER, **options: Any
    ) -> None:
        if "verify" in options or "cert" in options:
            raise TypeError("verify and cert come from the ClientIdentity: give them to it")
        self.identity = identity
        self._options = options
        self._pools: Pools[httpx.AsyncHTTPTransport] = Pools(self._make, retire_after)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._pending: list[httpx.AsyncHTTPTransport] = []
        self._pending_lock = threading.Lock()  # the checking thread adds, the loop takes
        self._unsubscribe = self._pools.follow(identity, self._close_soon)

    def _make(self, generation: int) -> httpx.AsyncHTTPTransport:
        return httpx.AsyncHTTPTransport(verify=self.identity.context, **self._options)

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
        task = asyncio.get_running_loop().create_task(_aclose_all(transports))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._loop is None:
            with contextlib.suppress(RuntimeError):  # trio: replaced transports are closed at requests
                self._loop = asyncio.get_running_loop()
        pending = self._take_pending()
        transport, to_close = self._pools.acquire(self.identity.generation)
        await _aclose_all([*pending, *to_close])
        try:
            response = await transport.handle_async_request(request)
        except BaseException:
            await _aclose_all(self._pools.release(transport))
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)

        async def done() -> None:
            await _aclose_all(self._pools.release(transport))

        response.stream = _AsyncReleased(stream, done)
        return response

    async def aclose(self) -> None:
        self._unsubscribe()
        await _aclose_all([*self._take_pending(), *self._pools.close()])

    @property
    def retired(self) -> int:
        """Replaced transports not closed yet (requests still in flight on them)."""
        return self._pools.retired


async def _aclose_all(transports: list[httpx.AsyncHTTPTransport]) -> None:
    for transport in transports:
        await transport.aclose()
