"""What the SNI identities of a server serve, and how a handshake, :meth:`status` and the summary read it:
the identities served, by name; the routing table, replaced whole on every change (never mutated: a
handshake sees the old table or the new one); the contexts built on demand. :class:`ServedIdentities` is
:class:`~tlsreload_plugins.sni.SNIIdentities`' base class, as :mod:`tlsreload_plugins.served` is
:class:`~tlsreload_plugins.Reloader`'s; the checks that change what is served are :mod:`.identities`'s.
"""

from __future__ import annotations

import ssl

from tlsreload_plugins.outcome import Status
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.sni.contexts import ContextCache
from tlsreload_plugins.sni.summary import Summary, summarize
from tlsreload_plugins.sni.table import lookup, routing_table


class ServedIdentities:
    """The identities served by name, the routing table of their server names, the contexts built, and
    the identities found but not served (by name: why)."""

    def __init__(self) -> None:
        self._identities: dict[str, Reloader] = {}
        self._table: dict[str, Reloader] = {}
        self._contexts = ContextCache()
        self._unserved: dict[str, str] = {}
        self._conflicts_logged: set[tuple[str, str, str]] = set()

    # -- the lookup (inside OpenSSL's ClientHello callback) ----------------------------------

    def context_for(self, server_name: str | None) -> ssl.SSLContext | None:
        """The newest context of the identity serving ``server_name``, or ``None`` when no SNI
        identity does (the default identity's, then). What Go's ``GetCertificate`` returns: a
        dispatcher of your own can delegate to it. Constant time; never raises."""
        reloader = self.reloader_for(server_name)
        # Built on the first handshake that names it (a concurrent one waits for that build), kept among
        # the contexts of the identities asked for most recently (sni_contexts).
        return None if reloader is None else self._contexts.get(reloader)

    def reloader_for(self, server_name: str | None) -> Reloader | None:
        """The :class:`~tlsreload_plugins.Reloader` of the identity serving ``server_name``, or ``None``."""
        return lookup(self._table, server_name)

    # -- reading state -------------------------------------------------------------------------

    def reloaders(self) -> dict[str, Reloader]:
        """The identities served, by name."""
        return dict(self._identities)

    def status(self) -> dict[str, Status]:
        """Each served identity's :class:`~tlsreload_plugins.Status`, by name."""
        return {name: reloader.status() for name, reloader in self._identities.items()}

    def unserved(self) -> dict[str, str]:
        """Identities found but not served (their files were never usable, or OpenSSL refused what
        ``cryptography`` accepted), by name: why."""
        refused = self._contexts.refused()
        named = {name: refused[reloader] for name, reloader in self._identities.items() if reloader in refused}
        return {**self._unserved, **named}

    def summary(self) -> Summary:
        """How many identities there are, how many are served and refused (and why), how many contexts are
        built, which certificate expires first: what to read at 10,000 identities rather than :meth:`status`."""
        leaves = {name: reloader.leaf for name, reloader in self._identities.items()}
        unserved = self.unserved()
        return summarize(leaves, unserved, len(leaves) + len(unserved.keys() - leaves.keys()), len(self._contexts))

    def names(self) -> dict[str, str]:
        """The routing table: each server name (or ``*.`` wildcard) and the identity that answers it."""
        by_reloader = {id(reloader): name for name, reloader in self._identities.items()}
        return {host: by_reloader.get(id(reloader), "?") for host, reloader in self._table.items()}

    def _rebuild(self) -> None:
        # One reference swap: a handshake sees the old table or the new one.
        self._table = routing_table(self._identities, self._conflicts_logged)
