"""What every server's glue does the same way, once: check at start, make the reloader, wait.

A server's glue (:mod:`tlsreload_plugins.servers`) says only what is particular to it: how it is
configured, where its context is built (its *recipe*) and its worker lifecycle. The rest is here:

* :class:`Settings`: tlsreload's own settings, checked in one call (:meth:`Settings.check`).
* :func:`check_at_start`: before a server binds or starts workers, decide as the first reload
  would whether the files and settings can serve, and start the server's one reader of them
  (:mod:`tlsreload_plugins.publication`) where the server has processes that serve.
* :func:`start_reloader`: the one place glue makes a :class:`~tlsreload_plugins.Reloader`: from
  the files, or from what the server's reader published; a worker the server restarts while nothing valid
  exists waits for usable files (:func:`wait_until_usable`, the package's one waiting loop)
  instead of exiting, which would stop the whole server. Then it gets its SNI identities and
  metrics (:func:`equip`).

Everything that cannot serve raises :class:`CannotServe` with one sentence; the glue turns it
into the server's own failed start (:func:`exit_if_cannot_serve`: an exit status, a halt). A
server's worker processes: :mod:`tlsreload_plugins.serving.workers`; a server configured by an object:
:mod:`tlsreload_plugins.serving.configured`; a drop-in command's options: :mod:`tlsreload_plugins.serving.options`.
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
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import NoReturn, TypeVar

from tlsreload_plugins.authorization import Authorizer, resolve_authorizer
from tlsreload_plugins.errors import InvalidIdentity, ReloadError
from tlsreload_plugins.examine import Recipe, build_context, load_identity
from tlsreload_plugins.expiry import SPIFFE_DIRECTORY
from tlsreload_plugins.files import Password, Snapshot, TLSFiles
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf, judge_period
from tlsreload_plugins.memory_files import RecipeFor, context_from
from tlsreload_plugins.publication.reader import ReaderFailed, ReaderProcess
from tlsreload_plugins.publication.subscription import Subscription
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.resumption import authorized
from tlsreload_plugins.retrying import BOOT_ATTEMPTS, RETRY_DELAY, retry_at_start
from tlsreload_plugins.settings import (
    resolve_crl,
    resolve_expiry_warning_days,
    resolve_interval,
    resolve_metrics,
    resolve_sni_directories,
)

__all__ = [
    "BOOT_ATTEMPTS",
    "RETRY_DELAY",
    "CannotServe",
    "Settings",
    "Waiting",
    "check_at_start",
    "equip",
    "exit_if_cannot_serve",
    "retry_at_start",
    "start_reader",
    "start_reloader",
    "wait_until_usable",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.serving")

T = TypeVar("T")

POLL = 0.1
"""Seconds between looks at a stop request while waiting (hypercorn's workers poll their shutdown event as often)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class CannotServe(Exception):
    """The files or settings cannot serve TLS; ``str()`` is the one line to show the operator."""


@contextlib.contextmanager
def exit_if_cannot_serve(stop: int | Callable[[], NoReturn]) -> Iterator[None]:
    """Stop the server as it stops on a failed start when the block cannot serve TLS: one ERROR line (the
    sentence of the :class:`CannotServe`; for a ``ValueError``, a bad setting, prefixed ``cannot serve TLS:``),
    then ``stop``: the server's exit status (``sys.exit(stop)``), or its own way to stop (gunicorn's arbiter
    halts, which exits too).

    Raises:
        SystemExit: in place of the ``CannotServe`` or ``ValueError``.

    Example::

        with exit_if_cannot_serve(STARTUP_FAILURE):
            check_at_start(files, recipe, password, settings)
    """
    try:
        yield
    except (CannotServe, ValueError) as e:
        log.error("%s", e if isinstance(e, CannotServe) else f"cannot serve TLS: {e}")
        if callable(stop):
            stop()
        else:
            sys.exit(stop)


class Settings(FrozenRecord):
    """tlsreload's own settings for one server; ``None`` means "from the environment".

    Attributes:
        interval: seconds between checks (``$TLSRELOAD_INTERVAL``, else 1).
        sni: directories of more identities chosen by server name (``$TLSRELOAD_SNI``): one ``os.pathsep``-separated
            string, or any iterable of directories (kept as a tuple: it is read more than once).
        metrics: export Prometheus metrics (``$TLSRELOAD_METRICS``, else off).
        crl: a PEM file of CRLs for the CAs of the client-CA bundle (``$TLSRELOAD_CRL``, else none), reloaded
            with it: see :meth:`with_crl`.
        authorize: which clients may connect, by the SPIFFE ID of their certificate
            (``$TLSRELOAD_SPIFFE_AUTHORIZE``, else any client the server's own settings accept): an
            :class:`~tlsreload_plugins.authorization.Authorizer`, a matcher, or the syntax of
            :func:`~tlsreload_plugins.authorization.parse_authorizer`; applied by
            :func:`~tlsreload_plugins.resumption.authorized`.
    """

    _fields = ("interval", "sni", "metrics", "crl", "authorize")
    __slots__ = _fields
    interval: float | None
    sni: tuple[str, ...] | str | None
    metrics: bool | None
    crl: str | None
    authorize: Authorizer | Callable[[str], bool] | str | None

    def __init__(
        self,
        interval: float | None = None,
        sni: Iterable[str] | str | None = None,
        metrics: bool | None = None,
        crl: str | None = None,
        authorize: Authorizer | Callable[[str], bool] | str | None = None,
    ) -> None:
        directories = sni if sni is None or isinstance(sni, str) else tuple(sni)
        self._set(interval, directories, metrics, crl, authorize)

    def with_crl(self, files: TLSFiles) -> TLSFiles:
        """``files`` with the CRL file: the server's own setting (``files.crl``), else :attr:`crl`, else
        ``$TLSRELOAD_CRL``.

        Raises:
            ValueError: a CRL without a client-CA bundle (there is nothing for it to revoke).
        """
        crl = resolve_crl(files.crl or self.crl)
        if crl and not files.ca_certs:
            raise ValueError(f"a CRL ({crl}) needs the client-CA bundle it revokes certificates of")
        return files._replace(crl=crl)

    def check(self, *, as_options: bool = False) -> None:
        """Raise :class:`ValueError` naming the first setting (or environment variable) that is not usable.

        ``as_options``: the settings are a drop-in command's ``--tls-*`` options
        (:mod:`~tlsreload_plugins.serving.options`): a bad interval is named ``--tls-reload-interval``, as the
        command's usage error (exit 2) names any other option.

        Example (what :func:`~tlsreload_plugins.serving.options.argparse_settings` and ``click_settings`` do for a
        drop-in command, the error becoming its usage error)::

            Settings(options.tls_reload_interval, options.tls_sni, options.tls_metrics).check(as_options=True)
        """
        _resolved("--tls-reload-interval", self.interval, resolve_interval, as_options)
        resolve_expiry_warning_days()
        resolve_metrics(self.metrics)
        resolve_sni_directories(self.sni)
        _resolved("--tls-spiffe-authorize", self.authorize, resolve_authorizer, as_options)


def _resolved(option: str, value: T, resolve: Callable[[T], object], as_options: bool) -> None:
    """``resolve(value)``; its ``ValueError`` names ``option`` when the value was a drop-in's option."""
    try:
        resolve(value)
    except ValueError as e:
        if as_options and value is not None:
            raise ValueError(f"argument {option}: {e}") from e
        raise


class Waiting(FrozenRecord):
    """How a worker the server restarted waits for usable files, when it has nothing valid to serve.

    Attributes:
        leave: called when a stop request arrives before the files are usable (the server's way for a
            worker to leave without having served: ``sys.exit(0)``, ``os._exit(0)``); must not return.
        every: seconds between tries.
        signals: signals that ask the worker to stop while it waits (noted by a flag only: a lock taken
            in a signal handler may be the one the interrupted code holds).
        stopped: another stop request to look at (hypercorn's shutdown event), polled every :data:`POLL`.
        between: called before each wait (a gunicorn worker tells its arbiter it is alive).
    """

    _fields = ("leave", "every", "signals", "stopped", "between")
    __slots__ = _fields
    leave: Callable[[], NoReturn]
    every: float
    signals: tuple[int, ...]
    stopped: Callable[[], bool]
    between: Callable[[], object]

    def __init__(
        self,
        leave: Callable[[], NoReturn],
        every: float = RETRY_DELAY,
        signals: tuple[int, ...] = STOP_SIGNALS,
        stopped: Callable[[], bool] = lambda: False,
        between: Callable[[], object] = lambda: None,
    ) -> None:
        self._set(leave, every, signals, stopped, between)


def wait_until_usable(
    attempt: Callable[[], T],
    *,
    every: float = RETRY_DELAY,
    signals: tuple[int, ...] = STOP_SIGNALS,
    stopped: Callable[[], bool] = lambda: False,
    between: Callable[[], object] = lambda: None,
) -> T | None:
    """Try ``attempt`` every ``every`` seconds until it returns (its result), or until one of ``signals``
    arrives or ``stopped()`` is true (``None``). A :class:`~tlsreload_plugins.ReloadError` from it means
    "not yet". The signals' handlers are restored when ``attempt`` succeeds, and left noting stop requests
    otherwise (the process is leaving; its server may send the signal again as it stops).

    Example::

        reloader = wait_until_usable(lambda: Reloader("tls.crt", "tls.key", recipe=build), every=0.5)
        if reloader is None:
            sys.exit(0)  # asked to stop before the files were usable
    """
    requested: list[int] = []
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
        previous = {sig: signal.signal(sig, lambda signum, frame: requested.append(signum)) for sig in signals}
    next_try = time.monotonic() + every
    while True:
        between()
        time.sleep(min(POLL, every))
        if requested or stopped():
            return None
        if time.monotonic() < next_try:
            continue
        next_try = time.monotonic() + every
        try:
            result = attempt()
        except ReloadError:
            continue
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]
        # A stop asked for while attempt() ran (it reads and validates: up to seconds under load) is still a stop:
        # the server's parent asked once, and would wait forever for a worker that went on to serve. Asked after
        # the handlers went back, it reaches the server's own.
        return None if requested or stopped() else result


