"""gunicorn glue: reload the TLS certificate inside every worker, whatever the worker class.

``gunicorn -c python:tlsreload_plugins.gunicorn_conf ...`` (the drop-in, :mod:`tlsreload_plugins.gunicorn_conf`),
or ``add_reload(globals())`` at the end of your own ``gunicorn.conf.py``: it wraps the ``ssl_context``,
``on_starting``, ``post_worker_init`` and ``worker_exit`` hooks; yours still run. Configuration: gunicorn's
``certfile``, ``keyfile``, ``ca_certs``; ``tls_sni`` and ``tls_metrics``; ``$TLSRELOAD_KEY_PASSWORD_FILE``.

Where the context is built: your ``ssl_context`` hook applied to gunicorn's default factory is the recipe;
the hook then returns the worker's one reloading context (``sync`` and ``gthread`` call it per connection,
the others once). ``uvicorn_worker.UvicornWorker`` never calls the hook: its ``CONFIG_KWARGS`` get a factory
(see :mod:`tlsreload_plugins.servers.uvicorn_worker`). Worker lifecycle: forked. ``on_starting`` checks the files
in the arbiter before it binds, into the last good store every worker shares; each worker makes its reloader
in ``post_worker_init`` (after gevent's patching) with a :class:`~tlsreload_plugins.ThreadDriver`, and stops
it in ``worker_exit``. See docs/gunicorn.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import logging
import os
import shlex
import ssl
import sys
import threading
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from .. import logs
from ..identity import Password, TLSFiles
from ..lastgood import RecipeFor, SharedStore
from ..reloader import Recipe, Reloader, resolve_password
from ..serving import CannotServe, Settings, Waiting, check_at_start, run_here, running_here, start_reloader, stop_here

__all__ = ["add_reload", "reload_hooks", "reloaders", "worker_reloader"]

log = logging.getLogger("tlsreload_plugins.gunicorn")

STARTUP_FAILURE = 1
"""Exit status of the arbiter when the TLS files or settings are unusable at start-up (gunicorn's own
for a configuration error)."""

DROP_IN = "python:tlsreload_plugins.gunicorn_conf"
"""The drop-in configuration, as given to ``-c``."""

SSLContextHook = Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]
ServerHook = Callable[[Any], object]
WorkerExitHook = Callable[[Any, Any], object]


_building = threading.local()
"""Set while a reload calls gunicorn's factory, so that our own hook hands it the user's context."""

_last_good: SharedStore | None = None
"""The newest identity any worker served, in memory shared by the arbiter and every worker it forks
(created in the arbiter before the first fork). Shared memory rather than the arbiter reading the files
in a thread: a fork() while another thread is inside OpenSSL could leave the child's locks held forever."""

chained_config: str | None = None
"""The configuration the drop-in applied besides itself (``./gunicorn.conf.py``, ...), for the start-up log."""


def worker_reloader() -> Reloader | None:
    """The current worker's :class:`~tlsreload_plugins.Reloader`: ``None`` in the arbiter, without
    TLS, or before the worker has built it (a ``UvicornWorker`` builds it as its server starts)."""
    return running_here()


def reloaders() -> list[Reloader]:
    """The reloaders of this process, as the other servers' glue says it: the worker's one, or none."""
    reloader = worker_reloader()
    return [] if reloader is None else [reloader]


