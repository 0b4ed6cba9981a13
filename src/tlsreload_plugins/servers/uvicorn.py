"""uvicorn glue: a drop-in command, a context factory, and the factory of gunicorn's ``UvicornWorker``.

* ``tlsreload-uvicorn app:app --ssl-certfile C --ssl-keyfile K [any uvicorn option]`` is uvicorn's own
  command plus the ``--tls-*`` options, handed to the public ``uvicorn.run(..., ssl_context_factory=...)``;
  checks run from each serving process's event loop, so the app needs no change.
* :func:`reloading_ssl_context` is a ``uvicorn.Config(ssl_context_factory=...)``; its checks follow the app's
  ASGI lifespan (:class:`TLSReloadLifespan`, :func:`reloading_certificates`, from :mod:`tlsreload_plugins.lifespan`),
  or run from the server's loop when no lifespan can (``--lifespan off``), a log line saying so.

Where the context is built: uvicorn calls the factory in each serving process; the recipe is uvicorn's own
default factory, so verify mode, CA bundle, ciphers, ALPN and the key password apply on every reload.
Worker lifecycle: one process, or spawned by uvicorn's supervisor: the parent checks the files and keeps the
newest valid identity in a :class:`~tlsreload_plugins.lastgood.SharedStore` that travels with the factory.
The key password: ``ssl_keyfile_password``, else ``$TLSRELOAD_KEY_PASSWORD_FILE``. See docs/uvicorn.md.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import os
import signal
import ssl
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__, lifespan, logs
from ..identity import Password, TLSFiles, password_text
from ..lastgood import RecipeFor, SharedStore
from ..lifespan import TLSReloadLifespan, reloaders, reloading_certificates
from ..reloader import MIN_INTERVAL, Reloader, resolve_password
from ..serving import OPTION_HELP, CannotServe, Settings, Waiting, check_at_start, keep_for_workers, start_reloader

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

STARTUP_FAILURE = 3
"""Exit status when the certificate files or settings are not usable at start-up: uvicorn's own
(``uvicorn.main.STARTUP_FAILURE``; uvicorn >= 0.50 also has ``uvicorn.config.STARTUP_FAILURE``)."""

LIFESPAN_GRACE = 30.0
"""Seconds after start-up after which a reloader that no lifespan is checking gets checked anyway
(with a warning): the app was not wrapped with :class:`TLSReloadLifespan`."""


def _route_logs() -> None:
    logs.forward_to(logging.getLogger("uvicorn.error"))


lifespan.route_logs = _route_logs


def _check_if_forgotten(reloader: Reloader) -> None:
    if lifespan.unchecked(reloader):
        lifespan.check_until_exit(
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
    lifespan.register(reloader)
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
    app needs no lifespan extension. ``last_good``, the parent's store, travels with the factory into
    each process uvicorn's supervisor starts: a child takes the parent's verdict on new files, and one
    started while the files are broken serves the newest valid identity kept there (or, when it expired,
    waits for usable files instead of exiting with :data:`STARTUP_FAILURE`, on which uvicorn's supervisor
    stops the whole server)."""
    reloader = _new_reloader(config, default_factory, interval, last_good, sni, metrics)
    lifespan.register(reloader)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        log.error(
            "uvicorn built its TLS context outside its event loop: %s will NOT be reloaded", reloader.files.describe()
        )
        return reloader.context
    lifespan.check_until_exit(logging.DEBUG, "tlsreload-uvicorn")
    return reloader.context


def recipe_for_config(config: Any, password: Password) -> RecipeFor:
    """uvicorn's default factory (uvicorn/config.py, ``Config.load``) aimed at other files."""

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        from uvicorn.config import create_ssl_context

        return create_ssl_context(
            keyfile=files.keyfile,
            certfile=files.certfile,
            password=password_text(password) if password is not None else config.ssl_keyfile_password,
            ssl_version=config.ssl_version,
            cert_reqs=config.ssl_cert_reqs,
            ca_certs=files.ca_certs,
            ciphers=config.ssl_ciphers,
        )

    return recipe_for


def _files(config: Any) -> TLSFiles:
    certfile, keyfile, ca_certs = config.ssl_certfile, config.ssl_keyfile, config.ssl_ca_certs
    return TLSFiles(str(certfile), str(keyfile) if keyfile else None, str(ca_certs) if ca_certs else None)


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

    # A process uvicorn's supervisor replaces waits for usable files, answering its health checks (its
    # own thread does) and leaving at SIGTERM, rather than exit with the start-up failure code.
    waiting = Waiting(leave=lambda: sys.exit(0), signals=(signal.SIGTERM, signal.SIGINT))
    settings = Settings(interval, sni_directories, metrics_setting)
    try:
        return start_reloader(
            _files(config),
            recipe,
            recipe_for_config(config, password),
            password=password,
            settings=settings,
            store=last_good,
            waiting=waiting if last_good is not None else None,
        )
    except CannotServe as e:
        _startup_failure(str(e))


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
        lifespan.check_until_exit(logging.WARNING, "lifespan is off, so checks cannot follow the app's lifespan")
    else:
        loop.call_later(LIFESPAN_GRACE, _check_if_forgotten, reloader)


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
    settings = Settings(tls_reload_interval, tls_sni or None, tls_metrics or None)
    try:
        settings.check()
        password = resolve_password(options.get("ssl_keyfile_password"))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if not options.get("ssl_certfile"):
        log.warning("no --ssl-certfile given: serving without TLS, nothing to reload")
        uvicorn.run(**kwargs)
        return
    # Fail here, once, rather than in every worker.
    parameters = inspect.signature(uvicorn.Config).parameters.items()
    config = types.SimpleNamespace(**{k: p.default for k, p in parameters if k.startswith("ssl_")})
    vars(config).update((k, v) for k, v in kwargs.items() if k.startswith("ssl_"))
    files, store = _files(config), SharedStore()
    try:
        check_at_start(files, lambda: recipe_for_config(config, password)(files), password, settings, store)
    except CannotServe as e:
        _startup_failure(str(e))
    workers = kwargs.get("workers") or int(os.environ.get("WEB_CONCURRENCY", "1"))
    if workers > 1 or kwargs.get("reload"):  # a supervisor that starts serving processes later
        keep_for_workers(files, password, settings, store)
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
    help_of = OPTION_HELP
    interval = click.Option(
        ["--tls-reload-interval"], type=click.FloatRange(min=MIN_INTERVAL), help=help_of["--tls-reload-interval"]
    )
    params = [_with_our_version(param) if param.name == "version" else param for param in command.params]
    after_ssl = max(i for i, param in enumerate(params) if (param.name or "").startswith("ssl_")) + 1
    tls_sni = click.Option(["--tls-sni"], multiple=True, metavar="DIR", help=help_of["--tls-sni"])
    tls_metrics = click.Option(["--tls-metrics"], is_flag=True, default=False, help=help_of["--tls-metrics"])
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
