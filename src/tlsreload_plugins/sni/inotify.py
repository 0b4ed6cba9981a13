"""The kernel's change notifications on directories (Linux inotify), through ``ctypes`` on libc.

What the SNI identities' change tracker (:mod:`tlsreload_plugins.sni.tracker`) uses to look only at the
identities whose files changed, instead of reading every identity on every check. Nothing here decides anything: a
:class:`DirectoryEvents` watches directories and hands back which of them saw an event since it was
last asked. It never blocks (the descriptor is non-blocking) and starts no thread.

Where inotify is missing (macOS, a libc without it) :func:`open_events` returns ``None``, and the
callers check everything on every tick. Only ``ENOSPC`` (``fs.inotify.max_user_watches``
reached) makes :meth:`DirectoryEvents.watch` raise :class:`WatchesExhausted`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import sys
from dataclasses import dataclass, field

log: logging.Logger = logging.getLogger("tlsreload_plugins.inotify")

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

CHANGES = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
"""Every event that can change what a directory's files read as: a write in place (``IN_MODIFY``,
``IN_CLOSE_WRITE``), a mode change (``IN_ATTRIB``), kubelet's ``..data`` rename and certbot's relink
(``IN_MOVED_TO``, ``IN_CREATE``), removals, and the directory itself going away."""

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event), then len bytes of name
_BUFFER = 64 * 1024


class WatchesExhausted(Exception):
    """The kernel refuses more watches (``ENOSPC``: ``fs.inotify.max_user_watches`` reached)."""


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


@dataclass
class DirectoryEvents:
    """One inotify instance and the directories it watches (by path; one watch per directory inode).

    Attributes:
        fd: the inotify descriptor (non-blocking, close-on-exec).
        pid: the process that opened it: a forked child must open its own (:func:`open_events`), or
            the two would read each other's events.
    """

    fd: int
    libc: ctypes.CDLL
    pid: int = field(default_factory=os.getpid)
    # Watch descriptor -> the directories watched through it (tuples: thousands of them, most of one path).
    _paths: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _watch: dict[str, int] = field(default_factory=dict)  # directory -> watch descriptor

    def watch(self, directory: str, again: bool = False) -> bool:
        """Watch ``directory`` for :data:`CHANGES`; ``False`` when it cannot be watched (gone, not a
        directory, no permission). Watching it again changes nothing, unless ``again``: then the watch
        follows what the path names now (a link repointed since, such as kubelet's ``..data``).

        Raises:
            WatchesExhausted: the kernel's limit of watches is reached.
        """
        known = self._watch.get(directory)
        if known is not None and not again:
            return True
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(directory), CHANGES | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSPC:
                raise WatchesExhausted(f"inotify watch limit reached at {len(self._watch)} directories")
            if known is not None:
                self.unwatch(directory)
            return False
        if known is not None and known != wd:
            self.unwatch(directory)
        self._watch[directory] = wd
        paths = self._paths.get(wd, ())
        if directory not in paths:
            self._paths[wd] = (*paths, directory)
        return True

    def unwatch(self, directory: str) -> None:
        """Stop watching ``directory`` (the watch stays while another watched path names the same inode)."""
        wd = self._watch.pop(directory, None)
        if wd is None:
            return
        paths = tuple(path for path in self._paths.get(wd, ()) if path != directory)
        if paths:
            self._paths[wd] = paths
        elif self._paths.pop(wd, None) is not None:
            self.libc.inotify_rm_watch(self.fd, wd)

    def watched(self) -> int:
        """How many directories are watched."""
        return len(self._watch)

    def is_watched(self, directory: str) -> bool:
        """Whether ``directory`` is watched (a directory removed since is not, once its events are read)."""
        return directory in self._watch

    def changed(self) -> tuple[set[str], set[str], bool]:
        """Drain the events that arrived since the last call, without waiting.

        Returns:
            The directories that saw an event, the ``directory/name`` entries named by those events
            (a subdirectory created in a watched directory, say), and whether the kernel's queue
            overflowed (events were lost: everything must be looked at).
        """
        directories: set[str] = set()
        entries: set[str] = set()
        overflow = False
        while True:
            try:
                data = os.read(self.fd, _BUFFER)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                log.debug("reading inotify events failed: %s", e)
                overflow = True
                break
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + length].split(b"\0", 1)[0]
                at += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                    continue
                paths = self._paths.get(wd, ())
                directories.update(paths)
                if name:
                    entries.update(os.path.join(path, os.fsdecode(name)) for path in paths)
                if mask & IN_IGNORED:  # the directory is gone (or unwatched): the kernel dropped the watch
                    for path in self._paths.pop(wd, ()):
                        self._watch.pop(path, None)
        return directories, entries, overflow

    def close(self) -> None:
        """Close the descriptor (only in the process that opened it)."""
        if self.pid == os.getpid():
            os.close(self.fd)
        self._paths.clear()
        self._watch.clear()


def open_events() -> DirectoryEvents | None:
    """A new inotify instance, or ``None`` where the system has none (or refuses one more instance:
    ``fs.inotify.max_user_instances``)."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        log.debug("inotify_init1 failed: %s", os.strerror(ctypes.get_errno()))
        return None
    return DirectoryEvents(fd, libc)
