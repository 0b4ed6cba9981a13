"""Identities that passed, published for a server's serving processes: :class:`Publication` writes them (the
reader, :mod:`tlsreload_plugins.publication.reader`), :func:`read_version` and :func:`read_figures` read them (each
serving process).

A publication is one private directory (0700, on a memory filesystem where there is one), written as kubelet writes
a mounted Secret (:func:`~tlsreload_plugins.atomic_swap.swap_in`): each version is a directory holding the bytes
read from the configured files exactly as they passed (``tls.crt``, ``tls.key``, ``ca.crt``, ``crl.pem``) and
``verdict.json``, the leaf validation found for them; one rename of ``..data`` makes it current. A version's name
carries the fingerprint of its bytes (``..7-3f2a...``), so that a serving process's look at whether something new
was published is one ``readlink`` (:func:`~tlsreload_plugins.atomic_swap.current_version`). A version never changes
once written: a serving process builds its context from that version's own paths, and one removed while it reads
(a newer one was published meanwhile) is read again at its next look.

Beside the versions, ``reader.json``: the reader's figures (:class:`ReaderFigures`: who it is, whether the files
are usable now and why not, naming the configured file), replaced by a rename at every change. Only bytes that
passed are ever published: a process that starts, for any reason, serves the newest identity that did.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from typing import Any

from tlsreload_plugins.atomic_swap import current_version, swap_in, write_private
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles, fingerprint, read_files
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.private_directories import owner_alive

__all__ = [
    "FIGURES_NAME",
    "VERDICT_NAME",
    "Publication",
    "ReaderFigures",
    "Version",
    "read_figures",
    "read_version",
    "reader_gone",
    "version_fingerprint",
]

NAMES = ("tls.crt", "tls.key", "ca.crt", "crl.pem")
"""The files of a version: certificate (its chain after it), key, client-CA bundle, CRLs."""
VERDICT_NAME = "verdict.json"
"""The leaf validation found for a version's bytes, and their fingerprint."""
FIGURES_NAME = "reader.json"
"""The reader's figures, beside the versions."""
FIGURES_BYTES = 64 * 1024
"""The most of ``reader.json`` that is read (a few hundred bytes: an error message or two)."""


class Version(FrozenRecord):
    """One published version, as a serving process reads it.

    Attributes:
        name: the version directory's name (``..N-FINGERPRINT``).
        snapshot: its bytes; ``snapshot.files`` are the version's own paths, which a recipe builds a context from.
        leaf: the leaf validation found for them (its dates judged at publication; judge them again when serving).
    """

    _fields = ("name", "snapshot", "leaf")
    __slots__ = _fields
    name: str
    snapshot: Snapshot
    leaf: Leaf

    def __init__(self, name: str, snapshot: Snapshot, leaf: Leaf) -> None:
        self._set(name, snapshot, leaf)


class ReaderFigures(FrozenRecord):
    """What the reader says about itself and the files, in ``reader.json``.

    Attributes:
        owner: the reader process (:func:`~tlsreload_plugins.private_directories.owner`: namespace, pid, start).
        files: the configured files it reads (what every line names).
        error: why the files are not usable now (naming the file), ``None`` when they are.
        error_path: the file ``error`` names, when one.
        error_level: the level that error is logged at (``logging.WARNING``, ``logging.ERROR``).
        failures: how many distinct problems it has found since it started.
        error_content: the fingerprint of what the files held when ``error`` was found (``None``: unreadable): the
            published version's when only its dates are wrong (expired since), which is then no last good identity.
    """

    _fields = ("owner", "files", "error", "error_path", "error_level", "failures", "error_content")
    __slots__ = _fields
    owner: str
    files: TLSFiles
    error: str | None
    error_path: str | None
    error_level: int
    failures: int
    error_content: str | None

    def __init__(
        self,
        owner: str,
        files: TLSFiles,
        error: str | None = None,
        error_path: str | None = None,
        error_level: int = 30,
        failures: int = 0,
        error_content: str | None = None,
    ) -> None:
        self._set(owner, files, error, error_path, error_level, failures, error_content)

    def refusal(self) -> InvalidIdentity | None:
        """The reader's current refusal as an error naming its file, ``None`` when the files are usable."""
        return None if self.error is None else InvalidIdentity(self.error, path=self.error_path)


