"""Tornado joins the shared hostile-files matrix: :mod:`asyncio_server_apps` served by Tornado from
:data:`server_kinds.WORKERS` processes under ``tornado.process.fork_processes``."""

from __future__ import annotations

from pathlib import Path

from server_kinds import WORKERS, register
from tlstest import RenameEachLayout


def tornado_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ca-certs", str(client_ca), *extra)
    if crl is not None:
        extra = ("--crl", str(crl), *extra)
    files = ["--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    return ["-m", "asyncio_server_apps", "tornado", *files, "--port", str(port), "--processes", str(WORKERS), *extra]


register("tornado", tornado_args, log_lines_name_the_worker=True)
