"""The Sanic glue's documented import path: the module itself is :mod:`tlsreload_plugins.servers.sanic`.

This name is the same module object (not a copy), so its settings and reloaders are shared. Absolute
imports: this module's name is also the server's.
"""

import sys

from tlsreload_plugins.servers import sanic as _glue
from tlsreload_plugins.servers.sanic import *  # noqa: F403 - the glue's public names, for type checkers
from tlsreload_plugins.servers.sanic import reload_certificates as reload_certificates  # deprecated: reloading

sys.modules[__name__] = _glue
