"""uvicorn glue: a drop-in command, a context factory, and gunicorn's ``UvicornWorker``. See docs/uvicorn.md.

``tlsreload-uvicorn`` is uvicorn's command plus the ``--tls-*`` options, handed to ``uvicorn.run(...,
ssl_context_factory=...)`` (``--tls-spiffe``: the certificate, key and CA bundle from SPIFFE's Workload API, followed
by the supervisor); :func:`reloading_ssl_context` is that factory for programs, its checks following
the app's ASGI lifespan (:class:`TLSReloadLifespan`, :func:`reloading_certificates`). Where the context is built:
uvicorn calls the factory in each serving process; the recipe is its own default factory (verify mode, CA bundle,
ciphers, ALPN, ``ssl_keyfile_password``, else ``$TLSRELOAD_KEY_PASSWORD_FILE``). Worker lifecycle: one process,
or spawned by uvicorn's supervisor; with workers (or SNI identities), the supervisor starts the server's one reader of
the files (:mod:`tlsreload_plugins.publication`), whose publication reaches each serving process with the factory.
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.examine import Recipe
from tlsreload_plugins.serving import lifespan, logs
from tlsreload_plugins.serving.configured import (
    check_config_at_start,
    config_recipes,
    parameter_names,
    start_from_config,
)
from tlsreload_plugins.serving.lifespan import TLSReloadLifespan, reloaders, reloading_certificates
from tlsreload_plugins.serving.options import click_settings, spiffe_choice, with_tls_options
from tlsreload_plugins.serving.start import Settings, exit_if_cannot_serve
from tlsreload_plugins.serving.workers import ReloaderMaker, waiting_in_spawned_worker
from tlsreload_plugins.settings import resolve_password, resolve_sni_directories, resolve_spiffe

if TYPE_CHECKING:  # uvicorn is the [uvicorn] extra: imported where used, so that a missing extra is one
    import uvicorn  # clear line, not a ModuleNotFoundError from this module's import

__all__ = ["TLSReloadLifespan", "main", "reloaders", "reloading_certificates", "reloading_ssl_context"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.uvicorn")

STARTUP_FAILURE = 3
"""Exit status when the files or settings are not usable at start-up: uvicorn's (``uvicorn.main.STARTUP_FAILURE``)."""

LIFESPAN_GRACE = 30.0
"""Seconds after start-up after which a reloader no lifespan checks is checked anyway, with a warning."""

route_logs: Callable[[], None] = functools.partial(logs.forward_to, logging.getLogger("uvicorn.error"))
lifespan.route_logs = route_logs


def reloading_ssl_context(
    config: uvicorn.Config,
    default_factory: Callable[[], ssl.SSLContext],
    *,
    interval: float | None = None,
    sni: Iterable[str] | str | None = None,
    metrics: bool | None = None,
    crl: str | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> ssl.SSLContext:
    """``uvicorn.Config(ssl_context_factory=...)``: a context that follows the files on disk.

    Args:
        config: uvicorn's ``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs`` and ``ssl_keyfile_password`` (else
            the first line of ``$TLSRELOAD_KEY_PASSWORD_FILE``, read again on every reload).
        default_factory: uvicorn's own, the recipe. ``interval``, ``sni``, ``metrics``, ``crl`` (CRLs for the CAs of
            ``ssl_ca_certs``, else ``$TLSRELOAD_CRL``): see ``serving.Settings``.
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``serving.Settings``.

    Returns:
        The context, checked while the app's lifespan runs.

    Raises:
        SystemExit: the files or settings are not usable: one ERROR line, :data:`STARTUP_FAILURE`.

    Example: ``uvicorn.run("app:app", ssl_certfile=C, ssl_keyfile=K, ssl_context_factory=reloading_ssl_context)``;
    another interval: ``functools.partial(reloading_ssl_context, interval=5)`` (it pickles, as ``workers`` needs).
    """
    return _context(config, default_factory, Settings(interval, sni, metrics, crl, authorize))


def _context(
    config: Any,
    factory: Recipe,
    settings: Settings,
    drop_in: bool = False,
    publication: str | None = None,
) -> ssl.SSLContext:
    """``drop_in``: for ``tlsreload-uvicorn``, whose checks run from the server's loop (no lifespan needed), and a
    process with nothing valid to serve waits for usable files (exiting would stop uvicorn's supervisor).
    ``publication``: where the supervisor's reader publishes (``--workers``, ``--reload``): loaded, not the files."""
    route_logs()
    with exit_if_cannot_serve(STARTUP_FAILURE):
        waiting = waiting_in_spawned_worker() if drop_in else None
        reloader = start_from_config(
            config,
            _uvicorn_context,
            names=NAMES,
            settings=settings,
            own=factory,
            waiting=waiting,
            publication=publication,
        )
    if not drop_in:
        lifespan.follow_lifespan(reloader, lifespan_off=config.lifespan == "off", grace=LIFESPAN_GRACE)
    else:
        lifespan.check_from_loop(reloader, "tlsreload-uvicorn")
    return reloader.context


NAMES = ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "ssl_keyfile_password")  # the files and key password


