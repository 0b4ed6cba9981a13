"""aiohttp glue: :class:`ReloadingConnector`, a connector for ``aiohttp.ClientSession`` that presents a
:class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest certificate.

A connector is what a ``ClientSession`` takes its connections from (``connector=``), and ``connect`` is its
documented method. aiohttp fixes a ``TCPConnector``'s SSL context when it is made and keys its pooled connections
by it, so each generation of the identity gets a ``TCPConnector`` of its own: new requests take their connections
from the newest, never reusing one made with an older context, and a replaced one is closed, with its kept-alive
connections, once the connections it lent are given back: a response or websocket open across a change goes on, as
with aiohttp alone (``retire_after`` opts in to cutting it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection

from tlsreload_plugins.client.identity import ClientIdentity, OwnContext
from tlsreload_plugins.client.pools import Pools

if TYPE_CHECKING:
    from aiohttp.client import ClientTimeout
    from aiohttp.client_reqrep import ClientRequest
    from aiohttp.tracing import Trace

__all__ = ["ReloadingConnector"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.client")

_SSL_OPTIONS = ("ssl", "ssl_context", "verify_ssl", "fingerprint")
_BASE_OPTIONS = ("keepalive_timeout", "force_close", "limit", "limit_per_host", "timeout_ceil_threshold")
"""The options ``BaseConnector`` takes too: given to it as well, so that the connector's ``limit``,
``limit_per_host`` and ``force_close`` say what each generation's ``TCPConnector`` does."""


def _require_release_callbacks() -> None:
    """The connector learns that a lent connection is given back through ``Connection.add_callback`` (public by
    name, used by ``ClientSession`` itself, absent from aiohttp's reference documentation): refuse to start
    without it rather than never close a replaced connector."""
    if not callable(getattr(Connection, "add_callback", None)):
        raise RuntimeError(
            f"aiohttp {aiohttp.__version__}: aiohttp.connector.Connection.add_callback is gone; "
            "tlsreload_plugins.client.aiohttp cannot tell when a replaced connector is idle"
        )


