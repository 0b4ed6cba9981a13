"""What :class:`~tlsreload_plugins.sni.SNIIdentities` gathers in one pass before it adds identities (at start:
thousands): each one's bytes, read once (its reloader is handed them rather than reading the files again), and
which of them to validate: those the server's last good store keeps neither a verdict nor a refusal for (a
gunicorn arbiter validates every identity before it forks; a spawn server's parent keeps them current, and is
asked about renewals a check found: :func:`judged`). Those are validated in one batch
(:func:`~tlsreload_plugins.validation.apart.prejudged`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, read_files
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.lastgood.last_good import LastGood
from tlsreload_plugins.lastgood.store import SharedStore
from tlsreload_plugins.memory_files import RecipeFor


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
    ahead.kept, ahead.to_validate = judged(ahead.read, password, store, recipe_for)
    return ahead


def judged(
    read: Mapping[str, Snapshot],
    password: Password,
    store: SharedStore | None,
    recipe_for: RecipeFor,
    *,
    ask: bool = False,
) -> tuple[dict[str, Leaf], list[tuple[Snapshot, Password]]]:
    """Of the identities ``read`` (name: bytes), the leaf of each one whose bytes the store keeps a verdict for
    (found in one look at its table), and the bytes, with ``password``, that neither a verdict nor a refusal kept in
    the store covers: those to validate. ``ask``: ask the store's keeper (a spawn server's parent) about those once,
    and wait for its look, before they are counted (:meth:`~tlsreload_plugins.lastgood.store.SharedStore.ask`):
    a renewal is then validated once for all of the server's workers, in the keeper's child, not in one child per
    worker. Blocking when it asks.

    Example: ``kept, to_validate = judged({"api": read_files(files)}, None, store, recipe_for, ask=True)``.
    """
    if store is None:
        return {}, [(snapshot, password) for snapshot in read.values()]
    kept = store.verdicts_on({name: snapshot.parts for name, snapshot in read.items()}) if read else {}
    left = _not_judged(read, kept, password, store, recipe_for)
    if ask and left and store.ask(names=left):
        kept |= store.verdicts_on({name: read[name].parts for name in left})
        left = _not_judged(read, kept, password, store, recipe_for)
    return kept, [(read[name], password) for name in left]


def _not_judged(
    read: Mapping[str, Snapshot],
    kept: Mapping[str, Leaf],
    password: Password,
    store: SharedStore,
    recipe_for: RecipeFor,
) -> list[str]:
    """The names of ``read`` neither ``kept`` (verdicts) nor a refusal kept in ``store`` covers."""
    return [
        name
        for name, snapshot in read.items()
        if name not in kept and LastGood(store, recipe_for, name).refusal(snapshot, password) is None
    ]
