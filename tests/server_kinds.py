"""The server kinds of the shared matrix (hostile files today): how to start each, in one place.

A kind is a name and a function ``args(port, layout, *extra, client_ca=None) -> list[str]``: the command line,
starting with ``-m``, of a real server serving ``hostile_apps`` (``/`` with the worker's pid, ``/status`` with its
reloaders' ``status()``, ``/metrics``; every answer with an ``x-worker-pid`` header) on ``127.0.0.1:port``
over TLS with ``layout.cert_path`` and ``layout.key_path``, in :data:`WORKERS` serving processes (or one,
see :data:`SINGLE`), checking every ``$TLSRELOAD_INTERVAL`` with ``$TLSRELOAD_METRICS`` on. With ``client_ca`` (a
path), the server requires client certificates signed by a CA in that bundle, in its own convention (mutual TLS);
with ``crl`` too (a path), it refuses those the CRLs in that file revoke, in its own convention (an option, a keyword,
an endpoint key; gunicorn's drop-in: ``$TLSRELOAD_CRL``).

A server joins the matrix with one module ``tests/kinds_<server>.py`` that calls :func:`register` at import:
this module imports every such module, so no test file is edited to add a server.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from test_gunicorn import ASGI_WORKERS, DROP_IN, UVICORN, gunicorn
from test_hypercorn import drop_in as hypercorn_drop_in
from test_uvicorn import drop_in as uvicorn_drop_in
from tlsreload_plugins.settings import CRL_ENV
from tlstest import RenameEachLayout

Args = Callable[..., list[str]]

WORKERS = 2
"""Serving processes per server, where the server has workers."""

KINDS: dict[str, Args] = {}
SINGLE: set[str] = set()
"""Kinds that serve from one process (no workers): the matrix expects one pid there."""
LOG_LINES_NAME_THE_WORKER: set[str] = set()
"""Kinds whose log lines carry the worker's pid as ``[pid] [LEVEL]`` (gunicorn's and hypercorn's format)."""


def register(name: str, args: Args, *, single_process: bool = False, log_lines_name_the_worker: bool = False) -> None:
    """Add a server kind to the matrix (see the module docstring)."""
    assert name not in KINDS, f"server kind {name!r} registered twice"
    KINDS[name] = args
    if single_process:
        SINGLE.add(name)
    if log_lines_name_the_worker:
        LOG_LINES_NAME_THE_WORKER.add(name)


def workers(kind: str) -> int:
    """How many distinct processes answer for ``kind``."""
    return 1 if kind in SINGLE else WORKERS


def args(
    kind: str, port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    """The command line of ``kind`` (see the module docstring)."""
    if crl is None:
        return KINDS[kind](port, layout, *extra, client_ca=client_ca)
    return KINDS[kind](port, layout, *extra, client_ca=client_ca, crl=crl)


def gunicorn_kind(worker_class: str) -> Args:
    """The command line of gunicorn with ``worker_class`` (a kind of the matrix, or one a test adds)."""

    def gunicorn_args(
        port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
    ) -> list[str]:
        if client_ca is not None:
            extra = ("--ca-certs", str(client_ca), "--cert-reqs", "2", *extra)
        if crl is not None:  # the drop-in's convention: $TLSRELOAD_CRL (gunicorn's --env sets it before on_starting)
            extra = ("--env", f"{CRL_ENV}={crl}", *extra)
        command = gunicorn(port, layout.cert_path, layout.key_path, "-c", DROP_IN, *extra, worker_class=worker_class)
        command[-1] = "hostile_apps:asgi" if worker_class in ASGI_WORKERS else "hostile_apps:wsgi"
        return command

    return gunicorn_args


for _worker_class in ("sync", "gthread", "gevent", "asgi", UVICORN):
    register(_worker_class, gunicorn_kind(_worker_class), log_lines_name_the_worker=True)


def _uvicorn_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ssl-ca-certs", str(client_ca), "--ssl-cert-reqs", "2", *extra)
    if crl is not None:
        extra = ("--tls-crl", str(crl), *extra)
    return uvicorn_drop_in(port, layout, "--workers", str(WORKERS), *extra, app="hostile_apps:asgi")


def _hypercorn_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ca-certs", str(client_ca), "--verify-mode", "CERT_REQUIRED", *extra)
    if crl is not None:
        extra = ("--tls-crl", str(crl), *extra)
    return hypercorn_drop_in(port, layout, "--workers", str(WORKERS), *extra, app="hostile_apps:asgi")


register("tlsreload-uvicorn", _uvicorn_args)
register("tlsreload-hypercorn", _hypercorn_args, log_lines_name_the_worker=True)

for _module in sorted(Path(__file__).parent.glob("kinds_*.py")):
    importlib.import_module(_module.stem)
