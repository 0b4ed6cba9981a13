"""How a :class:`~tlsreload_plugins.lastgood.SharedStore` reaches a process multiprocessing starts (uvicorn's
``--workers``, hypercorn's workers, which get the store with the configuration the server pickles for them):
on Linux its memfd (and the pipe to its keeper) is passed as a file descriptor, as the server's listening
sockets are, so the parent and the child share one table (:func:`_attached`); elsewhere the child gets a copy
of the table as it was (:func:`_copied`). (Importable from :mod:`tlsreload_plugins.lastgood.store` too, where these
were first defined.)
"""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Protocol

from tlsreload_plugins.lastgood.keeper import _PASSES
from tlsreload_plugins.lastgood.table import decode

if TYPE_CHECKING:
    from tlsreload_plugins.lastgood.store import SharedStore


class _Descriptor(Protocol):
    """What multiprocessing hands a child for a file descriptor it passed along (``DupFd``)."""

    def detach(self) -> int: ...


def _for_process_being_started(*fds: int | None) -> tuple[_Descriptor | None, ...] | None:
    """``fds`` wrapped to be passed to the process multiprocessing is starting now (it pickles that
    process's arguments, a server's configuration among them), or ``None`` when it is starting none."""
    try:
        from multiprocessing import context, reduction

        if context.get_spawning_popen() is None:
            return None
        return tuple(None if fd is None else reduction.DupFd(fd) for fd in fds)
    except (ImportError, AttributeError):  # multiprocessing changed: the child gets a copy (see keep_newest_valid)
        return None


def shared_with_spawned_processes() -> str | None:
    """``None`` when a :class:`~tlsreload_plugins.lastgood.SharedStore` pickled for a process multiprocessing starts
    (uvicorn's and hypercorn's workers) is shared with it, live; otherwise why the process gets a copy."""
    if not hasattr(os, "memfd_create"):
        return "this system has no memfd_create"
    try:
        from multiprocessing import context, reduction
    except ImportError as e:
        return f"multiprocessing cannot be imported: {e}"
    for module, name in ((context, "get_spawning_popen"), (reduction, "DupFd")):
        if not callable(getattr(module, name, None)):
            return f"multiprocessing.{module.__name__.rpartition('.')[2]}.{name} is missing in this Python"
    return None


def _attached(mapping: _Descriptor, asks: _Descriptor | None, region_bytes: int) -> SharedStore:
    """The :class:`~tlsreload_plugins.lastgood.SharedStore` a spawned process shares with its parent, from the
    descriptors passed."""
    from tlsreload_plugins.lastgood.store import _HEADER, SharedStore  # store.py imports this module

    store = SharedStore.__new__(SharedStore)
    store._region = _HEADER.size + region_bytes
    store._fd = store._lock_fd = mapping.detach()
    store._map = mmap.mmap(store._fd, _PASSES.size + 2 * store._region, flags=mmap.MAP_SHARED)
    store._asks = asks.detach() if asks is not None else None
    store._start_in_process()
    return store


def _copied(payload: bytes, region_bytes: int) -> SharedStore:
    """A :class:`~tlsreload_plugins.lastgood.SharedStore` of this process only, holding the table ``payload`` (see
    :func:`~tlsreload_plugins.lastgood.table.encode`)."""
    from tlsreload_plugins.lastgood.store import DEFAULT, SharedStore  # store.py imports this module

    store = SharedStore(region_bytes)
    table = decode(payload)
    if table:
        store._change(DEFAULT, lambda kept, refused: kept.update(table))
    return store
