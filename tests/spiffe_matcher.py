"""A SPIFFE ID matcher for the tests' servers (``TLSRELOAD_SPIFFE_AUTHORIZE=spiffe_matcher:allows``): it accepts the
IDs listed in the file named by ``$SPIFFE_MATCHER_ALLOWED``, read again at every call, so that a test that takes an
ID out of the set (a rename into place) changes what every worker accepts from its next handshake on: what an
operator's own matcher over a changing policy does. (A real matcher keeps its policy in memory: it runs in the
handshake. Reading a tiny file here keeps the test free of a race between workers taking a change at different
moments.)
"""

from __future__ import annotations

import os

ALLOWED_ENV = "SPIFFE_MATCHER_ALLOWED"


def allows(spiffe_id: str) -> bool:
    """Whether ``spiffe_id`` is listed in the file (a missing file lists nothing)."""
    try:
        with open(os.environ[ALLOWED_ENV]) as f:
            return spiffe_id in f.read().split()
    except OSError:
        return False
