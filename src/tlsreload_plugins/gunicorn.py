"""The gunicorn glue's documented import path: the module itself is :mod:`tlsreload_plugins.servers.gunicorn`.

This name is the same module object (not a copy), so its functions and settings are shared.
"""

import sys

from tlsreload_plugins.servers import gunicorn as _glue
from tlsreload_plugins.servers.gunicorn import *  # noqa: F403 - the glue's public names, for type checkers
from tlsreload_plugins.servers.gunicorn import add_reload as add_reload  # deprecated: reloading

sys.modules[__name__] = _glue
