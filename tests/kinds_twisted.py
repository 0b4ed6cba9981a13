"""daphne in the shared matrix: hostile_apps' ASGI app behind a ``tlsreload:`` endpoint, one process."""

from __future__ import annotations

import server_kinds
from test_twisted import daphne, tlsreload
from tlstest import RenameEachLayout


def daphne_args(port: int, layout: RenameEachLayout, *extra: str) -> list[str]:
    *options, app = daphne(tlsreload(port, layout.cert_path, layout.key_path))
    return [*options, *extra, app]


server_kinds.register("daphne", daphne_args, single_process=True)
