"""Decide and act on one check: changed? valid? swap?

:class:`Reloader` holds the live :class:`ssl.SSLContext` a server was given and, on every
:meth:`Reloader.check`, re-reads the files, and when their content changed and is valid,
puts a freshly built context in its place. It does no waiting and owns no thread: the
drivers in :mod:`tlsreload_plugins.drivers` call ``check`` on an interval.

How the swap works: the server keeps the one context object it was handed. Its
``sni_callback``, which OpenSSL calls on every ClientHello (with or without SNI), moves
the new connection onto the newest complete context (``sslobject.context = newest``).
Each connection therefore sees either the old identity or the new one, never a context
halfway through ``load_cert_chain`` (which, on a live context, fails handshakes made at
that moment).
"""

from __future__ import annotations

import enum
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .identity import (
    InvalidIdentity,
    Leaf,
    Password,
    Snapshot,
    TLSFiles,
    fingerprint,
    read_files,
    validate,
)

log = logging.getLogger("tlsreload_plugins.reloader")

DEFAULT_INTERVAL = 1.0
"""Seconds between checks. An unchanged check reads two small files and hashes them (about 12
microseconds, see docs/benchmarks.md), so checking every second costs nothing measurable and
a rotation is served within about a second."""

DEFAULT_EXPIRY_WARNING_DAYS = 14.0
"""Warn when the served certificate expires within this many days. cert-manager renews at
two thirds of the lifetime and certbot 30 days ahead: a certificate this close to expiry
means renewal is not reaching the server."""

INTERVAL_ENV = "TLSRELOAD_INTERVAL"
EXPIRY_WARNING_ENV = "TLSRELOAD_EXPIRY_WARNING_DAYS"

Recipe = Callable[[], ssl.SSLContext]
SNICallback = Callable[[ssl.SSLObject, str, ssl.SSLContext], "int | None"]


def _number(value: str | float, name: str, unit: str, *, zero_allowed: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of {unit}, got {value!r}") from None
    in_range = number >= 0 if zero_allowed else number > 0
    if not in_range or number == float("inf"):  # NaN fails both comparisons
        kind = "a non-negative" if zero_allowed else "a positive"
        raise ValueError(f"{name} must be {kind} number, got {value!r}")
    return number


def resolve_interval(interval: float | None = None) -> float:
    """The check interval: ``interval`` if given, else ``$TLSRELOAD_INTERVAL``, else 1 second."""
    if interval is not None:
        return _number(interval, "interval", "seconds")
    env = os.environ.get(INTERVAL_ENV)
    if env:
        return _number(env, INTERVAL_ENV, "seconds")
    return DEFAULT_INTERVAL


def resolve_expiry_warning_days(days: float | None = None) -> float:
    """Days before expiry to warn: ``days`` if given, else ``$TLSRELOAD_EXPIRY_WARNING_DAYS``, else 14."""
    if days is not None:
        return _number(days, "expiry_warning_days", "days", zero_allowed=True)
    env = os.environ.get(EXPIRY_WARNING_ENV)
    if env:
        return _number(env, EXPIRY_WARNING_ENV, "days", zero_allowed=True)
    return DEFAULT_EXPIRY_WARNING_DAYS


class Outcome(enum.Enum):
    """What one :meth:`Reloader.check` did."""

    UNCHANGED = "unchanged"
    """The files hold what is being served."""
    RELOADED = "reloaded"
    """New valid content: new handshakes now get it."""
    PENDING = "pending"
    """New content that is not usable yet (seen once, or changing while read): tried again next check."""
    FAILED = "failed"
    """Content unusable on two checks in a row: reported, the last good identity keeps serving."""


@dataclass(frozen=True)
class Status:
    """A consistent snapshot of a reloader's state, for health checks and metrics."""

    files: TLSFiles
    interval: float
    leaf: Leaf
    """The certificate new handshakes get."""
    last_success: float
    """``time.time()`` of the last check that found a usable identity on disk."""
    last_reload: float | None
    last_error: str | None
    """Why the files on disk are not being served, or ``None`` when they are."""
    checks: int
    reloads: int
    failures: int
    """Failures reported (one per distinct problem, not one per check)."""


def build_context(recipe: Recipe) -> ssl.SSLContext:
    """Call the server's recipe; an error loading the files becomes :class:`InvalidIdentity`."""
    try:
        context = recipe()
    except (ssl.SSLError, OSError, ValueError) as e:
        raise InvalidIdentity(f"the SSL context could not be built from the files: {e}") from None
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"the SSL context recipe returned {type(context).__name__}, not ssl.SSLContext")
    return context


