"""Find SNI identities on disk: which directories are configured, which of them (or of their
subdirectories) hold an identity, and by what name each is served.

A directory is an identity when it holds one of :data:`IDENTITY_FILES` (a Kubernetes TLS Secret, a
certbot lineage); otherwise its immediate subdirectories are looked at. No certificate is read
here: serving the identities found is :mod:`tlsreload_plugins.sni.identities`'s. A server's parent process
uses :func:`every_identity` to keep the last good of each (:mod:`tlsreload_plugins.lastgood.last_good`).
(These names are also importable from :mod:`tlsreload_plugins.sni.identities`, where they were first defined.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.lastgood.store import DEFAULT

if TYPE_CHECKING:
    from tlsreload_plugins.sni.tracker import ChangeTracker

SNI_ENV = "TLSRELOAD_SNI"
"""Directories of SNI identities, separated by ``os.pathsep`` (``:`` on Unix)."""

IDENTITY_FILES = (("tls.crt", "tls.key"), ("fullchain.pem", "privkey.pem"))
"""The (certificate, key) file names that make a directory an identity, in order of preference:
a Kubernetes TLS Secret, a certbot lineage."""

_MARKERS = frozenset(name for pair in IDENTITY_FILES for name in pair) | {"cert.pem", "chain.pem"}
"""Any of these present keeps an identity alive: certbot relinks its files one at a time."""


def resolve_directories(directories: Iterable[str] | str | None = None) -> list[str]:
    """The SNI directories: ``directories`` if given (a sequence, or one ``os.pathsep``-separated
    string), else ``$TLSRELOAD_SNI``, else none. Empty entries are dropped.

    Raises:
        ValueError: a directory does not exist or is not a directory.
    """
    if directories is None:
        directories = os.environ.get(SNI_ENV, "")
    if isinstance(directories, str):
        directories = directories.split(os.pathsep)
    found = [str(d) for d in directories if str(d)]
    for directory in found:
        if not os.path.isdir(directory):
            raise ValueError(f"SNI directory {directory} does not exist or is not a directory")
    return found


def identity_files(directory: str) -> TLSFiles | None:
    """The certificate and key of the identity ``directory`` is, or ``None`` when it is none."""
    prefix = directory + "/" if directory and not directory.endswith("/") else directory  # os.path.join's
    for cert, key in IDENTITY_FILES:  # lstat, not a listing: a kubelet Secret is found in one system call
        cert_path, key_path = prefix + cert, prefix + key
        if os.path.lexists(cert_path) or os.path.lexists(key_path):
            return TLSFiles(cert_path, key_path)
    return None


def _is_alive(files: TLSFiles) -> bool:
    directory = os.path.dirname(files.certfile)
    try:
        return not _MARKERS.isdisjoint(os.listdir(directory))
    except OSError:
        return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """``os.path.isdir(entry.path)``, from the listing where it can (a link is still followed)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _discover(directories: Sequence[str]) -> tuple[dict[str, TLSFiles], list[TLSFiles]]:
    """Every identity in ``directories``, by name, in precedence order, and those left out because
    an identity found before has the same name."""
    found: dict[str, TLSFiles] = {}
    shadowed: list[TLSFiles] = []

    def add(name: str, files: TLSFiles) -> None:
        if found.setdefault(name, files) is not files:
            shadowed.append(files)

    for directory in directories:
        files = identity_files(directory)
        if files is not None:
            add(os.path.basename(os.path.normpath(directory)), files)
            continue
        try:
            with os.scandir(directory) as listing:  # a listing that says which entries are directories: no stat each
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or not _is_dir(entry):  # kubelet's ..data, ..2026_...
                continue
            files = identity_files(entry.path)
            if files is not None:
                add(entry.name, files)
    return found, shadowed


def discover(directories: Sequence[str], ca_certs: str | None = None) -> dict[str, TLSFiles]:
    """Every identity in ``directories`` now, by name, each with the server's client-CA bundle
    ``ca_certs``: the identities an :class:`SNIIdentities` over them would serve."""
    found, _ = _discover(directories)
    return {name: TLSFiles(files.certfile, files.keyfile, ca_certs) for name, files in found.items()}


def every_identity(files: TLSFiles, directories: Iterable[str] | str | None) -> Callable[[], dict[str, TLSFiles]]:
    """A function giving the configured identity (under :data:`~tlsreload_plugins.lastgood.last_good.DEFAULT`)
    and every SNI identity in ``directories`` found when it is called: what a server's parent process
    keeps the last good of (:func:`~tlsreload_plugins.lastgood.last_good.keep_newest_valid`). Its ``tick(interval)``
    gives the same and the names to look at now: those whose files the kernel saw change, and a slice of
    the others (:class:`~tlsreload_plugins.sni.tracker.ChangeTracker`; ``None``: every one).

    Raises:
        ValueError: a directory does not exist (now; one removed later gives no SNI identity).
    """
    return _EveryIdentity(files, resolve_directories(directories))


@dataclass
class _EveryIdentity:
    files: TLSFiles
    directories: list[str]
    _tracker: ChangeTracker | None = None
    _found: tuple[object, dict[str, TLSFiles]] = (None, {})  # the tracker's last found, and what it gave

    def __call__(self) -> dict[str, TLSFiles]:
        return {DEFAULT: self.files, **discover(self.directories, self.files.ca_certs)}

    def tick(self, interval: float) -> tuple[dict[str, TLSFiles], set[str] | None]:
        from tlsreload_plugins.sni.tracker import ChangeTracker  # here: sni_watch builds on this module

        if self._tracker is None:
            self._tracker = ChangeTracker(self.directories, interval, self.files.ca_certs)
        self._tracker.interval = interval
        tick = self._tracker.tick()
        if tick.found is not self._found[0]:  # something added, removed or changed its files
            ca = self.files.ca_certs
            named = {name: TLSFiles(f.certfile, f.keyfile, ca) for name, f in tick.found.items()}
            self._found = (tick.found, {DEFAULT: self.files, **named})
        look = None if tick.everything else {DEFAULT, *tick.check}
        return self._found[1], look
