"""Servers that fork their workers: each worker's reloader, and worker classes another server ships.

The parent checks the files once, before it binds and forks (:func:`~tlsreload_plugins.serving.check_at_start`
with ``forks=True``, into a :class:`~tlsreload_plugins.lastgood.SharedStore` created before the first fork).
Then, in each worker:

* :func:`serve_in_worker`, from its set-up hook: its reloader, checked in a thread as this process's
  (:func:`~tlsreload_plugins.serving.run_here`) until its exit hook calls
  :func:`~tlsreload_plugins.serving.stop_here`; :func:`reloaders_here` lists it.
* :func:`glue_for`: a worker class another server ships builds its context its own way; that server's
  glue knows how to reach it.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping

from .identity import Password, TLSFiles
from .lastgood import RecipeFor, SharedStore
from .reloader import Recipe, Reloader, resolve_password
from .serving import CannotServe, Settings, Waiting, run_here, running_here, start_reloader

__all__ = ["glue_for", "reloaders_here", "serve_in_worker"]

log = logging.getLogger("tlsreload_plugins.forked")


def serve_in_worker(
    files: TLSFiles,
    recipe: Recipe,
    recipe_for: RecipeFor,
    *,
    settings: Settings,
    store: SharedStore | None,
    password: Password = None,
    between: Callable[[], object] = lambda: None,
    boot_error: int = 1,
) -> Reloader:
    """Make a forked worker's reloader, and check it in a thread as this process's.

    A worker with nothing valid to serve (unusable files, nothing usable in ``store``) waits for usable
    files, and leaves with status 0 when asked to stop first. Its parent checked the settings before the
    first fork, so only a store lost can keep it from serving: then it logs one line and exits.

    Args:
        files, recipe, recipe_for, settings, store: as :func:`~tlsreload_plugins.serving.start_reloader`.
        password: the key password, else ``$TLSRELOAD_KEY_PASSWORD_FILE``'s.
        between: called before each wait (a worker tells its parent that it is alive).
        boot_error: the exit status by which the server knows that a worker could not boot.

    Returns:
        The reloader, checked until :func:`~tlsreload_plugins.serving.stop_here`; hand the server its ``context``.
    """
    waiting = Waiting(leave=lambda: sys.exit(0), between=between)
    try:
        reloader = start_reloader(
            files,
            recipe,
            recipe_for,
            password=resolve_password(password),
            settings=settings,
            store=store,
            waiting=waiting,
        )
    except CannotServe as e:
        log.error("worker %s: %s", os.getpid(), e)
        sys.exit(boot_error)
    return run_here(reloader)


def reloaders_here() -> list[Reloader]:
    """The reloaders serving TLS in this process: its worker's one (:func:`serve_in_worker`), or none."""
    reloader = running_here()
    return [] if reloader is None else [reloader]


def glue_for(cls: object, glue_by_package: Mapping[str, str]) -> str | None:
    """The glue that ``glue_by_package`` names for the top-level package defining the class ``cls`` or one
    of its bases (the first found in method resolution order); ``None`` when it names none, or ``cls`` is
    not a class.

    Example: ``glue_for(worker_class, {"uvicorn_worker": "uvicorn_worker"})``.
    """
    for base in inspect.getmro(cls) if isinstance(cls, type) else ():
        glue = glue_by_package.get(base.__module__.split(".")[0])
        if glue is not None:
            return glue
    return None
