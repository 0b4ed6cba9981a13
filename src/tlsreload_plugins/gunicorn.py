"""Reload gunicorn's TLS certificate inside every worker, whatever the worker class.

Two ways to use it. With no configuration file of your own::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

With your own ``gunicorn.conf.py``, call :func:`add_reload` at its end, after your hooks::

    from tlsreload_plugins.gunicorn import add_reload
    ...
    add_reload(globals())

It wraps the file's ``ssl_context``, ``post_worker_init``, ``worker_exit`` and ``when_ready``
hooks (defining those that are missing): yours still run, and what your ``ssl_context`` sets
(``minimum_version``, ciphers, ...) is applied again on every reload.

How it works. In the arbiter, ``when_ready`` checks the files once and stops gunicorn with one
clear error if they are unusable; the arbiter never holds a reloader or a thread. Each worker,
once set up (``post_worker_init``: after a gevent worker has monkey-patched, after the fork with
``--preload``), builds one :class:`~tlsreload_plugins.Reloader` whose recipe is your
``ssl_context`` hook applied to gunicorn's default factory, and starts a
:class:`~tlsreload_plugins.ThreadDriver` (a greenlet under gevent). The ``ssl_context`` hook then
returns that worker's one context every time: ``sync`` and ``gthread`` call it per connection,
``gevent``, ``tornado`` and ``asgi`` once. ``uvicorn_worker.UvicornWorker`` never calls the hook:
its ``uvicorn.Config`` gets an ``ssl_context_factory`` that applies your hook to uvicorn's own
default factory (so verify mode, CA bundle, ciphers and protocol are uvicorn-worker's).
``worker_exit`` stops the worker's driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from . import metrics
from .drivers import ThreadDriver
from .identity import InvalidIdentity, TLSFiles
from .reloader import Recipe, Reloader, load_identity, resolve_expiry_warning_days, resolve_interval

log = logging.getLogger("tlsreload_plugins.gunicorn")

BOOT_ATTEMPTS = 3
RETRY_DELAY = 0.5
"""Unusable files at start-up are read BOOT_ATTEMPTS times, RETRY_DELAY seconds apart, before
giving up: a process that starts in the middle of a rotation (certbot relinks its files one at a
time) must not fail. A worker waiting for usable files reads them every RETRY_DELAY seconds too
(independent of the interval, which may be longer than gunicorn's worker timeout)."""

T = TypeVar("T")
SSLContextHook = Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]
ServerHook = Callable[[Any], object]
WorkerExitHook = Callable[[Any, Any], object]


@dataclass
class _Serving:
    pid: int
    reloader: Reloader
    driver: ThreadDriver


_serving: _Serving | None = None
"""This worker's reloader. Keyed by pid so that a forked child never uses its parent's."""

_routed: list[logging.Handler] = []
"""The handlers :func:`route_logs` gave the package's logger (any others were configured by the user)."""

_building = threading.local()
"""Set while a reload calls gunicorn's factory, so that our own hook hands it the user's context."""


def worker_reloader() -> Reloader | None:
    """The current worker's :class:`~tlsreload_plugins.Reloader`: ``None`` in the arbiter, without
    TLS, or before the worker has built it (a ``UvicornWorker`` builds it as its server starts)."""
    serving = _serving
    return serving.reloader if serving is not None and serving.pid == os.getpid() else None


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
    interval: float | None = None,
) -> dict[str, Callable[..., Any]]:
    """Return gunicorn hooks ``ssl_context``, ``post_worker_init``, ``worker_exit`` and
    ``when_ready`` that add certificate reloading to the given ones (each may be ``None``).
    ``interval`` defaults to ``$TLSRELOAD_INTERVAL``, else 1 second. Most configurations want
    :func:`add_reload`."""
    user_ssl_context = ssl_context or _gunicorn_default_ssl_context

    def reloading_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        reloader = worker_reloader()
        if reloader is None or getattr(_building, "active", False):
            return user_ssl_context(conf, default_ssl_context_factory)
        return reloader.context

    def reloading_post_worker_init(worker: Any) -> None:
        # Ours first: the user's hook can then reach the reloader through worker_reloader().
        start_worker(worker, user_ssl_context, interval)
        if post_worker_init is not None:
            post_worker_init(worker)

    def reloading_when_ready(server: Any) -> None:
        check_at_start(server, interval)
        if when_ready is not None:
            when_ready(server)

    def reloading_worker_exit(server: Any, worker: Any) -> None:
        try:
            if worker_exit is not None:
                worker_exit(server, worker)
        finally:
            stop_worker()

    return {
        "ssl_context": reloading_ssl_context,
        "post_worker_init": reloading_post_worker_init,
        "worker_exit": reloading_worker_exit,
        "when_ready": reloading_when_ready,
    }


