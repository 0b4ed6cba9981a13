"""Several files replaced as one: kubelet's atomic writer, for directories of key material this package writes.

Each version is a new directory (``..N``) holding every file; one rename of the ``..data`` symlink makes it the
current one, and the stable names (``tls.crt`` -> ``..data/tls.crt``) follow it. A reader that opens the stable
names, or resolves ``..data`` once and reads inside the version it names, never sees half a write. Files are
private (0600) from their creation. Used by :class:`~tlsreload_plugins.sources.pushed.PushedIdentity` and by the
reader's publication (:mod:`tlsreload_plugins.publication.published`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping

__all__ = ["DATA_LINK", "current_version", "swap_in", "write_private"]

DATA_LINK = "..data"
"""The symlink whose one rename swaps every file at once (kubelet's name for it)."""


def swap_in(directory: str, version: str, parts: Mapping[str, bytes | None]) -> None:
    """Write ``parts`` (file name: bytes; ``None``: no such file) into ``directory/version``, then point ``..data``
    at it with one rename and give each file its stable name; the previous version is removed.

    Args:
        directory: a private directory this process writes (0700).
        version: the new version's name, beginning with ``..`` (hidden, as kubelet's) and new in ``directory``.
        parts: the files of the version.

    Raises:
        OSError: a write failed (the current version is left as it was).

    Example: ``swap_in(directory, "..2", {"tls.crt": cert, "tls.key": key, "ca.crt": None})``.
    """
    target = os.path.join(directory, version)
    os.mkdir(target, 0o700)
    for name, data in parts.items():
        if data is not None:
            write_private(os.path.join(target, name), data)
    link = os.path.join(directory, DATA_LINK)
    old = current_version(directory)
    staged = os.path.join(directory, f"{DATA_LINK}_tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staged)
    os.symlink(version, staged)
    os.rename(staged, link)
    for name, data in parts.items():
        path = os.path.join(directory, name)
        if data is not None and not os.path.islink(path):
            os.symlink(os.path.join(DATA_LINK, name), path)
    if old is not None and old != version:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


def current_version(directory: str) -> str | None:
    """The name of the version ``..data`` points at in ``directory`` (one ``readlink``); ``None`` when there is none
    (nothing swapped in yet, or the directory is gone)."""
    try:
        return os.readlink(os.path.join(directory, DATA_LINK))
    except OSError:
        return None


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to a new file only its owner can read (0600 from its creation, never wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
