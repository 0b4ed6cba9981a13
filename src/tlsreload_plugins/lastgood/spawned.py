"""File descriptors passed to a process multiprocessing starts (uvicorn's ``--workers``, hypercorn's workers), as
the server's listening sockets are: how a :class:`~tlsreload_plugins.lastgood.SharedStore` pickled with a
server's configuration shares its memfd, and the pipe to its keeper, with the process it is pickled for
(:func:`for_process_being_started`), and whether this system and this Python can do so
(:func:`shared_with_spawned_processes`).
"""

from __future__ import annotations

import os
from typing import Protocol


class Descriptor(Protocol):
    """What multiprocessing hands a child for a file descriptor it passed along (``DupFd``)."""

    def detach(self) -> int: ...


def for_process_being_started(*fds: int | None) -> tuple[Descriptor | None, ...] | None:
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
