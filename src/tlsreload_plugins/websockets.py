"""The websockets glue's documented import path: the module itself is :mod:`tlsreload_plugins.servers.websockets`.

This name is the same module object (not a copy), so its functions and state are shared. The glue is imported
by its absolute name: this file is named like the ``websockets`` package, and an absolute name says which is meant.
"""

import sys

import tlsreload_plugins.servers.websockets as _glue
from tlsreload_plugins.servers.websockets import *  # noqa: F403 - the glue's public names, for type checkers
from tlsreload_plugins.servers.websockets import reloading_ssl as reloading_ssl  # deprecated: reloading

sys.modules[__name__] = _glue
