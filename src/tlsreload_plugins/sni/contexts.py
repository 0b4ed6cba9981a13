"""The SNI identities' contexts, built on the first handshake that names an identity and kept for the
identities asked for most recently, at most :data:`CONTEXTS` of them.

A context with its certificate and key loaded takes memory and time to build, in every worker, and most
identities are asked for rarely or never (docs/sni.md has the figures). An identity's files are validated
(``cryptography``) when it is found and on every change; its context is built (OpenSSL, the server's own
recipe, from the bytes validated) when a handshake names it, inside the ClientHello callback, or by a reload
of its files, off the event loop (kept as if just asked for: a renewed identity's next handshake builds
nothing). A second handshake naming it meanwhile waits for that build (:attr:`Reloader.newest_context
<tlsreload_plugins.Reloader.newest_context>`): it never gets another identity's certificate. Memory stays
flat however many names clients ask for: the contexts of the identities asked for least recently are
dropped, and built again when asked for.

A context OpenSSL refuses to build from content ``cryptography`` accepted (a key weaker than the
server's security level allows, say) leaves that identity's names to the default identity, with one
WARNING, until its files change.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections import OrderedDict

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.reloader import Reloader

log: logging.Logger = logging.getLogger("tlsreload_plugins.sni")

CONTEXTS = 1000
"""Contexts kept at most: those of the identities handshakes named most recently."""


class ContextCache:
    """The built contexts of at most ``capacity`` on-demand reloaders, least recently asked dropped first.

    Thread-safe; :meth:`get` runs inside OpenSSL's ClientHello callback and never raises.
    """

    def __init__(self, capacity: int = CONTEXTS) -> None:
        if capacity < 1:
            raise ValueError(f"at least one context must be kept, not {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()  # held for a few dictionary operations, never during a build
        self._recent: OrderedDict[Reloader, None] = OrderedDict()
        self._refused: dict[Reloader, tuple[str, str]] = {}  # reloader -> (leaf sha256, why) of a failed build

    def get(self, reloader: Reloader) -> ssl.SSLContext | None:
        """``reloader``'s newest context, built now if need be; ``None`` when it cannot be built (its
        names then get the default identity)."""
        refused = self._refused.get(reloader)
        if refused is not None and refused[0] == reloader.leaf.sha256:
            return None
        try:
            context = reloader.newest_context
        except (InvalidIdentity, TypeError) as e:
            self._refuse(reloader, str(e))
            return None
        except Exception as e:  # a recipe's own bug: never out of a ClientHello callback
            self._refuse(reloader, f"{type(e).__name__}: {e}")
            return None
        self.keep(reloader)
        return context

    def keep(self, reloader: Reloader) -> None:
        """Count ``reloader``'s context among those kept, as the one asked for most recently: one a handshake
        just got, or one its reload just built off the event loop (the next handshake naming it need not build
        it). The least recently asked beyond :attr:`capacity` are dropped."""
        evicted: list[Reloader] = []
        with self._lock:
            recent = self._recent
            if reloader in recent:
                recent.move_to_end(reloader)
            else:
                recent[reloader] = None
                while len(recent) > self.capacity:
                    evicted.append(recent.popitem(last=False)[0])
        for old in evicted:
            old.release_context()

    def _refuse(self, reloader: Reloader, why: str) -> None:
        self._refused[reloader] = (reloader.leaf.sha256, why)
        log.warning(
            "SNI identity %s not served (its names get the default certificate): %s",
            os.path.basename(os.path.dirname(reloader.files.certfile)),
            why,
        )

    def refused(self) -> dict[Reloader, str]:
        """The reloaders whose served content could not be built, with why (while that content is served)."""
        return {reloader: why for reloader, (sha, why) in list(self._refused.items()) if sha == reloader.leaf.sha256}

    def forget(self, reloader: Reloader) -> None:
        """Stop counting ``reloader`` (an identity removed). Its context is left to it, and goes when it goes:
        a handshake that looked the identity up just before its removal still gets that context."""
        with self._lock:
            self._recent.pop(reloader, None)
        self._refused.pop(reloader, None)

    def __len__(self) -> int:
        """How many contexts are kept."""
        return len(self._recent)
