"""A server's start with reloading, beyond :mod:`~tlsreload_plugins.serving`: what the drop-in commands
and the glue of servers that spawn their workers would otherwise each say in their own words.

* :func:`exit_if_cannot_serve`: a :class:`~tlsreload_plugins.serving.CannotServe` becomes the server's
  own failed start: one ERROR line, its exit status.
* :func:`usage_problem` and :func:`with_tls_options`: a drop-in command is the server's own command
  plus the ``--tls-*`` options, whose bad values are usage errors (exit 2) like any other option's.
* :func:`check_in_parent`: check the files once in the parent, and keep its verdicts for the workers.
* :func:`waiting_in_spawned_worker`: how a spawned worker with nothing valid to serve waits, and leaves.

Nothing here knows a server; click is imported only by :func:`with_tls_options`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from .files import Password, TLSFiles
from .lastgood import SharedStore
from .reloader import Recipe
from .serving import OPTION_HELP, RETRY_DELAY, CannotServe, Settings, Waiting, check_at_start, keep_for_workers
from .settings import MIN_INTERVAL, resolve_interval

if TYPE_CHECKING:  # a drop-in command's only: workers, which import this module too, have no use for it
    import click

__all__ = [
    "check_in_parent",
    "exit_if_cannot_serve",
    "usage_problem",
    "waiting_in_spawned_worker",
    "with_tls_options",
]

log = logging.getLogger("tlsreload_plugins.startup")


@contextlib.contextmanager
def exit_if_cannot_serve(status: int) -> Iterator[None]:
    """Stop the process as its server stops on a failed start when the block cannot serve TLS: one ERROR line
    (the sentence of the :class:`~tlsreload_plugins.serving.CannotServe`; for a ``ValueError``, a bad setting,
    prefixed ``cannot serve TLS:``), then ``sys.exit(status)``.

    Raises:
        SystemExit: with ``status``, in place of the ``CannotServe`` or ``ValueError``.

    Example::

        with exit_if_cannot_serve(STARTUP_FAILURE):
            check_at_start(files, recipe, password, settings, store)
    """
    try:
        yield
    except (CannotServe, ValueError) as e:
        log.error("%s", e if isinstance(e, CannotServe) else f"cannot serve TLS: {e}")
        sys.exit(status)


def usage_problem(settings: Settings) -> str | None:
    """What a drop-in command says as its usage error (exit 2) about tlsreload's settings, or ``None`` when
    they are usable: a bad interval given as an option is named as ``--tls-reload-interval``.

    Example::

        problem = usage_problem(Settings(options.tls_reload_interval, options.tls_sni, options.tls_metrics))
        if problem is not None:
            parser.error(problem)
    """
    if settings.interval is not None:
        try:
            resolve_interval(settings.interval)
        except ValueError as e:
            return f"argument --tls-reload-interval: {e}"
    try:
        settings.check()
    except ValueError as e:
        return str(e)
    return None


def with_tls_options(stock: click.Command, callback: Callable[..., object], *, after: str) -> click.Command:
    """A server's own click command, with tlsreload's options: for a drop-in command.

    Args:
        stock: the server's command.
        callback: runs in place of the stock callback, with the stock parameters and ``tls_reload_interval``
            (a float >= 0.1, or None), ``tls_sni`` (a tuple) and ``tls_metrics`` (a bool).
        after: the options go after the last parameter whose name starts with it (the server's TLS options).

    Returns:
        A copy of ``stock`` (help texts, defaults and environment variables unchanged) whose ``--version``
        also names this package.

    Example::

        with_tls_options(uvicorn.main, run, after="ssl_").main(args=args)
    """
    import click

    command = copy.copy(stock)
    params = [_with_our_version(param) if param.name == "version" else param for param in command.params]
    at = max(i for i, param in enumerate(params) if (param.name or "").startswith(after)) + 1
    ours = [
        click.Option(
            ["--tls-reload-interval"],
            type=click.FloatRange(min=MIN_INTERVAL),
            help=OPTION_HELP["--tls-reload-interval"],
        ),
        click.Option(["--tls-sni"], multiple=True, metavar="DIR", help=OPTION_HELP["--tls-sni"]),
        click.Option(["--tls-metrics"], is_flag=True, default=False, help=OPTION_HELP["--tls-metrics"]),
    ]
    command.params = [*params[:at], *ours, *params[at:]]
    command.callback = callback
    return command


def _with_our_version(param: click.Parameter) -> click.Parameter:
    """The server's ``--version``, followed by a line naming this package."""
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


def check_in_parent(
    files: TLSFiles, recipe: Recipe, password: Password, settings: Settings, store: SharedStore, *, spawns: bool
) -> None:
    """In a server's parent, before it starts serving: decide once, as the first reload would, whether the
    files and settings can serve (:func:`~tlsreload_plugins.serving.check_at_start`), rather than in every
    worker. ``spawns``: the server starts workers, now or later (``--workers``, ``--reload``, SIGHUP), that
    get ``store`` with their configuration: keep it current for them
    (:func:`~tlsreload_plugins.serving.keep_for_workers`), so they take its verdicts.

    Raises:
        CannotServe: a setting or the files are not usable.

    Example::

        with exit_if_cannot_serve(STARTUP_FAILURE):
            check_in_parent(files, recipe, password, settings, store, spawns=workers > 1)
    """
    check_at_start(files, recipe, password, settings, store)
    if spawns:
        keep_for_workers(files, password, settings, store)


def waiting_in_spawned_worker(
    *,
    stop_event: str | None = None,
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    every: float = RETRY_DELAY,
    at_once: bool = False,
) -> Waiting | None:
    """How a worker its server's parent spawned waits for usable files when it has nothing valid to serve, for
    :func:`~tlsreload_plugins.serving.start_reloader`: exiting instead, with the start-up failure status,
    would make such a parent stop the whole server. It leaves with status 0 when its parent stops it.

    Args:
        stop_event: the keyword argument under which the parent hands this worker process's target the event
            it sets to stop its workers (found through the process object: CPython keeps the arguments in its
            private ``_kwargs``); the worker leaves when it is set.
        signals: the signals that ask the worker to stop.
        every: seconds between tries.
        at_once: leave with ``os._exit(0)`` once the logs are flushed, not ``sys.exit(0)``: under trio, the
            nurseries turn ``SystemExit`` into an exception group, status 1 (the app's lifespan shutdown does
            not run).

    Returns:
        The :class:`~tlsreload_plugins.serving.Waiting`; ``None`` when ``stop_event`` names no event of this
        process (not a worker such a parent started).

    Example::

        waiting = waiting_in_spawned_worker(stop_event="shutdown_event", signals=(signal.SIGTERM,))
    """
    stopped: Callable[[], bool] = lambda: False  # noqa: E731
    if stop_event is not None:
        kwargs = getattr(multiprocessing.current_process(), "_kwargs", None)
        event: Any = kwargs.get(stop_event) if isinstance(kwargs, dict) else None
        if not callable(getattr(event, "is_set", None)):
            return None
        stopped = event.is_set
    return Waiting(leave=_exit_now if at_once else _exit_quietly, every=every, signals=signals, stopped=stopped)


def _exit_quietly() -> NoReturn:
    sys.exit(0)


def _exit_now() -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
