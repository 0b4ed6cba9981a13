"""Check this process's reloaders for exactly as long as an ASGI app's lifespan runs.

A server's glue registers each reloader it makes (:func:`register`) where the server builds its
context; nothing checks it yet. An ASGI lifespan then drives the checks:
:class:`TLSReloadLifespan` (middleware) or :func:`reloading_certificates` (an async context manager
for an app's own ``lifespan=``) start an :class:`~tlsreload_plugins.AsyncioDriver` for every
registered reloader nothing checks yet, and stop them as the lifespan ends. Where no lifespan can
(``--lifespan off``, an app without the lifespan protocol), the glue calls :func:`check_until_exit`
and the checks run from the server's event loop until the process exits, a log line saying so.

The registry is needed because an ASGI lifespan scope carries no reference to the server or its
configuration. Nothing here knows a server.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from .drivers import AsyncioDriver
from .reloader import Reloader

__all__ = ["TLSReloadLifespan", "check_until_exit", "register", "reloaders", "reloading_certificates", "unchecked"]

log = logging.getLogger("tlsreload_plugins.lifespan")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LIFESPAN_ENDS = frozenset({"lifespan.startup.failed", "lifespan.shutdown.complete", "lifespan.shutdown.failed"})

_drivers: dict[Reloader, AsyncioDriver | None] = {}
"""This process's registered reloaders, each with the driver that checks it (``None`` while nothing does)."""

_said_nothing_to_reload = False


def _no_routing() -> None:
    pass


route_logs: Callable[[], object] = _no_routing
"""Called before a lifespan claims the reloaders: the server's glue sets it to show our lines in its log."""


def register(reloader: Reloader) -> None:
    """Register ``reloader`` (made where the server builds its context) for a lifespan to check."""
    _drivers[reloader] = None


def reloaders() -> list[Reloader]:
    """The reloaders registered in this process (for health checks, metrics)."""
    return list(_drivers)


def unchecked(reloader: Reloader) -> bool:
    """Whether ``reloader`` is registered and nothing checks it yet."""
    return reloader in _drivers and _drivers[reloader] is None


def _claim() -> list[AsyncioDriver]:
    """A driver for every registered reloader nothing checks yet (not started)."""
    global _said_nothing_to_reload
    route_logs()
    if not _drivers and not _said_nothing_to_reload:
        _said_nothing_to_reload = True
        log.warning(
            "no reloading TLS context in this process, nothing to reload: give uvicorn "
            "ssl_context_factory=tlsreload_plugins.uvicorn.reloading_ssl_context (tlsreload-uvicorn does) "
            "and an --ssl-certfile"
        )
    claimed = [AsyncioDriver(reloader) for reloader, driver in _drivers.items() if driver is None]
    for driver in claimed:
        _drivers[driver.reloader] = driver
    return claimed


def check_until_exit(level: int, why: str) -> None:
    """Check every unchecked reloader from the running asyncio loop until it closes (the server cancels
    its tasks at exit), logging ``why`` at ``level`` for each."""
    import asyncio

    loop = asyncio.get_running_loop()
    for driver in _claim():
        log.log(
            level, "%s: checking %s from the event loop until the process exits", why, driver.reloader.files.describe()
        )
        # start() never suspends: the loop's ready queue holds this task until it has run.
        loop.create_task(driver.start())  # noqa: RUF006


@contextlib.asynccontextmanager
async def reloading_certificates() -> AsyncIterator[list[Reloader]]:
    """Check this process's reloaders while the block runs; yields the ones it checks.

    For an app's own lifespan, entered first so checks start before slow start-up work::

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with reloading_certificates():
                ...  # the app's own start-up
                yield
                ...  # the app's own shutdown
    """
    drivers = _claim()
    try:
        for driver in drivers:
            await driver.start()
        yield [driver.reloader for driver in drivers]
    finally:
        for driver in drivers:
            await driver.stop()
            del _drivers[driver.reloader]
            log.debug("stopped checking %s", driver.reloader.files.describe())


class TLSReloadLifespan:
    """ASGI middleware: checks certificates from lifespan start-up until lifespan shutdown.

    Works around any ASGI app, and composes with its own lifespan: checks start when the server
    sends ``lifespan.startup`` (before the app's own start-up) and stop just before the app's
    ``lifespan.shutdown.complete`` reaches the server. Other scopes pass straight through.
    ``app = TLSReloadLifespan(app)`` or, for Starlette and FastAPI,
    ``app.add_middleware(TLSReloadLifespan)``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        async with contextlib.AsyncExitStack() as checking:
            started = False

            async def on_receive() -> Message:
                nonlocal started
                message = await receive()
                if message["type"] == "lifespan.startup" and not started:
                    started = True
                    await checking.enter_async_context(reloading_certificates())
                return message

            async def on_send(message: Message) -> None:
                if message["type"] in _LIFESPAN_ENDS:
                    await checking.aclose()
                await send(message)

            try:
                await self.app(scope, on_receive, on_send)
            except Exception:
                if not started:  # uvicorn's 'auto' lifespan serves on without one
                    check_until_exit(logging.INFO, "the app does not support the ASGI lifespan protocol")
                raise
