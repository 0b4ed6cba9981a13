"""A gunicorn worker class deriving from aiohttp's that builds its TLS context elsewhere (no
``_create_ssl_context``): what the drop-in's guard on aiohttp's private builder must refuse at start."""

from __future__ import annotations

from aiohttp.worker import GunicornWebWorker


class WithoutContextBuilder(GunicornWebWorker):  # type: ignore[misc]
    _create_ssl_context = None
