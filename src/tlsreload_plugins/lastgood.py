"""The last good identity, kept in memory so that a process that starts while the files on disk are
broken serves it instead of nothing.

A server's processes come and go (gunicorn's ``max_requests``, HUP, a crashed or killed worker,
uvicorn's supervisor replacing a child). A new process reads the files like the first one did;
if they are broken at that moment it has nothing to serve, although its siblings were serving a
good certificate a moment before. :class:`LastGood` keeps the newest identity a server put in
service in a :class:`Store` its processes share, and builds a context from it when the files
cannot be used:

* :class:`SharedStore` for servers that ``fork()`` their workers (gunicorn): an anonymous shared
  memory mapping created before the first fork. Every worker writes what it starts serving; every
  new worker reads it. Nothing touches the disk.
* :class:`CopyStore` for servers that start workers with ``spawn`` (uvicorn's ``--workers``): a
  plain holder pickled into each new child with its configuration; the parent keeps it current.

A context is built from the bytes through the server's own recipe, given paths to in-memory files
(``memfd_create``, read as ``/proc/self/fd/N``). Where memfd is missing, the files go to a private
directory (0700, files 0600) and are removed as soon as the context is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import shutil
import signal
import ssl
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, TypeVar

from .identity import (
    MAX_FILE_BYTES,
    InvalidIdentity,
    Leaf,
    Password,
    ReloadError,
    Snapshot,
    TLSFiles,
    fingerprint,
    judge_period,
    read_files,
    validate,
)

log = logging.getLogger("tlsreload_plugins.lastgood")

RecipeFor = Callable[[TLSFiles], ssl.SSLContext]
Stop = Callable[[], bool]
T = TypeVar("T")
"""Builds the server's context exactly as it does from its configured files, but from ``files``."""