class Publication:
    """The writing side of a publication, in the reader: :meth:`publish` a version, :meth:`say` the figures.

    Args:
        directory: the publication's private directory (made by the process that starts the reader, which removes
            it: a reader that is replaced leaves it to the next).

    Example::

        publication = Publication(directory)
        publication.publish(snapshot, leaf)       # bytes that passed, and their verdict
        publication.say(ReaderFigures(owner(), files))
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._numbers = itertools.count(_next_number(current_version(directory)))

    def publish(self, snapshot: Snapshot, leaf: Leaf) -> str:
        """Make ``snapshot`` (bytes that passed validation, ``leaf`` its verdict) the current version: one rename.
        Returns the version's name. Blocking (writes).

        Raises:
            OSError: it could not be written (the current version stays).
        """
        observed = fingerprint(snapshot)
        current = current_version(self.directory)
        if current is not None and version_fingerprint(current) == observed:
            return current
        name = f"..{next(self._numbers)}-{observed}"
        verdict = json.dumps({"fingerprint": observed, "leaf": leaf.fields()}).encode()
        swap_in(self.directory, name, {**dict(zip(NAMES, snapshot.parts, strict=True)), VERDICT_NAME: verdict})
        return name

    def say(self, figures: ReaderFigures) -> None:
        """Replace ``reader.json`` with ``figures`` (one rename). Blocking (a write).

        Raises:
            OSError: it could not be written.
        """
        files = figures.files
        data = {
            "owner": figures.owner,
            "files": [files.certfile, files.keyfile, files.ca_certs, files.crl],
            "error": figures.error,
            "error_path": figures.error_path,
            "error_level": figures.error_level,
            "failures": figures.failures,
            "error_content": figures.error_content,
        }
        path = os.path.join(self.directory, FIGURES_NAME)
        staged = f"{path}.{os.getpid()}"
        if os.path.lexists(staged):
            os.unlink(staged)
        write_private(staged, json.dumps(data).encode())
        os.rename(staged, path)

    def remove(self) -> None:
        """Remove the directory and everything published in it. Idempotent."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _next_number(current: str | None) -> int:
    """The number after the current version's (a reader that replaces another goes on counting)."""
    try:
        return int((current or "..0-").removeprefix("..").split("-", 1)[0]) + 1
    except ValueError:
        return 1


def version_fingerprint(name: str) -> str | None:
    """The fingerprint a version's name carries (:func:`~tlsreload_plugins.files.fingerprint` of its bytes)."""
    _, _, observed = name.partition("-")
    return observed or None


def read_version(directory: str, name: str) -> Version:
    """Read version ``name`` of the publication in ``directory``: its bytes and its verdict.

    Raises:
        InvalidIdentity: it cannot be read whole (removed while being read: a newer one was published), or its
            verdict is not for exactly these bytes.
    """
    root = os.path.join(directory, name)
    present = [os.path.join(root, part) if os.path.lexists(os.path.join(root, part)) else None for part in NAMES]
    if present[0] is None:
        raise InvalidIdentity(f"the published version {root} is gone (a newer one was published)", path=root)
    snapshot = read_files(TLSFiles(present[0], *present[1:]))
    try:
        with open(os.path.join(root, VERDICT_NAME), "rb") as f:
            verdict: Any = json.loads(f.read(FIGURES_BYTES))
        leaf = Leaf.from_fields(verdict["leaf"])
        observed = verdict["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidIdentity(f"the verdict of the published version {root} cannot be read: {e}", path=root) from e
    if observed != fingerprint(snapshot) or version_fingerprint(name) != observed:
        raise InvalidIdentity(f"the verdict of the published version {root} is not for its bytes", path=root)
    return Version(name, snapshot, leaf)


def read_figures(directory: str) -> ReaderFigures | None:
    """The reader's figures in the publication in ``directory``; ``None`` when there are none (yet) or they cannot
    be read."""
    try:
        with open(os.path.join(directory, FIGURES_NAME), "rb") as f:
            data: Any = json.loads(f.read(FIGURES_BYTES))
        certfile, keyfile, ca_certs, crl = data["files"]
        return ReaderFigures(
            str(data["owner"]),
            TLSFiles(certfile, keyfile, ca_certs, crl),
            data["error"],
            data["error_path"],
            int(data["error_level"]),
            int(data["failures"]),
            data.get("error_content"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def reader_gone(figures: ReaderFigures) -> bool:
    """Whether the reader that wrote ``figures`` has gone (killed, crashed): nothing new will be published."""
    return not owner_alive(figures.owner)