class ReloadingConnector(aiohttp.BaseConnector):
    """An ``aiohttp.ClientSession`` connector presenting ``identity``'s newest client certificate and trusting its
    newest CA bundle.

    Each generation of the identity gets its own ``aiohttp.TCPConnector`` (made with ``ssl=`` a context of this
    connector's own): connections made with an older context are never reused after a change, and a replaced
    connector is closed once the connections it lent are released (idle ones at once), on the event loop the
    connector was made on (told from the checking thread with ``call_soon_threadsafe``). A response or websocket
    open across a change goes on, as with aiohttp alone. Make it inside a running event loop, as ``TCPConnector``;
    its own context of the identity is built at its first request, on a worker thread (never on the loop).

    ``limit`` and ``limit_per_host`` hold per generation: while a replaced connector still has connections lent,
    the new one may open its own ``limit`` as well. A request given its own ``ssl=`` presents what it was given.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh.
        retire_after: seconds after a change at which the connections a replaced connector still lends are cut
            (aborted: a response being read raises ``aiohttp.ClientPayloadError``, a websocket closes); ``None``
            (the default): never, as aiohttp alone never closes a connection under a response.
        **options: what ``aiohttp.TCPConnector`` takes besides ``ssl``, ``ssl_context``, ``verify_ssl`` and
            ``fingerprint`` (``limit``, ``keepalive_timeout``, ``force_close``, ``resolver``...).

    Raises:
        TypeError: an SSL option is given (they come from the identity).
        RuntimeError: this aiohttp lacks what the connector relies on (``Connection.add_callback``), or no event
            loop is running.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        async with aiohttp.ClientSession(connector=ReloadingConnector(identity)) as session:
            async with session.get("https://service.internal/") as response:
                print(await response.text())
    """

    def __init__(self, identity: ClientIdentity, *, retire_after: float | None = None, **options: Any) -> None:
        given = [name for name in _SSL_OPTIONS if name in options]
        if given:
            raise TypeError(f"{', '.join(given)}: the SSL settings come from the ClientIdentity: give them to it")
        _require_release_callbacks()
        super().__init__(**{name: options[name] for name in _BASE_OPTIONS if name in options})
        self.identity = identity
        self._own: OwnContext | None = None  # built on a worker thread at the first request: never on the loop
        self._options = options
        self._pools: Pools[aiohttp.TCPConnector] = Pools(self._make, retire_after)
        self._closing: set[asyncio.Task[None]] = set()
        self._lent: dict[aiohttp.TCPConnector, set[ResponseHandler]] = {}  # on the loop only
        self._event_loop = asyncio.get_running_loop()
        self._unsubscribe = self._pools.follow(identity, self._close_soon, self._cut_soon)

    def _make(self, generation: int) -> aiohttp.TCPConnector:
        assert self._own is not None  # _own_context() came first
        return aiohttp.TCPConnector(ssl=self._own.context, **self._options)

    async def _own_context(self) -> OwnContext:
        """This connector's own context of the identity, made at its first request on a worker thread: building
        one reads its CA bundle (the system's takes tens of milliseconds), which must not stall the event loop."""
        own = self._own
        if own is None:
            made = await asyncio.to_thread(self.identity.own_context)
            own = self._own = self._own or made  # two first requests at once: one context kept
        return own

    async def connect(self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout) -> Connection:
        """A connection for ``req`` from the newest generation's connector (made now when the identity changed);
        what ``ClientSession`` calls for each request."""
        own = self._own or await self._own_context()
        connector, to_close = self._pools.acquire(own.generation)
        self._close_on_loop(to_close)
        try:
            connection = await connector.connect(req, traces, timeout)
        except BaseException:
            self._close_on_loop(self._pools.release(connector))
            raise
        protocol = connection.protocol
        if protocol is not None:
            self._lent.setdefault(connector, set()).add(protocol)

        def released() -> None:
            lent = self._lent.get(connector)
            if lent is not None and protocol is not None:
                lent.discard(protocol)
                if not lent:
                    del self._lent[connector]
            self._close_on_loop(self._pools.release(connector))

        # Called when the connection is released or closed, before it goes back to its connector's pool: a
        # connector found idle is closed in a task, after the connection is back.
        connection.add_callback(released)
        return connection

    def _cut_soon(self, connectors: list[aiohttp.TCPConnector]) -> None:
        """From the checking thread: cut what ``connectors`` still lend, on the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed, and the connections with it
            self._event_loop.call_soon_threadsafe(self._cut_on_loop, connectors)

    def _cut_on_loop(self, connectors: list[aiohttp.TCPConnector]) -> None:
        """Abort the connections ``connectors`` lent: aiohttp sees each lost under its response, as when a server
        goes away (``ClientPayloadError`` for a body being read, ``ServerDisconnectedError`` before its headers),
        and gives it back; the connector is closed once they all are (never under a reader, which would leave
        its read hanging)."""
        protocols = [protocol for connector in connectors for protocol in self._lent.get(connector, ())]
        for protocol in protocols:
            if protocol.transport is not None:
                protocol.transport.abort()
        if protocols:
            log.info(
                "cut %d aiohttp connection(s) still lent %gs after their client certificate was replaced "
                "(retire_after)",
                len(protocols),
                self._pools.retire_after or 0,
            )

    def _close_soon(self, connectors: list[aiohttp.TCPConnector]) -> None:
        """From the checking thread: close ``connectors`` on the event loop."""
        if not connectors:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed, and the connections with it
            self._event_loop.call_soon_threadsafe(self._close_on_loop, connectors)

    def _close_on_loop(self, connectors: list[aiohttp.TCPConnector]) -> None:
        if not connectors:
            return
        task = self._event_loop.create_task(_close_all(connectors))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self, *, abort_ssl: bool = False) -> None:
        """Close every generation's connector and their connections; the identity's subscriptions end."""
        self._unsubscribe()
        await super().close()
        await _close_all(self._pools.close())
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    @property
    def retired(self) -> int:
        """Replaced connectors not closed yet (connections still lent from them)."""
        return self._pools.retired


async def _close_all(connectors: list[aiohttp.TCPConnector]) -> None:
    for connector in connectors:
        try:
            await connector.close()
        except Exception as e:  # one connector's failure to close must not keep the others open
            log.warning("closing a replaced aiohttp connector failed: %s: %s", type(e).__name__, e)
