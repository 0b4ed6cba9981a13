"""What a check decided, and when a problem is reported: :class:`Outcome`, :class:`Status`,
:class:`Settling` and :class:`Record` (the expiry: :mod:`tlsreload_plugins.expiry`).

Plain values and small decisions, no I/O: :class:`~tlsreload_plugins.reloader.Reloader` (and a client's
:class:`~tlsreload_plugins.client.identity.ClientIdentity`) returns an :class:`Outcome` from every check, keeps
what its checks found in a :class:`Record` (handed out as a :class:`Status`), whose :class:`Settling` says whether
a bad content is reported now (:func:`warn_revocation`: when the served CRLs' expiry is, :func:`warn_uncovered`:
which CAs have none,
:func:`warn_unasked`: that no client is asked to meet them).
"""

from __future__ import annotations

import enum
import logging
import ssl
from collections.abc import Callable
from typing import Any, Literal

from tlsreload_plugins.errors import ReloadError
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf


class Outcome(enum.Enum):
    """What one :meth:`Reloader.check` did."""

    UNCHANGED = "unchanged"
    """The files hold what is being served."""
    RELOADED = "reloaded"
    """New valid content: new handshakes now get it."""
    PENDING = "pending"
    """New content that is not usable yet (seen once, or changing while read): tried again next check."""
    FAILED = "failed"
    """Content unusable on two checks in a row (or the server cannot be moved onto it): reported, the
    last good identity keeps serving."""


class Status(FrozenRecord):
    """A consistent snapshot of a reloader's state, for health checks and metrics."""

    _fields = (
        "files",
        "interval",
        "leaf",
        "last_success",
        "last_reload",
        "last_error",
        "checks",
        "reloads",
        "failures",
        "refused_resumptions",
    )
    __slots__ = _fields
    files: TLSFiles
    """The files watched."""
    interval: float
    """Seconds between checks."""
    leaf: Leaf
    """The certificate new handshakes get."""
    last_success: float
    """``time.time()`` of the last check that found a usable identity on disk."""
    last_reload: float | None
    """``time.time()`` of the last reload, or ``None`` before the first."""
    last_error: str | None
    """Why the files on disk are not being served, or ``None`` when they are."""
    checks: int
    """Checks made."""
    reloads: int
    """New certificates put in service."""
    failures: int
    """Failures reported (one per distinct problem, not one per check)."""
    refused_resumptions: int
    """TLS sessions refused because they were resumed across a change of the client-CA bundle or its CRLs, on a
    connection accepted before it (:mod:`tlsreload_plugins.resumption`); each client's next connection makes a full
    handshake against the new trust."""

    def __init__(
        self,
        files: TLSFiles,
        interval: float,
        leaf: Leaf,
        last_success: float,
        last_reload: float | None,
        last_error: str | None,
        checks: int,
        reloads: int,
        failures: int,
        refused_resumptions: int = 0,
    ) -> None:
        self._set(
            files, interval, leaf, last_success, last_reload, last_error, checks, reloads, failures, refused_resumptions
        )


class Settling:
    """When a bad content is reported: once per distinct problem, and (when settling) only after the
    same problem was seen on two checks in a row, so a rotation caught half-written is no failure."""

    def __init__(self) -> None:
        self.pending: str | None = None
        self.reported: str | None = None

    def bad(self, key: str, settle: bool) -> Outcome | None:
        """The outcome of a check that found problem ``key``; ``None`` when it must be reported now."""
        if key == self.reported:
            return Outcome.FAILED
        if settle and key != self.pending:
            self.pending = key
            return Outcome.PENDING
        self.pending = None
        self.reported = key
        return None

    def good(self) -> bool:
        """A check found usable files; ``True`` when that ends a reported problem."""
        was_reported = self.reported is not None
        self.pending = self.reported = None
        return was_reported


Notice = tuple[list[Callable[..., object]], tuple[Any, ...]]
"""Calls decided under a state lock, made after it is released: the callables and their arguments."""