def _gunicorn_default_ssl_context(conf: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    return default_factory()  # gunicorn's own default ssl_context hook


def _is_ours(hook: object) -> bool:
    return getattr(hook, "__qualname__", "").startswith(f"{reload_hooks.__name__}.")


def reload_hooks(
    ssl_context: SSLContextHook | None = None,
    post_worker_init: ServerHook | None = None,
    worker_exit: WorkerExitHook | None = None,
    when_ready: ServerHook | None = None,
    *,
    on_starting: ServerHook | None = None,
    interval: float | None = None,
    sni: Sequence[str] | str | None = None,
    metrics: bool | None = None,
) -> dict[str, Callable[..., Any]]:
    """gunicorn hooks ``ssl_context``, ``on_starting``, ``post_worker_init`` and ``worker_exit`` that add
    certificate reloading to the given ones (each may be ``None``); most configurations want :func:`add_reload`.

    Args:
        interval: seconds between checks (``$TLSRELOAD_INTERVAL``, else 1).
        sni: directories of more identities chosen by server name (``$TLSRELOAD_SNI``).
        metrics: export Prometheus metrics (``$TLSRELOAD_METRICS``, else off).
        when_ready: returned unchanged (the start-up check runs in ``on_starting``, before binding).

    Returns:
        The hooks by name, for a configuration module's namespace.
    """
    user_ssl_context = ssl_context or _gunicorn_default_ssl_context
    settings = Settings(interval, sni, metrics)

    def reloading_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        reloader = worker_reloader()
        if reloader is None or getattr(_building, "active", False):
            password = resolve_password(None)
            if password is not None:  # gunicorn's factory has no password: OpenSSL would prompt on a tty
                default_ssl_context_factory = _factory_with_password(conf, password)
            return user_ssl_context(conf, default_ssl_context_factory)
        return reloader.context

    def reloading_on_starting(server: Any) -> None:
        _check_at_start(server, settings)
        if on_starting is not None:
            on_starting(server)

    def reloading_post_worker_init(worker: Any) -> None:
        # Ours first: the user's hook can then reach the reloader through worker_reloader().
        _start_worker(worker, user_ssl_context, settings)
        if post_worker_init is not None:
            post_worker_init(worker)

    def reloading_worker_exit(server: Any, worker: Any) -> None:
        try:
            if worker_exit is not None:
                worker_exit(server, worker)
        finally:
            stop_here()

    hooks: dict[str, Callable[..., Any]] = {
        "ssl_context": reloading_ssl_context,
        "on_starting": reloading_on_starting,
        "post_worker_init": reloading_post_worker_init,
        "worker_exit": reloading_worker_exit,
    }
    if when_ready is not None:
        hooks["when_ready"] = when_ready
    return hooks


def add_reload(
    namespace: MutableMapping[str, Any],
    *,
    interval: float | None = None,
    sni: Sequence[str] | str | None = None,
    metrics: bool | None = None,
) -> None:
    """Add certificate reloading to a gunicorn configuration module; calling it twice changes nothing.

    Args:
        namespace: the module's ``globals()``; its hooks are wrapped (those it lacks, defined).
        interval: as :func:`reload_hooks`.
        sni: else the module's ``tls_sni`` (a list of directories), else ``$TLSRELOAD_SNI``.
        metrics: else the module's ``tls_metrics``, else ``$TLSRELOAD_METRICS``, else off.

    Example: at the end of ``gunicorn.conf.py``, after your hooks: ``add_reload(globals())``.
    """
    if _is_ours(namespace.get("ssl_context")):
        return
    namespace.update(
        reload_hooks(
            namespace.get("ssl_context"),
            namespace.get("post_worker_init"),
            namespace.get("worker_exit"),
            on_starting=namespace.get("on_starting"),
            interval=interval,
            sni=sni if sni is not None else namespace.get("tls_sni"),
            metrics=metrics if metrics is not None else namespace.get("tls_metrics"),
        )
    )


def config_locations() -> tuple[str | None, str | None]:
    """The ``-c`` of the command line and the ``-c`` of ``$GUNICORN_CMD_ARGS`` (each ``None`` when absent)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-c", "--config")

    def config_of(args: list[str]) -> str | None:
        try:
            known, _ = parser.parse_known_args(args)
        except SystemExit:  # not gunicorn's command line (a custom application): no -c to find
            return None
        config: str | None = known.config
        return config

    env = os.environ.get("GUNICORN_CMD_ARGS")
    return config_of(sys.argv[1:]), config_of(shlex.split(env)) if env else None


def _refuse_as_configuration() -> None:
    """``-c python:tlsreload_plugins.gunicorn`` (the library, not the drop-in) would run with no reloading:
    refuse it, through gunicorn's own one-line configuration error (``Error: ...``, exit 1)."""
    if "gunicorn.app.base" not in sys.modules:
        return
    wrong = "python:tlsreload_plugins.gunicorn"
    command_line, environment = config_locations()
    if wrong in (command_line, environment if command_line is None else None):
        raise RuntimeError(
            f"{wrong} is tlsreload's library and sets nothing, so certificates would not be reloaded: "
            f"use -c {DROP_IN}, or add_reload(globals()) at the end of your own configuration file"
        )


def _check_at_start(arbiter: Any, settings: Settings) -> None:
    """In the arbiter, before it binds: halt gunicorn with one error line when a setting or the files
    cannot make a context, instead of starting workers that fail."""
    global _last_good
    logs.share_handlers(getattr(arbiter.log, "error_log", None))
    if chained_config is not None:
        log.info("the drop-in configuration also applies %s, as gunicorn would without it", chained_config)
    cfg = arbiter.cfg
    if not cfg.is_ssl:
        log.warning("no --certfile given: serving without TLS, nothing to reload")
        return
    try:
        if not cfg.certfile:
            raise CannotServe(
                f"cannot serve TLS: --keyfile {cfg.keyfile} is set but --certfile is not: give --certfile "
                "(the key may be in the certificate file, not the other way round)"
            )
        _prepare_worker_class(cfg)
        _last_good = _last_good or SharedStore()
        check_at_start(_files(cfg), _gunicorn_recipe(cfg), resolve_password(None), settings, _last_good, forks=True)
    except (CannotServe, ValueError) as e:
        log.error("%s", e if isinstance(e, CannotServe) else f"cannot serve TLS: {e}")
        arbiter.halt(reason="the TLS certificate files or settings are not usable", exit_status=STARTUP_FAILURE)


def _files(cfg: Any) -> TLSFiles:
    return TLSFiles(cfg.certfile, cfg.keyfile, cfg.ca_certs)


def _start_worker(worker: Any, user_ssl_context: SSLContextHook, settings: Settings) -> None:
    """Set reloading up in this worker process (what ``post_worker_init`` does)."""
    logs.share_handlers(getattr(worker.log, "error_log", None))
    if not worker.cfg.is_ssl:
        return
    if _is_uvicorn_worker(type(worker)):
        from . import uvicorn_worker  # its uvicorn calls the factory as it starts serving, after this hook

        uvicorn_worker.in_gunicorn_worker(
            worker, user_ssl_context, lambda *recipes: serve(worker, *recipes, settings=settings)
        )
        return
    hook = worker.cfg.ssl_context
    if not _is_ours(hook):
        # An ssl_context defined after add_reload(globals()) replaced ours: gunicorn never asks us for a
        # context, so a reloader here would claim reloads that no handshake gets.
        log.error(
            "the ssl_context hook in effect (%s) is not tlsreload's: one defined after add_reload(globals()) "
            "replaces it, and this worker's certificate is NOT reloaded; call add_reload(globals()) last",
            getattr(hook, "__qualname__", repr(hook)),
        )
        return

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        return _gunicorn_recipe(with_files(worker.cfg, files))()

    serve(worker, _gunicorn_recipe(worker.cfg), recipe_for, settings=settings)


OTHER_SERVERS_WORKERS = {"uvicorn_worker": "uvicorn_worker", "uvicorn": "uvicorn_worker", "aiohttp": "aiohttp"}
"""Worker classes another server ships, by its top-level package: the glue that knows how they build their
context (its ``prepare_gunicorn_worker_class`` configures the class, or refuses it with one line)."""


def _other_server(worker_class: Any) -> str | None:
    """The glue module for a worker class another server ships, or ``None`` for gunicorn's own."""
    for cls in inspect.getmro(worker_class):
        glue = OTHER_SERVERS_WORKERS.get(cls.__module__.split(".")[0])
        if glue is not None:
            return glue
    return None


def _is_uvicorn_worker(worker_class: Any) -> bool:
    return _other_server(worker_class) == "uvicorn_worker"


def _prepare_worker_class(cfg: Any) -> None:
    """Raises ValueError with the reason when the worker class builds a context no hook of ours reaches."""
    worker_class: Any = cfg.worker_class
    glue = _other_server(worker_class) if isinstance(worker_class, type) else None
    if glue is not None:
        importlib.import_module(f"{__package__}.{glue}").prepare_gunicorn_worker_class(
            worker_class, cfg.worker_class_str
        )


def _gunicorn_recipe(cfg: Any) -> Recipe:
    from gunicorn import sock  # type: ignore[import-untyped]  # here: gunicorn is an optional dependency

    def build() -> ssl.SSLContext:
        # gunicorn's own path (its default factory, with ALPN, through the user's hook), with our
        # hook stepping aside so it returns the user's fresh context instead of the live one.
        _building.active = True
        try:
            context: ssl.SSLContext = sock.ssl_context(cfg)
        finally:
            _building.active = False
        return context

    return build


def _factory_with_password(conf: Any, password: Password) -> Callable[[], ssl.SSLContext]:
    """gunicorn's default factory (gunicorn/sock.py ``ssl_context``) loading the key with ``password``."""
    from gunicorn import sock

    def factory() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=conf.ca_certs)
        context.load_cert_chain(certfile=conf.certfile, keyfile=conf.keyfile, password=password)
        context.verify_mode = conf.cert_reqs
        if conf.ciphers:
            context.set_ciphers(conf.ciphers)
        alpn = getattr(sock, "_get_alpn_protocols", None)
        if alpn is not None:
            protocols = alpn(conf)
            if protocols:
                context.set_alpn_protocols(protocols)
        elif getattr(conf, "http_protocols", None) not in (None, ["h1"]):
            raise RuntimeError(
                "this gunicorn moved its ALPN set-up (gunicorn.sock._get_alpn_protocols): an encrypted key "
                "cannot be combined with --http-protocols"
            )
        return context

    return factory


