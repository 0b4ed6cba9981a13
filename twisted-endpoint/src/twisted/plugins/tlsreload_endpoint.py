"""Twisted's plugin for the ``tlsreload:`` endpoint (``ssl:`` plus live certificate reload), shipped by the
tlsreload-twisted-endpoint distribution (which ``tlsreload-plugins[twisted]`` installs) into Twisted's
``twisted/plugins`` directory (Twisted collects plugin modules from every such directory on ``sys.path``).

Twisted imports this module whenever it looks for endpoint plugins, so it imports nothing beyond what
Twisted has loaded already: tlsreload itself is imported when a ``tlsreload:`` endpoint is asked for.
See ``tlsreload_plugins.servers.twisted``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IStreamServerEndpointStringParser
from twisted.plugin import IPlugin
from zope.interface import implementer  # type: ignore[import-untyped, unused-ignore]


@implementer(IPlugin, IStreamServerEndpointStringParser)
class _TLSReloadServerParser:
    prefix = "tlsreload"

    def parseStreamServer(self, reactor: Any, *args: str, **kwargs: str) -> Any:
        from tlsreload_plugins.servers.twisted import reloading_endpoint

        return reloading_endpoint(reactor, *args, **kwargs)


tlsreloadServerParser = _TLSReloadServerParser()