class Store(Protocol):
    """Where the processes of one server keep the newest identity any of them served."""

    def write(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (already validated and being served)."""

    def read(self) -> tuple[bytes, bytes | None, bytes | None] | None:
        """The newest ``(cert, key, ca)`` kept, or ``None``."""


class CopyStore:
    """A holder that travels by copy: pickled into each new process with the server's configuration."""

    def __init__(self) -> None:
        self.parts: tuple[bytes, bytes | None, bytes | None] | None = None

    def write(self, snapshot: Snapshot) -> None:
        self.parts = (snapshot.cert, snapshot.key, snapshot.ca)

    def read(self) -> tuple[bytes, bytes | None, bytes | None] | None:
        return self.parts


_HEADER = struct.Struct("<Q3q32s")  # generation, three lengths (-1: no such file), sha256 of the payload
_SLOT_BYTES = _HEADER.size + 3 * MAX_FILE_BYTES


class SharedStore:
    """An anonymous ``MAP_SHARED`` mapping: created in a parent before ``fork()``, shared by all its children.

    Two slots, written alternately, each with a generation number and a digest of its payload: a
    writer killed halfway, or two writing at once, leave a slot whose digest does not match, and
    the reader takes the other one. Readers validate what they read anyway. Pages are only used
    once written (a chain and key take a few KiB).
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 2 * _SLOT_BYTES, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_ANONYMOUS", 0x20))

    def _slot(self, index: int) -> tuple[int, tuple[bytes, bytes | None, bytes | None]] | None:
        base = index * _SLOT_BYTES
        generation, *lengths, digest = _HEADER.unpack_from(self._map, base)
        if generation == 0 or any(n > MAX_FILE_BYTES for n in lengths):
            return None
        start = base + _HEADER.size
        payload = self._map[start : start + sum(max(n, 0) for n in lengths)]
        if hashlib.sha256(payload).digest() != digest:
            return None
        parts: list[bytes | None] = []
        for n in lengths:
            parts.append(None if n < 0 else payload[:n])
            payload = payload[max(n, 0) :]
        cert, key, ca = parts
        return (generation, (cert, key, ca)) if cert is not None else None

    def read(self) -> tuple[bytes, bytes | None, bytes | None] | None:
        slots = [slot for slot in (self._slot(0), self._slot(1)) if slot is not None]
        return max(slots, key=lambda slot: slot[0])[1] if slots else None

    def write(self, snapshot: Snapshot) -> None:
        parts = (snapshot.cert, snapshot.key, snapshot.ca)
        if self.read() == parts:
            return
        generations = [_HEADER.unpack_from(self._map, i * _SLOT_BYTES)[0] for i in (0, 1)]
        index = 0 if generations[0] <= generations[1] else 1  # overwrite the older slot
        payload = b"".join(part or b"" for part in parts)
        lengths = [-1 if part is None else len(part) for part in parts]
        base = index * _SLOT_BYTES
        _HEADER.pack_into(self._map, base, 0, *lengths, b"")  # invalid while being written
        self._map[base + _HEADER.size : base + _HEADER.size + len(payload)] = payload
        digest = hashlib.sha256(payload).digest()
        _HEADER.pack_into(self._map, base, max(generations) + 1, *lengths, digest)


@contextlib.contextmanager
def in_memory_files(cert: bytes, key: bytes | None, ca: bytes | None) -> Iterator[TLSFiles]:
    """Paths that read as ``cert``, ``key`` and ``ca`` for the ``with`` block, in memory where the
    system allows it (memfd), else in a private directory removed at the end of the block."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:

            def path(name: str, data: bytes | None) -> str | None:
                if data is None:
                    return None
                fd = os.memfd_create(f"tlsreload-{name}", getattr(os, "MFD_CLOEXEC", 1))
                fds.append(fd)
                os.write(fd, data)
                return f"/proc/self/fd/{fd}"

            yield TLSFiles(path("cert", cert) or "", path("key", key), path("ca", ca))
        finally:
            for fd in fds:
                os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="tlsreload-")  # 0700
    try:

        def write(name: str, data: bytes | None) -> str | None:
            if data is None:
                return None
            target = os.path.join(directory, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return target

        yield TLSFiles(write("cert.pem", cert) or "", write("key.pem", key), write("ca.pem", ca))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class LastGood:
    """The newest identity a server served, and how to build a context from it.

    Attributes:
        store: where the identity is kept (:class:`SharedStore`, :class:`CopyStore`).
        recipe_for: the server's recipe, aimed at other paths.
    """

    store: Store
    recipe_for: RecipeFor

    def remember(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` as the newest served identity."""
        self.store.write(snapshot)

    def recall(self, files: TLSFiles, password: Password, now: float) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
        """Validate the kept identity again, judge its dates at ``now``, and build a context from it.

        The snapshot returned carries the configured ``files`` (its bytes are the kept ones), so a
        reloader compares what is on disk with what it serves as usual.

        Raises:
            InvalidIdentity: nothing is kept, or what is kept is no longer usable (expired, say).
        """
        parts = self.store.read()
        if parts is None:
            raise InvalidIdentity("no certificate was served by this server before")
        snapshot = Snapshot(files, *parts)
        leaf = validate(snapshot, password)
        try:
            judge_period(leaf, files, datetime.fromtimestamp(now, timezone.utc))
        except InvalidIdentity:
            raise InvalidIdentity(
                f"the last good certificate (serial {leaf.serial}) is outside its validity period "
                f"({leaf.not_before.isoformat()} to {leaf.not_after.isoformat()})"
            ) from None
        with in_memory_files(*parts) as paths:
            try:
                context = self.recipe_for(paths)
            except Exception as e:
                raise InvalidIdentity(f"the last good certificate could not be loaded: {type(e).__name__}: {e}") from e
        return snapshot, leaf, context


def keep_newest_valid(files: TLSFiles, password: Password, store: Store, interval: float) -> threading.Thread:
    """Keep ``store`` holding the newest valid identity at ``files``, checked every ``interval`` seconds
    in a daemon thread; returns the thread.

    For the parent of a server that starts its workers with ``spawn`` (uvicorn's ``--workers``,
    hypercorn's): each child it starts later gets a pickled copy of the store. A thread is safe in
    such a parent: its children start as fresh interpreters, not as a bare ``fork()`` of it.
    """

    def keep() -> None:
        seen = ""  # the content judged last; not set for a pair refused for its dates only, which time changes
        while True:
            time.sleep(interval)
            try:
                snapshot = read_files(files)
                current = fingerprint(snapshot)
                if current == seen:
                    continue
                try:
                    leaf = validate(snapshot, password)
                except InvalidIdentity:
                    seen = current  # unusable content is not parsed again on every check
                    continue
                judge_period(leaf, files, datetime.now(timezone.utc))
            except Exception:  # the serving processes report what is wrong; nothing is served here
                continue
            store.write(snapshot)
            seen = current
            log.debug("processes started from now on get serial %s if the files are unusable then", leaf.serial)

    thread = threading.Thread(target=keep, name="tlsreload-last-good", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def stop_signals_noted(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)) -> Iterator[Stop]:
    """Note a stop request while a process waits for usable files, before the server's own signal
    handlers can act on one (an event loop that does not run yet, a flag nobody reads); yields a
    function that tells whether one arrived. The handlers only set a flag: a lock taken in a signal
    handler (``threading.Event.set``) may be the one the interrupted code holds."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: requested.append(signum)) for sig in signals}
    try:
        yield lambda: bool(requested)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def retry_until_usable(
    attempt: Callable[[], T], *, every: float, stop: Stop, between: Callable[[], object] = lambda: None
) -> T | None:
    """Call ``attempt`` every ``every`` seconds until it returns (its result) or ``stop()`` is true
    (``None``); a :class:`~tlsreload_plugins.ReloadError` from it means "not yet". ``between`` runs
    before each wait (a gunicorn worker tells its arbiter it is alive)."""
    while True:
        between()
        time.sleep(every)
        if stop():
            return None
        try:
            return attempt()
        except ReloadError:
            continue
