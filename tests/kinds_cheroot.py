"""cheroot joins the shared matrix: its ``wsgi.Server`` serving hostile_apps' WSGI app with tlsreload's SSL
adapter, in one process (:mod:`cheroot_apps`)."""

from __future__ import annotations

from pathlib import Path

import server_kinds
from tlstest import RenameEachLayout


def cheroot_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ca-certs", str(client_ca), *extra)
    if crl is not None:
        extra = ("--crl", str(crl), *extra)
    args = ["-m", "cheroot_apps", "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    return [*args, "--port", str(port), *extra]


server_kinds.register("cheroot", cheroot_args, single_process=True)
