"""A SPIFFE source in a process of its own: :class:`SourceProcess`, for the process that starts a server's workers.

gunicorn's arbiter forks its workers: a thread running in it at a ``fork()`` (a :class:`SpiffeSource`'s, and gRPC's
own) is a lock that may be held in the child, and Python 3.12 warns about it. So the drop-ins do not follow the
Workload API in the process that starts the workers: they start this module as a child process
(``python -m tlsreload_plugins.sources.source_process``), which runs the :class:`SpiffeSource`, writes the SVID's
files as any source does, and says on its standard output, once, where they are (or why it could not). The parent
runs no thread: it waits for that one line on a pipe.

The child leaves with its parent: it looks every :data:`PARENT_POLL` seconds whether its parent is still the one that
started it, and on SIGTERM or SIGINT; either way it closes the source, which removes the files. Killed with SIGKILL,
it leaves them to the sweep of the next source made in the same place
(:mod:`tlsreload_plugins.private_directories`). Its log lines go to the parent's standard error.

A source process that has gone (killed, crashed) is seen by the serving processes, which read its figures at their
checks (:func:`~tlsreload_plugins.sources.stream_status.source_gone`): one ERROR line each, and the stream's metrics
say it is not connected. The last SVID keeps serving until it expires; gunicorn's HUP starts a new source process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection
from types import TracebackType

from tlsreload_plugins.child_answer import answer, say
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.sources.spiffe import FIRST_SVID_TIMEOUT, NoSVID, SpiffeSource

__all__ = ["PARENT_POLL", "SourceProcess", "SourceProcessFailed", "main"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sources.source_process")

PARENT_POLL = 0.5
"""Seconds between the child's looks at whether its parent is still there."""

START_MARGIN = 15.0
"""Seconds the parent waits for the child's line beyond the first SVID's timeout (an interpreter starting, grpcio
imported, on a loaded machine)."""

STOP_WAIT = 5.0
"""Seconds :meth:`SourceProcess.close` gives the child to close its source before killing it."""


class SourceProcessFailed(RuntimeError):
    """The source process could not start serving: no SVID in time, no grpcio, a bad address; ``str()`` is why."""


class SourceProcess:
    """A :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource` run in a child process; :attr:`files` are its files.

    Starts at once and returns when the first SVID is written (or raises).

    Args:
        endpoint: the Workload API's address (``""``: ``$SPIFFE_ENDPOINT_SOCKET``'s).
        spiffe_id: the SVID to serve (default: the Workload API's first).
        federation: federated trust domains whose bundles are trusted too (``True``: all).
        timeout: seconds to wait for the first SVID (default the source's).

    Raises:
        SourceProcessFailed: the child said why it could not serve, or said nothing in time (it is stopped).

    Example::

        with SourceProcess("unix:///run/spire/agent.sock") as source:
            serve(certfile=source.files.certfile, keyfile=source.files.keyfile, ca_certs=source.files.ca_certs)
    """

    def __init__(
        self,
        endpoint: str,
        *,
        spiffe_id: str | None = None,
        federation: bool | Collection[str] = False,
        timeout: float | None = None,
    ) -> None:
        settings = {
            "endpoint": endpoint,
            "spiffe_id": spiffe_id,
            "federation": federation if isinstance(federation, bool) else sorted(federation),
            "timeout": timeout,
        }
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tlsreload_plugins.sources.source_process", json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        self.pid: int = self._process.pid
        deadline = time.monotonic() + (FIRST_SVID_TIMEOUT if timeout is None else timeout) + START_MARGIN
        said = answer(self._process.stdout, deadline)
        if said is None or "certfile" not in said:
            self.close()
            reason = said.get("error") if said else None
            raise SourceProcessFailed(str(reason or f"the source process {self.pid} said nothing in time"))
        self.files: TLSFiles = TLSFiles(str(said["certfile"]), said.get("keyfile"), said.get("ca_certs"))

    def alive(self) -> bool:
        """Whether the child still runs (a server that reaps every child, as gunicorn's arbiter does, makes it
        look gone once it has exited, as it is)."""
        return self._process.poll() is None

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after :data:`STOP_WAIT` s): it closes its source, which removes
        the files. Idempotent."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> SourceProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


# -- the child ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The child: run the source until SIGTERM, SIGINT or the parent's end; exit 3 when it cannot serve."""
    settings = json.loads((sys.argv[1:] if argv is None else argv)[0])
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        source = SpiffeSource(
            settings["endpoint"] or None,
            spiffe_id=settings["spiffe_id"],
            federation=settings["federation"],
            timeout=settings["timeout"],
        )
    except (ValueError, ImportError, NoSVID) as e:
        say({"error": str(e)})
        return 3
    with source:
        files = source.files
        say({"certfile": files.certfile, "keyfile": files.keyfile, "ca_certs": files.ca_certs})
        while not stop.wait(PARENT_POLL) and os.getppid() == parent:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
