"""Reload gunicorn's TLS certificate inside every worker, whatever the worker class.

Two ways to use it. The drop-in configuration::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

keeps the configuration gunicorn would have read without it (``./gunicorn.conf.py``, or the
``-c`` of ``$GUNICORN_CMD_ARGS``): its settings and hooks apply as gunicorn applies them. Or, in
your own ``gunicorn.conf.py``, call :func:`add_reload` at its end, after your hooks::

    from tlsreload_plugins.gunicorn import add_reload
    ...
    add_reload(globals())

It wraps the file's ``ssl_context``, ``on_starting``, ``post_worker_init`` and ``worker_exit``
hooks (defining those that are missing): yours still run, and what your ``ssl_context`` sets
(``minimum_version``, ciphers, ...) is applied again on every reload.

How it works. In the arbiter, ``on_starting`` (before any socket is bound) checks the settings
and the files once and stops gunicorn with one clear error line if they are unusable; the
arbiter never holds a reloader or a thread. Each worker, once set up (``post_worker_init``:
after a gevent worker has monkey-patched, after the fork with ``--preload``), builds one
:class:`~tlsreload_plugins.Reloader` whose recipe is your ``ssl_context`` hook applied to
gunicorn's default factory, and starts a :class:`~tlsreload_plugins.ThreadDriver` (a greenlet
under gevent). The ``ssl_context`` hook then returns that worker's one context every time:
``sync`` and ``gthread`` call it per connection, ``gevent``, ``tornado`` and ``asgi`` once.
``uvicorn_worker.UvicornWorker`` never calls the hook: ``on_starting`` adds an
``ssl_context_factory`` to its documented ``CONFIG_KWARGS``, which applies your hook to uvicorn's
own default factory (so verify mode, CA bundle, ciphers and protocol are uvicorn-worker's).
``worker_exit`` stops the worker's driver.

An encrypted key's password comes from ``$TLSRELOAD_KEY_PASSWORD_FILE`` (gunicorn has no
setting for it): the file's first line, read again on every reload.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import shlex
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import metrics, sni
from ..drivers import ThreadDriver
from ..identity import InvalidIdentity, Password, TLSFiles, password_text
from ..lastgood import LastGood, RecipeFor, SharedStore, retry_until_usable, stop_signals_noted
from ..reloader import (
    Recipe,
    Reloader,
    load_identity,
    resolve_expiry_warning_days,
    resolve_interval,
    resolve_password,
)

__all__ = ["add_reload", "reload_hooks", "reloaders", "worker_reloader"]

log = logging.getLogger("tlsreload_plugins.gunicorn")

BOOT_ATTEMPTS = 3
RETRY_DELAY = 0.5
"""Unusable files at start-up are read BOOT_ATTEMPTS times, RETRY_DELAY seconds apart, before
giving up: a process that starts in the middle of a rotation (certbot relinks its files one at a
time) must not fail. A worker waiting for usable files reads them every RETRY_DELAY seconds too
(independent of the interval, which may be longer than gunicorn's worker timeout)."""

STARTUP_FAILURE = 1
"""Exit status of the arbiter when the TLS files or settings are unusable at start-up (gunicorn's own
for a configuration error)."""

DROP_IN = "python:tlsreload_plugins.gunicorn_conf"
"""The drop-in configuration, as given to ``-c``."""

T = TypeVar("T")
SSLContextHook = Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]
ServerHook = Callable[[Any], object]
WorkerExitHook = Callable[[Any, Any], object]
SNISetting = Sequence[str] | str | None


@dataclass(frozen=True)
class _Settings:
    """tlsreload's own settings, from :func:`reload_hooks` (``None``: from the environment)."""

    interval: float | None = None
    sni: SNISetting = None
    metrics: bool | None = None


@dataclass
class _Serving:
    pid: int
    reloader: Reloader
    driver: ThreadDriver


@dataclass
class _UvicornWorkerSetUp:
    """What ``post_worker_init`` leaves for the factory a ``UvicornWorker``'s uvicorn calls later."""

    pid: int
    worker: Any
    user_ssl_context: SSLContextHook
    settings: _Settings


_serving: _Serving | None = None
"""This worker's reloader. Keyed by pid so that a forked child never uses its parent's."""

_uvicorn_worker: _UvicornWorkerSetUp | None = None

_routed: list[logging.Handler] = []
"""The handlers :func:`_route_logs` gave the package's logger (any others were configured by the user)."""

_building = threading.local()
"""Set while a reload calls gunicorn's factory, so that our own hook hands it the user's context."""