def with_files(cfg: Any, files: TLSFiles) -> Any:
    """A copy of gunicorn's configuration ``cfg`` naming other certificate, key and CA files."""
    conf = copy.copy(cfg)
    conf.settings = dict(cfg.settings)
    for name, path in (("certfile", files.certfile), ("keyfile", files.keyfile), ("ca_certs", files.ca_certs)):
        setting = copy.copy(cfg.settings[name])
        setting.value = path
        conf.settings[name] = setting
    return conf


def serve(worker: Any, recipe: Recipe, recipe_for: RecipeFor, *, settings: Settings) -> Reloader:
    """Make this worker's reloader and start checking it; a worker with nothing valid to serve waits
    for usable files (telling the arbiter it is alive), and leaves with status 0 when asked to stop."""
    waiting = Waiting(leave=lambda: sys.exit(0), between=worker.notify)
    try:
        reloader = start_reloader(
            _files(worker.cfg),
            recipe,
            recipe_for,
            password=resolve_password(None),
            settings=settings,
            store=_last_good,
            waiting=waiting,
        )
    except CannotServe as e:  # the arbiter checked the settings: only a store lost can bring this here
        log.error("worker %s: %s", os.getpid(), e)
        sys.exit(3)  # gunicorn's WORKER_BOOT_ERROR
    return run_here(reloader)


_refuse_as_configuration()
