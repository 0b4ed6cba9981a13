"""Reload TLS certificates inside uvicorn: a drop-in command, a lifespan extension, a context factory.

Three ways, one mechanism:

* ``tlsreload-uvicorn app:app --ssl-certfile C --ssl-keyfile K [any uvicorn option]``
  (or ``python -m tlsreload_plugins.uvicorn``) is uvicorn's own command plus
  ``--tls-reload-interval``; it does the two steps below for you, in every worker.
* :func:`reloading_ssl_context` is a ``uvicorn.Config(ssl_context_factory=...)``. uvicorn calls it
  in each serving process; it builds a :class:`~tlsreload_plugins.Reloader` whose recipe is
  uvicorn's own default factory (so verify mode, CA bundle, ciphers, ALPN and key password all
  apply on every reload), registers it in this process and hands uvicorn ``reloader.context``.
* :class:`TLSReloadLifespan` (ASGI middleware) or :func:`reloading_certificates` (an async
  context manager for an app's own ``lifespan=``) checks the registered reloaders for exactly
  as long as the app's lifespan runs.

When no lifespan can do it (``--lifespan off``, an app that does not speak the lifespan
protocol, or a factory used without the extension), checks run from the server's event loop
until the process exits, and a log line says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib
import inspect
import logging
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import click
import uvicorn
from uvicorn.config import STARTUP_FAILURE

from . import metrics
from .drivers import AsyncioDriver
from .identity import InvalidIdentity, TLSFiles, read_files, validate
from .reloader import INTERVAL_ENV, Reloader, resolve_expiry_warning_days, resolve_interval

__all__ = [
    "LIFESPAN_GRACE",
    "TLSReloadLifespan",
    "main",
    "reloaders",
    "reloading_certificates",
    "reloading_ssl_context",
]

log = logging.getLogger("tlsreload_plugins.uvicorn")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LIFESPAN_GRACE = 30.0
"""Seconds after start-up after which a reloader that no lifespan is checking gets checked anyway
(with a warning): the app was not wrapped with :class:`TLSReloadLifespan`."""

_LIFESPAN_ENDS = frozenset({"lifespan.startup.failed", "lifespan.shutdown.complete", "lifespan.shutdown.failed"})

# -- the reloaders of this process ---------------------------------------------------------
# uvicorn's lifespan scope carries no reference to the config or server: the factory leaves
# each reloader here and the lifespan extension picks them up. Each value is the driver that
# checks the reloader, or None while nothing does.
_drivers: dict[Reloader, AsyncioDriver | None] = {}
_said_nothing_to_reload = False


def reloaders() -> list[Reloader]:
    """The reloaders :func:`reloading_ssl_context` made in this process (for health checks, metrics)."""
    return list(_drivers)


def _claim() -> list[AsyncioDriver]:
    """A driver for every registered reloader nothing checks yet (not started)."""
    global _said_nothing_to_reload
    _route_logs_to_uvicorn()
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


def _check_until_exit(level: int, why: str) -> None:
    """Check every unchecked reloader from the running loop until it closes (uvicorn cancels it at exit)."""
    loop = asyncio.get_running_loop()
    for driver in _claim():
        log.log(
            level, "%s: checking %s from the event loop until the process exits", why, driver.reloader.files.describe()
        )
        # start() never suspends: the loop's ready queue holds this task until it has run.
        loop.create_task(driver.start())  # noqa: RUF006


def _check_if_forgotten(reloader: Reloader) -> None:
    if _drivers.get(reloader, False) is None:
        _check_until_exit(
            logging.WARNING,
            f"no TLSReloadLifespan or reloading_certificates() started within {LIFESPAN_GRACE:g}s of start-up "
            "(wrap the app to tie checks to its lifespan)",
        )


# -- the context factory -------------------------------------------------------------------


def reloading_ssl_context(
    config: uvicorn.Config, default_factory: Callable[[], ssl.SSLContext], *, interval: float | None = None
) -> ssl.SSLContext:
    """``uvicorn.Config(ssl_context_factory=...)``: a context that follows the files on disk.

    Reads ``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs`` and ``ssl_keyfile_password`` from
    ``config``; ``interval`` defaults to ``$TLSRELOAD_INTERVAL``, else 1 s. For another interval,
    pass ``functools.partial(reloading_ssl_context, interval=5)`` (a partial of this module-level
    function still pickles, which ``--workers`` and ``--reload`` need). Files that are not usable
    at start-up log one error and exit with uvicorn's start-up failure code (3).
    """
    _route_logs_to_uvicorn()
    if not config.ssl_certfile:
        log.error("tlsreload needs ssl_certfile (and usually ssl_keyfile) set on the uvicorn Config")
        sys.exit(STARTUP_FAILURE)
    try:
        # The one place this module makes a Reloader.
        reloader = Reloader(
            str(config.ssl_certfile),
            str(config.ssl_keyfile) if config.ssl_keyfile else None,
            recipe=default_factory,
            ca_certs=str(config.ssl_ca_certs) if config.ssl_ca_certs else None,
            password=config.ssl_keyfile_password,
            interval=interval,
        )
    except (InvalidIdentity, ValueError) as e:  # ValueError: a bad $TLSRELOAD_INTERVAL or expiry setting
        log.error("cannot serve TLS: %s", e)
        sys.exit(STARTUP_FAILURE)
    metrics.observe(reloader)
    _drivers[reloader] = None
    _arrange_checks(config, reloader)
    return reloader.context


def _arrange_checks(config: uvicorn.Config, reloader: Reloader) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # Config.load() called before the server's loop runs: only a lifespan can start checks
        if config.lifespan == "off":
            files = reloader.files.describe()
            log.warning("lifespan is off and no event loop runs yet: %s will NOT be reloaded", files)
        return
    if config.lifespan == "off":
        _check_until_exit(logging.WARNING, "lifespan is off, so checks cannot follow the app's lifespan")
    else:
        loop.call_later(LIFESPAN_GRACE, _check_if_forgotten, reloader)


# -- the lifespan extension ----------------------------------------------------------------


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
                    _check_until_exit(logging.INFO, "the app does not support the ASGI lifespan protocol")
                raise


# -- logs ----------------------------------------------------------------------------------


class _ToUvicorn(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        # uvicorn's format shows no logger name: say whose line it is.
        record = copy.copy(record)
        record.msg = f"tlsreload: {record.msg}"
        logging.getLogger("uvicorn.error").handle(record)


def _route_logs_to_uvicorn() -> None:
    """Show tlsreload's lines as uvicorn shows its own: its handlers, its format, its --log-level.

    Left alone when the application configured logging itself (a handler on the root logger or on
    ``tlsreload_plugins``): the lines then go where it said.
    """
    ours = logging.getLogger("tlsreload_plugins")
    if ours.handlers or logging.getLogger().handlers:
        return
    ours.addHandler(_ToUvicorn())
    ours.setLevel(logging.getLogger("uvicorn.error").getEffectiveLevel())
    ours.propagate = False


# -- the drop-in command -------------------------------------------------------------------


class _DropInConfig(uvicorn.Config):
    """uvicorn's Config plus the reloading factory and the lifespan extension.

    Built in the command's process; ``--workers`` and ``--reload`` children receive it pickled and
    call :meth:`load` themselves, so each one gets its own reloader and extension.
    """

    def __init__(self, app: Any, *, tls_reload_interval: float | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)  # configures logging
        _route_logs_to_uvicorn()
        self.tls_reload = bool(self.ssl_certfile)
        if not self.tls_reload:
            log.warning("no --ssl-certfile given: serving without TLS, nothing to reload")
            return
        self.ssl_context_factory = functools.partial(reloading_ssl_context, interval=tls_reload_interval)
        # Fail here, once, rather than in every worker.
        files = TLSFiles(
            str(self.ssl_certfile),
            str(self.ssl_keyfile) if self.ssl_keyfile else None,
            str(self.ssl_ca_certs) if self.ssl_ca_certs else None,
        )
        try:
            validate(read_files(files), self.ssl_keyfile_password)
        except InvalidIdentity as e:
            log.error("cannot serve TLS: %s", e)
            sys.exit(STARTUP_FAILURE)

    def load(self) -> None:
        super().load()
        if self.tls_reload and self.lifespan != "off":
            # Outermost, after uvicorn's own wrapping: --factory, --interface and proxy headers still apply.
            self.loaded_app = TLSReloadLifespan(self.loaded_app)


def _run(tls_reload_interval: float | None, **uvicorn_options: Any) -> None:
    if "ssl_context_factory" not in inspect.signature(uvicorn.Config).parameters:
        click.echo(f"tlsreload-uvicorn needs uvicorn 0.47 or newer; this is uvicorn {uvicorn.__version__}", err=True)
        sys.exit(STARTUP_FAILURE)
    try:
        resolve_interval(tls_reload_interval)
        resolve_expiry_warning_days()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    # uvicorn's command builds its Config through the module global `Config` of uvicorn.main; run
    # that very command with ours in its place, so that every option keeps uvicorn's own meaning.
    uvicorn_main: Any = importlib.import_module("uvicorn.main")  # `uvicorn.main` is the command, not the module
    original = uvicorn_main.Config
    uvicorn_main.Config = functools.partial(_DropInConfig, tls_reload_interval=tls_reload_interval)
    try:
        uvicorn.main.callback(**uvicorn_options)  # type: ignore[misc]
    finally:
        uvicorn_main.Config = original


def _command() -> click.Command:
    command = copy.copy(uvicorn.main)
    interval = click.Option(
        ["--tls-reload-interval"],
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        allow_from_autoenv=False,
        help=f"Seconds between checks of the TLS certificate files. Defaults to ${INTERVAL_ENV}, else 1.",
    )
    after_ssl = max(i for i, param in enumerate(command.params) if (param.name or "").startswith("ssl_")) + 1
    command.params = [*command.params[:after_ssl], interval, *command.params[after_ssl:]]
    command.callback = _run
    return command


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-uvicorn``: uvicorn's command line, reloading certificates."""
    _command().main(args=args)


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: pickled configs and the app's own
    # imports must all meet the one registry of tlsreload_plugins.uvicorn.
    from tlsreload_plugins.uvicorn import main as _main

    _main()
