"""What a SPIFFE source's stream did, for the server's other processes: :class:`StreamFigures`.

The source runs in one process (gunicorn's arbiter, uvicorn's supervisor) and the workers only read its files. Its
figures reach them the same way: a small JSON file, :data:`STATUS_NAME`, in the source's private directory next to
the ``..data`` swap, replaced atomically (written beside it, then renamed) whenever a figure changes
(:func:`write_figures`); the workers' metrics read it at each check (:func:`figures_path`, :func:`read_figures`).
A file that is missing, unreadable or malformed is no figures, never an error: it stops nothing.

Imports neither grpc nor prometheus_client: the source writes, :mod:`tlsreload_plugins.metrics` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from tlsreload_plugins.expiry import SPIFFE_DIRECTORY
from tlsreload_plugins.frozen import FrozenRecord

__all__ = [
    "MAX_STATUS_BYTES",
    "STATUS_NAME",
    "StreamFigures",
    "figures_path",
    "read_figures",
    "source_gone",
    "write_figures",
]

STATUS_NAME = "stream.json"
"""The figures' file, in a SPIFFE source's private directory (beside ``tls.crt``, ``tls.key`` and ``ca.crt``)."""

MAX_STATUS_BYTES = 64 * 1024
"""The most read of a figures file: a larger one is malformed (the source writes a few hundred bytes)."""

_INTS = ("updates", "drops", "reconnects", "refused", "pid")


class StreamFigures(FrozenRecord):
    """A SPIFFE source's figures at one moment (a record: workers import it where metrics are on).

    Fields:
        endpoint: the Workload API's address, as given (``unix:///run/spire/agent.sock``).
        connected: whether the stream is open.
        spiffe_id: the SPIFFE ID served (``None`` before the first SVID written).
        updates: updates written into the files.
        drops: times the stream went away after it had been open.
        reconnects: times it was open again after a drop.
        refused: messages not written (malformed, no SVID, none with the SPIFFE ID asked for, files not written).
        not_after: when the SVID last written expires, Unix time (``None``: its DER does not say).
        written: when the figures were written, Unix time.
        pid: the process that runs the source (and writes the figures): :func:`source_gone` looks at it.

    Example: ``StreamFigures("unix:///run/spire/agent.sock", True, "spiffe://example.org/web", 1, 0, 0, 0,
    1767225600.0, time.time(), os.getpid())``.
    """

    _fields = (
        "endpoint",
        "connected",
        "spiffe_id",
        "updates",
        "drops",
        "reconnects",
        "refused",
        "not_after",
        "written",
        "pid",
    )
    __slots__ = _fields
    endpoint: str
    connected: bool
    spiffe_id: str | None
    updates: int
    drops: int
    reconnects: int
    refused: int
    not_after: float | None
    written: float
    pid: int

    def __init__(
        self,
        endpoint: str,
        connected: bool,
        spiffe_id: str | None,
        updates: int,
        drops: int,
        reconnects: int,
        refused: int,
        not_after: float | None,
        written: float,
        pid: int,
    ) -> None:
        self._set(endpoint, connected, spiffe_id, updates, drops, reconnects, refused, not_after, written, pid)


def figures_path(certfile: str) -> str | None:
    """Where the figures of the SPIFFE source whose files ``certfile`` is one of are; ``None`` when ``certfile``
    is not in a SPIFFE source's directory (``tlsreload-spiffe-...``).

    Example: ``figures_path(source.files.certfile)`` -> ``"/dev/shm/tlsreload-spiffe-.../stream.json"``.
    """
    directory = os.path.dirname(certfile)
    if not (os.sep + os.path.basename(directory)).startswith(SPIFFE_DIRECTORY):
        return None
    return os.path.join(directory, STATUS_NAME)


def write_figures(directory: str, figures: StreamFigures) -> None:
    """Make ``figures`` what :data:`STATUS_NAME` in ``directory`` holds, at once: a reader sees the old file or the
    new, never half of one. Blocking (file writes): the source's thread calls it.

    Raises:
        OSError: the file could not be written (the directory removed, a full filesystem).

    Example: ``write_figures(source.pushed.directory, figures)``.
    """
    data = json.dumps(figures._asdict(), separators=(",", ":")).encode()
    path = os.path.join(directory, STATUS_NAME)
    staged = os.path.join(directory, f".{STATUS_NAME}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(staged, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def read_figures(path: str) -> StreamFigures | None:
    """The figures at ``path`` (:func:`figures_path`); ``None`` when the file is missing, unreadable, larger than
    :data:`MAX_STATUS_BYTES` or not figures. Never raises. Blocking (a file read): not on an event loop.

    Example: ``figures = read_figures(path)``; ``figures.drops if figures else None``.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATUS_BYTES + 1)
        if len(data) > MAX_STATUS_BYTES:
            return None
        return _figures(json.loads(data))
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        return None


def _figures(fields: Any) -> StreamFigures | None:
    """``fields`` (decoded JSON) as figures, if each field has its type."""
    if not isinstance(fields, dict) or set(fields) != set(StreamFigures._fields):
        return None
    counts = [fields[name] for name in _INTS]
    numbers = [fields["written"], *([] if fields["not_after"] is None else [fields["not_after"]])]
    if (
        not isinstance(fields["endpoint"], str)
        or not isinstance(fields["connected"], bool)
        or not (fields["spiffe_id"] is None or isinstance(fields["spiffe_id"], str))
        or not all(type(count) is int and count >= 0 for count in counts)
        or not all(isinstance(number, int | float) and not isinstance(number, bool) for number in numbers)
    ):
        return None
    return StreamFigures(
        fields["endpoint"],
        fields["connected"],
        fields["spiffe_id"],
        fields["updates"],
        fields["drops"],
        fields["reconnects"],
        fields["refused"],
        None if fields["not_after"] is None else float(fields["not_after"]),
        float(fields["written"]),
        fields["pid"],
    )


def source_gone(figures: StreamFigures) -> bool:
    """Whether the process that ran the source of ``figures`` has gone (killed, crashed): no new SVID will come.
    Quick (a signal 0, no I/O).

    Example: ``source_gone(figures)`` is ``False`` while the source runs.
    """
    if figures.pid <= 0:
        return True
    try:
        os.kill(figures.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process by that number: not ours, but alive
        return False
    return False
