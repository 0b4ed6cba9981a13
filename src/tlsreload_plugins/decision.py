"""One identity's decision, written once: whether what a look at its files found is served, refused or looked at
again (:class:`Decision`).

The server's :class:`~tlsreload_plugins.reloader.Reloader`, a client's
:class:`~tlsreload_plugins.client.identity.ClientIdentity` and each SNI identity (a ``Reloader`` made on demand)
decide with it. h11's ``ConnectionState`` is the model: plain state, one method that decides
(:meth:`Decision.conclude`), no I/O and no ``ssl``; each kind only acts on what it says (puts a new context in place
for new handshakes, presents one to new connections) and says that in its own words.
"""

from __future__ import annotations

import logging

from tlsreload_plugins.errors import NotServable
from tlsreload_plugins.examine import Examined
from tlsreload_plugins.files import Snapshot, TLSFiles, fingerprint
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome, Record

__all__ = ["Decision", "servable"]


def servable(examined: Examined) -> bool:
    """Whether ``examined`` is new content, valid and built, that nothing changed while it was read: what
    :meth:`Decision.conclude` answers ``RELOADED`` to."""
    return (
        examined.error is None
        and not examined.unchanged
        and not examined.changed_while_building
        and examined.context is not None
        and examined.leaf is not None
        and examined.snapshot is not None
    )


class Decision:
    """What one identity's checks have decided so far: the content served and the last content refused.

    Attributes:
        files: the identity's files (named in what is said).
        record: its counters, callbacks and reports (a refusal settles there: :meth:`Record.failed
            <tlsreload_plugins.outcome.Record.failed>`).
        served: the bytes of the identity served, as they were judged.
        fingerprint: their :func:`~tlsreload_plugins.files.fingerprint`: a look that finds it again is ``UNCHANGED``.
        leaf: the certificate served.
        known_bad: the last content refused (not parsed again while the files hold it), ``None`` since the last
            content accepted.

    Example::

        decision = Decision(files, record, snapshot, leaf)
        outcome = decision.conclude(examine_files(...), now, settle=True)
        if outcome is Outcome.RELOADED:
            ...  # put the new context in place for new handshakes, say so
            decision.accept(examined, now)
    """

    __slots__ = ("files", "fingerprint", "known_bad", "leaf", "record", "served")

    def __init__(self, files: TLSFiles, record: Record, served: Snapshot, leaf: Leaf) -> None:
        self.files: TLSFiles = files
        self.record: Record = record
        self.served: Snapshot = served
        self.fingerprint: str = fingerprint(served)
        self.leaf: Leaf = leaf
        self.known_bad: Examined | None = None

    def conclude(self, examined: Examined, now: float, settle: bool, *, quiet: bool = False) -> Outcome:
        """What ``examined`` means for what is served and said. No I/O: the caller holds its state lock.

        Returns:
            ``FAILED`` (content refused, reported at ERROR when the server cannot serve it, else WARNING, or at DEBUG
            with ``quiet``: another reports it) or ``PENDING`` (refused, not reported until refused on two checks in
            a row, with ``settle``; or changed while it was read); ``UNCHANGED`` (the content served, which is
            usable); ``RELOADED``: new valid content (:func:`servable`), which the caller puts in place and then
            :meth:`accept`-s.
        """
        record = self.record
        record.checks += 1
        error = examined.error
        if error is not None:
            if examined.fingerprint is not None:
                self.known_bad = examined
            level = logging.DEBUG if quiet else logging.ERROR if isinstance(error, NotServable) else logging.WARNING
            return record.failed(f"{examined.fingerprint}:{error}", error, settle, level, self.leaf)
        if examined.unchanged:
            record.succeeded(now, self.leaf, self.files)
            return Outcome.UNCHANGED
        if not servable(examined):
            record.log.debug("%s files changed while being loaded; checking again", record.noun)
            return Outcome.PENDING
        return Outcome.RELOADED

    def accept(self, examined: Examined, now: float) -> Leaf:
        """Make ``examined``'s content (:func:`servable`) the one served, from ``now``: counted, ``on_reload``
        notified. Returns the certificate served until now.

        Raises:
            ValueError: ``examined`` is not servable content.
        """
        if not servable(examined) or examined.snapshot is None or examined.leaf is None:
            raise ValueError("only new, valid content is accepted")
        old = self.leaf
        self.served = examined.snapshot
        self.leaf = examined.leaf
        self.fingerprint = examined.fingerprint or fingerprint(examined.snapshot)
        self.known_bad = None
        self.record.succeeded(now, self.leaf, self.files)
        self.record.reloaded(now, old, self.leaf)
        return old
