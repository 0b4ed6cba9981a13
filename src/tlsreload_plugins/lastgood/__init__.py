"""The last good identity, kept across a server's processes: a worker that starts while the files are broken
serves the newest identity its server served.

:class:`LastGood` is one identity's view of a :class:`SharedStore`, a table in shared memory (a memfd) that forked
workers inherit and spawned workers receive; :mod:`.table` is its byte format, :mod:`.memory_files` the in-memory
files a context is built from.
"""

from tlsreload_plugins.lastgood.last_good import LastGood, keep_all_valid
from tlsreload_plugins.lastgood.store import SharedStore

__all__ = ["LastGood", "SharedStore", "keep_all_valid"]