_last_good: SharedStore | None = None
"""The newest identity any worker served, in memory shared by the arbiter and every worker it forks
(created in the arbiter before the first fork): a worker that starts while the files are broken
serves it. Shared memory rather than the arbiter reading the files in a thread: a fork() while
another thread is inside OpenSSL could leave the child's OpenSSL locks held forever."""

_chained_config: str | None = None
"""The configuration the drop-in applied besides itself (``./gunicorn.conf.py``, ...), for the start-up log."""


def worker_reloader() -> Reloader | None:
    """The current worker's :class:`~tlsreload_plugins.Reloader`: ``None`` in the arbiter, without
    TLS, or before the worker has built it (a ``UvicornWorker`` builds it as its server starts)."""
    serving = _serving
    return serving.reloader if serving is not None and serving.pid == os.getpid() else None


def reloaders() -> list[Reloader]:
    """The reloaders of this process, as ``tlsreload_plugins.uvicorn.reloaders()`` and
    ``tlsreload_plugins.hypercorn.reloaders()`` say it: the worker's one, or none."""
    reloader = worker_reloader()
    return [] if reloader is None else [reloader]


def _gunicorn_default_ssl_context(
    conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]
) -> ssl.SSLContext:
    """gunicorn's own default ``ssl_context`` hook: the default factory, unchanged."""
    return default_ssl_context_factory()


# -- the hooks ------------------------------------------------------------------------------------


def reload_hooks(
    ssl_context: SSLContextHook | None = None,
    post_worker_init: ServerHook | None = None,
    worker_exit: WorkerExitHook | None = None,
    when_ready: ServerHook | None = None,
    *,
    on_starting: ServerHook | None = None,
    interval: float | None = None,
    sni: SNISetting = None,
    metrics: bool | None = None,
) -> dict[str, Callable[..., Any]]:
    """Return gunicorn hooks ``ssl_context``, ``on_starting``, ``post_worker_init`` and
    ``worker_exit`` that add certificate reloading to the given ones (each may be ``None``).
    ``interval`` defaults to ``$TLSRELOAD_INTERVAL``, else 1 second. Most configurations want
    :func:`add_reload`. ``when_ready``, given, is returned unchanged (the start-up check now runs
    in ``on_starting``, before gunicorn binds its sockets). ``sni``: directories of more identities
    chosen by server name (default ``$TLSRELOAD_SNI``), see :mod:`tlsreload_plugins.sni`. ``metrics``:
    export Prometheus metrics (default ``$TLSRELOAD_METRICS``, else off), see :mod:`tlsreload_plugins.metrics`."""
    user_ssl_context = ssl_context or _gunicorn_default_ssl_context
    settings = _Settings(interval, sni, metrics)

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
            _stop_worker()

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
    sni: SNISetting = None,
    metrics: bool | None = None,
) -> None:
    """Add certificate reloading to a gunicorn configuration module: call ``add_reload(globals())``
    at the end of ``gunicorn.conf.py``. Wraps the module's ``ssl_context``, ``on_starting``,
    ``post_worker_init`` and ``worker_exit`` (defining those it lacks); calling it twice changes nothing.
    SNI identities: ``sni``, else the module's ``tls_sni`` (a list of directories), else ``$TLSRELOAD_SNI``.
    Metrics: ``metrics``, else the module's ``tls_metrics``, else ``$TLSRELOAD_METRICS``, else off."""
    already = getattr(namespace.get("ssl_context"), "__qualname__", "")
    if already.startswith(f"{reload_hooks.__name__}."):
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


# -- the drop-in configuration ----------------------------------------------------------------------


def _config_locations() -> tuple[str | None, str | None]:
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


def _replaced_config() -> str | None:
    """The configuration gunicorn would have read had the drop-in not been named (gunicorn/app/base.py,
    ``Application.load_config``: the ``-c`` of the command line, else that of ``$GUNICORN_CMD_ARGS``, else
    ``./gunicorn.conf.py`` when it exists); ``None`` when there is none, or the drop-in was not named with
    ``-c`` (a custom application loads it by itself)."""
    from gunicorn.config import get_default_config_file  # type: ignore[import-untyped]  # optional dependency

    command_line, environment = _config_locations()
    if command_line == DROP_IN:
        return environment if environment not in (None, DROP_IN) else get_default_config_file()
    if command_line is None and environment == DROP_IN:
        path: str | None = get_default_config_file()
        return path
    return None


