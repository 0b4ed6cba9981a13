"""The shared store: the newest identity each name of a server served, with the leaf its validation
found, in memory every process of the server shares (:class:`SharedStore`).

Two regions written alternately, each a table of identities by name (:mod:`tlsreload_plugins.lastgood.table`),
with the refusal validation found for the newest content of each name it refused (so that a process reading
those bytes takes it rather than judging them again), followed by the changes made since it was written, each
a record appended to it; writers take turns under a POSIX record lock. A spawn
server's parent is the store's keeper (:class:`Keeper`), which its workers ask to look at new content. On Linux
the mapping is a memfd, passed to spawned workers as a file descriptor when the store is pickled for them
(:mod:`tlsreload_plugins.lastgood.spawned`); elsewhere they get a copy. What is kept, and how a context is built
from it, is :mod:`tlsreload_plugins.lastgood.last_good`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import select
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TypeVar

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.lastgood.spawned import Descriptor, for_process_being_started
from tlsreload_plugins.lastgood.table import Index, Kept, Parts, Refusal, decode, encode, encode_change

# The store's log lines keep the logger they were always written under.
log = logging.getLogger("tlsreload_plugins.lastgood")

T = TypeVar("T")

DEFAULT = ""
"""The name the configured identity (certfile and keyfile) is kept under. SNI identities are kept under
their own names (their directories' names), which are never empty."""

_PASSES = struct.Struct("<QQ")  # the keeper's passes: how many it began, the number of the last one it completed
_HEADER = struct.Struct("<QQ32s")  # generation, payload length, sha256 of the payload
_LOG = struct.Struct("<Q")  # after the header: the bytes of change records appended after the payload
_HEAD = _HEADER.size + _LOG.size
_RECORD = struct.Struct("<I32s")  # each change record: its length and sha256, then the record

LOG_BYTES = 4 * 1024 * 1024
"""Change records a region takes after its table before the next change rewrites the table whole (into the other
region): at least this many bytes, or as many as the table takes. A write costs what it changes; the table is
rewritten once per about as many bytes of changes as it holds."""

REGION_BYTES = 256 * 1024 * 1024
"""Room for the table of kept identities in a :class:`SharedStore` (two such regions are mapped): the
configured identity and tens of thousands of SNI identities (a client-CA bundle shared by all of them is
kept once). Address space only: the pages written are the only memory used."""

_MAX_ASK = 512
"""An ask naming an identity is at most this long (POSIX guarantees atomic pipe writes of 512 bytes)."""

_ASK_WRITE = max(_MAX_ASK, getattr(select, "PIPE_BUF", _MAX_ASK))
"""The most bytes of asks written to the keeper's pipe at once: written whole (4096 on Linux), so a hundred
names reach the keeper in one read, and one pass looks at all of them."""

ASK_POLL = 0.016
"""The longest pause, in seconds, between two looks of a worker that asked (:meth:`SharedStore.ask`) at whether the
keeper's pass has completed. A pass that validates takes a child process, a tenth of a second or more; a thread
that woke every millisecond would take the GIL from the worker's event loop as often, and on a busy machine the
loop would then wait for that thread to be given a CPU."""

LOCK_WAIT = 2.0
"""Seconds a write waits for another process's write to end before giving up (it logs why)."""

ASK_WAIT = 3.0
"""Seconds a worker waits for the keeper's verdict on new content (:meth:`SharedStore.ask`) before it
judges the content itself. The keeper validates in a child process (:mod:`tlsreload_plugins.validation.apart`),
which takes longer on a loaded machine."""


def _named(name: str) -> str:
    return f"SNI identity {name}" if name else "the server"


def _passes(mapping: mmap.mmap) -> tuple[int, int]:
    """The keeper's passes numbered in ``mapping``'s first bytes: how many it began, the last one it completed."""
    begun, completed = _PASSES.unpack_from(mapping, 0)
    return int(begun), int(completed)


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
    digest does not match, and readers take the other one (they validate what they read anyway). A change
    is a record appended after the newest region's table, with its own digest, committed by one store of
    its length once written: a write costs what it changes, and each process takes in only the records it
    has not read. The table is rewritten whole, into the other region, once the records outgrow it.
    Writers take turns through a POSIX record lock, which the kernel releases when its holder dies,
    and never wait on it: they try again every millisecond, so a gevent hub is never blocked, and
    give up after :data:`LOCK_WAIT` seconds.

    A spawn server's parent keeps the table current (its :class:`Keeper`:
    :func:`~tlsreload_plugins.lastgood.last_good.keep_newest_valid`); a worker that finds new content on disk asks
    it to look (:meth:`ask`), and takes its verdict instead of parsing the content itself, so the workers load no
    ``cryptography`` while the content on disk is valid.
    """

    def __init__(self, region_bytes: int = REGION_BYTES) -> None:
        self._region = _HEAD + region_bytes
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
        # The newest intact region, its generation, and where each identity's contents lie in it.
        self._cached: tuple[int, int, Index | dict[str, Kept]] = (-1, 0, {})
        self._full_logged: set[str] = set()

    # -- to a spawned process -------------------------------------------------------------------

    def __reduce__(self) -> tuple[Callable[..., SharedStore], tuple[object, ...]]:
        """How the store reaches a process multiprocessing starts (uvicorn's ``--workers``, hypercorn's workers,
        which get it with the configuration the server pickles for them): its memfd (and the pipe to its keeper)
        passed as file descriptors, so the parent and the child share one table (:meth:`_attached`); when they
        cannot be passed, a copy of the table as it is now (:meth:`_copied`)."""
        passed = for_process_being_started(self._fd, self._asks) if self._fd is not None else None
        if passed is not None:
            return type(self)._attached, (*passed, self._region - _HEAD)
        return type(self)._copied, (encode(self._table()), self._region - _HEAD)

    @classmethod
    def _attached(cls, mapping: Descriptor, asks: Descriptor | None, region_bytes: int) -> SharedStore:
        """The store a spawned process shares with its parent, from the descriptors passed."""
        store = cls.__new__(cls)
        store._region = _HEAD + region_bytes
        store._fd = store._lock_fd = mapping.detach()
        store._map = mmap.mmap(store._fd, _PASSES.size + 2 * store._region, flags=mmap.MAP_SHARED)
        store._asks = asks.detach() if asks is not None else None
        store._start_in_process()
        return store

    @classmethod
    def _copied(cls, payload: bytes, region_bytes: int) -> SharedStore:
        """A store of this process only, holding the table ``payload`` (see
        :func:`~tlsreload_plugins.lastgood.table.encode`)."""
        store = cls(region_bytes)
        table = decode(payload)
        if table:
            store._change(DEFAULT, kept=table)
        return store

    # -- the table ------------------------------------------------------------------------------

    def _base(self, index: int) -> int:
        return _PASSES.size + index * self._region

    def _generation(self, index: int) -> int:
        generation: int = _HEADER.unpack_from(self._map, self._base(index))[0]
        return generation

    def _appended(self, index: int) -> int:
        """Where the change records committed to region ``index`` end, in the mapping."""
        base = self._base(index)
        length: int = _HEADER.unpack_from(self._map, base)[1]
        logged: int = _LOG.unpack_from(self._map, base + _HEADER.size)[0]
        return base + _HEAD + length + logged

    def _current(self) -> tuple[int, int, Index] | None:
        """The newest intact region: its number, generation and index, the change records committed to it taken
        in (``None`` when neither is intact)."""
        region, known, table = self._cached
        if isinstance(table, Index) and self._generation(region) == known > self._generation(1 - region):
            # Still the newest, and not being rewritten (that zeroes its generation): at most records to take in.
            return region, known, self._caught_up(region, known, table)
        for index in sorted((0, 1), key=self._generation, reverse=True):
            base = self._base(index)
            generation, length, digest = _HEADER.unpack_from(self._map, base)
            if generation == 0 or length > self._region - _HEAD:
                continue
            region, known, table = self._cached
            if (region, known) == (index, generation) and isinstance(table, Index):
                return index, generation, self._caught_up(index, generation, table)
            start = base + _HEAD
            with memoryview(self._map)[start : start + length] as payload:
                intact = hashlib.sha256(payload).digest() == digest and self._generation(index) == generation
                try:
                    located = Index.of(payload, start) if intact else None
                except ValueError:
                    located = None
            if located is None:
                continue  # torn, being rewritten as it was read, or not a table this version wrote
            return index, generation, self._caught_up(index, generation, located)
        return None

    def _caught_up(self, region: int, generation: int, located: Index) -> Index:
        """``located`` with the change records committed to ``region`` since taken in, all at once (cached): each
        record whose digest matches, up to the first that does not (a writer writes a record before committing
        it; a damaged one is left out, with what follows, until the next write rewrites the table)."""
        end = min(self._appended(region), self._base(region) + self._region)
        records: list[tuple[memoryview, int]] = []
        at = located.end
        with memoryview(self._map) as mapping:
            while at + _RECORD.size <= end:
                size, digest = _RECORD.unpack_from(self._map, at)
                start = at + _RECORD.size
                if start + size > end or hashlib.sha256(mapping[start : start + size]).digest() != digest:
                    break
                records.append((mapping[start : start + size], start))
                at = start + size
            if records:
                with contextlib.suppress(ValueError):  # left out until the next write rewrites the table
                    located = located.with_changes(records)
            for record, _ in records:
                record.release()
        if self._generation(region) == generation:
            self._cached = (region, generation, located)
        return located

    def _kept(self, name: str) -> Kept | None:
        """What is kept for ``name``: its contents copied out of the shared memory, not the whole table."""
        return self._located(lambda located: located.contents(self._map, name))

    def _located(self, read: Callable[[Index], T | None]) -> T | None:
        """What ``read`` finds in the newest intact region, read again when it was rewritten meanwhile."""
        for _ in range(3):
            current = self._current()
            if current is None:
                return None
            region, generation, located = current
            found = read(located)
            if self._generation(region) == generation:
                return found
            self._cached = (-1, 0, {})  # rewritten while being read: look again
        return None

    def _table(self) -> dict[str, Kept]:
        """The newest intact table, every identity decoded (empty when none is): for a write."""
        return self._contents()[0]

    def _contents(self) -> tuple[dict[str, Kept], dict[str, Refusal]]:
        """:meth:`_table` and the refusals kept, from one region."""
        current = self._current()
        if current is None:
            return {}, {}
        region, generation, located = current
        table = {name: kept for name in located.entries if (kept := located.contents(self._map, name)) is not None}
        refusals = located.all_refusals(self._map)
        return (table, refusals) if self._generation(region) == generation else self._contents()

    def read(self, name: str = DEFAULT) -> Parts | None:
        """The newest ``(cert, key, ca)`` kept for ``name``, or ``None``."""
        kept = self._kept(name)
        return None if kept is None else kept[0]

    def verdict(self, name: str = DEFAULT) -> tuple[Parts, Leaf] | None:
        """The identity kept for ``name`` with the leaf its validation found, or ``None``."""
        kept = self._kept(name)
        return None if kept is None or kept[1] is None else (kept[0], kept[1])

    def look(self) -> None:
        """Take in what the server's other processes wrote since this one last looked (a table rewritten whole:
        its index decoded, tens of milliseconds at ten thousand identities), so that :meth:`known` finds it. Off
        the event loop: a check calls it."""
        self._current()

    def known(self, name: str = DEFAULT) -> Kept | None:
        """What is kept for ``name`` as this process last looked (:meth:`look`, or any read or write), with the leaf
        its validation found: nothing decoded, hashed or taken in but that identity's bytes, for a ClientHello
        callback. ``None`` when nothing is, or when the region it lay in was rewritten since (two rewrites of the
        table since that look)."""
        region, generation, located = self._cached
        if not isinstance(located, Index) or self._generation(region) != generation:
            return None
        found = located.contents(self._map, name)
        return found if self._generation(region) == generation else None  # not rewritten while copied out

    def verdicts_on(self, identities: Mapping[str, Parts]) -> dict[str, Leaf]:
        """The leaf kept for each name of ``identities`` (name: its bytes) whose bytes are exactly those kept for it,
        by name, found in one look at the table and compared in place (nothing copied out of the shared memory)."""

        def read(located: Index) -> dict[str, Leaf]:
            held = {name: located.holds(self._map, name, parts) for name, parts in identities.items()}
            return {name: leaf for name, (same, leaf) in held.items() if same and leaf is not None}

        return self._located(read) or {}

    def refusal(self, name: str, content: str) -> InvalidIdentity | None:
        """The refusal validation found for the content named ``content`` (see :meth:`refuse`) of identity
        ``name``, when it is the one kept for ``name``; else ``None``."""
        found = self._located(lambda located: located.refusal(self._map, name))
        return None if found is None or found[0] != content else InvalidIdentity(found[1], path=found[2])

    def refuses(self, name: str) -> bool:
        """Whether a refusal is kept for ``name`` (whatever content it is for): when not, a caller need not work
        out which content it holds (:func:`~tlsreload_plugins.lastgood.last_good.content_key` hashes it)."""
        return bool(self._located(lambda located: name in located.refusals))

    def refuse(self, name: str, content: str, error: InvalidIdentity) -> None:
        """Keep ``error``, validation's refusal of identity ``name``'s content ``content`` (a digest of its bytes
        and key password: :func:`~tlsreload_plugins.lastgood.last_good.content_key`), in place of the one kept for
        ``name`` before: the server's processes that read that content take it rather than judging it again.
        Never a refusal for dates, which time changes. Never raises."""
        self.refuse_many({name: (content, error)})

    def refuse_many(self, refusals: Mapping[str, tuple[str, InvalidIdentity]]) -> None:
        """:meth:`refuse` for each name of ``refusals`` (name: content, refusal), in one write. Never raises."""
        changes = {
            name: (content, str(error), error.path)
            for name, (content, error) in refusals.items()
            if self.refusal(name, content) is None
        }
        if changes:
            what = f"the refusal of {_named(next(iter(changes)))}" if len(changes) == 1 else f"{len(changes)} refusals"
            self._change(next(iter(changes)), what, refused=changes)

    def write(self, snapshot: Snapshot, name: str = DEFAULT, leaf: Leaf | None = None) -> None:
        """Keep ``snapshot`` (already validated and being served) as identity ``name``, with the
        ``leaf`` its validation found. Never raises."""
        self.write_many({name: (snapshot, leaf)})

    def write_many(self, identities: Mapping[str, tuple[Snapshot, Leaf | None]]) -> bool:
        """Keep each identity of ``identities`` (name: its snapshot and leaf) as :meth:`write` would, in one
        write: what a server's process finding thousands of identities at once does. Whether the store keeps
        them all now. Never raises."""
        wanted = {name: (s.parts, leaf) for name, (s, leaf) in identities.items()}

        def changed(located: Index) -> dict[str, Kept]:  # in one look at the table, compared in place
            held = {name: located.holds(self._map, name, parts) for name, (parts, _) in wanted.items()}
            return {
                name: (parts, leaf)
                for name, (parts, leaf) in wanted.items()
                if not held[name][0] or (leaf is not None and held[name][1] != leaf)
            }

        found = self._located(changed)
        changes: dict[str, Kept] = dict(wanted) if found is None else found
        if len(changes) == 1:
            return self._change(next(iter(changes)), kept=changes)
        if changes:
            what = f"the last good certificates of {len(changes)} identities"
            return self._change(next(iter(changes)), what, kept=changes)
        return True

    def forget(self, name: str) -> None:
        """Keep nothing for ``name`` any more (an SNI identity removed from its directory)."""
        current = self._current()
        if self.read(name) is not None or (current is not None and name in current[2].refusals):
            self._change(name, removed=(name,))

    def _change(
        self,
        name: str,
        what: str | None = None,
        *,
        kept: Mapping[str, Kept] | None = None,
        refused: Mapping[str, Refusal] | None = None,
        removed: Collection[str] = (),
    ) -> bool:
        """Remove the names ``removed``, then keep the identities ``kept`` and the refusals ``refused``, by name,
        in one write; whether it did. The change is a record appended to the newest region (its cost is the
        change's); once the region's records outgrow :data:`LOG_BYTES` or its table, the table is rewritten whole
        into the other region."""
        what = what or f"the last good certificate of {_named(name)}"
        kept, refused = kept or {}, refused or {}
        with self._exclusive() as locked:
            if not locked:
                log.warning("%s is not kept: another process held the store", what)
                return False
            current = self._current()
            if current is not None and self._append(current, kept, refused, removed):
                return True
            table, refusals = self._contents()
            for gone in removed:
                table.pop(gone, None)
                refusals.pop(gone, None)
            table.update(kept)
            refusals.update(refused)
            payload = encode(table, refusals)
            if len(payload) > self._region - _HEAD:
                if name not in self._full_logged:
                    self._full_logged.add(name)
                    log.warning(
                        "%s is not kept: the identities kept would take %d bytes, more than the %d kept in memory",
                        what,
                        len(payload),
                        self._region - _HEAD,
                    )
                return False
            generations = [self._generation(i) for i in (0, 1)]
            index = 0 if generations[0] <= generations[1] else 1  # overwrite the older region
            base = self._base(index)
            _HEADER.pack_into(self._map, base, 0, len(payload), b"")  # invalid while being written
            _LOG.pack_into(self._map, base + _HEADER.size, 0)
            self._map[base + _HEAD : base + _HEAD + len(payload)] = payload
            generation = max(generations) + 1
            _HEADER.pack_into(self._map, base, generation, len(payload), hashlib.sha256(payload).digest())
            start = base + _HEAD
            located = Index.of(memoryview(payload), start)  # no need to hash it again
            for kept_name, (_, leaf) in table.items():  # decoded already: processes forked from here take them too
                if leaf is not None:
                    located.leaves[located.entries[kept_name][3]] = leaf
            self._cached = (index, generation, located)
        return True

    def _append(
        self,
        current: tuple[int, int, Index],
        kept: Mapping[str, Kept],
        refused: Mapping[str, Refusal],
        removed: Collection[str],
    ) -> bool:
        """Append the change as a record to the newest region ``current``, under the write lock; ``False`` when it
        is for a table rewrite instead (the records would outgrow their room, or one could not be read)."""
        region, generation, located = current
        base = self._base(region)
        length: int = _HEADER.unpack_from(self._map, base)[1]
        if located.end != self._appended(region):
            return False  # a damaged record: rewriting the table leaves it behind
        logged = located.end - (base + _HEAD + length)
        room = min(max(LOG_BYTES, length), self._region - _HEAD - length)
        if logged + sum(len(parts[0]) + len(parts[1] or b"") for parts, _ in kept.values()) > room:
            return False  # known before encoding anything (a client-CA bundle may be kept already)
        some = next(iter(located.entries), "")  # the identities share their client-CA bundle
        record = encode_change(
            kept,
            refused,
            removed,
            len(located.starts),
            lambda name, blob: located.find(self._map, blob, (name, some)),
        )
        if logged + _RECORD.size + len(record) > room:
            return False
        start = located.end + _RECORD.size
        self._map[start : start + len(record)] = record
        _RECORD.pack_into(self._map, located.end, len(record), hashlib.sha256(record).digest())
        _LOG.pack_into(self._map, base + _HEADER.size, logged + _RECORD.size + len(record))  # committed
        changed = located.with_changes([(memoryview(record), start)])
        for kept_name, (_, leaf) in kept.items():  # decoded already
            if leaf is not None:
                changed.leaves[changed.entries[kept_name][3]] = leaf
        self._cached = (region, generation, changed)
        return True

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

    def ask(self, wait: float = ASK_WAIT, names: Collection[str] | None = None) -> bool:
        """Have the keeper (:func:`~tlsreload_plugins.lastgood.last_good.keep_newest_valid`, in a spawn server's
        parent) look at the files now (those of the identities ``names`` at least; ``None``: every identity), and
        wait until it has: ``True`` then; ``False`` at once when this store has no keeper (gunicorn's), or after
        ``wait`` seconds when the keeper does not answer. Blocking.

        One ask names any number of identities: a worker's check that found a hundred renewals asks once, and
        the keeper validates them in one child for every worker, rather than each worker in its own.

        Example: ``store.ask(names=["api.example.com"])``.
        """
        if self._asks is None:
            return False
        begun = _passes(self._map)[0]
        try:
            for asked in _asks(names):
                os.write(self._asks, asked)  # at most PIPE_BUF bytes: written whole, never interleaved
        except BlockingIOError:
            pass  # the pipe is full of asks the keeper has yet to read: it will look
        except OSError:
            return False  # the keeper is gone
        deadline, pause = time.monotonic() + wait, 0.001
        while _passes(self._map)[1] <= begun:  # until a pass that began after the ask has completed
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, ASK_POLL)
        return True

    def keep(self) -> Keeper:
        """Make this process the store's keeper: the processes it starts from now on can :meth:`ask` it."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)  # shared with the children: a full pipe never blocks a worker
        self._asks = write_end
        return Keeper(self._map, read_end)


def _asks(names: Collection[str] | None) -> Iterator[bytes]:
    """The writes to the keeper's pipe that ask about ``names`` (``None``: every identity): lines of names, each
    write at most :data:`_ASK_WRITE` bytes; a name that cannot be a line of its own asks about every identity."""
    if names is None:
        yield b"\0\n"  # \0: all of them
        return
    pending = b""
    for name in names:
        label = name.encode(errors="replace")
        if len(label) >= _MAX_ASK or b"\n" in label or b"\0" in label:  # the default identity's name is empty
            yield b"\0\n"
            return
        if len(pending) + len(label) + 1 > _ASK_WRITE:
            yield pending
            pending = b""
        pending += label + b"\n"
    if pending:
        yield pending


class Keeper(FrozenRecord):
    """The keeper's side of a :class:`SharedStore` (a spawn server's parent, which keeps the store current for its
    workers: :func:`~tlsreload_plugins.lastgood.last_good.keep_newest_valid`): it waits for the workers' asks, and
    numbers its passes in the store's first bytes, so that a worker that asked knows when a pass that began after
    its ask has completed."""

    _fields = ("mapping", "asks")
    __slots__ = _fields
    mapping: mmap.mmap
    """The store's mapping, whose first bytes number the keeper's passes."""
    asks: int
    """The read end of the pipe workers ask through."""

    def __init__(self, mapping: mmap.mmap, asks: int) -> None:
        self._set(mapping, asks)

    def wait(self, timeout: float) -> set[str] | None:
        """Return when a worker asks, or after ``timeout`` seconds: the names of the identities asked
        about (empty: none asked), ``None`` when one asked about every identity."""
        asked: set[str] | None = set()
        if select.select([self.asks], [], [], timeout)[0]:
            data = b""
            with contextlib.suppress(BlockingIOError):
                data = os.read(self.asks, 65536)
            for ask in data.split(b"\n")[:-1]:
                if b"\0" in ask or asked is None:
                    asked = None
                else:
                    asked.add(ask.decode(errors="replace"))
        return asked

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """Number a look at every identity: a worker's :meth:`SharedStore.ask` waits for the end of one that began
        after it asked."""
        begun, completed = _passes(self.mapping)
        _PASSES.pack_into(self.mapping, 0, begun + 1, completed)
        try:
            yield
        finally:
            _PASSES.pack_into(self.mapping, 0, begun + 1, begun + 1)