def add_reload(namespace: MutableMapping[str, Any], *, interval: float | None = None) -> None:
    """Add certificate reloading to a gunicorn configuration module: call ``add_reload(globals())``
    at the end of ``gunicorn.conf.py``. Wraps the module's ``ssl_context``, ``post_worker_init``,
    ``worker_exit`` and ``when_ready`` (defining those it lacks); calling it twice changes nothing."""
    already = getattr(namespace.get("ssl_context"), "__qualname__", "")
    if already.startswith(f"{reload_hooks.__name__}."):
        return
    namespace.update(
        reload_hooks(
            namespace.get("ssl_context"),
            namespace.get("post_worker_init"),
            namespace.get("worker_exit"),
            namespace.get("when_ready"),
            interval=interval,
        )
    )


# -- inside a worker ------------------------------------------------------------------------------


def start_worker(worker: Any, user_ssl_context: SSLContextHook, interval: float | None = None) -> None:
    """Set reloading up in this worker process (what ``post_worker_init`` does)."""
    route_logs(worker.log)
    if not worker.cfg.is_ssl:
        return
    config: Any = getattr(worker, "config", None)
    if type(config).__module__ == "uvicorn.config":
        # uvicorn_worker.UvicornWorker: its Config.load(), which builds the one context, runs later.
        if not hasattr(config, "ssl_context_factory"):
            log.error("this uvicorn has no Config.ssl_context_factory: upgrade uvicorn to reload certificates")
            return

        def uvicorn_factory(config: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
            return _serve(worker, lambda: user_ssl_context(worker.cfg, default_factory), interval).context

        config.ssl_context_factory = uvicorn_factory
        return
    _serve(worker, _gunicorn_recipe(worker.cfg), interval)


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


def _serve(worker: Any, recipe: Recipe, interval: float | None) -> Reloader:
    global _serving
    reloader = _first_reloader(worker, recipe, interval)
    driver = ThreadDriver(reloader)
    _serving = _Serving(os.getpid(), reloader, driver)
    driver.start()
    return reloader


def new_reloader(cfg: Any, recipe: Recipe, interval: float | None) -> Reloader:
    """Where each worker's :class:`~tlsreload_plugins.Reloader` is created, with its metrics when installed."""
    reloader = Reloader(cfg.certfile, cfg.keyfile, recipe=recipe, ca_certs=cfg.ca_certs, interval=interval)
    metrics.observe(reloader)
    return reloader


def _first_reloader(worker: Any, recipe: Recipe, interval: float | None) -> Reloader:
    """Build the worker's reloader; while the files are unusable, wait for usable ones.

    Only a worker started after the arbiter's own check (a ``max_requests`` restart, a crash,
    a HUP) can get here with unusable files. Exiting would stop gunicorn (a boot error) or loop
    (any other code); waiting keeps the other workers serving their last good certificate and
    this one starts serving as soon as the files are fixed. It tells the arbiter it is alive.
    """

    def attempt() -> Reloader:
        return new_reloader(worker.cfg, recipe, interval)

    try:
        return _retry_at_start(attempt)
    except InvalidIdentity as e:
        log.error("worker %s cannot load the TLS files and waits for usable ones before serving: %s", os.getpid(), e)
    with _stop_signals_noted() as stopping:
        while True:
            worker.notify()
            time.sleep(RETRY_DELAY)
            if stopping.is_set():
                sys.exit(0)
            try:
                reloader = attempt()
            except InvalidIdentity:
                continue
            log.info("worker %s: the TLS files are usable again; serving", os.getpid())
            return reloader


@contextlib.contextmanager
def _stop_signals_noted() -> Iterator[threading.Event]:
    # The worker's own handlers may not run yet (the asgi worker's live in its event loop,
    # uvicorn's only flag its server): note a stop request ourselves while waiting.
    stopping = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
    previous = {sig: signal.signal(sig, lambda signum, frame: stopping.set()) for sig in stops}
    try:
        yield stopping
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def check_at_start(arbiter: Any, interval: float | None = None) -> None:
    """In the arbiter, before any worker starts (what ``when_ready`` does): stop gunicorn with
    one clear error when the files cannot make a context or a ``TLSRELOAD_*`` variable is not a
    number, instead of starting workers that fail."""
    route_logs(arbiter.log)
    cfg = arbiter.cfg
    if not cfg.is_ssl:
        return
    files = TLSFiles(cfg.certfile, cfg.keyfile, cfg.ca_certs)
    try:
        resolve_interval(interval)
        resolve_expiry_warning_days()
        _retry_at_start(lambda: load_identity(files, _gunicorn_recipe(cfg)))
    except (InvalidIdentity, ValueError) as e:
        log.error("cannot serve TLS: %s", e)
        arbiter.halt(reason="the TLS certificate files or settings are not usable", exit_status=1)


def _retry_at_start(attempt: Callable[[], T]) -> T:
    for remaining in reversed(range(BOOT_ATTEMPTS)):
        try:
            return attempt()
        except InvalidIdentity:
            if not remaining:
                raise
            time.sleep(RETRY_DELAY)
    raise AssertionError("unreachable")


def stop_worker() -> None:
    """Stop this worker's driver (what ``worker_exit`` does); does nothing in the arbiter."""
    global _serving
    serving = _serving
    if serving is None or serving.pid != os.getpid():
        return
    _serving = None
    serving.driver.stop()


def route_logs(gunicorn_logger: Any) -> None:
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