def _read_config(location: str) -> dict[str, Any]:
    """A configuration's names, read as gunicorn reads them (gunicorn/app/base.py): ``python:MODULE`` is
    imported; a file is executed as the module ``__config__``, and an error in it is reported as gunicorn
    reports it (``Failed to read config file: ...`` and the traceback, exit 1)."""
    if location.startswith("python:"):
        return dict(vars(importlib.import_module(location[len("python:") :])))
    filename = location[len("file:") :] if location.startswith("file:") else location
    if not os.path.exists(filename):
        raise RuntimeError(f"{filename!r} doesn't exist")
    try:
        loader = importlib.machinery.SourceFileLoader("__config__", filename)
        spec = importlib.util.spec_from_file_location("__config__", filename, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["__config__"] = module
        loader.exec_module(module)
    except Exception:
        print(f"Failed to read config file: {filename}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(1)
    return dict(vars(module))


def _drop_in_settings() -> dict[str, Any]:
    """The settings of ``tlsreload_plugins.gunicorn_conf``: those of the configuration gunicorn would have
    read without it, then reloading added to its hooks. gunicorn applies ``$GUNICORN_CMD_ARGS`` and the
    command line over them, as it always does."""
    from gunicorn.config import KNOWN_SETTINGS

    global _chained_config
    names = {setting.name for setting in KNOWN_SETTINGS}
    location = _replaced_config()
    read = {} if location is None else _read_config(location)
    settings = {k: v for k, v in read.items() if k in names}
    _chained_config = location
    add_reload(settings, sni=read.get("tls_sni"), metrics=read.get("tls_metrics"))
    on_starting, on_reload = settings.get("on_starting"), settings.get("on_reload")

    # gunicorn reads a configuration *file* again on HUP but imports a python: module once. Forgetting the
    # drop-in once it has been read makes the next HUP read it, and the user's file, again.
    def forget_drop_in_on_starting(server: Any) -> None:
        sys.modules.pop("tlsreload_plugins.gunicorn_conf", None)
        if on_starting is not None:
            on_starting(server)

    def forget_drop_in_on_reload(server: Any) -> None:
        sys.modules.pop("tlsreload_plugins.gunicorn_conf", None)
        if on_reload is not None:
            on_reload(server)

    settings["on_starting"] = forget_drop_in_on_starting
    settings["on_reload"] = forget_drop_in_on_reload
    return settings


def _refuse_as_configuration() -> None:
    """``-c python:tlsreload_plugins.gunicorn`` (the library, not the drop-in) would run with no reloading:
    refuse it, through gunicorn's own one-line configuration error (``Error: ...``, exit 1)."""
    if "gunicorn.app.base" not in sys.modules:
        return
    wrong = "python:tlsreload_plugins.gunicorn"
    command_line, environment = _config_locations()
    if wrong in (command_line, environment if command_line is None else None):
        raise RuntimeError(
            f"{wrong} is tlsreload's library and sets nothing, so certificates would not be reloaded: "
            f"use -c {DROP_IN}, or add_reload(globals()) at the end of your own configuration file"
        )


# -- in the arbiter -------------------------------------------------------------------------------


def _check_at_start(arbiter: Any, settings: _Settings) -> None:
    """In the arbiter, before gunicorn binds its sockets (what ``on_starting`` does): stop gunicorn
    with one clear error line when a setting or the files cannot make a context, instead of
    starting workers that fail; get a ``UvicornWorker`` to use the reloading factory."""
    _route_logs(arbiter.log)
    if _chained_config is not None:
        log.info("the drop-in configuration also applies %s, as gunicorn would without it", _chained_config)
    cfg = arbiter.cfg
    if not cfg.is_ssl:
        log.warning("no --certfile given: serving without TLS, nothing to reload")
        return
    try:
        if not cfg.certfile:
            raise ValueError(
                f"--keyfile {cfg.keyfile} is set but --certfile is not: give --certfile "
                "(the key may be in the certificate file, not the other way round)"
            )
        resolve_interval(settings.interval)
        resolve_expiry_warning_days()
        metrics.wanted(settings.metrics)
        password = resolve_password(None)
        sni.resolve_directories(settings.sni)
        _prepare_uvicorn_worker(cfg)
        files = TLSFiles(cfg.certfile, cfg.keyfile, cfg.ca_certs)
        snapshot, _, _ = _retry_at_start(lambda: load_identity(files, _gunicorn_recipe(cfg), password))
        _last_good_store().write(snapshot)
    except (InvalidIdentity, ValueError) as e:  # ValueError: a bad setting
        log.error("cannot serve TLS: %s", e)
        arbiter.halt(reason="the TLS certificate files or settings are not usable", exit_status=STARTUP_FAILURE)


def _last_good_store() -> SharedStore:
    global _last_good
    if _last_good is None:
        _last_good = SharedStore()
    return _last_good


def _retry_at_start(attempt: Callable[[], T]) -> T:
    for remaining in reversed(range(BOOT_ATTEMPTS)):
        try:
            return attempt()
        except InvalidIdentity:
            if not remaining:
                raise
            time.sleep(RETRY_DELAY)
    raise AssertionError("unreachable")


def _is_uvicorn_worker(worker_class: Any) -> bool:
    return any(cls.__module__.split(".")[0] in ("uvicorn_worker", "uvicorn") for cls in inspect.getmro(worker_class))


def _prepare_uvicorn_worker(cfg: Any) -> None:
    """``uvicorn_worker.UvicornWorker`` builds its ``uvicorn.Config`` from gunicorn's settings plus the
    class's ``CONFIG_KWARGS`` (its documented way to pass more) and never calls gunicorn's ``ssl_context``
    hook: add the reloading factory there. Raises ValueError when that way is gone."""
    worker_class: Any = cfg.worker_class
    if not isinstance(worker_class, type) or not _is_uvicorn_worker(worker_class):
        return
    owner: Any = worker_class
    import uvicorn

    kwargs = getattr(worker_class, "CONFIG_KWARGS", None)
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"the worker class {cfg.worker_class_str} has no CONFIG_KWARGS (uvicorn-worker's way to configure "
            "uvicorn): certificates cannot be reloaded with this version"
        )
    if "ssl_context_factory" not in inspect.signature(uvicorn.Config).parameters:
        raise ValueError(
            f"uvicorn {uvicorn.__version__} has no Config(ssl_context_factory=...): upgrade to uvicorn 0.47 or newer"
        )
    owner.CONFIG_KWARGS = {**kwargs, "ssl_context_factory": _uvicorn_worker_context}


# -- inside a worker ------------------------------------------------------------------------------


def _start_worker(worker: Any, user_ssl_context: SSLContextHook, settings: _Settings) -> None:
    """Set reloading up in this worker process (what ``post_worker_init`` does)."""
    global _uvicorn_worker
    _route_logs(worker.log)
    if not worker.cfg.is_ssl:
        return
    if _is_uvicorn_worker(type(worker)):
        # Its uvicorn calls _uvicorn_worker_context as it starts serving, after this hook. Guard: the
        # factory must have reached uvicorn's Config (read through the worker's undocumented `config`).
        config = getattr(worker, "config", None)
        if getattr(config, "ssl_context_factory", None) is not _uvicorn_worker_context:
            log.error(
                "%s did not hand tlsreload's ssl_context_factory to uvicorn (CONFIG_KWARGS): this worker "
                "would never reload its certificate; stopping",
                type(worker).__name__,
            )
            sys.exit(3)  # gunicorn's WORKER_BOOT_ERROR: the arbiter stops with "Worker failed to boot."
        _uvicorn_worker = _UvicornWorkerSetUp(os.getpid(), worker, user_ssl_context, settings)
        return

    hook = worker.cfg.ssl_context
    if not getattr(hook, "__qualname__", "").startswith(f"{reload_hooks.__name__}."):
        # An ssl_context defined after add_reload(globals()) replaced ours: gunicorn never asks us for a
        # context, so a reloader here would claim reloads that no handshake gets.
        log.error(
            "the ssl_context hook in effect (%s) is not tlsreload's: one defined after add_reload(globals()) "
            "replaces it, and this worker's certificate is NOT reloaded; call add_reload(globals()) last",
            getattr(hook, "__qualname__", repr(hook)),
        )
        return

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        return _gunicorn_recipe(_with_files(worker.cfg, files))()

    _serve(worker, _gunicorn_recipe(worker.cfg), recipe_for, settings)


def _uvicorn_worker_context(config: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The ``ssl_context_factory`` of a ``UvicornWorker``'s uvicorn: the user's ``ssl_context`` hook
    applied to uvicorn's default factory, reloading."""
    set_up = _uvicorn_worker
    if set_up is None or set_up.pid != os.getpid():
        log.error("tlsreload's post_worker_init did not run in this worker: its certificate will NOT be reloaded")
        return default_factory()
    password = resolve_password(None)

    def recipe() -> ssl.SSLContext:
        if password is not None:  # uvicorn's default factory reads it from the Config on every call
            config.ssl_keyfile_password = password_text(password)
        return set_up.user_ssl_context(set_up.worker.cfg, default_factory)

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        from uvicorn.config import create_ssl_context

        def uvicorn_factory() -> ssl.SSLContext:  # uvicorn's default factory (uvicorn/config.py), on `files`
            secret = password_text(password) if password is not None else config.ssl_keyfile_password
            return create_ssl_context(
                keyfile=files.keyfile,
                certfile=files.certfile,
                password=secret,
                ssl_version=config.ssl_version,
                cert_reqs=config.ssl_cert_reqs,
                ca_certs=files.ca_certs,
                ciphers=config.ssl_ciphers,
            )

        return set_up.user_ssl_context(_with_files(set_up.worker.cfg, files), uvicorn_factory)

    return _serve(set_up.worker, recipe, recipe_for, set_up.settings).context


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


def _with_files(cfg: Any, files: TLSFiles) -> Any:
    """A copy of gunicorn's configuration ``cfg`` naming other certificate, key and CA files."""
    conf = copy.copy(cfg)
    conf.settings = dict(cfg.settings)
    for name, path in (("certfile", files.certfile), ("keyfile", files.keyfile), ("ca_certs", files.ca_certs)):
        setting = copy.copy(cfg.settings[name])
        setting.value = path
        conf.settings[name] = setting
    return conf


def _serve(worker: Any, recipe: Recipe, recipe_for: RecipeFor, settings: _Settings) -> Reloader:
    global _serving
    reloader = _first_reloader(worker, recipe, recipe_for, settings)
    try:
        sni.attach_from_settings(reloader, settings.sni, recipe_for)
    except ValueError as e:  # a directory removed since the arbiter checked it
        log.error("worker %s serves no SNI identities: %s", os.getpid(), e)
    driver = ThreadDriver(reloader)
    _serving = _Serving(os.getpid(), reloader, driver)
    driver.start()
    return reloader


def _new_reloader(cfg: Any, recipe: Recipe, recipe_for: RecipeFor, settings: _Settings) -> Reloader:
    """Where each worker's :class:`~tlsreload_plugins.Reloader` is created, with its metrics when wanted."""
    last_good = LastGood(_last_good, recipe_for) if _last_good is not None else None
    reloader = Reloader(
        cfg.certfile, cfg.keyfile, recipe=recipe, ca_certs=cfg.ca_certs, interval=settings.interval, last_good=last_good
    )
    if metrics.wanted(settings.metrics):
        metrics.observe(reloader)
    return reloader


def _first_reloader(worker: Any, recipe: Recipe, recipe_for: RecipeFor, settings: _Settings) -> Reloader:
    """Build the worker's reloader: from the files, else from the last good identity the server
    served; while neither is usable (the last good one expired), wait for usable files.

    Only a worker started after the arbiter's own check (a ``max_requests`` restart, a crash,
    a HUP) can get here with unusable files. Exiting would stop gunicorn (a boot error) or loop
    (any other code); waiting keeps the other workers serving their last good certificate and
    this one starts serving as soon as the files are fixed. It tells the arbiter it is alive.
    """

    def attempt() -> Reloader:
        return _new_reloader(worker.cfg, recipe, recipe_for, settings)

    try:
        return _retry_at_start(attempt)
    except InvalidIdentity as e:
        log.error("worker %s cannot load the TLS files and waits for usable ones before serving: %s", os.getpid(), e)
    with stop_signals_noted() as stopping:
        reloader = retry_until_usable(attempt, every=RETRY_DELAY, stop=stopping, between=worker.notify)
    if reloader is None:
        sys.exit(0)
    log.info("worker %s: the TLS files are usable again; serving", os.getpid())
    return reloader


def _stop_worker() -> None:
    """Stop this worker's driver (what ``worker_exit`` does); does nothing in the arbiter."""
    global _serving
    serving = _serving
    if serving is None or serving.pid != os.getpid():
        return
    _serving = None
    serving.driver.stop()


def _route_logs(gunicorn_logger: Any) -> None:
    """Send the ``tlsreload_plugins`` loggers' lines to gunicorn's error log: same handlers,
    format and ``--log-level``, and no second copy through the root logger. Left alone when
    the logging configuration already gave ``tlsreload_plugins`` handlers of its own."""
    global _routed
    error_log = getattr(gunicorn_logger, "error_log", None)
    package_log = logging.getLogger("tlsreload_plugins")
    if not isinstance(error_log, logging.Logger) or package_log.handlers not in ([], _routed):
        return
    # A HUP gives gunicorn's error log new handlers (and maybe a new level): follow them.
    _routed = list(error_log.handlers)
    package_log.handlers = list(_routed)
    package_log.setLevel(error_log.level)
    package_log.propagate = False


_refuse_as_configuration()
