"""How a start reads files that may be in the middle of a rotation: :func:`retry_at_start`.

certbot relinks its files one at a time, and kubelet's swap may land between two reads: a process that starts at that
moment must not fail. Used by every glue's start (:mod:`tlsreload_plugins.serving.start`) and by the reader
(:mod:`tlsreload_plugins.publication.reader`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tlsreload_plugins.errors import ReloadError

__all__ = ["BOOT_ATTEMPTS", "RETRY_DELAY", "retry_at_start"]

T = TypeVar("T")

BOOT_ATTEMPTS = 3
RETRY_DELAY = 0.5
"""Unusable files at start are read BOOT_ATTEMPTS times, RETRY_DELAY seconds apart, before giving
up: a process that starts in the middle of a rotation (certbot relinks its files one at a time) must
not fail. A worker waiting for usable files reads them every RETRY_DELAY seconds too (independent of
the interval, which may be longer than a server's worker timeout)."""


def retry_at_start(attempt: Callable[[], T]) -> T:
    """``attempt()``, tried :data:`BOOT_ATTEMPTS` times :data:`RETRY_DELAY` apart while it raises a
    :class:`~tlsreload_plugins.ReloadError`; the last error passes through."""
    for remaining in reversed(range(BOOT_ATTEMPTS)):
        try:
            return attempt()
        except ReloadError:
            if not remaining:
                raise
            time.sleep(RETRY_DELAY)
    raise AssertionError("unreachable")
