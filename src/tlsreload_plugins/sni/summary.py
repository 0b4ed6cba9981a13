"""What an operator reads about many SNI identities at once: how many, how many served, how many refused,
which expires first. One line in the start-up log, :meth:`SNIIdentities.summary
<tlsreload_plugins.sni.SNIIdentities.summary>`, the aggregate metrics (:func:`tlsreload_plugins.metrics.report_sni`)
and ``tlsreload check DIR`` say it the same way, instead of a line per identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tlsreload_plugins.identity import Leaf

SHOWN = 20
"""Identities named in a summary's line at most (the refused first): a log line stays one line."""


@dataclass(frozen=True)
class Summary:
    """The SNI identities of a server (or of a directory ``tlsreload check`` read), counted.

    Attributes:
        identities: identities found.
        valid: identities served (their files, or their last good certificate, validated).
        refused: identities not served, by name: why (their names get the default identity).
        built: contexts built and kept now (on demand: identities handshakes asked for lately).
        soonest: the served identity whose certificate expires first and when, or ``None``.
    """

    identities: int
    valid: int
    refused: Mapping[str, str] = field(default_factory=dict)
    built: int = 0
    soonest: tuple[str, datetime] | None = None

    def line(self) -> str:
        """``10000 identities, 9998 valid, 2 refused (a, b); the soonest to expire: shop on 2027-01-02``."""
        text = f"{self.identities} identit{'y' if self.identities == 1 else 'ies'}, {self.valid} valid, "
        text += f"{len(self.refused)} refused"
        if self.refused:
            names = sorted(self.refused)
            more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            text += f" ({', '.join(names[:SHOWN])}{more})"
        if self.soonest is not None:
            text += f"; the soonest to expire: {self.soonest[0]} on {self.soonest[1].isoformat()}"
        return text


def soonest(leaves: Iterable[tuple[str, Leaf]]) -> tuple[str, datetime] | None:
    """The name and expiry of the leaf that expires first among ``leaves`` (name, leaf), or ``None``."""
    first: tuple[str, datetime] | None = None
    for name, leaf in leaves:
        if first is None or leaf.not_after < first[1]:
            first = (name, leaf.not_after)
    return first


def summarize(leaves: Mapping[str, Leaf], refused: Mapping[str, str], found: int, built: int = 0) -> Summary:
    """A :class:`Summary` of ``found`` identities of which those in ``leaves`` (name: leaf served) are
    served and those in ``refused`` (name: why) are not."""
    served = {name: leaf for name, leaf in leaves.items() if name not in refused}
    return Summary(found, len(served), dict(refused), built, soonest(served.items()))
