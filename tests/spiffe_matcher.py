"""A SPIFFE ID matcher for the tests' servers (``TLSRELOAD_SPIFFE_AUTHORIZE=spiffe_matcher:allows``): it accepts the
IDs listed in the file named by ``$SPIFFE_MATCHER_ALLOWED``, which a thread of each serving process reads again every
0.05 s (a handshake reads nothing but the first in its process), so that a test can take an ID out of the accepted
set while the server runs: what an operator's own matcher over a changing policy does.
"""

from __future__ import annotations

import os
import threading
import time

ALLOWED_ENV = "SPIFFE_MATCHER_ALLOWED"
EVERY = 0.05

_allowed: frozenset[str] = frozenset()
_follower_pid: int | None = None
_lock = threading.Lock()


def _read() -> None:
    global _allowed
    try:
        with open(os.environ[ALLOWED_ENV]) as f:
            _allowed = frozenset(f.read().split())
    except OSError:
        _allowed = frozenset()


def _follow() -> None:
    while True:
        time.sleep(EVERY)
        _read()


def allows(spiffe_id: str) -> bool:
    """Whether ``spiffe_id`` is in the file's set (a forked worker starts its own follower at its first call)."""
    global _follower_pid
    if _follower_pid != os.getpid():
        with _lock:
            if _follower_pid != os.getpid():
                _read()
                threading.Thread(target=_follow, name="spiffe-matcher", daemon=True).start()
                _follower_pid = os.getpid()
    return spiffe_id in _allowed
