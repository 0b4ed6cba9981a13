"""The worker classes other servers ship for gunicorn, and the glue that knows how each builds its TLS context.

gunicorn's ``-k`` takes any worker class; those of uvicorn (``uvicorn_worker.UvicornWorker``) and aiohttp
(``GunicornWebWorker``) build their context their own way, never through gunicorn's ``ssl_context`` hook. The
gunicorn glue looks a class up here (:func:`~tlsreload_plugins.serving.workers.glue_for`, by the top-level package
defining it or a base). Each function imports its server's glue only when that worker class is used, so that
gunicorn's users without uvicorn or aiohttp installed import nothing of them.
"""

from __future__ import annotations

from typing import Any

from tlsreload_plugins.serving.workers import ReloaderMaker, WorkerClassGlue

__all__ = ["WORKER_CLASSES"]


def _prepare_uvicorn_worker(worker_class: Any, name: str) -> None:
    from tlsreload_plugins.servers import uvicorn

    uvicorn.prepare_gunicorn_worker_class(worker_class, name)


def _serve_in_uvicorn_worker(worker: Any, serve: ReloaderMaker) -> None:
    from tlsreload_plugins.servers import uvicorn  # its uvicorn calls the factory as it starts serving, after this hook

    uvicorn.in_gunicorn_worker(worker, serve)


def _prepare_aiohttp_worker(worker_class: Any, name: str) -> None:
    from tlsreload_plugins.servers import aiohttp

    aiohttp.prepare_gunicorn_worker_class(worker_class, name)


def _serve_in_aiohttp_worker(worker: Any, serve: ReloaderMaker) -> None:
    from tlsreload_plugins.servers import aiohttp

    aiohttp.in_gunicorn_worker(worker, serve)


_UVICORN_WORKER = WorkerClassGlue(prepare=_prepare_uvicorn_worker, serve=_serve_in_uvicorn_worker)

WORKER_CLASSES = {
    "uvicorn_worker": _UVICORN_WORKER,
    "uvicorn": _UVICORN_WORKER,
    "aiohttp": WorkerClassGlue(prepare=_prepare_aiohttp_worker, serve=_serve_in_aiohttp_worker),
}
"""The glue of each worker class another server ships, by the top-level package defining it: ``uvicorn_worker``
(uvicorn-worker), ``uvicorn`` (uvicorn's own ``uvicorn.workers``), ``aiohttp``."""