def check_at_start(
    files: TLSFiles,
    recipe: Recipe,
    password: Password,
    settings: Settings,
    *,
    reader: bool = False,
) -> ReaderProcess | None:
    """Decide, as the first reload would, whether ``files`` and ``settings`` can serve; start the server's reader,
    which its serving processes load. For a server's parent (or a server of one process), before it binds or
    starts workers.

    Args:
        files, recipe, password, settings: as :func:`start_reloader`.
        reader: start the server's one reader of ``files`` and of its SNI identities
            (:class:`~tlsreload_plugins.publication.reader.ReaderProcess`), which judges them and publishes what
            passes: its workers load only that (``start_reloader(..., publication=reader.directory)``).

    Returns:
        The reader, when ``reader``: close it when the server stops.

    Raises:
        CannotServe: a setting or the files are not usable (after :data:`BOOT_ATTEMPTS` reads).

    Example::

        with exit_if_cannot_serve(STARTUP_FAILURE):
            reader = check_at_start(files, recipe, password, settings, reader=True)
    """
    started: ReaderProcess | None = None
    try:
        settings.check()
        files = settings.with_crl(files)
        recipe = authorized(recipe, resolve_authorizer(settings.authorize))
        if reader:
            started = start_reader(files, password, settings)
            # The server's own recipe too, once, as a worker will build it: a hook that raises stops the start here.
            retry_at_start(lambda: build_context(recipe, files))
        else:
            snapshot, leaf, _ = retry_at_start(lambda: load_identity(files, recipe, password))
            _judged_at_start[files] = (snapshot, leaf)
    except (ReloadError, ValueError, ReaderFailed) as e:  # ValueError: a bad setting
        if started is not None:
            started.close()
        raise CannotServe(f"cannot serve TLS: {e}") from e
    return started


