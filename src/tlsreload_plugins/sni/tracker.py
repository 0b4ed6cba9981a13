"""The SNI identities' change tracker: which identities to look at on a tick, those the kernel saw change and
a slice of the rest, so that an unchanged tick costs what changed rather than a read of every identity.

* A :class:`ChangeTracker` holds inotify watches (:mod:`tlsreload_plugins.sni.inotify`) on every configured SNI
  directory, every candidate identity directory in them, and the directory each identity's files resolve to
  (kubelet's ``..data`` rename shows in the identity's directory; certbot's relink in ``live/<name>/``; a
  rewrite in place in ``archive/<name>/`` or ``..2024_xx/``), and re-resolves those after each look;
* an identity under a directory that saw an event is *dirty*: the caller checks it in full (read, hash,
  validate) on this tick;
* the ticker stays as the safety net, as controller-runtime's certwatcher keeps its poll beside its inotify
  watches: every tick also sweeps a slice of the identities, so that each is looked at at least every
  ``max(SWEEP_PERIOD, interval)`` seconds whatever the kernel said (``Reloader.sweep``: a ``stat`` per file, and a
  full check when that changed);
* where inotify is missing, or the kernel's watches run out (one WARNING), every identity is checked on every
  tick.

The decisions are plain functions (:func:`per_tick`, :func:`sweep_slice`, :func:`dirty_under`), testable without
files or threads. Finding the identities is :mod:`tlsreload_plugins.sni.discovery`'s; the tracker serves
:class:`~tlsreload_plugins.sni.SNIIdentities` and a server's parent process (:func:`every_identity`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.sni.discovery import (
    identities_found,
    identity_files,
    is_directory,
)
from tlsreload_plugins.sni.inotify import DirectoryEvents, WatchesExhausted, open_events

log: logging.Logger = logging.getLogger("tlsreload_plugins.sni")

SWEEP_PERIOD = 60.0
"""Seconds within which every identity is swept whatever the kernel reported (or the check interval, when longer):
the safety net under the change notifications."""

EVERYTHING = "\0every identity"
"""The owner of a watched directory whose change concerns every identity (the shared client-CA bundle's)."""


def per_tick(total: int, interval: float, period: float = SWEEP_PERIOD) -> int:
    """How many of ``total`` identities one tick sweeps, so that every one is swept at least every
    ``max(period, interval)`` seconds with a tick every ``interval`` seconds.

    Example: ``per_tick(10_000, 1.0)`` is 167; ``per_tick(10, 120.0)`` is 10.
    """
    if total <= 0:
        return 0
    ticks = max(1, int(max(period, interval) / interval))
    return -(-total // ticks)


def sweep_slice(paths: Sequence[str], cursor: int, count: int) -> tuple[list[str], int, bool]:
    """The ``count`` entries of ``paths`` from ``cursor`` on, wrapping round; the next cursor; whether
    the slice reached the end of ``paths`` (a whole round is complete)."""
    if not paths or count <= 0:
        return [], 0, bool(not paths)
    start = cursor % len(paths)
    count = min(count, len(paths))
    end = start + count
    taken = list(paths[start:end]) + list(paths[: max(0, end - len(paths))])
    return taken, end % len(paths), end >= len(paths)


def dirty_under(directories: Iterable[str], owners: Mapping[str, Iterable[str]]) -> set[str]:
    """The candidate identity paths that watch one of ``directories`` (``owners``: watched directory to
    the candidate paths concerned). :data:`EVERYTHING` stands for all of them."""
    dirty: set[str] = set()
    for directory in directories:
        dirty.update(owners.get(directory, ()))
    return dirty


def watched_directories(path: str, files: TLSFiles | None) -> set[str]:
    """What to watch for the candidate identity at ``path``: the directory itself and, when it is an
    identity, the directories its certificate and key resolve to (through kubelet's or certbot's links)."""
    watched = {path}
    if files is not None:
        for name in (files.certfile, files.keyfile):
            if name:
                watched.add(_resolved_directory(name))
    return watched


def _resolved_directory(name: str) -> str:
    """The directory the file ``name`` is in once its links are followed, as a path the kernel resolves
    (``dir/..data`` for kubelet's ``dir/tls.crt``, ``live/x/../../archive/x`` for certbot's): following
    the last link by hand costs a ``readlink`` or two where ``os.path.realpath`` takes one system call
    per path component."""
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            target = os.readlink(name)
        except OSError:  # not a link (or gone): name is the file itself
            break
        # os.path.join(os.path.dirname(name), target) without its generality: twice per identity at start
        name = target if target.startswith("/") else name[: name.rfind("/") + 1] + target
    return os.path.dirname(name)


@dataclass(frozen=True)
class Tick:
    """What a :meth:`ChangeTracker.tick` found.

    Attributes:
        found: every identity, by name, in precedence order (the same object as on the last tick when
            nothing was added, removed or changed its files).
        shadowed: identities left out because one found before has the same name.
        check: the names to check in full now (dirty, swept, or new).
        everything: every identity is to be checked (no watches, or events were lost).
        dirty: those of ``check`` the kernel reported a change for (or new, or asked for again).
    """

    found: dict[str, TLSFiles]
    shadowed: list[TLSFiles]
    check: frozenset[str]
    everything: bool
    dirty: frozenset[str] = frozenset()


@dataclass
class ChangeTracker:
    """Finds the identities in ``directories`` and tells, on each tick, which to check in full.

    Not thread-safe: one caller (the SNI identities' check, under their lock). Opens its inotify instance
    on the first tick, in the process that ticks (a forked child opens its own).
    """

    directories: list[str]
    interval: float
    ca_certs: str | None = None
    period: float = SWEEP_PERIOD
    crl: str | None = None
    _events: DirectoryEvents | None = None
    _watching: bool = True  # False: no inotify here, or its watches ran out: check everything
    _root_of: dict[str, str] = field(default_factory=dict)  # candidate path -> the configured directory it is in
    _files: dict[str, TLSFiles | None] = field(default_factory=dict)  # candidate path -> identity_files(path)
    # Watched directory -> candidate paths concerned, and candidate path -> directories watched for it (tuples:
    # thousands of them, of one to three paths each).
    _owners: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _watched: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)  # candidate paths in precedence order (also the sweep's)
    _cursor: int = 0
    _found: dict[str, TLSFiles] = field(default_factory=dict)
    _path_of: dict[str, str] = field(default_factory=dict)  # identity name -> its candidate path
    _shadowed: list[TLSFiles] = field(default_factory=list)

    # -- the tick ----------------------------------------------------------------------------

    def tick(self, also: Iterable[str] = ()) -> Tick:
        """Drain the change notifications and decide what to check now; ``also``: names to check again
        whatever happened (an identity caught mid-rotation, one seen gone once). Blocking (directory reads)."""
        if self._events is not None and self._events.pid != os.getpid():
            self._events.close()  # forked: the parent's instance is not ours (closes only our copy)
            self._events = None
        if self._watching and self._events is None:
            self._events = open_events()
            if self._events is None:
                self._watching = False
                log.debug("no inotify here: every SNI identity is read on every check")
            else:
                return self._start_watching()
        if not self._watching or self._events is None:
            found, shadowed = identities_found(self.directories)
            return self._result(found, shadowed, frozenset(found), everything=True)
        directories, entries, overflow = self._events.changed()
        if overflow:
            log.debug("inotify queue overflowed: every SNI identity is looked at")
            return self._start_watching()
        try:
            return self._incremental(directories, entries, set(also))
        except WatchesExhausted as e:
            return self._stop_watching(e)

    def resolved(self, name: str) -> None:
        """Watch again what identity ``name``'s files resolve to now (after a check found new content)."""
        path = self._path_of.get(name)
        if path is not None and self._watching and self._events is not None and path in self._root_of:
            try:
                self._look(path)
            except WatchesExhausted as e:
                self._stop_watching(e)

    def _incremental(self, directories: set[str], entries: set[str], also: set[str]) -> Tick:
        assert self._events is not None
        dirty = dirty_under(directories, self._owners)
        everything = EVERYTHING in dirty
        relisted = False
        for root in self.directories:
            if root in directories or not self._events.is_watched(root):  # changed, or (re)appeared
                relisted = True
                dirty |= self._list(root, entries)
        if also:
            dirty |= {self._path_of[name] for name in also if name in self._path_of}
        count = per_tick(len(self._order), self.interval, self.period)
        swept, self._cursor, whole_round = sweep_slice(self._order, self._cursor, count)
        if whole_round:  # once a round, read the configured directories themselves again too
            for root in self.directories:
                dirty |= self._list(root, set())
            relisted = True
        looked = {path for path in dirty if path in self._root_of}
        changed = relisted
        for path in looked:  # the watches follow what changed; a swept identity is only read
            changed |= self._look(path)
        if changed:
            self._rebuild()
        found = self._found
        if everything:
            return self._result(found, self._shadowed, frozenset(found), everything=True)
        dirty_names = {os.path.basename(os.path.normpath(path)) for path in looked}
        names = dirty_names | {os.path.basename(os.path.normpath(path)) for path in swept}
        tick = self._result(found, self._shadowed, frozenset(name for name in names if name in found), False)
        return Tick(tick.found, tick.shadowed, tick.check, False, frozenset(dirty_names))

    def _start_watching(self) -> Tick:
        """Watch everything from scratch: on the first tick, and after events were lost."""
        assert self._events is not None
        try:
            for directory in list(self._owners):
                self._events.unwatch(directory)
            self._owners.clear()
            self._watched.clear()
            self._root_of.clear()
            self._files.clear()
            for shared in (self.ca_certs, self.crl):  # every identity's trust
                if shared:
                    self._add_watch(os.path.dirname(os.path.realpath(shared)), EVERYTHING)
            for root in self.directories:
                self._list(root, set())
            for path in self._order:
                self._look(path)
        except WatchesExhausted as e:
            return self._stop_watching(e)
        self._rebuild()
        return self._result(self._found, self._shadowed, frozenset(self._found), everything=True)

    def _stop_watching(self, error: WatchesExhausted) -> Tick:
        log.warning(
            "cannot watch the SNI directories for changes (%s; raise fs.inotify.max_user_watches): every SNI "
            "identity is read on every check instead",
            error,
        )
        self._watching = False
        if self._events is not None:
            self._events.close()
            self._events = None
        found, shadowed = identities_found(self.directories)
        return self._result(found, shadowed, frozenset(found), everything=True)

    def _result(
        self, found: dict[str, TLSFiles], shadowed: list[TLSFiles], check: frozenset[str], everything: bool
    ) -> Tick:
        self._found, self._shadowed = found, shadowed
        return Tick(found, shadowed, check, everything)

    # -- discovery, kept current by the events ----------------------------------------------------

    def _list(self, root: str, entries: set[str]) -> set[str]:
        """Read configured directory ``root`` again: its candidates are itself when it is an identity, else its
        subdirectories. Returns the candidate paths to look at: new ones, and those an event named."""
        assert self._events is not None
        self._events.watch(root)
        before = {path for path, of in self._root_of.items() if of == root}
        if identity_files(root) is not None:
            now = {root}
        else:
            try:
                with os.scandir(root) as listing:
                    now = {entry.path for entry in listing if not entry.name.startswith(".") and is_directory(entry)}
            except OSError:
                now = set()
        replaced = {path for path in now & before if path in entries}  # a subdirectory replaced, a link repointed
        for path in (before - now) | replaced:
            self._drop(path)
        for path in now - before | replaced:
            self._root_of[path] = root
        if now != before:
            self._order = self._ordered()
        return (now - before) | replaced

    def _ordered(self) -> list[str]:
        """Candidate paths in precedence order: directories as configured, subdirectories sorted."""
        by_root: dict[str, list[str]] = {root: [] for root in self.directories}
        for path, root in self._root_of.items():
            by_root[root].append(path)
        return [path for root in self.directories for path in sorted(by_root[root])]

    def _look(self, path: str) -> bool:
        """Watch candidate ``path`` and what its files resolve to, then see which files it holds; whether
        that changed (it became an identity, stopped being one, or holds other files)."""
        before = self._files.get(path, False)
        self._add_watch(path, path)
        files = identity_files(path)
        self._files[path] = files
        wanted = watched_directories(path, files)
        for directory in set(self._watched.get(path, ())) - wanted:
            self._remove_owner(directory, path)
        for directory in wanted - {path}:
            self._add_watch(directory, path, again=True)  # a link in the way may point elsewhere now
        return before != files

    def _add_watch(self, directory: str, owner: str, again: bool = False) -> None:
        assert self._events is not None
        if self._events.watch(directory, again):
            owners = self._owners.get(directory, ())
            if owner not in owners:
                self._owners[directory] = (*owners, owner)
            watched = self._watched.get(owner, ())
            if directory not in watched:
                self._watched[owner] = (*watched, directory)

    def _remove_owner(self, directory: str, owner: str) -> None:
        owners = tuple(other for other in self._owners.get(directory, ()) if other != owner)
        if owners:
            self._owners[directory] = owners
        elif self._owners.pop(directory, None) is not None and directory not in self.directories and self._events:
            self._events.unwatch(directory)  # (the configured directories stay watched)
        watched = tuple(other for other in self._watched.get(owner, ()) if other != directory)
        if watched:
            self._watched[owner] = watched
        else:
            self._watched.pop(owner, None)

    def _drop(self, path: str) -> None:
        for directory in list(self._watched.get(path, ())):
            self._remove_owner(directory, path)
        self._watched.pop(path, None)
        self._root_of.pop(path, None)
        self._files.pop(path, None)

    def _rebuild(self) -> None:
        found: dict[str, TLSFiles] = {}
        shadowed: list[TLSFiles] = []
        path_of: dict[str, str] = {}
        for path in self._order:
            files = self._files.get(path)
            if files is None:
                continue
            name = os.path.basename(os.path.normpath(path))
            if found.setdefault(name, files) is not files:
                shadowed.append(files)
            else:
                path_of[name] = path
        if found != self._found or shadowed != self._shadowed:  # else the same objects: nothing to redo
            self._found, self._shadowed, self._path_of = found, shadowed, path_of

    def close(self) -> None:
        """Stop watching (closes the inotify descriptor)."""
        if self._events is not None:
            self._events.close()
            self._events = None
