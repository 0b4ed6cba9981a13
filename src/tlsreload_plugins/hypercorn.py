"""The hypercorn glue's documented import path: the module itself is :mod:`tlsreload_plugins.servers.hypercorn`.

This name is the same module object (not a copy), so its functions and settings are shared.
"""

import sys

from tlsreload_plugins.servers import hypercorn as _glue
from tlsreload_plugins.servers.hypercorn import *  # noqa: F403 - the glue's public names, for type checkers

if __name__ == "__main__":
    _glue.main()
else:
    sys.modules[__name__] = _glue