def start_reader(files: TLSFiles, password: Password, settings: Settings) -> ReaderProcess:
    """The server's one reader of ``files`` (the CRL: else :attr:`Settings.crl`) and of its SNI identities, started
    with ``settings``' interval and SNI directories: what :func:`check_at_start` starts with ``reader``, and what a
    glue that starts it later (Tornado, before its first fork) calls itself.

    Raises:
        ReaderFailed: nothing could be published (the sentence names the file).
        ValueError: a bad setting.

    Example: ``reader = start_reader(files, password, settings)``; every worker then loads ``reader.directory``.
    """
    interval, sni = resolve_interval(settings.interval), resolve_sni_directories(settings.sni)
    return ReaderProcess(settings.with_crl(files), password=password, interval=interval, sni=sni)


def start_reloader(
    files: TLSFiles,
    recipe: Recipe,
    recipe_for: RecipeFor,
    *,
    password: Password,
    settings: Settings,
    waiting: Waiting | None = None,
    publication: str | None = None,
) -> Reloader:
    """Make a serving process's reloader, with its SNI identities and metrics.

    Args:
        files: the configured certificate, key, client-CA and CRL files (the CRL: else :attr:`Settings.crl`).
        recipe: the server's own way to build its context from ``files``.
        recipe_for: the same recipe aimed at other files (SNI identities, what the server's reader published).
        password: the key's password (see :func:`~tlsreload_plugins.reloader.resolve_password`).
        settings: tlsreload's settings.
        waiting: given where the server restarts workers: with nothing valid in what its reader published (expired
            since), wait for a usable publication that way instead of failing.
        publication: the directory the server's reader publishes into (:func:`check_at_start`'s ``reader``): the
            reloader loads what it published and never opens ``files``, which it names.

    Returns:
        The reloader; hand ``reloader.context`` to the server and drive its checks.

    Raises:
        CannotServe: nothing can be served and this process may not wait (or a setting is bad).
    """
    try:
        files = settings.with_crl(files)
        authorizer = resolve_authorizer(settings.authorize)
    except ValueError as e:
        raise CannotServe(f"cannot serve TLS: {e}") from e
    recipe, recipe_for = authorized(recipe, authorizer), authorized(recipe_for, authorizer)
    subscription = Subscription(publication, recipe_for) if publication is not None else None

    def attempt(last_good: tuple[Snapshot, Leaf, ssl.SSLContext] | None = None) -> Reloader:
        return Reloader(
            files.certfile,
            files.keyfile,
            recipe=recipe,
            ca_certs=files.ca_certs,
            crl=files.crl,
            password=password,
            interval=settings.interval,
            last_good=last_good,
            subscription=subscription,
        )

    try:
        reloader = retry_at_start(attempt)
    except ValueError as e:  # a bad interval or expiry setting
        raise CannotServe(f"cannot serve TLS: {e}") from e
    except ReloadError as e:
        judged = _judged_at_start.get(files) if publication is None else None
        if judged is not None:  # the files broke since this process's own check: serve what it judged
            reloader = attempt(_judged_identity(judged, recipe_for, e))
        elif waiting is None or publication is None:  # nothing was ever served (a reader would have published)
            raise CannotServe(f"cannot serve TLS: {e}") from e
        else:
            reloader = _wait(attempt, e, waiting)
    equip(reloader, settings, recipe_for, worker=waiting is not None, publication=publication)
    if authorizer is not None and resolve_metrics(settings.metrics):
        from tlsreload_plugins import metrics  # prometheus_client: only where metrics are on

        metrics.observe_authorizer(authorizer, "server")
    return reloader


