"""aiohttp glue: ``web.run_app(app, ssl_context=reloading(app, certfile, keyfile))``.

How it is configured: aiohttp takes an :class:`ssl.SSLContext` (``web.run_app(ssl_context=...)``,
``web.TCPSite(ssl_context=...)``) and never rebuilds it. :func:`reloading` gives it one from
:func:`~tlsreload_plugins.fresh_context`: validated now (unusable files raise before anything binds),
then checked in a daemon thread, never on aiohttp's event loop. New connections get the newest valid
certificate; established ones (keep-alive, websockets) keep the one they started with.

The checks are tied to the app's life with a ``cleanup_ctx`` entry put first, so it is entered before
the app's own and left after them: the certificate stays fresh through the app's own shutdown, and the
checking thread is stopped (and joined in the loop's executor) when the app has finished.

gunicorn's ``aiohttp.GunicornWebWorker`` (and ``GunicornUVLoopWebWorker``, and a user's subclass) build their
context in each worker as it starts, with ``GunicornWebWorker._create_ssl_context(cfg)``, never calling gunicorn's
``ssl_context`` hook. The gunicorn drop-in gives each such worker, in ``post_worker_init``, a reloader whose recipe
is that builder, and has the worker's builder hand out the reloader's context
(:func:`in_gunicorn_worker`); :func:`prepare_gunicorn_worker_class` checks at start that the builder is still
there (a private name: a renamed one stops the server at start, with one line).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.fresh import FreshContext, fresh_context, reloaders
from tlsreload_plugins.memory_files import RecipeFor

if TYPE_CHECKING:  # a type only: aiohttp's users import nothing of gunicorn's workers
    from tlsreload_plugins.serving.workers import ReloaderMaker

__all__ = ["reloaders", "reloading"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.aiohttp")


def reloading(
    app: Any,
    certfile: str,
    keyfile: str | None = None,
    *,
    ca_certs: str | None = None,
    crl: str | None = None,
    password_file: str | None = None,
    sni: Iterable[str] | str | None = None,
    interval: float | None = None,
    recipe: RecipeFor | None = None,
    metrics: bool | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> ssl.SSLContext:
    """An :class:`ssl.SSLContext` for ``app`` that follows the certificate files for as long as ``app`` runs.

    Call it before the app starts (it reads and validates the files: blocking, not for a coroutine).

    Args:
        app: the ``aiohttp.web.Application``; its ``cleanup_ctx`` gets the entry that stops the checks.
        certfile, keyfile, ca_certs, crl, password_file, sni, interval, recipe, metrics: as
            :func:`~tlsreload_plugins.fresh_context` (``ca_certs`` means mutual TLS: client certificates
            are required and verified against that bundle, reloaded like the pair).
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``fresh_context``.

    Returns:
        The context to give aiohttp, once: ``web.run_app(app, ssl_context=...)`` or ``web.TCPSite(...,
        ssl_context=...)``.

    Raises:
        InvalidIdentity: the files cannot be used now; one sentence names the file and what is wrong.
        ValueError: a setting is not usable (see :func:`~tlsreload_plugins.fresh_context`).
        RuntimeError: ``app`` has already started (aiohttp freezes its ``cleanup_ctx`` then).

    Example::

        app = web.Application()
        web.run_app(app, port=8443, ssl_context=reloading(app, "/etc/tls/tls.crt", "/etc/tls/tls.key"))
    """
    if getattr(app.cleanup_ctx, "frozen", False):
        raise RuntimeError("reloading() needs an app that has not started yet: its cleanup_ctx is frozen")
    fresh = fresh_context(
        certfile,
        keyfile,
        ca_certs=ca_certs,
        crl=crl,
        password_file=password_file,
        sni=sni,
        interval=interval,
        recipe=recipe,
        metrics=metrics,
        authorize=authorize,
    )
    app.cleanup_ctx.insert(0, _checking_while_the_app_runs(fresh))
    return fresh.context


def _checking_while_the_app_runs(fresh: FreshContext) -> Callable[[Any], AsyncIterator[None]]:
    async def checking(app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # close() joins the checking thread, which may be in the middle of a check: not on the loop.
            await asyncio.get_running_loop().run_in_executor(None, fresh.close)
            log.debug("stopped checking %s", fresh.reloader.files.describe())

    return checking


def _is_aiohttp_class(worker_class: Any) -> bool:
    return isinstance(worker_class, type) and any(
        cls.__module__.split(".")[0] == "aiohttp" for cls in inspect.getmro(worker_class)
    )


CONTEXT_BUILDER = "_create_ssl_context"
"""Where aiohttp's gunicorn worker builds its TLS context: ``GunicornWebWorker._create_ssl_context(cfg)``, a static
method its ``_run`` calls through the instance once, as the worker starts serving."""


def prepare_gunicorn_worker_class(worker_class: Any, name: str) -> None:
    """For gunicorn's drop-in, before the arbiter binds: check that an aiohttp worker class builds its TLS context
    where :func:`in_gunicorn_worker` reaches it. Other classes are left alone.

    Args:
        worker_class: gunicorn's ``cfg.worker_class`` (the class).
        name: how the user named it (``cfg.worker_class_str``), for the message.

    Raises:
        ValueError: ``worker_class`` is, or derives from, one of aiohttp's and has no context builder this glue
            knows; its text is the reason.
    """
    if not _is_aiohttp_class(worker_class):
        return
    builder = getattr(worker_class, CONTEXT_BUILDER, None)
    if not callable(builder) or len(inspect.signature(builder).parameters) != 1:
        raise ValueError(
            f"the worker class {name} has no {CONTEXT_BUILDER}(cfg) (where aiohttp's GunicornWebWorker builds its "
            "TLS context), so its certificate could not be reloaded: this aiohttp is not supported; serve the app "
            "with web.run_app(app, ssl_context=tlsreload_plugins.aiohttp.reloading(app, certfile, keyfile))"
        )


def in_gunicorn_worker(worker: Any, serve: ReloaderMaker) -> None:
    """In an aiohttp worker's ``post_worker_init``: make its reloader with aiohttp's own builder as the recipe
    (``serve(recipe, recipe_for)``, which waits while nothing valid can be served), and have the worker's builder
    hand out the reloader's context, which the worker then serves for its whole life."""
    build = getattr(type(worker), CONTEXT_BUILDER)
    cfg = worker.cfg
    reloader = serve(lambda: build(cfg), lambda files: build(_WithFiles(cfg, files)))
    setattr(worker, CONTEXT_BUILDER, lambda cfg: reloader.context)


class _WithFiles:
    """gunicorn's configuration naming other certificate, key and CA files: what aiohttp's builder reads."""

    def __init__(self, cfg: Any, files: TLSFiles) -> None:
        self._cfg = cfg
        self.certfile, self.keyfile, self.ca_certs = files.certfile, files.keyfile, files.ca_certs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)
