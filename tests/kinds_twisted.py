"""daphne in the shared matrix: hostile_apps' ASGI app behind a ``tlsreload:`` endpoint, one process."""

from __future__ import annotations

from pathlib import Path

import server_kinds
from test_twisted import daphne, tlsreload
from tlstest import RenameEachLayout


def daphne_args(
    port: int, layout: RenameEachLayout, *extra: str, client_ca: Path | None = None, crl: Path | None = None
) -> list[str]:
    keywords: dict[str, object] = {"caFile": client_ca} if client_ca is not None else {}
    if crl is not None:
        keywords["crlFile"] = crl
    *options, app = daphne(tlsreload(port, layout.cert_path, layout.key_path, **keywords))
    return [*options, *extra, app]


server_kinds.register("daphne", daphne_args, single_process=True)
