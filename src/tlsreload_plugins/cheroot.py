"""The cheroot and CherryPy glue's documented import path: the module is :mod:`tlsreload_plugins.servers.cheroot`.

This name is the same module object (not a copy). Importing it registers ``server.ssl_module 'tlsreload'``
for CherryPy. Absolute imports: this module's name is also the server's.
"""

import sys

from tlsreload_plugins.servers import cheroot as _glue
from tlsreload_plugins.servers.cheroot import *  # noqa: F403 - the glue's public names, for type checkers

sys.modules[__name__] = _glue
