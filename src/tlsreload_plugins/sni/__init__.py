"""Several identities in one server, chosen by the server name a client asks for (SNI).

:class:`SNIIdentities` serves the identities found in directories (:mod:`.discovery`), each reloaded on its own,
routed by :mod:`.table`, its contexts built on first use (:mod:`.contexts`), changes noticed by inotify
(:mod:`.tracker`) behind a periodic sweep. :func:`for_reloader` finds the identities a reloader routes to.
"""

from tlsreload_plugins.sni.discovery import resolve_directories
from tlsreload_plugins.sni.identities import SNIIdentities, for_reloader

__all__ = ["SNIIdentities", "for_reloader", "resolve_directories"]
