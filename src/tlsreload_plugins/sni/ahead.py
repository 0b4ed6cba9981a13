"""What :class:`~tlsreload_plugins.sni.SNIIdentities` gathers in one pass before it adds identities (at start:
thousands): each one's bytes, read once (its reloader is handed them rather than reading the files again), and
which of them to validate: those the server's last good store keeps neither a verdict nor a refusal for (a
gunicorn arbiter validates every identity before it forks; a spawn server's parent keeps them current). Those
are validated in one batch (:func:`~tlsreload_plugins.validation.apart.prejudged`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, read_files
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.lastgood.last_good import LastGood
from tlsreload_plugins.lastgood.memory_files import RecipeFor
from tlsreload_plugins.lastgood.store import SharedStore


@dataclass
class Ahead:
    """What :func:`read_ahead` found.

    Attributes:
        read: each identity's bytes, by name (those whose files could not be read are left out).
        to_validate: the bytes that neither a verdict nor a refusal kept in the store covers, with the password.
        kept: the identities whose bytes the store keeps, with the leaf of their verdict: nothing to keep again.
    """

    read: dict[str, Snapshot] = field(default_factory=dict)
    to_validate: list[tuple[Snapshot, Password]] = field(default_factory=list)
    kept: dict[str, Leaf] = field(default_factory=dict)


def read_ahead(
    names: Iterable[str],
    found: Mapping[str, TLSFiles],
    trust: tuple[str | None, str | None],
    password: Password,
    store: SharedStore | None,
    recipe_for: RecipeFor,
) -> Ahead:
    """The bytes of each identity of ``names`` (whose files ``found`` gives; ``trust`` the client-CA bundle and
    CRL files they share), and which of them to validate. Blocking (reads files)."""
    ahead = Ahead()
    for name in names:
        files = TLSFiles(found[name].certfile, found[name].keyfile, *trust)
        with contextlib.suppress(InvalidIdentity):
            ahead.read[name] = read_files(files)
    # The verdicts the store keeps for exactly these bytes, in one look at its table (no keeper asked).
    parts = {name: snapshot.parts for name, snapshot in ahead.read.items()}
    ahead.kept = store.verdicts_on(parts) if store is not None and parts else {}
    for name, snapshot in ahead.read.items():
        if name not in ahead.kept and (
            store is None or LastGood(store, recipe_for, name).refusal(snapshot, password) is None
        ):
            ahead.to_validate.append((snapshot, password))
    return ahead
