"""aiohttp joins the shared hostile-files matrix: :mod:`asyncio_server_apps` served by aiohttp, one process; and by
gunicorn's drop-in with aiohttp's worker class, ``aiohttp.GunicornWebWorker``."""

from __future__ import annotations

from pathlib import Path

from server_kinds import gunicorn_kind, register
from tlstest import RenameEachLayout


def aiohttp_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    if client_ca is not None:
        extra = ("--ca-certs", str(client_ca), *extra)
    if crl is not None:
        extra = ("--crl", str(crl), *extra)
    files = ["--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    return ["-m", "asyncio_server_apps", "aiohttp", *files, "--port", str(port), *extra]


register("aiohttp", aiohttp_args, single_process=True, log_lines_name_the_worker=True)


def aiohttp_worker_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    command = gunicorn_kind("aiohttp.GunicornWebWorker")(port, layout, *extra, client_ca=client_ca, crl=crl)
    command[-1] = "asyncio_server_apps:aiohttp_app"
    return command


register("aiohttp-worker", aiohttp_worker_args, log_lines_name_the_worker=True)
