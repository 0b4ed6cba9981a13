"""The gRPC glue's documented import path: the module itself is :mod:`tlsreload_plugins.servers.grpc`.

This name is the same module object (not a copy), so its functions and registry are shared. Inside the
package, ``import grpc`` still means grpcio: imports are absolute (only ``from . import grpc`` names this).
"""

import sys

from tlsreload_plugins.servers import grpc as _glue
from tlsreload_plugins.servers.grpc import *  # noqa: F403 - the glue's public names, for type checkers

sys.modules[__name__] = _glue
