"""Sanic joins the shared matrix: Sanic's own command line serving :mod:`sanic_apps` (hostile_apps' routes) in
``server_kinds.WORKERS`` workers under Sanic's worker manager."""

from __future__ import annotations

from pathlib import Path

import server_kinds
from tlstest import RenameEachLayout


def sanic_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:  # Sanic's command line takes no client-CA bundle: app.run() in sanic_apps does
        files = ["--cert", str(layout.cert_path), "--key", str(layout.key_path), "--ca-certs", str(client_ca)]
        files += ["--crl", str(crl)] if crl is not None else []
        return ["-m", "sanic_apps", *files, "--port", str(port), "--workers", str(server_kinds.WORKERS), *extra]
    args = ["-m", "sanic", "sanic_apps:app", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--workers", str(server_kinds.WORKERS), "--no-access-logs"]
    return [*args, "--cert", str(layout.cert_path), "--key", str(layout.key_path), *extra]


server_kinds.register("sanic", sanic_args)
