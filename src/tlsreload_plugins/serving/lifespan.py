"""This process's reloaders, checked for exactly as long as an ASGI app's lifespan runs.

A server's glue registers each reloader it makes (:func:`register`) where the server builds its
context; nothing checks it yet. An ASGI lifespan then drives the checks:
:class:`TLSReloadLifespan` (middleware) or :func:`reloading_certificates` (an async context manager
for an app's own ``lifespan=``) start an :class:`~tlsreload_plugins.AsyncioDriver` for every
registered reloader nothing checks yet, and stop them as the lifespan ends. Where no lifespan can
(the lifespan is off, an app without the lifespan protocol), the checks run from the server's event
loop until the process exits, a log line saying so (:func:`check_until_exit`, :func:`follow_lifespan`);
a server that needs no lifespan checks from its loop at once (:func:`check_from_loop`), and glue that
starts its own checks registers the reloader with its driver, to be listed by :func:`reloaders`.

The registry is needed because an ASGI lifespan scope carries no reference to the server or its
configuration. Nothing here knows a server.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from tlsreload_plugins.drivers import AsyncioDriver, ThreadDriver, TrioDriver
from tlsreload_plugins.reloader import Reloader

__all__ = [
    "TLSReloadLifespan",
    "check_from_loop",
    "check_until_exit",
    "follow_lifespan",
    "register",
    "reloaders",
    "reloading_certificates",
    "unchecked",
    "unregister",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.lifespan")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LIFESPAN_ENDS = frozenset({"lifespan.startup.failed", "lifespan.shutdown.complete", "lifespan.shutdown.failed"})

_drivers: dict[Reloader, AsyncioDriver | TrioDriver | ThreadDriver | None] = {}
"""This process's registered reloaders, each with the driver that checks it (``None`` while nothing does)."""

_said_nothing_to_reload = False


def _no_routing() -> None:
    pass


route_logs: Callable[[], object] = _no_routing
"""Called before a lifespan claims the reloaders: the server's glue sets it to show our lines in its log."""


def register(reloader: Reloader, driver: AsyncioDriver | TrioDriver | ThreadDriver | None = None) -> None:
    """Register ``reloader`` (made where the server builds its context) for a lifespan to check; with the
    ``driver`` that checks it already, only to list it in :func:`reloaders`."""
    _drivers[reloader] = driver


def unregister(reloader: Reloader) -> AsyncioDriver | TrioDriver | ThreadDriver | None:
    """Forget ``reloader`` (no longer in :func:`reloaders`), for a process that stops serving it without exiting (an
    application that rebuilds its server, the tests); returns the driver that checked it, for the caller to stop.

    Example: ``driver = unregister(reloader)``, then ``driver.stop()`` for a thread driver.
    """
    return _drivers.pop(reloader, None)


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
            "no reloading TLS context in this process, nothing to reload: the server's TLS context must come "
            "from tlsreload's glue for it (its drop-in command, or its context factory), with a certificate file"
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


def follow_lifespan(reloader: Reloader, *, lifespan_off: bool, grace: float) -> None:
    """Register ``reloader`` for the app's lifespan to check, and see that something checks it.

    Args:
        reloader: made where the server builds its context.
        lifespan_off: the server runs no lifespan: from its running loop, check until the process exits
            (a WARNING says why); made before any loop runs, nothing can (a WARNING says it is not reloaded).
        grace: seconds after which, when no lifespan has claimed it, it is checked until exit anyway (a
            WARNING says the app was not wrapped with :class:`TLSReloadLifespan`).

    Example::

        follow_lifespan(reloader, lifespan_off=config.lifespan == "off", grace=30.0)
    """
    import asyncio

    register(reloader)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # made before the server's loop runs: only a lifespan can start the checks
        if lifespan_off:
            files = reloader.files.describe()
            log.warning("lifespan is off and no event loop runs yet: %s will NOT be reloaded", files)
        return
    if lifespan_off:
        check_until_exit(logging.WARNING, "lifespan is off, so checks cannot follow the app's lifespan")
    else:
        loop.call_later(grace, _check_if_forgotten, reloader, grace)


def _check_if_forgotten(reloader: Reloader, grace: float) -> None:
    if unchecked(reloader):
        check_until_exit(
            logging.WARNING,
            f"no TLSReloadLifespan or reloading_certificates() started within {grace:g}s of start-up "
            "(wrap the app to tie checks to its lifespan)",
        )


def check_from_loop(reloader: Reloader, who: str) -> None:
    """Register ``reloader`` and check it from the running asyncio loop until the process exits: for a server
    whose checks need no lifespan.

    Args:
        reloader: made where the server builds its context, in its loop.
        who: names the server in the log line (DEBUG); outside a running loop, an ERROR line says that the
            files will not be reloaded, and nothing checks them.

    Example::

        check_from_loop(reloader, "tlsreload-uvicorn")
    """
    import asyncio

    register(reloader)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        files = reloader.files.describe()
        log.error("%s: the TLS context was built outside the event loop: %s will NOT be reloaded", who, files)
        return
    check_until_exit(logging.DEBUG, who)


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