def _uvicorn_context(config: Any) -> ssl.SSLContext:
    """uvicorn's default factory (uvicorn/config.py, ``Config.load``) for a ``uvicorn.Config``, or a copy, with the
    ALPN protocols of its HTTP protocol class (``load()`` sets it) where its ``create_ssl_context`` takes them."""
    from uvicorn.config import create_ssl_context

    alpn = getattr(getattr(config, "http_protocol_class", None), "alpn_protocols", None)
    takes_alpn = "alpn_protocols" in parameter_names(create_ssl_context)  # uvicorn 0.47 (the floor) sets none either
    return create_ssl_context(
        keyfile=config.ssl_keyfile,
        certfile=config.ssl_certfile,
        password=config.ssl_keyfile_password,
        ssl_version=config.ssl_version,
        cert_reqs=config.ssl_cert_reqs,
        ca_certs=config.ssl_ca_certs,
        ciphers=config.ssl_ciphers,
        **({"alpn_protocols": alpn} if alpn and takes_alpn else {}),
    )


# -- gunicorn's UvicornWorker: its uvicorn.Config is gunicorn's settings plus the class's CONFIG_KWARGS (the documented
# way to pass more); it never calls gunicorn's ssl_context hook. The gunicorn glue calls the next two.


def prepare_gunicorn_worker_class(worker_class: Any, name: str) -> None:
    """In the arbiter: add a placeholder ``ssl_context_factory`` to a ``UvicornWorker`` class's ``CONFIG_KWARGS``
    (:func:`in_gunicorn_worker` replaces it). Raises ``ValueError``: no ``CONFIG_KWARGS``, or no such factory."""
    import uvicorn

    kwargs = getattr(worker_class, "CONFIG_KWARGS", None)
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"the worker class {name} has no CONFIG_KWARGS (uvicorn-worker's way to configure "
            "uvicorn): certificates cannot be reloaded with this version"
        )
    if "ssl_context_factory" not in parameter_names(uvicorn.Config):
        raise ValueError(
            f"uvicorn {uvicorn.__version__} has no Config(ssl_context_factory=...): upgrade to uvicorn 0.47 or newer"
        )
    worker_class.CONFIG_KWARGS = {**kwargs, "ssl_context_factory": _not_in_gunicorn_worker}


def in_gunicorn_worker(worker: Any, serve: ReloaderMaker) -> None:
    """In a ``UvicornWorker``'s ``post_worker_init``: its ``config``'s placeholder becomes a factory handing
    uvicorn's default one to ``serve(recipe, recipe_for)``, which makes the reloader (no placeholder: exit)."""
    config: Any = getattr(worker, "config", None)
    if getattr(config, "ssl_context_factory", None) is not _not_in_gunicorn_worker:
        log.error(
            "%s did not hand tlsreload's ssl_context_factory to uvicorn (CONFIG_KWARGS): this worker "
            "would never reload its certificate; stopping",
            type(worker).__name__,
        )
        sys.exit(3)  # gunicorn's WORKER_BOOT_ERROR: the arbiter stops with "Worker failed to boot."
    config.ssl_context_factory = functools.partial(_gunicorn_worker_context, serve)


def _not_in_gunicorn_worker(config: Any, default_factory: Recipe) -> ssl.SSLContext:
    log.error("tlsreload's post_worker_init did not run in this worker: its certificate will NOT be reloaded")
    return default_factory()


def _gunicorn_worker_context(serve: ReloaderMaker, config: Any, factory: Recipe) -> ssl.SSLContext:
    password = resolve_password(config.ssl_keyfile_password)
    recipe, recipe_for = config_recipes(config, _uvicorn_context, names=NAMES, password=password, own=factory)
    return serve(recipe, recipe_for).context


# -- the drop-in command: uvicorn's own command-line options (the click parameters of `uvicorn.main`), passed to
# the public `uvicorn.run(...)` with `ssl_context_factory`: every option keeps uvicorn's meaning.


