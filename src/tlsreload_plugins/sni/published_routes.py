"""SNI in a serving process of a server with a reader: :class:`PublishedRoutes`, the server's names looked up in the
publication when a handshake asks, at the cost of one identity.

The reader judges every SNI identity and publishes those that passed in the publication's index
(:mod:`tlsreload_plugins.publication.index`). A serving process holds no object per identity: a handshake's server
name is looked up there (exact, then the one-label wildcard), and the context is built from the published bytes
through the server's recipe, with the default identity's client-CA bundle and CRLs, then kept among the
:data:`~tlsreload_plugins.sni.contexts.CONTEXTS` asked for most recently. Building a context for a name not kept is
the only work a ClientHello does. Each check of the default identity looks whether the reader committed since
(``PRAGMA data_version``) and drops the contexts of identities that changed or left; a new client-CA bundle or CRL
drops them all (a new trust, new session caches).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections import OrderedDict
from typing import Any

from tlsreload_plugins.atomic_swap import current_version
from tlsreload_plugins.drivers import gevent_offload
from tlsreload_plugins.memory_files import RecipeFor, check_revocation_of, in_memory_files
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.publication.index import IndexReader
from tlsreload_plugins.publication.published import NAMES
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.sni.contexts import CONTEXTS

__all__ = ["PublishedRoutes"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sni")


class PublishedRoutes:
    """The SNI identities a reader published in ``directory``, served through ``recipe_for``.

    Hand :meth:`route` to :meth:`Reloader.set_route <tlsreload_plugins.Reloader.set_route>` and :meth:`refresh`
    to its ``on_check`` callbacks (:meth:`attach` does both).

    Example: ``PublishedRoutes(publication, recipe_for).attach(reloader)``.
    """

    def __init__(self, directory: str, recipe_for: RecipeFor, capacity: int = CONTEXTS) -> None:
        self.directory = directory
        self.recipe_for = recipe_for
        self.capacity = capacity
        self._index = IndexReader(directory)
        self._lock = threading.Lock()  # a few dictionary operations, never a build nor a query
        self._kept: OrderedDict[str, tuple[str, ssl.SSLContext]] = OrderedDict()  # name: fingerprint, context
        self._trust: tuple[str | None, bytes | None, bytes | None] = (None, None, None)  # version, CA, CRLs
        self._seen: int | None = None
        self._refused: set[str] = set()  # fingerprints OpenSSL refused to build (said once each)
        self._refresh()

    def attach(self, reloader: Reloader) -> PublishedRoutes:
        """Route ``reloader``'s handshakes and refresh at its checks; returns this."""
        reloader.set_route(self.route)
        reloader.add_callbacks(on_check=self.refresh)
        return self

    def route(self, server_name: str | None) -> ssl.SSLContext | None:
        """The context of the identity published for ``server_name``; ``None``: the default identity's. Runs inside
        OpenSSL's ClientHello callback: never raises."""
        if not server_name:
            return None
        try:
            found = self._index.lookup(server_name)
            if found is None:
                return None
            name, observed, cert, key = found
            with self._lock:
                kept = self._kept.get(name)
                if kept is not None and kept[0] == observed:
                    self._kept.move_to_end(name)
                    return kept[1]
            if observed in self._refused:
                return None
            context = self._build(cert, key)
            if context is None:
                self._refused.add(observed)
                return None
            with self._lock:
                self._kept[name] = (observed, context)
                self._kept.move_to_end(name)
                while len(self._kept) > self.capacity:
                    self._kept.popitem(last=False)
            return context
        except Exception:  # a handshake never fails for this: the default identity answers
            log.debug("SNI lookup of %r failed", server_name, exc_info=True)
            return None

    def _build(self, cert: bytes, key: bytes | None) -> ssl.SSLContext | None:
        _, ca, crl = self._trust
        try:
            with in_memory_files(cert, key, ca, crl) as paths:
                context = self.recipe_for(paths)
            if crl is not None:
                check_revocation_of(context, crl)
            return context
        except Exception as e:
            log.warning(
                "an SNI identity's published certificate could not be loaded (%s): its names get the default", e
            )
            return None

    def refresh(self, outcome: Outcome | None = None, status: Status | None = None) -> None:
        """Drop the contexts of identities the reader changed or removed since the last look, all of them when the
        default identity's client-CA bundle or CRLs changed. Blocking (small reads): a check's thread; under gevent,
        where a check's callbacks run on the hub, the reads go to its pool of native threads."""
        offload: Any = gevent_offload()
        if offload is None:
            self._refresh()
        else:
            offload(self._refresh)

    def _refresh(self) -> None:
        version = current_version(self.directory)
        if version is not None and version != self._trust[0]:
            ca, crl = self._read_trust(version)
            if current_version(self.directory) == version:  # else read mid-publication: at the next check
                if (ca, crl) != self._trust[1:]:
                    with self._lock:
                        self._kept.clear()
                self._trust = (version, ca, crl)
        seen = self._index.data_version()
        if seen == self._seen:
            return
        self._seen = seen
        with self._lock:
            kept = {name: observed for name, (observed, _) in self._kept.items()}
        current = self._index.fingerprints(kept)
        with self._lock:
            for name, observed in kept.items():
                if current.get(name) != observed:
                    self._kept.pop(name, None)

    def _read_trust(self, version: str) -> tuple[bytes | None, bytes | None]:
        """The client-CA bundle and CRLs of the default identity's ``version`` (``None``: it has none)."""
        root = os.path.join(self.directory, version)
        parts: list[bytes | None] = []
        for name in NAMES[2:]:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    parts.append(f.read())
            except OSError:  # none; or the version removed meanwhile, which the caller sees
                parts.append(None)
        return parts[0], parts[1]

    def __len__(self) -> int:
        """How many contexts are kept."""
        return len(self._kept)
