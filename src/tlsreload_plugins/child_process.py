"""What starting and reaping a child process needs from any thread of a server, gevent's hub threadpool
included: the functions gevent's monkey-patching leaves alone (:func:`original`), the descriptors a child is
started with and without (:func:`above_stdio`, :func:`inherited`), the flags its pipes are polled for
(:func:`select_flag`), and how it ended (:func:`ended`). For :mod:`tlsreload_plugins.validate_child`, which
starts the child that validates identities.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from typing import Any

__all__ = ["above_stdio", "ended", "inherited", "original", "select_flag"]


def original(module: str, name: str) -> Any:
    """``module.name`` as it was before gevent's monkey-patching, if any."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(importlib.import_module(module), name)


def above_stdio(fd: int) -> int:
    """``fd``, or a copy of it numbered above 2 (the original closed) when it is 0, 1 or 2."""
    # A pipe end numbered 0-2 (a daemon with its standard streams closed) would be dup2-ed onto itself, keep its
    # close-on-exec flag, and be closed in the child.
    if fd > 2:
        return fd
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    original("os", "close")(fd)
    return high


def inherited() -> list[int]:
    """This process's descriptors a child would inherit (above 2): closed in the child, which needs only its three
    pipes (a server's listening sockets stay the server's). Linux only (elsewhere a close of a descriptor closed
    meanwhile would fail the spawn)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    inherited = []
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            if int(name) > 2 and os.get_inheritable(int(name)):
                inherited.append(int(name))
    return inherited


def select_flag(name: str) -> int:
    """The :mod:`select` constant ``name`` (``"POLLIN"``, ``"POLLOUT"``)."""
    import select

    flag: int = getattr(select, name)
    return flag


def ended(status: int) -> str:
    """How a child ended, from its ``waitpid`` status: ``killed by SIGKILL``, ``exit status 1``."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(number).name}"
        return f"killed by signal {number}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
