"""websockets joins the shared hostile-files matrix: :mod:`asyncio_server_apps` served by websockets, one process."""

from __future__ import annotations

from pathlib import Path

from server_kinds import register
from tlstest import RenameEachLayout


def websockets_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ca-certs", str(client_ca), *extra)
    if crl is not None:
        extra = ("--crl", str(crl), *extra)
    files = ["--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    return ["-m", "asyncio_server_apps", "websockets", *files, "--port", str(port), *extra]


register("websockets", websockets_args, single_process=True, log_lines_name_the_worker=True)
