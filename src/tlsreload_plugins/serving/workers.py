"""A server's worker processes: a forked worker's reloader, a spawned worker's wait, and worker classes
another server ships.

Either way the parent checks the files once, before it binds or starts workers
(:func:`~tlsreload_plugins.serving.check_at_start`), and starts the server's one reader of them, whose publication
its workers load (:mod:`tlsreload_plugins.publication`); then, in each worker:

* *forked*: :func:`serve_in_worker`, from the worker's set-up hook, makes its reloader and checks it in a thread as
  this process's (:func:`run_here`) until its exit hook calls :func:`stop_here`; :func:`reloaders_here` lists it.
* *spawned* (the publication's path travels with the worker's configuration): the glue makes the reloader where the
  server builds its context, waiting as :func:`waiting_in_spawned_worker` says when nothing valid is left to serve.
* :class:`WorkerClassGlue`, :func:`glue_for`, :func:`prepare_worker_class`: a worker class another server
  ships builds its context its own way; that server's glue knows how to reach it, and prepares the class
  (or refuses it). The server's glue hands these a table of them, by the top-level package shipping the class.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.examine import Recipe
from tlsreload_plugins.files import Password, TLSFiles
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.serving.start import RETRY_DELAY, CannotServe, Settings, Waiting, start_reloader
from tlsreload_plugins.settings import resolve_password

__all__ = [
    "WorkerClassGlue",
    "glue_for",
    "prepare_worker_class",
    "reloaders_here",
    "run_here",
    "running_here",
    "serve_in_worker",
    "stop_here",
    "waiting_in_spawned_worker",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.workers")


# -- forked workers ---------------------------------------------------------------------------------


class _Here(FrozenRecord):
    _fields = ("pid", "reloader", "driver")
    __slots__ = _fields
    pid: int
    reloader: Reloader
    driver: ThreadDriver

    def __init__(self, pid: int, reloader: Reloader, driver: ThreadDriver) -> None:
        self._set(pid, reloader, driver)


_here: _Here | None = None
"""The reloader this process serves with: keyed by pid, so that a forked child never takes its parent's for its own."""


def run_here(reloader: Reloader) -> Reloader:
    """Check ``reloader`` in a :class:`~tlsreload_plugins.ThreadDriver` (a greenlet under gevent) as this
    process's reloader, until :func:`stop_here`; returns it. For a forked worker's set-up hook."""
    global _here
    _here = _Here(os.getpid(), reloader, ThreadDriver(reloader).start())
    return reloader


def running_here() -> Reloader | None:
    """This process's reloader (see :func:`run_here`); ``None`` before, after :func:`stop_here`, or in
    a process forked from the one that set it."""
    here = _here
    return here.reloader if here is not None and here.pid == os.getpid() else None


def reloaders_here() -> list[Reloader]:
    """The reloaders serving TLS in this process: its worker's one (:func:`running_here`), or none."""
    reloader = running_here()
    return [] if reloader is None else [reloader]


def stop_here() -> None:
    """Stop checking this process's reloader (a worker's exit hook); does nothing where none runs."""
    global _here
    here = _here
    if here is not None and here.pid == os.getpid():
        _here = None
        here.driver.stop()


def serve_in_worker(
    files: TLSFiles,
    recipe: Recipe,
    recipe_for: RecipeFor,
    *,
    settings: Settings,
    password: Password = None,
    between: Callable[[], object] = lambda: None,
    boot_error: int = 1,
    publication: str | None = None,
) -> Reloader:
    """Make a forked worker's reloader, and check it in a thread as this process's (:func:`run_here`).

    A worker with nothing valid to serve (what its server's reader published has expired since) waits for a usable
    publication, and leaves with status 0 when asked to stop first. Its parent checked the settings before the
    first fork; what else keeps it from serving is one line, and it exits.

    Args:
        files, recipe, recipe_for, settings: as :func:`~tlsreload_plugins.serving.start.start_reloader`.
        password: the key password, else ``$TLSRELOAD_KEY_PASSWORD_FILE``'s.
        between: called before each wait (a worker tells its parent that it is alive).
        boot_error: the exit status by which the server knows that a worker could not boot.
        publication: where the server's reader publishes (the worker loads only that; see
            :func:`~tlsreload_plugins.serving.start.start_reloader`).

    Returns:
        The reloader, checked until :func:`stop_here`; hand the server its ``context``.

    Example::

        serve_in_worker(files, recipe, recipe_for, settings=settings, between=worker.notify)
    """
    waiting = Waiting(leave=_exit_quietly, between=between)
    password = resolve_password(password)
    try:
        reloader = start_reloader(
            files,
            recipe,
            recipe_for,
            password=password,
            settings=settings,
            waiting=waiting,
            publication=publication,
        )
    except CannotServe as e:
        log.error("worker %s: %s", os.getpid(), e)
        sys.exit(boot_error)
    return run_here(reloader)