class Record:
    """What the checks of one identity found and what they are to tell: the counters and last error a
    :class:`Status` shows, the :class:`Settling` of failures, the lines a failure and a recovery log (once per
    distinct problem), and the callbacks (``on_reload(old_leaf, new_leaf)``, ``on_failure(error)``,
    ``on_check(outcome, status)``). The calls are decided under the owner's state lock (:meth:`notify`) and made
    once it is released (:meth:`deliver`), so that a callback may read ``status()``.

    ``log``, ``noun`` and ``verb`` word the lines, as in "certificate reload failed, still serving serial ...".
    Held by a :class:`~tlsreload_plugins.reloader.Reloader` and a client's
    :class:`~tlsreload_plugins.client.identity.ClientIdentity`; its state is their state lock's. No I/O.

    Example: ``record = Record(log, "certificate", "serving", time.time())``; in a check,
    ``outcome = record.failed(key, error, settle, logging.WARNING, leaf)``, then ``record.deliver(record.take())``.
    """

    __slots__ = (
        "checks",
        "failures",
        "last_error",
        "last_reload",
        "last_success",
        "log",
        "notices",
        "noun",
        "on_check",
        "on_failure",
        "on_reload",
        "refused_resumptions",
        "reloads",
        "reported_level",
        "settling",
        "verb",
    )

    def __init__(self, log: logging.Logger, noun: str, verb: str, now: float) -> None:
        self.log: logging.Logger = log
        self.noun: str = noun
        self.verb: str = verb
        self.checks: int = 0
        self.reloads: int = 0
        self.failures: int = 0
        self.refused_resumptions: int = 0
        self.last_success: float = now
        self.last_reload: float | None = None
        self.last_error: str | None = None
        self.settling: Settling = Settling()
        self.reported_level: int = logging.WARNING  # the level the failure reported last was logged at
        self.on_reload: list[Callable[[Leaf, Leaf], object]] = []
        self.on_failure: list[Callable[[ReloadError], object]] = []
        self.on_check: list[Callable[[Outcome, Status], object]] = []
        self.notices: list[Notice] = []

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None:
        """Register more callbacks; each kind is called in the order added."""
        if on_reload is not None:
            self.on_reload.append(on_reload)
        if on_failure is not None:
            self.on_failure.append(on_failure)
        if on_check is not None:
            self.on_check.append(on_check)

    def notify(self, callables: list[Callable[..., object]], *args: Any) -> None:
        """Call each of ``callables`` with ``args`` once the state lock is released (a copy of the list is kept)."""
        self.notices.append((list(callables), args))

    def take(self) -> list[Notice]:
        """The calls decided so far, forgotten here: to :meth:`deliver` once the state lock is released."""
        notices, self.notices = self.notices, []
        return notices

    def deliver(self, notices: list[Notice]) -> None:
        """Make the calls ``notices`` hold; one that raises is logged with its traceback, and the others made."""
        for callables, args in notices:
            for callback in callables:
                try:
                    callback(*args)
                except Exception:
                    self.log.exception("tlsreload callback %r raised", callback)

    def succeeded(self, now: float, leaf: Leaf, files: TLSFiles) -> None:
        """A check found ``files`` usable (``leaf``: what is served now); says so once after a reported failure, at
        INFO, or at DEBUG where that failure was logged at DEBUG (its owner said it for others: see :meth:`failed`)."""
        self.last_success = now
        if self.settling.good():
            level = logging.DEBUG if self.reported_level <= logging.DEBUG else logging.INFO
            self.log.log(
                level, "%s files %s are usable again; %s %s", self.noun, files.describe(), self.verb, leaf.describe()
            )
        self.last_error = None

    def failed(self, key: str, error: ReloadError, settle: bool, level: int, leaf: Leaf) -> Outcome:
        """A check found problem ``key`` (``error``), ``leaf`` still served: reported at ``level`` when it settled
        (:meth:`Settling.bad`) and was not reported already, with ``on_failure`` notified. Returns the outcome."""
        outcome = self.settling.bad(key, settle)
        if outcome is Outcome.PENDING:
            self.log.debug("%s files not usable yet (%s); checking again", self.noun, error)
        if outcome is not None:
            return outcome
        self.last_error = str(error)
        self.failures += 1
        self.reported_level = level
        self.log.log(
            level,
            "%s reload failed, still %s serial %s (not after %s): %s",
            self.noun,
            self.verb,
            leaf.serial,
            leaf.not_after.isoformat(),
            error,
        )
        self.notify(self.on_failure, error)
        return Outcome.FAILED

    def reloaded(self, now: float, old: Leaf, new: Leaf) -> None:
        """New content is served from ``now``: counted, and ``on_reload`` notified."""
        self.reloads += 1
        self.last_reload = now
        self.notify(self.on_reload, old, new)

    def refused_resumption(self) -> bool:
        """A session resumed across a change of trust was refused: counted. Whether it is the first (said once)."""
        self.refused_resumptions += 1
        return self.refused_resumptions == 1

    def status(self, files: TLSFiles, interval: float, leaf: Leaf) -> Status:
        """The :class:`Status` of an identity checked every ``interval`` seconds in ``files``, serving ``leaf``."""
        return Status(
            files=files,
            interval=interval,
            leaf=leaf,
            last_success=self.last_success,
            last_reload=self.last_reload,
            last_error=self.last_error,
            checks=self.checks,
            reloads=self.reloads,
            failures=self.failures,
            refused_resumptions=self.refused_resumptions,
        )


