"""Reload TLS certificates inside uvicorn: a drop-in command, a lifespan extension, a context factory.

Three ways, one mechanism:

* ``tlsreload-uvicorn app:app --ssl-certfile C --ssl-keyfile K [any uvicorn option]``
  (or ``python -m tlsreload_plugins.uvicorn``) is uvicorn's own command plus
  ``--tls-reload-interval`` (or ``$UVICORN_TLS_RELOAD_INTERVAL``): it hands uvicorn's parsed options
  to the public ``uvicorn.run(..., ssl_context_factory=...)`` with the factory below, whose checks
  run from each serving process's event loop, so the app needs no change and no lifespan.
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

An encrypted key's password comes from ``ssl_keyfile_password`` or, without it, from the first
line of ``$TLSRELOAD_KEY_PASSWORD_FILE``, read again on every reload (not visible in ``ps``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import logging
import os
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__, metrics, sni
from ..drivers import AsyncioDriver
from ..identity import InvalidIdentity, TLSFiles, password_text, read_files, validate
from ..lastgood import LastGood, SharedStore, keep_newest_valid, retry_until_usable, stop_signals_noted
from ..reloader import (
    INTERVAL_ENV,
    MIN_INTERVAL,
    Reloader,
    resolve_expiry_warning_days,
    resolve_interval,
    resolve_password,
)

if TYPE_CHECKING:  # uvicorn and click are the [uvicorn] extra: imported where used, so that a missing
    import click  # extra is one clear line, not a ModuleNotFoundError from this module's import
    import uvicorn

__all__ = [
    "LIFESPAN_GRACE",
    "STARTUP_FAILURE",
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

STARTUP_FAILURE = 3
"""Exit status when the certificate files or settings are not usable at start-up: uvicorn's own
(``uvicorn.main.STARTUP_FAILURE``; uvicorn >= 0.50 also has ``uvicorn.config.STARTUP_FAILURE``)."""

LIFESPAN_GRACE = 30.0
"""Seconds after start-up after which a reloader that no lifespan is checking gets checked anyway
(with a warning): the app was not wrapped with :class:`TLSReloadLifespan`."""

RETRY_DELAY = 0.5
"""Seconds between tries of a replacement process that has nothing valid to serve yet."""

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
    _route_logs()
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
    config: uvicorn.Config,
    default_factory: Callable[[], ssl.SSLContext],
    *,
    interval: float | None = None,
    sni: Sequence[str] | None = None,
    metrics: bool | None = None,
) -> ssl.SSLContext:
    """``uvicorn.Config(ssl_context_factory=...)``: a context that follows the files on disk.

    Reads ``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs`` and ``ssl_keyfile_password`` from
    ``config`` (without a password there, the first line of ``$TLSRELOAD_KEY_PASSWORD_FILE``,
    read again on every reload); ``interval`` defaults to ``$TLSRELOAD_INTERVAL``, else 1 s. For
    another interval, pass ``functools.partial(reloading_ssl_context, interval=5)`` (a partial of
    this module-level function still pickles, which ``--workers`` and ``--reload`` need). Files
    that are not usable at start-up log one error and exit with :data:`STARTUP_FAILURE` (3).
    ``sni``: directories of more identities chosen by server name (default ``$TLSRELOAD_SNI``),
    see :mod:`tlsreload_plugins.sni`. ``metrics``: export Prometheus metrics (default
    ``$TLSRELOAD_METRICS``, else off), see :mod:`tlsreload_plugins.metrics`.
    """
    reloader = _new_reloader(config, default_factory, interval, sni_directories=sni, metrics_setting=metrics)
    _drivers[reloader] = None
    _arrange_checks(config, reloader)
    return reloader.context


def _drop_in_ssl_context(
    config: uvicorn.Config,
    default_factory: Callable[[], ssl.SSLContext],
    *,
    interval: float | None = None,
    last_good: SharedStore | None = None,
    sni: Sequence[str] | None = None,
    metrics: bool | None = None,
) -> ssl.SSLContext:
    """The factory of ``tlsreload-uvicorn``: as :func:`reloading_ssl_context`, checking from the server's
    event loop (uvicorn calls it there, in each serving process) until the process exits, so that the
    app needs no lifespan extension. ``last_good`` travels with the factory into each process uvicorn's
    supervisor starts: the parent's :class:`~tlsreload_plugins.lastgood.SharedStore`, which the parent
    keeps current and every child shares. A child takes the parent's verdict on new files instead of
    parsing them itself; one started while the files are broken serves the newest valid identity kept
    there (or, when it expired, waits for usable files instead of exiting with :data:`STARTUP_FAILURE`,
    on which uvicorn's supervisor stops the whole server)."""
    reloader = _new_reloader(config, default_factory, interval, last_good, sni, metrics)
    _drivers[reloader] = None
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        log.error(
            "uvicorn built its TLS context outside its event loop: %s will NOT be reloaded", reloader.files.describe()
        )
        return reloader.context
    _check_until_exit(logging.DEBUG, "tlsreload-uvicorn")
    return reloader.context


def _new_reloader(
    config: uvicorn.Config,
    default_factory: Callable[[], ssl.SSLContext],
    interval: float | None,
    last_good: SharedStore | None = None,
    sni_directories: Sequence[str] | None = None,
    metrics_setting: bool | None = None,
) -> Reloader:
    """The one place this module makes a Reloader: uvicorn's own default factory as its recipe."""
    _route_logs()
    if not config.ssl_certfile:
        _startup_failure("tlsreload needs ssl_certfile (and usually ssl_keyfile) set on the uvicorn Config")
    password = resolve_password(config.ssl_keyfile_password)
    recipe = default_factory
    if config.ssl_keyfile_password is None and password is not None:

        def recipe() -> ssl.SSLContext:
            # uvicorn's default factory reads the password from its Config on every call.
            config.ssl_keyfile_password = password_text(password)
            return default_factory()

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        from uvicorn.config import create_ssl_context

        # uvicorn's default factory (uvicorn/config.py, Config.load), on other files.
        return create_ssl_context(
            keyfile=files.keyfile,
            certfile=files.certfile,
            password=password_text(password) if password is not None else None,
            ssl_version=config.ssl_version,
            cert_reqs=config.ssl_cert_reqs,
            ca_certs=files.ca_certs,
            ciphers=config.ssl_ciphers,
        )

    def attempt() -> Reloader:
        return Reloader(
            str(config.ssl_certfile),
            str(config.ssl_keyfile) if config.ssl_keyfile else None,
            recipe=recipe,
            ca_certs=str(config.ssl_ca_certs) if config.ssl_ca_certs else None,
            password=password,
            interval=interval,
            last_good=LastGood(last_good, recipe_for) if last_good is not None else None,
        )

    try:
        reloader = attempt()
    except ValueError as e:  # a bad $TLSRELOAD_INTERVAL or expiry setting
        _startup_failure(f"cannot serve TLS: {e}")
    except InvalidIdentity as e:
        if last_good is None or last_good.read() is None:  # the server's very first start
            _startup_failure(f"cannot serve TLS: {e}")
        reloader = _wait_for_usable_files(attempt, e)
    try:
        if metrics.wanted(metrics_setting):
            metrics.observe(reloader)
    except ValueError as e:  # a bad $TLSRELOAD_METRICS
        _startup_failure(f"cannot serve TLS: {e}")
    try:
        sni.attach_from_settings(reloader, sni_directories, recipe_for)
    except ValueError as e:  # a directory that does not exist
        _startup_failure(f"cannot serve TLS: {e}")
    return reloader


def _wait_for_usable_files(attempt: Callable[[], Reloader], error: InvalidIdentity) -> Reloader:
    """A replacement process with nothing to serve: wait, answering uvicorn's health checks (its own
    thread does) and leaving at SIGTERM, rather than exit with the start-up failure code."""
    log.error("process %s cannot load the TLS files and waits for usable ones before serving: %s", os.getpid(), error)
    with stop_signals_noted((signal.SIGTERM, signal.SIGINT)) as stopping:
        reloader = retry_until_usable(attempt, every=RETRY_DELAY, stop=stopping)
    if reloader is None:
        sys.exit(0)
    log.info("process %s: the TLS files are usable again; serving", os.getpid())
    return reloader


def _startup_failure(message: str) -> NoReturn:
    log.error("%s", message)
    sys.exit(STARTUP_FAILURE)


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


def _route_logs() -> None:
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
# uvicorn's own command-line options (the click parameters of `uvicorn.main`), passed to the public
# `uvicorn.run(...)` with `ssl_context_factory`: every option keeps uvicorn's meaning, and nothing of
# uvicorn is replaced.

MISSING_EXTRA = "pip install 'tlsreload-plugins[uvicorn]'"


def _run(
    tls_reload_interval: float | None, tls_sni: tuple[str, ...] = (), tls_metrics: bool = False, **options: Any
) -> None:
    import click
    import uvicorn

    kwargs = _run_arguments(options)
    if options.get("ssl_keyfile") and not options.get("ssl_certfile"):
        raise click.UsageError(
            "--ssl-keyfile needs --ssl-certfile (the key may be in the certificate file, not the other way round)"
        )
    # uvicorn's logging and --env-file now, for what follows; uvicorn.run sets them up again the same way.
    logging_options = ("env_file", "log_config", "log_level", "use_colors")
    uvicorn.Config(kwargs["app"], **{name: kwargs[name] for name in logging_options if name in kwargs})
    _route_logs()
    try:
        resolve_interval(tls_reload_interval)
        resolve_expiry_warning_days()
        password = resolve_password(options.get("ssl_keyfile_password"))
        sni.resolve_directories(tls_sni or None)
        metrics.wanted(tls_metrics or None)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if not options.get("ssl_certfile"):
        log.warning("no --ssl-certfile given: serving without TLS, nothing to reload")
        uvicorn.run(**kwargs)
        return
    # Fail here, once, rather than in every worker.
    files = TLSFiles(
        str(options["ssl_certfile"]),
        str(options["ssl_keyfile"]) if options.get("ssl_keyfile") else None,
        str(options["ssl_ca_certs"]) if options.get("ssl_ca_certs") else None,
    )
    try:
        snapshot = read_files(files)
        leaf = validate(snapshot, password)
    except InvalidIdentity as e:
        _startup_failure(f"cannot serve TLS: {e}")
    store = SharedStore()
    store.write(snapshot, leaf=leaf)
    workers = kwargs.get("workers") or int(os.environ.get("WEB_CONCURRENCY", "1"))
    if workers > 1 or kwargs.get("reload"):  # a supervisor that starts serving processes later
        identities = sni.every_identity(files, tls_sni or None)
        keep_newest_valid(identities, password, store, resolve_interval(tls_reload_interval))
    factory = functools.partial(
        _drop_in_ssl_context,
        interval=tls_reload_interval,
        last_good=store,
        sni=list(tls_sni) or None,
        metrics=tls_metrics or None,
    )
    uvicorn.run(**kwargs, ssl_context_factory=factory)


def _run_arguments(options: dict[str, Any]) -> dict[str, Any]:
    """``uvicorn.run`` keyword arguments for uvicorn's parsed command-line ``options``, as uvicorn's command
    passes them (``uvicorn/main.py``, ``main``): unset options are left to ``uvicorn.run``'s defaults and
    ``--header`` values become (name, value) pairs. Guard: an option ``uvicorn.run`` does not take, or a
    ``uvicorn.run`` without ``ssl_context_factory``, stops the command with one line."""
    import uvicorn

    accepted = inspect.signature(uvicorn.run).parameters
    if "ssl_context_factory" not in accepted:
        _refuse(f"tlsreload-uvicorn needs uvicorn 0.47 or newer; this is uvicorn {uvicorn.__version__}")
    unknown = sorted(name for name in options if name not in accepted)
    if unknown:
        _refuse(
            f"tlsreload-uvicorn does not know how uvicorn {uvicorn.__version__} passes "
            f"{', '.join(unknown)} to uvicorn.run(): use a tlsreload-plugins release that supports it"
        )
    kwargs = {name: value for name, value in options.items() if value is not None and value != ()}
    if kwargs.get("headers"):
        kwargs["headers"] = [
            header.split(":", 1) if isinstance(header, str) else header for header in kwargs["headers"]
        ]
    return kwargs


def _refuse(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    sys.exit(STARTUP_FAILURE)


def _command() -> click.Command:
    import click
    import uvicorn

    stock = uvicorn.main
    if not isinstance(stock, click.Command) or not any(param.name == "ssl_certfile" for param in stock.params):
        _refuse(f"tlsreload-uvicorn cannot find uvicorn {uvicorn.__version__}'s command-line options (uvicorn.main)")
    command = copy.copy(stock)
    interval = click.Option(
        ["--tls-reload-interval"],
        type=click.FloatRange(min=MIN_INTERVAL),
        default=None,
        help=f"Seconds between checks of the TLS certificate files. Defaults to ${INTERVAL_ENV}, else 1.",
    )
    params = [_with_our_version(param) if param.name == "version" else param for param in command.params]
    after_ssl = max(i for i, param in enumerate(params) if (param.name or "").startswith("ssl_")) + 1
    tls_sni = click.Option(
        ["--tls-sni"],
        multiple=True,
        metavar="DIR",
        help=f"A directory of more TLS identities, chosen by server name (SNI): a Kubernetes TLS Secret or "
        f"certbot lineage, or a directory of them. Repeatable. Defaults to ${sni.SNI_ENV}.",
    )
    tls_metrics = click.Option(
        ["--tls-metrics"],
        is_flag=True,
        default=False,
        help=f"Export Prometheus metrics of the TLS certificates (needs prometheus_client). "
        f"Defaults to ${metrics.METRICS_ENV}.",
    )
    command.params = [*params[:after_ssl], interval, tls_sni, tls_metrics, *params[after_ssl:]]
    command.callback = _run
    return command


def _with_our_version(param: click.Parameter) -> click.Parameter:
    """uvicorn's ``--version``, followed by a line naming this package."""
    import click

    stock_callback = param.callback
    param = copy.copy(param)

    def print_versions(ctx: click.Context, this: click.Parameter, value: Any) -> Any:
        try:
            return stock_callback(ctx, this, value) if stock_callback is not None else value
        except click.exceptions.Exit:
            click.echo(f"with tlsreload-plugins {__version__}")
            raise

    param.callback = print_versions
    return param


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-uvicorn``: uvicorn's command line, reloading certificates."""
    try:
        import click  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"tlsreload-uvicorn needs uvicorn, which is not installed ({e}): {MISSING_EXTRA}", file=sys.stderr)
        sys.exit(1)
    _command().main(args=args)


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: pickled configs and the app's own
    # imports must all meet the one registry of tlsreload_plugins.uvicorn.
    from tlsreload_plugins.uvicorn import main as _main

    _main()