T = TypeVar("T")

ReloaderMaker = Callable[[Recipe, RecipeFor], Reloader]
"""Makes a worker's reloader from the recipes of the context its worker class builds (``serve(recipe, recipe_for)``)."""


class WorkerClassGlue(FrozenRecord):
    """What a server's glue does with a worker class another server ships, which builds its TLS context its own
    way (gunicorn's ``uvicorn_worker.UvicornWorker``, aiohttp's ``GunicornWebWorker``).

    Attributes:
        prepare: ``prepare(cls, name)``, in the server's parent at start: configures the class, or raises
            ``ValueError`` saying why its certificate could not be reloaded (``name``: how the user named it).
        serve: ``serve(worker, serve_with)``, in each worker as it starts: has the worker's context made by
            ``serve_with(recipe, recipe_for)`` (a :data:`ReloaderMaker`); ``None``: the worker builds its context as the
            server's own worker classes do.
    """

    _fields = ("prepare", "serve")
    __slots__ = _fields
    prepare: Callable[[Any, str], None]
    serve: Callable[[Any, ReloaderMaker], None] | None

    def __init__(
        self, prepare: Callable[[Any, str], None], serve: Callable[[Any, ReloaderMaker], None] | None = None
    ) -> None:
        self._set(prepare, serve)


def glue_for(cls: object, glue_by_package: Mapping[str, T]) -> T | None:
    """What ``glue_by_package`` holds for the top-level package defining the class ``cls`` or one of its bases
    (the first found in method resolution order); ``None`` when it holds nothing for them, or ``cls`` is not a
    class.

    Example: ``glue_for(type(worker), {"uvicorn_worker": uvicorn_worker_glue})``.
    """
    for base in inspect.getmro(cls) if isinstance(cls, type) else ():
        glue = glue_by_package.get(base.__module__.split(".")[0])
        if glue is not None:
            return glue
    return None


def prepare_worker_class(cls: object, name: str, glue_by_package: Mapping[str, WorkerClassGlue]) -> None:
    """Have the glue that :func:`glue_for` finds for the worker class ``cls`` prepare it (its ``prepare``):
    configure the class, or refuse it; nothing when ``glue_by_package`` holds no glue for it. For the server's
    parent, at start.

    Args:
        cls: the worker class; name: how the user named it, for messages.
        glue_by_package: as for :func:`glue_for`.

    Raises:
        ValueError: the glue refuses the class: its certificate could not be reloaded (the text says why).

    Example: ``prepare_worker_class(cfg.worker_class, cfg.worker_class_str, WORKER_CLASSES)``
    """
    glue = glue_for(cls, glue_by_package)
    if glue is not None:
        glue.prepare(cls, name)


# -- spawned workers --------------------------------------------------------------------------------


def waiting_in_spawned_worker(
    *,
    stop_event: str | None = None,
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    every: float = RETRY_DELAY,
    at_once: bool = False,
) -> Waiting | None:
    """How a worker its server's parent spawned waits for usable files when it has nothing valid to serve, for
    :func:`~tlsreload_plugins.serving.start.start_reloader`: exiting instead, with the start-up failure status,
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
        The :class:`~tlsreload_plugins.serving.start.Waiting`; ``None`` when ``stop_event`` names no event of this
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
