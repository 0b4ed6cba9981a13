"""gunicorn's ``uvicorn_worker.UvicornWorker``: its glue is in :mod:`tlsreload_plugins.servers.uvicorn`."""

from tlsreload_plugins.servers.uvicorn import in_gunicorn_worker, prepare_gunicorn_worker_class

__all__ = ["in_gunicorn_worker", "prepare_gunicorn_worker_class"]
