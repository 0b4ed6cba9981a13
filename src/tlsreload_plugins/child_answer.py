"""The one line a helper child process answers its parent with, on its standard output: :func:`say`, :func:`answer`.

The package's helper children (a SPIFFE source, a server's reader of the files) start, do what they must before
the parent may go on (the first SVID, the first publication), and say so, or why not, as one JSON object on one
line. The parent waits for it without a thread (``select``), until a deadline.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import IO, Any

__all__ = ["LINE_BYTES", "answer", "say"]

LINE_BYTES = 64 * 1024
"""The most the parent reads of the line (a few hundred bytes: paths, a version, or a sentence)."""


def answer(stream: IO[bytes] | None, deadline: float) -> dict[str, Any] | None:
    """The first line of ``stream`` as a JSON object, read until ``deadline`` (``time.monotonic()``); ``None`` when
    none came in time, the stream ended first, or it is not one.

    Example: ``answer(process.stdout, time.monotonic() + 30)``.
    """
    if stream is None:
        return None
    data = b""
    while b"\n" not in data and len(data) < LINE_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            return None
        chunk = os.read(stream.fileno(), LINE_BYTES)
        if not chunk:
            return None
        data += chunk
    try:
        parsed = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def say(what: dict[str, Any]) -> None:
    """Write ``what`` as the child's one line to its parent (standard output, flushed).

    Example: ``say({"error": "no SVID in time"})``.
    """
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()
