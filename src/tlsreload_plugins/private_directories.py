"""Private directories of key material named for the process that owns them, and the sweep that removes those whose
owner died without removing them: :func:`private_directory`, :func:`sweep`.

A directory holding private keys is removed by its owner's ``close`` or exit handler; a process killed with SIGKILL
runs neither, and on a memory filesystem (``/dev/shm``) its keys then stay, readable by its user, until reboot. So
each directory's name carries its owner: the pid namespace, the pid and the process's start time
(``tlsreload-pushed-4026531836.4242.98765-k2j1x``). The next process that makes one in the same place removes those
whose owner is gone: one of its own user, in its own pid namespace (a pid of another namespace means nothing here,
and its owner may well be alive), whose pid no longer runs, or runs a process that started at another time (a pid
reused after its owner died).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile

__all__ = ["MEMORY_FILESYSTEMS", "memory_directory", "owner", "owner_alive", "private_directory", "sweep"]

log: logging.Logger = logging.getLogger("tlsreload_plugins")

PREFIX = "tlsreload-"
_OWNED = re.compile(r"^tlsreload-[a-z]+-(\d+)\.(\d+)\.(\d+)-")


def _namespace() -> int:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), 0 where the system has none to show."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat``'s 22nd field); ``None`` where no
    such process is seen or the system has no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def owner(pid: int | None = None) -> str:
    """The owner part of a private directory's name for process ``pid`` (this one by default):
    ``NAMESPACE.PID.START``.

    Example: ``owner()`` -> ``"4026531836.4242.98765"``.
    """
    pid = os.getpid() if pid is None else pid
    return f"{_namespace()}.{pid}.{_started(pid) or 0}"


def owner_alive(named: str) -> bool:
    """Whether the process :func:`owner` named ``named`` (``NAMESPACE.PID.START``) still runs: not when its pid is
    gone, reused by a process that started at another time, or a zombie its parent has not reaped yet (what cannot
    be told counts as alive). Quick: one read of ``/proc``.

    Example: ``owner_alive(owner())`` is ``True``.
    """
    try:
        namespace, pid, started = (int(part) for part in named.split("."))
    except ValueError:
        return False
    if not _alive(namespace, pid, started):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _alive(namespace: int, pid: int, started: int) -> bool:
    """Whether the owner a directory's name records may still run (what cannot be told counts as alive)."""
    if namespace != _namespace():
        return True  # another pid namespace's pid: not ours to judge
    now = _started(pid)
    if now is not None:
        return started == 0 or now == started
    if os.path.isdir("/proc/self"):
        return False  # /proc shows every process of this namespace: none has that pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(parent: str) -> list[str]:
    """Remove the private directories in ``parent`` whose owner died without removing them (this user's, of this
    pid namespace); one WARNING line says how many and where.

    Args:
        parent: where private directories are made (``/dev/shm``, the temporary directory).

    Returns:
        The directories removed.

    Example: ``sweep("/dev/shm")``.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        named = _OWNED.match(entry.name)
        if named is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if _alive(int(named[1]), int(named[2]), int(named[3])):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    if removed:
        log.warning(
            "removed %d private director%s of key material in %s left by processes that died without removing "
            "them (killed with SIGKILL?): %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            parent,
            ", ".join(os.path.basename(path) for path in removed),
        )
    return removed


def private_directory(kind: str, parent: str | None = None) -> str:
    """A new directory only this user can enter (0700), named for this process, in ``parent``, after removing what
    dead owners left there (:func:`sweep`).

    Args:
        kind: what it holds, a lowercase word (``pushed``, ``watch``, ``memory``).
        parent: where to make it (default: the system's temporary directory).

    Returns:
        Its path. Its owner removes it (a process killed with SIGKILL leaves it to the next :func:`sweep`).

    Raises:
        OSError: it cannot be made.
        ValueError: ``kind`` is not a lowercase word.

    Example: ``directory = private_directory("pushed", "/dev/shm")``.
    """
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"kind must be a lowercase word, not {kind!r}")
    parent = parent if parent is not None else tempfile.gettempdir()
    sweep(parent)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{owner()}-", dir=parent)


MEMORY_FILESYSTEMS = ("/dev/shm",)
"""Where a directory of key material is made first: memory, never written to a disk."""


def memory_directory() -> tuple[str | None, bool]:
    """Where to make a private directory of key material: ``/dev/shm``, else ``$XDG_RUNTIME_DIR``, when writable.

    Returns:
        The directory and ``True``; else ``(None, False)``: the system's temporary directory, which may be on disk.

    Example: ``parent, in_memory = memory_directory()``.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    for candidate in (*MEMORY_FILESYSTEMS, *((runtime,) if runtime else ())):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate, True
    return None, False