CRLWarning = Literal["soon", "passed"]
"""The last warning given about the served CRLs' ``nextUpdate``: it is near, or it has passed."""


def warn_revocation(
    log: logging.Logger, leaf: Leaf, files: TLSFiles, now: float, last: CRLWarning | None
) -> CRLWarning | None:
    """Warn on ``log`` (the reloader's) once that the CRLs served with ``leaf`` near their ``nextUpdate``
    (:meth:`~tlsreload_plugins.revocation.Revocation.warn_at`), and say once, as an error, when it has passed:
    OpenSSL then refuses every client certificate. ``last``: the warning given so far for these CRLs (``None``:
    none). Returns the warning given by now."""
    revocation = leaf.revocation
    warn_at = revocation.warn_at() if revocation is not None else None
    if revocation is None or revocation.next_update is None or warn_at is None or now < warn_at:
        return last
    if now >= revocation.next_update.timestamp():
        if last != "passed":
            log.error(
                "the CRL served from %s passed its nextUpdate at %s and no newer valid one is on disk: every client "
                "certificate is refused (OpenSSL fails closed on an expired CRL) until the CRL is renewed",
                files.crl,
                revocation.next_update.isoformat(),
            )
        return "passed"
    if last is None:
        log.warning(
            "the CRL served from %s needs renewing: its nextUpdate is %s (in %.1f hours), after which every client "
            "certificate is refused, and no newer one is on disk yet",
            files.crl,
            revocation.next_update.isoformat(),
            (revocation.next_update.timestamp() - now) / 3600,
        )
    return "soon"


def warn_unasked(log: logging.Logger, files: TLSFiles, verify_mode: ssl.VerifyMode) -> None:
    """Say on ``log`` that the CRL file of ``files`` refuses nobody when a server context of ``verify_mode`` asks no
    client for a certificate (``CERT_NONE``): the CRL was given to refuse clients, and would silently not."""
    if files.crl and verify_mode == ssl.CERT_NONE:
        log.warning(
            "the CRL file %s refuses nobody: the server asks no client for a certificate (its verify mode is "
            "CERT_NONE); require client certificates signed by %s for the CRL to refuse those it revokes",
            files.crl,
            files.ca_certs,
        )


def warn_uncovered(log: logging.Logger, leaf: Leaf, files: TLSFiles, old: Leaf | None) -> None:
    """Name on ``log`` the CAs of the client-CA bundle that the CRLs served with ``leaf`` do not cover (OpenSSL
    refuses every client certificate they issued): when starting (``old`` is ``None``), and when a reload from
    ``old`` changes which they are."""
    revocation = leaf.revocation
    if revocation is None or not revocation.uncovered:
        return
    if old is not None and old.revocation is not None and old.revocation.uncovered == revocation.uncovered:
        return
    log.warning(
        "the CRL file %s holds no CRL for %d CA(s) of the client-CA bundle %s, whose client certificates are "
        "therefore all refused: %s",
        files.crl,
        len(revocation.uncovered),
        files.ca_certs,
        "; ".join(revocation.uncovered),
    )
