"""What :class:`~tlsreload_plugins.sni.SNIIdentities` gathers in one pass before it adds identities (at start:
thousands): each one's bytes, read once (its reloader is handed them rather than reading the files again), to be
validated in one batch (:func:`~tlsreload_plugins.validation.apart.prejudged`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, Stamp, TLSFiles, read_files, stamp


@dataclass
class Ahead:
    """What :func:`read_ahead` found.

    Attributes:
        read: each identity's bytes, by name (those whose files could not be read are left out).
        stamps: each one's :func:`~tlsreload_plugins.files.stamp`, taken before its bytes were read.
    """

    read: dict[str, Snapshot] = field(default_factory=dict)
    stamps: dict[str, Stamp | None] = field(default_factory=dict)


def read_ahead(names: Iterable[str], found: Mapping[str, TLSFiles], trust: tuple[str | None, str | None]) -> Ahead:
    """The bytes of each identity of ``names`` (whose files ``found`` gives; ``trust`` the client-CA bundle and
    CRL files they share), and their stamps. Blocking (reads files)."""
    ahead = Ahead()
    for name in names:
        files = TLSFiles(found[name].certfile, found[name].keyfile, *trust)
        before = stamp(files)
        with contextlib.suppress(InvalidIdentity):
            ahead.read[name] = read_files(files)
            ahead.stamps[name] = before
    return ahead
