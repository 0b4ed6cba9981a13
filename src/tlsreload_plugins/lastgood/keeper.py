"""The keeper's side of a :class:`~tlsreload_plugins.lastgood.SharedStore` (a spawn server's parent, which keeps the
store current for its workers: :func:`~.last_good.keep_newest_valid`): it waits for the workers'
asks, and numbers its passes in the store's first bytes (:data:`_PASSES`), so that a worker that asked knows when
a pass that began after its ask has completed. (Importable from
:mod:`.store` too, where it was first defined.)
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tlsreload_plugins.lastgood.store import SharedStore

_PASSES = struct.Struct("<QQ")  # the keeper's passes: how many it began, the number of the last one it completed


@dataclass(frozen=True)
class Keeper:
    """The keeper's side of a :class:`~tlsreload_plugins.lastgood.SharedStore`: it waits for asks, and numbers its
    passes."""

    store: SharedStore
    asks: int
    """The read end of the pipe workers ask through."""

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
        """Number a look at every identity: a worker's :meth:`SharedStore.ask
        <tlsreload_plugins.lastgood.store.SharedStore.ask>` waits for the end of one that began after it asked."""
        begun, completed = self.store._passes()
        _PASSES.pack_into(self.store._map, 0, begun + 1, completed)
        try:
            yield
        finally:
            _PASSES.pack_into(self.store._map, 0, begun + 1, begun + 1)