_judged_at_start: dict[TLSFiles, tuple[Snapshot, Leaf]] = {}
"""What :func:`check_at_start` judged in this process (without a reader), by files: a server of one process whose
files break between that check and its serving serves it (:func:`start_reloader`)."""


def _judged_identity(
    judged: tuple[Snapshot, Leaf], recipe_for: RecipeFor, error: ReloadError
) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
    """The identity :func:`check_at_start` judged, with a context built from its bytes by ``recipe_for``.

    Raises:
        CannotServe: it is no longer usable (expired since, say), with why the files cannot be used either.
    """
    snapshot, leaf = judged
    try:
        judge_period(leaf, snapshot.files, datetime.now(timezone.utc))
        return snapshot, leaf, context_from(snapshot, recipe_for)
    except (InvalidIdentity, TypeError) as e:
        raise CannotServe(f"cannot serve TLS: {error}; the certificate checked at start: {e}") from e


def _wait(attempt: Callable[[], Reloader], error: ReloadError, waiting: Waiting) -> Reloader:
    pid = os.getpid()
    log.error("worker %s cannot load the TLS files and waits for usable ones before serving: %s", pid, error)
    reloader = wait_until_usable(
        attempt, every=waiting.every, signals=waiting.signals, stopped=waiting.stopped, between=waiting.between
    )
    if reloader is None:
        log.info("worker %s stops without having served", pid)
        waiting.leave()
    log.info("worker %s: the TLS files are usable again; serving", pid)
    return reloader


def equip(
    reloader: Reloader,
    settings: Settings,
    recipe_for: RecipeFor,
    *,
    worker: bool = False,
    publication: str | None = None,
) -> None:
    """Give ``reloader`` its metrics (when wanted) and its SNI identities (when configured).

    ``worker``: a process the server may restart, whose settings its parent already checked: an SNI
    directory gone since then is logged (the process serves no SNI identities) rather than fatal.
    ``publication``: the server's reader publishes the SNI identities; they are looked up there, by name, when a
    handshake asks (:class:`~tlsreload_plugins.sni.published_routes.PublishedRoutes`).

    Raises:
        CannotServe: a bad ``$TLSRELOAD_METRICS``, or an SNI directory that does not exist.
    """
    try:
        if resolve_metrics(settings.metrics):
            from tlsreload_plugins import metrics  # prometheus_client and its families: only where metrics are on

            metrics.observe(reloader)
    except ValueError as e:
        raise CannotServe(f"cannot serve TLS: {e}") from e
    if SPIFFE_DIRECTORY in reloader.files.certfile:
        from tlsreload_plugins.sources.source_watch import watching  # only where a SPIFFE source's files serve

        watch = watching(reloader.files.certfile)
        if watch is not None:
            reloader.add_callbacks(on_check=watch)
    try:
        directories = resolve_sni_directories(settings.sni)
        if directories and publication is not None:
            from tlsreload_plugins.sni.published_routes import PublishedRoutes  # the SNI machinery: only where used

            PublishedRoutes(publication, recipe_for).attach(reloader)
        elif directories:
            from tlsreload_plugins.sni.identities import attach_from_settings  # the SNI machinery: only where used

            attach_from_settings(reloader, directories, recipe_for)
    except ValueError as e:
        if not worker:
            raise CannotServe(f"cannot serve TLS: {e}") from e
        log.error("worker %s serves no SNI identities: %s", os.getpid(), e)
