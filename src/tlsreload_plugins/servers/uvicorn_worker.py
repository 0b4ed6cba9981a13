"""uvicorn-worker glue: gunicorn's ``uvicorn_worker.UvicornWorker``, reloading.

The worker class builds its ``uvicorn.Config`` from gunicorn's settings plus the class's ``CONFIG_KWARGS``
(uvicorn-worker's documented way to pass more) and never calls gunicorn's ``ssl_context`` hook: the gunicorn
drop-in adds a ``ssl_context_factory`` there (:func:`prepare_gunicorn_worker_class`, in the arbiter). The
factory's recipe is the user's gunicorn ``ssl_context`` hook applied to uvicorn's own default factory; the
worker's reloader is made and driven by the gunicorn glue (forked workers, the arbiter's last good store).
"""

from __future__ import annotations

import inspect
import logging
import os
import ssl
import sys
from collections.abc import Callable
from typing import Any

from ..files import TLSFiles, password_text
from ..reloader import Reloader
from ..settings import resolve_password
from .uvicorn import recipe_for_config

__all__ = ["in_gunicorn_worker", "prepare_gunicorn_worker_class"]

log = logging.getLogger("tlsreload_plugins.gunicorn")


_in_gunicorn: tuple[int, Any, Callable[..., ssl.SSLContext], Callable[..., Reloader]] | None = None
"""This worker's pid, gunicorn worker, the user's ``ssl_context`` hook and the gunicorn glue's ``serve``."""


def prepare_gunicorn_worker_class(worker_class: Any, name: str) -> None:
    """Add the reloading ``ssl_context_factory`` to a ``UvicornWorker`` class's ``CONFIG_KWARGS``.

    Raises:
        ValueError: that way is gone (no ``CONFIG_KWARGS``, or a uvicorn without ``ssl_context_factory``).
    """
    import uvicorn

    kwargs = getattr(worker_class, "CONFIG_KWARGS", None)
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"the worker class {name} has no CONFIG_KWARGS (uvicorn-worker's way to configure "
            "uvicorn): certificates cannot be reloaded with this version"
        )
    if "ssl_context_factory" not in inspect.signature(uvicorn.Config).parameters:
        raise ValueError(
            f"uvicorn {uvicorn.__version__} has no Config(ssl_context_factory=...): upgrade to uvicorn 0.47 or newer"
        )
    worker_class.CONFIG_KWARGS = {**kwargs, "ssl_context_factory": _gunicorn_worker_context}


def in_gunicorn_worker(
    worker: Any, user_ssl_context: Callable[..., ssl.SSLContext], serve: Callable[..., Reloader]
) -> None:
    """In a ``UvicornWorker`` (its ``post_worker_init``): check that the factory reached uvicorn's Config
    (read through the worker's undocumented ``config``; stop the worker when it did not), and leave what
    it needs. ``serve(recipe, recipe_for)`` makes and drives the worker's reloader."""
    global _in_gunicorn
    if getattr(getattr(worker, "config", None), "ssl_context_factory", None) is not _gunicorn_worker_context:
        log.error(
            "%s did not hand tlsreload's ssl_context_factory to uvicorn (CONFIG_KWARGS): this worker "
            "would never reload its certificate; stopping",
            type(worker).__name__,
        )
        sys.exit(3)  # gunicorn's WORKER_BOOT_ERROR: the arbiter stops with "Worker failed to boot."
    _in_gunicorn = (os.getpid(), worker, user_ssl_context, serve)


def _gunicorn_worker_context(config: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The ``ssl_context_factory`` of a ``UvicornWorker``'s uvicorn: the user's gunicorn ``ssl_context`` hook
    applied to uvicorn's default factory, reloading."""
    if _in_gunicorn is None or _in_gunicorn[0] != os.getpid():
        log.error("tlsreload's post_worker_init did not run in this worker: its certificate will NOT be reloaded")
        return default_factory()
    from . import gunicorn

    _, worker, user_ssl_context, serve = _in_gunicorn
    password = resolve_password(None)
    uvicorn_recipe_for = recipe_for_config(config, password)

    def recipe() -> ssl.SSLContext:
        if password is not None:  # uvicorn's default factory reads it from the Config on every call
            config.ssl_keyfile_password = password_text(password)
        return user_ssl_context(worker.cfg, default_factory)

    def recipe_for(files: TLSFiles) -> ssl.SSLContext:
        return user_ssl_context(gunicorn.with_files(worker.cfg, files), lambda: uvicorn_recipe_for(files))

    return serve(recipe, recipe_for).context