def _run(
    tls_reload_interval: float | None,
    tls_sni: tuple[str, ...],
    tls_metrics: bool,
    tls_crl: str | None,
    tls_spiffe_authorize: str | None,
    tls_spiffe: str | None,
    tls_spiffe_id: str | None,
    tls_spiffe_federation: str | None,
    **options: Any,
) -> None:
    import click

    kwargs = _run_arguments(options)
    if options.get("ssl_keyfile") and not options.get("ssl_certfile"):
        raise click.UsageError(
            "--ssl-keyfile needs --ssl-certfile (the key may be in the certificate file, not the other way round)"
        )
    config = _config(kwargs)  # uvicorn's logging and --env-file now, for what follows (which may read $TLSRELOAD_*)
    route_logs()
    settings = click_settings(tls_reload_interval, tls_sni, tls_metrics, tls_crl, tls_spiffe_authorize)
    spiffe = resolve_spiffe(tls_spiffe)
    try:
        spiffe_id, federation = spiffe_choice(tls_spiffe_id, tls_spiffe_federation)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if spiffe is None:
        if spiffe_id or federation:
            option = "--tls-spiffe-id" if spiffe_id else "--tls-spiffe-federation"
            raise click.UsageError(f"{option} chooses what comes from SPIFFE's Workload API: it needs --tls-spiffe")
        _serve(kwargs, options, config, settings)
        return
    given = [f"--{name.replace('_', '-')}" for name in NAMES[:3] if options.get(name)]
    if given:
        raise click.UsageError(f"--tls-spiffe takes the certificate, key and CA bundle from SPIFFE: drop {given[0]}")
    from tlsreload_plugins.serving.spiffe import start_source  # its gRPC stream reader: only where SPIFFE is used

    with exit_if_cannot_serve(STARTUP_FAILURE):
        source = start_source(spiffe, spiffe_id=spiffe_id, federation=federation)
    with source:  # in the supervisor: its files are read like any (by the reader, with workers), never the stream
        files = source.files
        paths = {"ssl_certfile": files.certfile, "ssl_keyfile": files.keyfile, "ssl_ca_certs": files.ca_certs}
        kwargs.update(paths)
        _serve(kwargs, {**options, **paths}, _config(kwargs), settings)


def _config(kwargs: dict[str, Any]) -> Any:
    """A ``uvicorn.Config`` of the run's logging, environment file and TLS settings (the app is not loaded)."""
    import uvicorn

    names = ("env_file", "log_config", "log_level", "use_colors", *(name for name in kwargs if name.startswith("ssl_")))
    return uvicorn.Config(kwargs["app"], **{name: kwargs[name] for name in names if name in kwargs})


def _serve(kwargs: dict[str, Any], options: dict[str, Any], config: Any, settings: Settings) -> None:
    import uvicorn

    if not options.get("ssl_certfile"):
        log.warning("no --ssl-certfile given: serving without TLS, nothing to reload")
        uvicorn.run(**kwargs)
        return
    workers = kwargs.get("workers") or int(os.environ.get("WEB_CONCURRENCY", "1"))
    spawns = workers > 1 or bool(kwargs.get("reload"))  # a supervisor that starts serving processes later
    with exit_if_cannot_serve(STARTUP_FAILURE):
        # A supervisor, or SNI identities (thousands, maybe: judged and kept once, beside the serving process, which
        # looks them up when asked): the reader of the files is a child process, not the serving one.
        reader = spawns or bool(resolve_sni_directories(settings.sni))
        started = check_config_at_start(config, _uvicorn_context, names=NAMES, settings=settings, reader=reader)
    publication = started.directory if started is not None else None
    factory = functools.partial(_context, settings=settings, drop_in=True, publication=publication)
    try:
        uvicorn.run(**kwargs, ssl_context_factory=factory)
    finally:
        if started is not None:
            started.close()


def _run_arguments(options: dict[str, Any]) -> dict[str, Any]:
    """``uvicorn.run``'s keyword arguments for ``options``, as ``uvicorn/main.py`` passes them; one line and an exit
    where ``uvicorn.run`` does not take one of them, or ``ssl_context_factory``."""
    import uvicorn

    accepted = parameter_names(uvicorn.run)
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


def _refuse(message: str, status: int = STARTUP_FAILURE) -> NoReturn:
    print(message, file=sys.stderr)
    sys.exit(status)


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-uvicorn``: uvicorn's command line, reloading certificates.

    Example: ``main(["app:app", "--ssl-certfile", "tls.crt", "--ssl-keyfile", "tls.key"])``.
    """
    try:
        import click
        import uvicorn
    except ImportError as e:
        extra = "pip install 'tlsreload-plugins[uvicorn]'"
        _refuse(f"tlsreload-uvicorn needs uvicorn, which is not installed ({e}): {extra}", 1)
    stock = uvicorn.main
    if not isinstance(stock, click.Command) or not any(param.name == "ssl_certfile" for param in stock.params):
        _refuse(f"tlsreload-uvicorn cannot find uvicorn {uvicorn.__version__}'s command-line options (uvicorn.main)")
    with_tls_options(stock, _run, after="ssl_", spiffe=True).main(args=args)


if __name__ == "__main__":
    # The importable module, not this __main__ copy: pickled configs meet the one registry of the importable module.
    from tlsreload_plugins.servers.uvicorn import main as _main

    _main()
