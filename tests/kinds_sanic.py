"""Sanic joins the shared matrix: Sanic's own command line serving :mod:`sanic_apps` (hostile_apps' routes) in
``server_kinds.WORKERS`` workers under Sanic's worker manager."""

from __future__ import annotations

import server_kinds
from tlstest import RenameEachLayout


def sanic_args(port: int, layout: RenameEachLayout, *extra: str) -> list[str]:
    args = ["-m", "sanic", "sanic_apps:app", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--workers", str(server_kinds.WORKERS), "--no-access-logs"]
    return [*args, "--cert", str(layout.cert_path), "--key", str(layout.key_path), *extra]


server_kinds.register("sanic", sanic_args)
