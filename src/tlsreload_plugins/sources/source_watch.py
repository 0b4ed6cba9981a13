"""A serving process watching the SPIFFE source whose files it serves: :class:`SourceWatch`.

The source runs in another process (:mod:`tlsreload_plugins.sources.source_process`) and writes its figures beside
the SVID's files (:mod:`tlsreload_plugins.sources.stream_status`). If that process goes away (killed, crashed), the
files stay as they were and nothing else would tell: the serving processes would go on serving the last SVID in
silence until it expired. Each serving process's checks read the figures, and the first check that finds their
writer gone says so, once, at ERROR: no new SVID will come, the last one serves until it expires.
"""

from __future__ import annotations

import logging
from typing import Any

from tlsreload_plugins.drivers import gevent_offload
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.sources.stream_status import StreamFigures, figures_path, read_figures, source_gone

__all__ = ["SourceWatch", "figures_now", "watching"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sources.source_watch")


class SourceWatch:
    """An ``on_check`` callback for a reloader serving a SPIFFE source's files: said once when the source is gone.

    Example: ``reloader.add_callbacks(on_check=SourceWatch(path))``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.gone: StreamFigures | None = None
        """The figures of the source found gone (``None`` while it runs)."""

    def __call__(self, outcome: Outcome, status: Status) -> None:
        if self.gone is not None:
            return
        figures = figures_now(self.path)
        if figures is not None and source_gone(figures):
            self.gone = figures
            log.error(
                "the SPIFFE source (process %d, following the Workload API at %s) has gone: no new SVID will be "
                "served until the server is restarted (gunicorn: or sent HUP); the last one, %s, serves until it "
                "expires",
                figures.pid,
                figures.endpoint,
                figures.spiffe_id,
            )


def figures_now(path: str) -> StreamFigures | None:
    """The source's figures at ``path``, read from a check (:func:`~.stream_status.read_figures`): under gevent a
    check runs on the hub, so the read goes to its pool of native threads (a read on the hub stalls every
    connection of the worker)."""
    offload: Any = gevent_offload()
    return read_figures(path) if offload is None else offload(lambda: read_figures(path))


def watching(certfile: str) -> SourceWatch | None:
    """A watch for the source whose files ``certfile`` is one of; ``None`` for files of no SPIFFE source."""
    path = figures_path(certfile)
    return SourceWatch(path) if path is not None else None
