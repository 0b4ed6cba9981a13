"""The last good identity, kept in memory so that a process that starts while the files on disk are
broken serves it instead of nothing.

A server's processes come and go (gunicorn's ``max_requests``, HUP, a crashed or killed worker,
uvicorn's supervisor replacing a child). A new process reads the files like the first one did;
if they are broken at that moment it has nothing to serve, although its siblings were serving a
good certificate a moment before. :class:`LastGood` keeps the newest identity a server put in
service in a :class:`SharedStore`, memory all its processes share, and builds a context from it
when the files cannot be used. The store keeps one identity per name: the configured one
(:data:`DEFAULT`) and each SNI identity (:mod:`tlsreload_plugins.sni`) under its own name, each
with the leaf its validation found. Nothing touches the disk.

* Servers that ``fork()`` their workers (gunicorn) create the store before the first fork. Every
  worker writes what it starts serving; every new worker reads it.
* Servers that start workers with ``spawn`` (uvicorn's ``--workers``, hypercorn) pass the store to
  each child with its configuration (on Linux, as a memfd). Their parent validates the files too
  (:func:`keep_newest_valid`), so a worker takes the parent's verdict on new content instead of
  loading ``cryptography`` to parse it.

A context is built from the bytes through the server's own recipe, given paths to in-memory files
(``memfd_create``, read as ``/proc/self/fd/N``). Where memfd is missing, the files go to a private
directory (0700, files 0600) and are removed as soon as the context is built.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import select
import shutil
import signal
import ssl
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, TypeVar

from .identity import (
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


Parts = tuple[bytes, "bytes | None", "bytes | None"]
"""An identity as kept: the bytes of its certificate, key and client-CA files (``None``: no such file)."""

DEFAULT = ""
"""The name the configured identity (certfile and keyfile) is kept under. SNI identities are kept under
their own names (their directories' names), which are never empty."""


Kept = tuple[Parts, "Leaf | None"]
"""An identity as kept, with the leaf its validation found (``None``: kept without it)."""

_PASSES = struct.Struct("<QQ")  # the keeper's passes: how many it began, the number of the last one it completed
_HEADER = struct.Struct("<QQ32s")  # generation, payload length, sha256 of the payload
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<4i")  # indices of an identity's cert, key, CA and leaf among the table's blobs (-1: none)

REGION_BYTES = 16 * 1024 * 1024
"""Room for the table of kept identities in a :class:`SharedStore`: the configured identity and
thousands of SNI identities (a few KiB each; a client-CA bundle shared by all of them is kept once).
Only the pages written are ever used."""

LOCK_WAIT = 2.0
"""Seconds a write waits for another process's write to end before giving up (it logs why)."""

ASK_WAIT = 1.0
"""Seconds a worker waits for the keeper's verdict on new content (:meth:`SharedStore.ask`) before it
judges the content itself."""


def _leaf_bytes(leaf: Leaf | None) -> bytes | None:
    if leaf is None:
        return None
    fields = [leaf.subject, leaf.serial, list(leaf.sans), leaf.not_before.isoformat(), leaf.not_after.isoformat()]
    return json.dumps([*fields, leaf.sha256]).encode()


def _leaf_from(data: bytes) -> Leaf:
    try:
        subject, serial, sans, not_before, not_after, sha256 = json.loads(data)
        return Leaf(
            str(subject),
            str(serial),
            tuple(str(san) for san in sans),
            datetime.fromisoformat(not_before),
            datetime.fromisoformat(not_after),
            str(sha256),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"a leaf kept in a form this version does not read: {e}") from e


def encode(table: Mapping[str, Kept]) -> bytes:
    """The payload of a :class:`SharedStore` region: each distinct content once (file contents, leaves),
    then each identity's name and the indices of its contents (SNI identities share the client-CA bundle)."""
    blobs: dict[bytes, int] = {}
    entries: list[bytes] = []
    for name, (parts, leaf) in table.items():
        indices = [-1 if blob is None else blobs.setdefault(blob, len(blobs)) for blob in (*parts, _leaf_bytes(leaf))]
        label = name.encode()
        entries += [_COUNT.pack(len(label)), label, _ENTRY.pack(*indices)]
    out = [_COUNT.pack(len(blobs))]
    for blob in blobs:  # in index order: a dict keeps insertion order
        out += [_COUNT.pack(len(blob)), blob]
    return b"".join([*out, _COUNT.pack(len(table)), *entries])


def decode(payload: bytes) -> dict[str, Kept]:
    """The table :func:`encode` wrote. Raises ``ValueError`` on a payload it did not write."""
    view = memoryview(payload)
    at = 0

    def take(n: int) -> bytes:
        nonlocal at
        if n < 0 or at + n > len(view):
            raise ValueError("truncated table")
        at += n
        return bytes(view[at - n : at])

    def count() -> int:
        (n,) = _COUNT.unpack(take(_COUNT.size))
        return int(n)

    blobs = [take(count()) for _ in range(count())]
    table: dict[str, Kept] = {}
    for _ in range(count()):
        name = take(count()).decode()
        cert, key, ca, leaf = _ENTRY.unpack(take(_ENTRY.size))
        if cert < 0 or max(cert, key, ca, leaf) >= len(blobs):
            raise ValueError(f"identity {name!r} kept with contents the table does not hold")
        parts = (blobs[cert], None if key < 0 else blobs[key], None if ca < 0 else blobs[ca])
        table[name] = (parts, None if leaf < 0 else _leaf_from(blobs[leaf]))
    return table


def _named(name: str) -> str:
    return f"SNI identity {name}" if name else "the server"


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
    """``None`` when a :class:`SharedStore` pickled for a process multiprocessing starts (uvicorn's
    and hypercorn's workers) is shared with it, live; otherwise why the process gets a copy."""
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


class SharedStore:
    """The newest identity each name of one server served, with the leaf its validation found, in
    memory every process of the server shares.

    Created in the parent before it starts its workers. Forked workers (gunicorn) share the mapping
    they inherit. Spawned ones (uvicorn's ``--workers``, hypercorn) get the store with the
    configuration the server pickles for them: on Linux the mapping is a memfd, passed to each child
    as a file descriptor as the server's listening sockets are, so the parent and every child share
    one table; elsewhere a child gets a copy of the table as it was when the child started.

    It holds one table of identities, by name, in one of two regions written alternately, each with a
    generation number and a digest of its payload: a writer killed halfway leaves a region whose
    digest does not match, and readers take the other one (they validate what they read anyway).
    Writers take turns through a POSIX record lock, which the kernel releases when its holder dies,
    and never wait on it: they try again every millisecond, so a gevent hub is never blocked, and
    give up after :data:`LOCK_WAIT` seconds.

    A spawn server's parent keeps the table current (:func:`keep_newest_valid`); a worker that finds
    new content on disk asks it to look (:meth:`ask`), and takes its verdict instead of parsing the content
    itself, so the workers load no ``cryptography`` while the content on disk is valid.
    """

    def __init__(self, region_bytes: int = REGION_BYTES) -> None:
        self._region = _HEADER.size + region_bytes
        size = _PASSES.size + 2 * self._region
        self._fd: int | None = None
        if hasattr(os, "memfd_create"):
            self._fd = self._lock_fd = os.memfd_create("tlsreload-last-good", getattr(os, "MFD_CLOEXEC", 1))
            os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED)
        else:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_ANONYMOUS", 0x20))
            with tempfile.TemporaryFile() as lock_file:  # holds nothing: only locked
                self._lock_fd = os.dup(lock_file.fileno())
        self._asks: int | None = None  # where a worker asks the keeper to look (a pipe's write end)
        self._start_in_process()

    def _start_in_process(self) -> None:
        self._in_process = threading.Lock()  # POSIX record locks do not exclude threads of one process
        self._cached: tuple[int, int, dict[str, Kept]] = (-1, 0, {})  # region, generation, table
        self._full_logged: set[str] = set()

    def __reduce__(self) -> tuple[Callable[..., SharedStore], tuple[object, ...]]:
        passed = _for_process_being_started(self._fd, self._asks) if self._fd is not None else None
        if passed is not None:
            return _attached, (*passed, self._region - _HEADER.size)
        return _copied, (encode(self._table()), self._region - _HEADER.size)

    # -- the table ------------------------------------------------------------------------------

    def _base(self, index: int) -> int:
        return _PASSES.size + index * self._region

    def _generation(self, index: int) -> int:
        generation: int = _HEADER.unpack_from(self._map, self._base(index))[0]
        return generation

    def _table(self) -> dict[str, Kept]:
        """The newest intact table (empty when none is)."""
        for index in sorted((0, 1), key=self._generation, reverse=True):
            base = self._base(index)
            generation, length, digest = _HEADER.unpack_from(self._map, base)
            if generation == 0 or length > self._region - _HEADER.size:
                continue
            if self._cached[:2] == (index, generation):  # a region is rewritten only under a new generation
                return self._cached[2]
            payload = self._map[base + _HEADER.size : base + _HEADER.size + length]
            if hashlib.sha256(payload).digest() != digest or self._generation(index) != generation:
                continue  # torn, or being rewritten as it was read
            try:
                table = decode(payload)
            except ValueError:
                continue
            self._cached = (index, generation, table)
            return table
        return {}

    def read(self, name: str = DEFAULT) -> Parts | None:
        """The newest ``(cert, key, ca)`` kept for ``name``, or ``None``."""
        kept = self._table().get(name)
        return None if kept is None else kept[0]

    def verdict(self, name: str = DEFAULT) -> tuple[Parts, Leaf] | None:
        """The identity kept for ``name`` with the leaf its validation found, or ``None``."""
        kept = self._table().get(name)
        return None if kept is None or kept[1] is None else (kept[0], kept[1])

    def write(self, snapshot: Snapshot, name: str = DEFAULT, leaf: Leaf | None = None) -> None:
        """Keep ``snapshot`` (already validated and being served) as identity ``name``, with the
        ``leaf`` its validation found. Never raises."""
        parts = (snapshot.cert, snapshot.key, snapshot.ca)
        kept = self._table().get(name)
        if kept is None or kept[0] != parts or (leaf is not None and kept[1] != leaf):
            self._change(name, lambda table: table.__setitem__(name, (parts, leaf)))

    def forget(self, name: str) -> None:
        """Keep nothing for ``name`` any more (an SNI identity removed from its directory)."""
        if self.read(name) is not None:
            self._change(name, lambda table: table.pop(name, None))

    def _change(self, name: str, change: Callable[[dict[str, Kept]], object]) -> None:
        with self._exclusive() as locked:
            if not locked:
                log.warning("the last good certificate of %s is not kept: another process held the store", _named(name))
                return
            table = dict(self._table())
            change(table)
            payload = encode(table)
            if len(payload) > self._region - _HEADER.size:
                if name not in self._full_logged:
                    self._full_logged.add(name)
                    log.warning(
                        "the last good certificate of %s is not kept: the identities kept would take %d bytes, "
                        "more than the %d kept in memory",
                        _named(name),
                        len(payload),
                        self._region - _HEADER.size,
                    )
                return
            generations = [self._generation(i) for i in (0, 1)]
            index = 0 if generations[0] <= generations[1] else 1  # overwrite the older region
            base = self._base(index)
            _HEADER.pack_into(self._map, base, 0, len(payload), b"")  # invalid while being written
            self._map[base + _HEADER.size : base + _HEADER.size + len(payload)] = payload
            _HEADER.pack_into(self._map, base, max(generations) + 1, len(payload), hashlib.sha256(payload).digest())

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[bool]:
        """Hold the store's write lock for the block (``True``), or ``False`` after :data:`LOCK_WAIT` seconds."""
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            if self._in_process.acquire(blocking=False):
                try:
                    fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # another process is writing
                    self._in_process.release()
                else:
                    try:
                        yield True
                    finally:
                        fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)
                        self._in_process.release()
                    return
            if time.monotonic() > deadline:
                yield False
                return
            time.sleep(0.001)  # cooperative under gevent

    # -- the keeper -----------------------------------------------------------------------------

    def ask(self, wait: float = ASK_WAIT) -> bool:
        """Have the keeper (:func:`keep_newest_valid`, in a spawn server's parent) look at the files
        now, and wait until it has: ``True`` then; ``False`` at once when this store has no keeper
        (gunicorn's), or after ``wait`` seconds when the keeper does not answer. Blocking."""
        if self._asks is None:
            return False
        begun = self._passes()[0]
        try:
            os.write(self._asks, b"?")
        except BlockingIOError:
            pass  # the pipe is full of asks the keeper has yet to read: it will look
        except OSError:
            return False  # the keeper is gone
        deadline = time.monotonic() + wait
        while self._passes()[1] <= begun:  # until a pass that began after the ask has completed
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def _passes(self) -> tuple[int, int]:
        begun, completed = _PASSES.unpack_from(self._map, 0)
        return int(begun), int(completed)

    def keep(self) -> Keeper:
        """Make this process the store's keeper: the processes it starts from now on can :meth:`ask` it."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)  # shared with the children: a full pipe never blocks a worker
        self._asks = write_end
        return Keeper(self, read_end)


@dataclass(frozen=True)
class Keeper:
    """The keeper's side of a :class:`SharedStore`: it waits for asks, and numbers its passes."""

    store: SharedStore
    asks: int
    """The read end of the pipe workers ask through."""

    def wait(self, timeout: float) -> None:
        """Return when a worker asks, or after ``timeout`` seconds."""
        if select.select([self.asks], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(self.asks, 65536)

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """Number a look at every identity: a worker's :meth:`SharedStore.ask` waits for the end of one
        that began after it asked."""
        begun, completed = self.store._passes()
        _PASSES.pack_into(self.store._map, 0, begun + 1, completed)
        try:
            yield
        finally:
            _PASSES.pack_into(self.store._map, 0, begun + 1, begun + 1)


def _attached(mapping: _Descriptor, asks: _Descriptor | None, region_bytes: int) -> SharedStore:
    """The :class:`SharedStore` a spawned process shares with its parent, from the descriptors passed."""
    store = SharedStore.__new__(SharedStore)
    store._region = _HEADER.size + region_bytes
    store._fd = store._lock_fd = mapping.detach()
    store._map = mmap.mmap(store._fd, _PASSES.size + 2 * store._region, flags=mmap.MAP_SHARED)
    store._asks = asks.detach() if asks is not None else None
    store._start_in_process()
    return store


def _copied(payload: bytes, region_bytes: int) -> SharedStore:
    """A :class:`SharedStore` of this process only, holding the table ``payload`` (see :func:`encode`)."""
    store = SharedStore(region_bytes)
    table = decode(payload)
    if table:
        store._change(DEFAULT, lambda kept: kept.update(table))
    return store


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
    """The newest identity a server served under one name, and how to build a context from it.

    Attributes:
        store: where the identity is kept.
        recipe_for: the server's recipe, aimed at other paths.
        name: the name it is kept under: :data:`DEFAULT` for the configured identity, an SNI
            identity's name for that identity.
    """

    store: SharedStore
    recipe_for: RecipeFor
    name: str = DEFAULT

    def remember(self, snapshot: Snapshot, leaf: Leaf | None = None) -> None:
        """Keep ``snapshot`` as the newest served identity of :attr:`name`, ``leaf`` its validation's verdict."""
        self.store.write(snapshot, self.name, leaf)

    def judged(self, snapshot: Snapshot) -> Leaf | None:
        """The leaf a validation found for exactly the bytes of ``snapshot``, when the store keeps one for
        :attr:`name` (another process of the server validated them): no need to parse them again. When
        the store does not, and a keeper looks after it (a spawn server's parent), the keeper is asked to
        look first. ``None`` when nobody has found them valid. Blocking (up to :data:`ASK_WAIT`)."""
        parts = (snapshot.cert, snapshot.key, snapshot.ca)
        kept = self.store.verdict(self.name)
        if (kept is None or kept[0] != parts) and self.store.ask():
            kept = self.store.verdict(self.name)
        return kept[1] if kept is not None and kept[0] == parts else None

    def recall(self, files: TLSFiles, password: Password, now: float) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
        """Validate the kept identity again, judge its dates at ``now``, and build a context from it.

        The snapshot returned carries the configured ``files`` (its bytes are the kept ones), so a
        reloader compares what is on disk with what it serves as usual.

        Raises:
            InvalidIdentity: nothing is kept, or what is kept is no longer usable (expired, say).
        """
        parts = self.store.read(self.name)
        if parts is None:
            raise InvalidIdentity("no certificate was served by this server before")
        snapshot = Snapshot(files, *parts)
        leaf = self.judged(snapshot) or validate(snapshot, password)
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


def keep_newest_valid(
    identities: Callable[[], Mapping[str, TLSFiles]], password: Password, store: SharedStore, interval: float
) -> threading.Thread:
    """Keep ``store`` holding the newest valid identity of each name ``identities()`` gives (the
    configured identity under :data:`DEFAULT`, and every SNI identity found now), with the leaf
    each validation found: checked at once, then every ``interval`` seconds and whenever a worker
    :meth:`asks <SharedStore.ask>`, in a daemon thread; returns the thread. A name no longer given
    is forgotten.

    For the parent of a server that starts its workers with ``spawn`` (uvicorn's ``--workers``,
    hypercorn's), before it starts them: they share the store, and take the verdicts found here
    instead of loading ``cryptography`` to parse the files themselves. A thread is safe in such a
    parent: its children start as fresh interpreters, not as a bare ``fork()`` of it. Where the store
    cannot be shared with them (:func:`shared_with_spawned_processes`), one WARNING says so: each
    worker then gets a copy of the store when it starts, and judges new content itself.
    """
    why_not = shared_with_spawned_processes()
    if why_not is not None:
        log.warning(
            "workers get a copy of the last good certificate when they start, and validate new certificates "
            "themselves (about 5 MiB more each): %s",
            why_not,
        )
    keeper = store.keep()

    # The content judged last, by name; not set for a pair refused for its dates only, which time changes.
    seen: dict[str, str] = {}

    def keep_all() -> None:
        with keeper.one_pass():
            try:
                found = dict(identities())
            except Exception:  # an SNI directory gone: the serving processes report it
                found = {}
            for name in [name for name in seen if name not in found]:
                del seen[name]
                store.forget(name)
            for name, files in found.items():
                judged = _keep_if_valid(files, password, store, name, seen.get(name))
                if judged is not None:
                    seen[name] = judged

    def keep() -> None:
        while True:
            keeper.wait(interval)
            keep_all()

    keep_all()  # before the server starts its first processes: each gets every verdict
    thread = threading.Thread(target=keep, name="tlsreload-last-good", daemon=True)
    thread.start()
    return thread


def _keep_if_valid(files: TLSFiles, password: Password, store: SharedStore, name: str, seen: str | None) -> str | None:
    """Write the identity at ``files`` to ``store`` as ``name`` when it is new and valid; returns the
    fingerprint of the content judged (``None`` when it must be judged again: unreadable, or refused
    for its dates)."""
    try:
        snapshot = read_files(files)
        current = fingerprint(snapshot)
        if current == seen:
            return current
        try:
            leaf = validate(snapshot, password)
        except InvalidIdentity:
            return current  # unusable content is not parsed again on every check
        judge_period(leaf, files, datetime.now(timezone.utc))
    except Exception:  # the serving processes report what is wrong; nothing is served here
        return None
    store.write(snapshot, name, leaf)
    log.debug(
        "processes started from now on get serial %s%s if the files are unusable then",
        leaf.serial,
        f" for SNI identity {name}" if name else "",
    )
    return current


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
