"""What starting and reaping a child process needs from any thread of a server, gevent's hub threadpool
included: the functions gevent's monkey-patching leaves alone (:func:`original`), the descriptors a child is
started with and without (:func:`above_stdio`, :func:`inherited`), the flags its pipes are polled for
(:func:`select_flag`), how much its pipes hold (:func:`widen`), how it ended (:func:`ended`); and what it is
fed: a batch of identities, framed (:func:`frames`). For :mod:`tlsreload_plugins.validation.child`, which
starts the child that validates identities.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from tlsreload_plugins.files import Password, Snapshot, password_bytes

__all__ = ["above_stdio", "ended", "frames", "inherited", "original", "select_flag", "widen"]

GROUP_BYTES = 1 << 20
"""The bytes of identities one header of :func:`frames` describes (closed after the identity that passes this):
few headers and writes for a batch, while a group of large files is not copied whole into one more buffer."""


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


def widen(fd: int, size: int) -> None:
    """Ask that the pipe ``fd`` is an end of hold ``size`` bytes (Linux: ``F_SETPIPE_SZ``). Elsewhere, or past
    ``/proc/sys/fs/pipe-max-size`` or the user's pipe quota, it keeps the size it has: the conversation is the
    same, its writer only wakes more often."""
    import fcntl

    setting = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setting is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setting, size)


def ended(status: int) -> str:
    """How a child ended, from its ``waitpid`` status: ``killed by SIGKILL``, ``exit status 1``."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(number).name}"
        return f"killed by signal {number}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def frames(items: Sequence[tuple[Snapshot, Password]], path: list[str]) -> Iterator[bytes]:
    """What the child validating ``items`` reads: ``path`` (the parent's ``sys.path``) as a JSON line, then per
    group of identities (:data:`GROUP_BYTES`) one JSON line, ``{"paths": [...], "sizes": [...], "faults":
    [...]}`` (four paths per identity; the sizes of its certificate, key, CA bundle, CRL and password bytes, five
    per identity, null for none; per identity the error its password raised, ``[type name, message]``, or
    null), followed by those bytes, end to end. Built as the child takes it, a group at a time.

    Example: ``b"".join(frames([(read_files(files), None)], sys.path))``.
    """
    yield json.dumps({"path": path}).encode() + b"\n"
    secrets: dict[int, tuple[bytes | None, list[str] | None]] = {}  # by password: SNI identities share one
    paths: list[str | None] = []
    sizes: list[int | None] = []
    faults: list[list[str] | None] = []
    blobs: list[bytes] = []
    length = 0
    for snapshot, password in items:
        known = secrets.get(id(password))
        if known is None:
            try:
                known = secrets[id(password)] = (password_bytes(password), None)
            except Exception as e:  # raised again in the child, where validate asks for the password
                known = secrets[id(password)] = (None, [type(e).__name__, str(e)])
        secret, fault = known
        files, parts = snapshot.files, snapshot.parts
        paths += (files.certfile, files.keyfile, files.ca_certs, files.crl)
        sizes += (*(None if part is None else len(part) for part in parts), None if secret is None else len(secret))
        faults.append(fault)
        blobs += (*(part or b"" for part in parts), secret or b"")
        length += sum(len(part or b"") for part in parts)
        if length >= GROUP_BYTES:
            yield _group(paths, sizes, faults, blobs)
            paths, sizes, faults, blobs, length = [], [], [], [], 0
    if faults:
        yield _group(paths, sizes, faults, blobs)


def _group(
    paths: list[str | None], sizes: list[int | None], faults: list[list[str] | None], blobs: list[bytes]
) -> bytes:
    header = json.dumps({"paths": paths, "sizes": sizes, "faults": faults}, separators=(",", ":"))
    return b"".join([header.encode(), b"\n", *blobs])