def load_identity(files: TLSFiles, recipe: Recipe, password: Password = None) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
    """Read and validate ``files`` and build a context with ``recipe``: what a reloader requires
    before it serves anything. Start-up checks and ``tlsreload check`` call this so that they
    decide exactly as the reloader does. Raises :class:`InvalidIdentity` with the reason."""
    snapshot = read_files(files)
    leaf = validate(snapshot, password)
    return snapshot, leaf, build_context(recipe)


class Reloader:
    """Keeps one server :class:`ssl.SSLContext` serving whatever valid identity is on disk.

    ``recipe`` builds a complete server context from the files, exactly the way the server
    does it (ALPN, protocol bounds, ciphers, verify mode and CA bundle included): each reload
    calls it again, so whatever it sets survives. The constructor builds the first context
    with it, which the server must use: :attr:`context`. If the files are not usable at that
    point, the constructor raises :class:`InvalidIdentity` with one clear message.

    ``on_reload(old_leaf, new_leaf)``, ``on_failure(error)`` and ``on_check(outcome, status)``
    are called after a reload, after each newly reported failure and after every check.
    More can be added later with :meth:`add_callbacks` (metrics, an adapter's hooks);
    exceptions they raise are logged and swallowed.
    """

    def __init__(
        self,
        certfile: str,
        keyfile: str | None = None,
        *,
        recipe: Recipe,
        ca_certs: str | None = None,
        password: Password = None,
        interval: float | None = None,
        expiry_warning_days: float | None = None,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[InvalidIdentity], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None:
        self.files = TLSFiles(str(certfile), str(keyfile) if keyfile else None, ca_certs or None)
        self.recipe = recipe
        self.password = password
        self.interval = resolve_interval(interval)
        self.expiry_warning_days = resolve_expiry_warning_days(expiry_warning_days)
        self._on_reload: list[Callable[[Leaf, Leaf], object]] = []
        self._on_failure: list[Callable[[InvalidIdentity], object]] = []
        self._on_check: list[Callable[[Outcome, Status], object]] = []
        self.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
        self._lock = threading.Lock()
        # on_reload/on_failure calls decided under the lock, made after it is released: a callback
        # may read status() (metrics do) without deadlocking the check.
        self._notices: list[tuple[list[Callable[..., object]], tuple[Any, ...]]] = []

        snapshot, leaf, live = load_identity(self.files, recipe, password)
        self.context: ssl.SSLContext = live
        """The context to hand to the server, once, for its whole life."""
        # The newest complete context and the SNI callback its recipe set, swapped as one tuple
        # so a handshake never pairs one context with another's callback.
        self._serving: tuple[ssl.SSLContext, SNICallback | None] = (live, live.sni_callback)
        live.sni_callback = self._on_client_hello
        self._fingerprint = fingerprint(snapshot)
        self._leaf = leaf
        self._pending_key: str | None = None
        self._reported_key: str | None = None
        self._last_error: str | None = None
        self._last_success = time.time()
        self._last_reload: float | None = None
        self._last_expiry_warning: float | None = None
        self._switch_failed_logged = False
        self._checks = self._reloads = self._failures = 0
        self._warn_expiry(self._last_success)

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[InvalidIdentity], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None:
        """Register more callbacks; each kind is called in the order added."""
        if on_reload is not None:
            self._on_reload.append(on_reload)
        if on_failure is not None:
            self._on_failure.append(on_failure)
        if on_check is not None:
            self._on_check.append(on_check)

    # -- the swap ---------------------------------------------------------------------------

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str, live: ssl.SSLContext) -> int | None:
        newest, user_callback = self._serving
        if newest is not live:
            try:
                conn.context = newest
            except Exception as e:  # an exotic socket wrapper: keep it on the old identity
                if not self._switch_failed_logged:
                    self._switch_failed_logged = True
                    log.error("cannot move a connection onto the new certificate (%s): %r", type(conn).__name__, e)
                newest, user_callback = live, None
        if user_callback is not None:
            return user_callback(conn, server_name, newest)
        return None

    # -- one check --------------------------------------------------------------------------

    def check(self, *, settle: bool = True) -> Outcome:
        """Read the files once and act on what is there.

        With ``settle`` (what the drivers use), content that is unusable is only reported
        when the same content was unusable on the previous check too: rotations that write
        the certificate and the key at different moments are not failures. ``settle=False``
        reports at once.
        """
        with self._lock:
            outcome = self._check(settle)
            status = self._status()
            notices, self._notices = self._notices, []
        for callbacks, args in notices:
            self._call(callbacks, *args)
        self._call(self._on_check, outcome, status)
        return outcome

    def _check(self, settle: bool) -> Outcome:
        now = time.time()
        self._checks += 1
        try:
            snapshot = read_files(self.files)
        except InvalidIdentity as e:
            return self._fail(str(e), e, settle)
        observed = fingerprint(snapshot)
        if observed == self._fingerprint:
            self._succeeded(now)
            return Outcome.UNCHANGED
        try:
            leaf = validate(snapshot, self.password)
            context = build_context(self.recipe)
            changed_while_building = fingerprint(read_files(self.files)) != observed
        except InvalidIdentity as e:
            return self._fail(f"{observed}:{e}", e, settle)
        if changed_while_building:
            # The recipe may have read other bytes than those validated: try again next check.
            log.debug("certificate files changed while being loaded; checking again")
            return Outcome.PENDING
        self._swap(context, leaf, observed, now)
        return Outcome.RELOADED

    def _swap(self, context: ssl.SSLContext, leaf: Leaf, observed_fingerprint: str, now: float) -> None:
        """Make ``context`` the one new handshakes get. Established connections keep theirs."""
        old = self._leaf
        self._serving = (context, context.sni_callback)
        self._fingerprint = observed_fingerprint
        self._leaf = leaf
        self._reloads += 1
        self._last_reload = now
        self._last_expiry_warning = None
        log.info(
            "reloaded TLS certificate from %s: serial %s -> %s; now serving %s",
            self.files.certfile,
            old.serial,
            leaf.serial,
            leaf.describe(),
        )
        self._succeeded(now)
        self._notices.append((self._on_reload, (old, leaf)))

    def _succeeded(self, now: float) -> None:
        self._last_success = now
        self._pending_key = None
        if self._last_error is not None:
            log.info("certificate files %s are usable again; serving %s", self.files.describe(), self._leaf.describe())
            self._last_error = None
            self._reported_key = None
        self._warn_expiry(now)

    def _fail(self, key: str, error: InvalidIdentity, settle: bool) -> Outcome:
        if key == self._reported_key:
            return Outcome.FAILED
        if settle and key != self._pending_key:
            self._pending_key = key
            log.debug("certificate files not usable yet (%s); checking again", error)
            return Outcome.PENDING
        self._pending_key = None
        self._reported_key = key
        self._last_error = str(error)
        self._failures += 1
        log.warning(
            "certificate reload failed, still serving serial %s (not after %s): %s",
            self._leaf.serial,
            self._leaf.not_after.isoformat(),
            error,
        )
        self._notices.append((self._on_failure, (error,)))
        return Outcome.FAILED

    def _warn_expiry(self, now: float) -> None:
        seconds_left = self._leaf.not_after.timestamp() - now
        if seconds_left > self.expiry_warning_days * 86400:
            return
        if self._last_expiry_warning is not None and now - self._last_expiry_warning < 86400:
            return
        self._last_expiry_warning = now
        if seconds_left <= 0:
            log.warning(
                "the served certificate EXPIRED at %s and no newer valid one is on disk: %s",
                self._leaf.not_after.isoformat(),
                self._leaf.describe(),
            )
        else:
            log.warning(
                "the served certificate expires in %.1f days (%s) and no newer one is on disk yet: %s",
                seconds_left / 86400,
                self._leaf.not_after.isoformat(),
                self._leaf.describe(),
            )

    def _call(self, callbacks: list[Callable[..., object]], *args: Any) -> None:
        for callback in callbacks:
            try:
                callback(*args)
            except Exception:
                log.exception("tlsreload callback %r raised", callback)

    # -- reading state ----------------------------------------------------------------------

    @property
    def leaf(self) -> Leaf:
        """The certificate new handshakes get."""
        return self._leaf

    def status(self) -> Status:
        """A consistent snapshot of the counters and the served certificate."""
        with self._lock:
            return self._status()

    def _status(self) -> Status:
        return Status(
            files=self.files,
            interval=self.interval,
            leaf=self._leaf,
            last_success=self._last_success,
            last_reload=self._last_reload,
            last_error=self._last_error,
            checks=self._checks,
            reloads=self._reloads,
            failures=self._failures,
        )

    def describe(self) -> str:
        """One line for the start-up log: what is watched, how often, what is served."""
        return f"watching {self.files.describe()} every {self.interval:g}s; serving {self._leaf.describe()}"
