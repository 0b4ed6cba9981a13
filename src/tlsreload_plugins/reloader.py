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
import hashlib
import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from .identity import (
    InvalidIdentity,
    Leaf,
    NotServable,
    Password,
    ReloadError,
    Snapshot,
    TLSFiles,
    fingerprint,
    judge_period,
    password_bytes,
    password_file,
    read_files,
    validate,
)
from .lastgood import LastGood

log = logging.getLogger("tlsreload_plugins.reloader")

DEFAULT_INTERVAL = 1.0
"""Seconds between checks. An unchanged check reads two small files and hashes them (about 12
microseconds, see docs/benchmarks.md), so checking every second costs nothing measurable and
a rotation is served within about a second."""

DEFAULT_EXPIRY_WARNING_DAYS = 14.0
"""Warn when the served certificate expires within this many days. cert-manager renews at
two thirds of the lifetime and certbot 30 days ahead: a certificate this close to expiry
means renewal is not reaching the server."""

MIN_INTERVAL = 0.1
"""The shortest check interval accepted: below it a worker would spend its time reading files."""

INTERVAL_ENV = "TLSRELOAD_INTERVAL"
EXPIRY_WARNING_ENV = "TLSRELOAD_EXPIRY_WARNING_DAYS"
PASSWORD_FILE_ENV = "TLSRELOAD_KEY_PASSWORD_FILE"

Recipe = Callable[[], ssl.SSLContext]
SNICallback = Callable[[ssl.SSLObject, str, ssl.SSLContext], "int | None"]
Route = Callable[["str | None"], "ssl.SSLContext | None"]
"""Picks the context for a handshake's server name (``None``: this reloader's own); see :meth:`Reloader.set_route`."""
T = TypeVar("T")
Offload = Callable[[Callable[[], T]], T]
"""Runs a blocking function elsewhere and returns its result (gevent: ``hub.threadpool.apply``)."""


def _number(value: str | float, name: str, unit: str, *, minimum: float = 0.0) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of {unit}, got {value!r}") from None
    if not number >= minimum or number == float("inf"):  # NaN fails the comparison
        raise ValueError(f"{name} must be a number of {unit} >= {minimum:g}, got {value!r}")
    return number


def resolve_interval(interval: float | None = None) -> float:
    """The check interval: ``interval`` if given, else ``$TLSRELOAD_INTERVAL``, else 1 second.

    Raises:
        ValueError: the interval is not a number of seconds >= :data:`MIN_INTERVAL`.
    """
    if interval is not None:
        return _number(interval, "interval", "seconds", minimum=MIN_INTERVAL)
    env = os.environ.get(INTERVAL_ENV)
    if env:
        return _number(env, INTERVAL_ENV, "seconds", minimum=MIN_INTERVAL)
    return DEFAULT_INTERVAL


def resolve_password(password: Password = None) -> Password:
    """The key password: ``password`` if given, else the first line of ``$TLSRELOAD_KEY_PASSWORD_FILE``
    (read again on every reload, as nginx's ``ssl_password_file``), else ``None``."""
    if password is not None:
        return password
    path = os.environ.get(PASSWORD_FILE_ENV)
    return password_file(path) if path else None


def resolve_expiry_warning_days(days: float | None = None) -> float:
    """Days before expiry to warn: ``days`` if given, else ``$TLSRELOAD_EXPIRY_WARNING_DAYS``, else 14."""
    if days is not None:
        return _number(days, "expiry_warning_days", "days")
    env = os.environ.get(EXPIRY_WARNING_ENV)
    if env:
        return _number(env, EXPIRY_WARNING_ENV, "days")
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
    """Content unusable on two checks in a row (or the server cannot be moved onto it): reported, the
    last good identity keeps serving."""


@dataclass(frozen=True)
class Status:
    """A consistent snapshot of a reloader's state, for health checks and metrics."""

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


def build_context(recipe: Recipe, files: TLSFiles | None = None) -> ssl.SSLContext:
    """Call the server's recipe (which reads ``files``, named in errors when given).

    Raises:
        InvalidIdentity: the recipe raised anything (OpenSSL refusing the files, a bug in a user's
            hook): the reason is in the message.
        TypeError: the recipe returned something that is not an :class:`ssl.SSLContext`.
    """
    try:
        context = recipe()
    except Exception as e:
        detail = str(e) if isinstance(e, (ssl.SSLError, OSError)) else f"{type(e).__name__}: {e}"
        source = f" {files.describe()}" if files is not None else ""
        raise InvalidIdentity(f"the SSL context could not be built from the files{source}: {detail}") from e
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"the SSL context recipe returned {type(context).__name__}, not ssl.SSLContext")
    return context


def load_identity(
    files: TLSFiles,
    recipe: Recipe,
    password: Password = None,
    judged: Callable[[Snapshot], Leaf | None] = lambda snapshot: None,
) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
    """Read and validate ``files`` and build a context with ``recipe``: what a reloader requires
    before it serves anything. Start-up checks and ``tlsreload check`` call this so that they
    decide exactly as the reloader does. ``judged(snapshot)`` may give the leaf an earlier
    validation of exactly those bytes found (:meth:`LastGood.judged <tlsreload_plugins.lastgood.LastGood.judged>`),
    which is then not parsed again. Raises :class:`InvalidIdentity` with the reason."""
    snapshot = read_files(files)
    leaf = judged(snapshot) or validate(snapshot, password)
    return snapshot, leaf, build_context(recipe, files)


FIXED_SETTINGS = ("minimum_version", "maximum_version", "verify_mode", "options")
"""Settings of the live context that a connection keeps when it is moved onto a rebuilt context
(OpenSSL's ``SSL_set_SSL_CTX`` moves the certificate, key, CA store, ALPN and ciphers only)."""


def fixed_setting_changes(live: ssl.SSLContext, rebuilt: ssl.SSLContext) -> list[str]:
    """The :data:`FIXED_SETTINGS` in which ``rebuilt`` differs from ``live``, described for a log line."""
    changes = []
    for name in FIXED_SETTINGS:
        before, after = getattr(live, name), getattr(rebuilt, name)
        if before != after:
            changes.append(f"{name} {getattr(after, 'name', after)} (serving {getattr(before, 'name', before)})")
    return changes


@dataclass(frozen=True)
class Examined:
    """What one look at the files found, before anything is decided (see :meth:`Reloader.check`)."""

    fingerprint: str | None
    """Digest of the content read, ``None`` when it could not be read."""
    snapshot: Snapshot | None = None
    unchanged: bool = False
    leaf: Leaf | None = None
    context: ssl.SSLContext | None = None
    error: ReloadError | None = None
    changed_while_building: bool = False
    fixed_changes: tuple[str, ...] = ()
    password: str = ""
    """Digest of the key password the content was judged with: a new password is a new verdict."""


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


_reloaders: weakref.WeakSet[Reloader] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child: give every reloader new ones.
    for reloader in list(_reloaders):
        reloader._lock = threading.Lock()
        reloader._check_lock = threading.Lock()
        reloader._notices = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Reloader:
    """Keeps one server :class:`ssl.SSLContext` serving whatever valid identity is on disk.

    ``recipe`` builds a complete server context from the files, exactly the way the server
    does it (ALPN, ciphers, CA bundle included): each reload calls it again. The constructor
    builds the first context with it, which the server must use: :attr:`context`. If the files
    are not usable at that point, the constructor raises :class:`InvalidIdentity` with one clear
    message. What a rebuilt context can change for new connections: the certificate chain and
    key, the client-CA store, ALPN and the cipher list. Protocol bounds, verify mode and options
    stay those of :attr:`context` (see :data:`FIXED_SETTINGS`); a rebuilt context that differs in
    them is logged as a warning.

    ``on_reload(old_leaf, new_leaf)``, ``on_failure(error)`` and ``on_check(outcome, status)``
    are called after a reload, after each newly reported failure and after every check.
    More can be added later with :meth:`add_callbacks` (metrics, an adapter's hooks);
    exceptions they raise are logged and swallowed.

    ``last_good`` keeps the identity this reloader serves where the server's other processes
    find it (:mod:`tlsreload_plugins.lastgood`): when the files cannot be used at construction, a
    valid identity kept there is served instead (one WARNING says so and why), and the files on
    disk are used as soon as they are usable.

    Safe to use from several threads and across ``fork()`` (the child gets fresh locks).
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
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
        clock: Callable[[], float] = time.time,
        last_good: LastGood | None = None,
    ) -> None:
        self.files = TLSFiles(str(certfile), str(keyfile) if keyfile else None, ca_certs or None)
        self.recipe = recipe
        self.password = resolve_password(password)
        self.interval = resolve_interval(interval)
        self.expiry_warning_days = resolve_expiry_warning_days(expiry_warning_days)
        self._clock = clock
        self._on_reload: list[Callable[[Leaf, Leaf], object]] = []
        self._on_failure: list[Callable[[ReloadError], object]] = []
        self._on_check: list[Callable[[Outcome, Status], object]] = []
        self.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
        # _lock guards the state below and is only ever held for a few assignments: status() never
        # waits for file I/O. _check_lock keeps checks one at a time (the ticker and reload_now).
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()
        # on_reload/on_failure calls decided under the lock, made after it is released: a callback
        # may read status() (metrics do) without deadlocking the check.
        self._notices: list[tuple[list[Callable[..., object]], tuple[Any, ...]]] = []

        self._last_good = last_good
        start_error: InvalidIdentity | None = None
        try:
            judged = last_good.judged if last_good is not None else (lambda snapshot: None)
            snapshot, leaf, live = load_identity(self.files, recipe, self.password, judged)
        except InvalidIdentity as e:
            if last_good is None:
                raise
            start_error = e
            try:
                snapshot, leaf, live = last_good.recall(self.files, self.password, clock())
            except InvalidIdentity as why_not:
                raise InvalidIdentity(f"{e}; {why_not}", path=e.path) from e
        if last_good is not None:
            last_good.remember(snapshot, leaf)
        self.context: ssl.SSLContext = live
        """The context to hand to the server, once, for its whole life."""
        # The newest complete context and the SNI callback its recipe set, swapped as one tuple
        # so a handshake never pairs one context with another's callback.
        self._serving: tuple[ssl.SSLContext, SNICallback | None] = (live, live.sni_callback)
        live.sni_callback = self._on_client_hello
        self._fingerprint = fingerprint(snapshot)
        self._leaf = leaf
        self._settling = Settling()
        self._known_bad: Examined | None = None
        self._fixed_warned: tuple[str, ...] = ()
        self._last_error: str | None = None
        self._last_success = clock()
        self._last_reload: float | None = None
        self._last_expiry_warning: float | None = None
        self._switch_failed_logged = False
        self._route: Route | None = None
        self._checks = self._reloads = self._failures = 0
        self._warn_expiry(self._last_success)
        _reloaders.add(self)
        if start_error is not None:
            self._started_from_last_good(start_error)

    def _started_from_last_good(self, error: InvalidIdentity) -> None:
        log.warning(
            "the TLS files cannot be used (%s); serving the last good certificate this server served "
            "until they can: %s",
            error,
            self._leaf.describe(),
        )
        self._last_error = str(error)
        self._failures = 1
        # The first checks will find the same problem: it has been reported just now.
        examined = self.examine(self._clock())
        if examined.error is not None:
            self._settling.reported = f"{examined.fingerprint}:{examined.error}"
            if examined.fingerprint is not None:
                self._known_bad = examined

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
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

    def set_route(self, route: Route | None) -> None:
        """Consult ``route(server_name)`` first on every handshake: a context it returns serves the
        connection instead of this reloader's newest one (``None`` to stop). It must be quick (it
        runs inside OpenSSL's ClientHello callback) and never raise; :mod:`tlsreload_plugins.sni`
        uses it to serve several identities by server name."""
        self._route = route

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str, live: ssl.SSLContext) -> int | None:
        newest, user_callback = self._serving
        route = self._route
        if route is not None:
            newest = route(server_name) or newest
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

    def _hook_in_place(self) -> bool:
        return self.context.sni_callback == self._on_client_hello

    # -- one check --------------------------------------------------------------------------

    def check(self, *, settle: bool = True, offload: Offload[Examined] | None = None) -> Outcome:
        """Read the files once and act on what is there. Blocking: call it from a thread, not an event loop.

        With ``settle`` (what the drivers use), content that is unusable is only reported
        when the same content was unusable on the previous check too: rotations that write
        the certificate and the key at different moments are not failures. ``settle=False``
        reports at once. ``offload`` runs the blocking part (reading, parsing, building the
        context) elsewhere, as gevent's ``hub.threadpool.apply`` does; the decision is then
        made in the calling thread.

        Never raises: unusable files, a recipe that raises or returns something else, and any
        error nobody foresaw are all reported failures (log line, :attr:`Status.last_error`,
        ``on_failure``). Only a callback's own bug reaches the log as a traceback.
        """
        with self._check_lock:
            now = self._clock()
            examined = offload(lambda: self.examine(now)) if offload is not None else self.examine(now)
            with self._lock:
                outcome = self._conclude(examined, now, settle)
                status = self._status()
                notices, self._notices = self._notices, []
        for callbacks, args in notices:
            self._call(callbacks, *args)
        self._call(self._on_check, outcome, status)
        return outcome

    def examine(self, now: float) -> Examined:
        """The blocking half of :meth:`check`: read, and when the content is new, validate and build.

        Takes no lock the server's threads wait on and changes no state. Never raises.
        """
        try:
            return self._examine(now)
        except Exception as e:  # a bug or an error nobody foresaw: a reported failure, not a dead ticker
            log.debug("unexpected error while checking %s", self.files.describe(), exc_info=True)
            error = NotServable(f"unexpected error while checking {self.files.describe()}: {type(e).__name__}: {e}")
            return Examined(fingerprint=None, error=error)

    def _examine(self, now: float) -> Examined:
        try:
            snapshot = read_files(self.files)
        except InvalidIdentity as e:
            return Examined(fingerprint=None, error=e)
        observed = fingerprint(snapshot)
        if observed == self._fingerprint:
            return Examined(fingerprint=observed, unchanged=True)
        when = datetime.fromtimestamp(now, timezone.utc)
        known = self._known_bad
        password = self._password_digest() if known is not None and known.fingerprint == observed else ""
        if known is not None and known.fingerprint == observed and known.password == password:
            # Known bad content is not parsed again; only a verdict on its dates can change with time.
            if known.leaf is None:
                return known
            try:
                judge_period(known.leaf, self.files, when)
            except InvalidIdentity as e:
                return Examined(fingerprint=observed, leaf=known.leaf, error=e, password=password)
        try:
            leaf = self._judge(snapshot)
        except InvalidIdentity as e:
            return Examined(fingerprint=observed, error=e, password=self._password_digest())
        try:
            judge_period(leaf, self.files, when)
        except InvalidIdentity as e:
            return Examined(fingerprint=observed, leaf=leaf, error=e, password=self._password_digest())
        try:
            context = build_context(self.recipe, self.files)
        except InvalidIdentity as e:
            # Not remembered as bad content: the recipe reads the files again, maybe mid-rotation.
            if fingerprint(read_files(self.files)) != observed:
                return Examined(fingerprint=observed, changed_while_building=True)
            return Examined(fingerprint=None, error=e)
        if context is self.context or context is self._serving[0] or context.sni_callback == self._on_client_hello:
            error = NotServable(
                f"the SSL context recipe for {self.files.certfile} returned a context already in use (does an "
                "ssl_context hook cache its context?): it must build a new one on every call"
            )
            return Examined(fingerprint=observed, error=error)
        # The recipe may have read other bytes than those validated: then try again next check.
        changed = fingerprint(read_files(self.files)) != observed
        changes = tuple(fixed_setting_changes(self.context, context))
        return Examined(
            observed, snapshot, leaf=leaf, context=context, changed_while_building=changed, fixed_changes=changes
        )

    def _judge(self, snapshot: Snapshot) -> Leaf:
        """The leaf of ``snapshot`` if it is a usable identity: the verdict another process of the server
        found for exactly these bytes when the last good store has one (a spawn server's parent validates
        for its workers), else this process's own validation."""
        judged = self._last_good.judged(snapshot) if self._last_good is not None else None
        return judged or validate(snapshot, self.password)

    def _password_digest(self) -> str:
        try:
            secret = password_bytes(self.password)
        except Exception as e:  # an unreadable password file: that is the verdict's input too
            return f"unreadable: {e}"
        return hashlib.sha256(secret or b"").hexdigest()

    def _conclude(self, examined: Examined, now: float, settle: bool) -> Outcome:
        """The deciding half of :meth:`check`: no I/O, called with the state lock held."""
        self._checks += 1
        if not self._hook_in_place():
            error = NotServable(
                f"the server's SSL context no longer calls tlsreload's sni_callback (other code replaced it after "
                f"start): new certificates from {self.files.certfile} cannot be served"
            )
            return self._fail("hook replaced", error, settle=False, level=logging.ERROR)
        if examined.error is not None:
            if examined.fingerprint is not None:
                self._known_bad = examined
            level = logging.ERROR if isinstance(examined.error, NotServable) else logging.WARNING
            return self._fail(f"{examined.fingerprint}:{examined.error}", examined.error, settle, level)
        if examined.unchanged:
            self._succeeded(now)
            return Outcome.UNCHANGED
        if examined.changed_while_building or examined.context is None or examined.leaf is None:
            log.debug("certificate files changed while being loaded; checking again")
            return Outcome.PENDING
        if examined.fixed_changes and examined.fixed_changes != self._fixed_warned:
            self._fixed_warned = examined.fixed_changes
            log.warning(
                "the rebuilt SSL context for %s sets %s; connections keep the settings the server started with "
                "(protocol bounds, verify mode and options are fixed at start: restart to change them)",
                self.files.certfile,
                ", ".join(examined.fixed_changes),
            )
        self._swap(examined.context, examined.leaf, examined.fingerprint or "", now)
        if self._last_good is not None and examined.snapshot is not None:
            # After the state lock is released: a shared store may wait for another process's write.
            self._notices.append(([self._last_good.remember], (examined.snapshot, examined.leaf)))
        return Outcome.RELOADED

    def _swap(self, context: ssl.SSLContext, leaf: Leaf, observed_fingerprint: str, now: float) -> None:
        """Make ``context`` the one new handshakes get. Established connections keep theirs."""
        old = self._leaf
        self._serving = (context, context.sni_callback)
        self._fingerprint = observed_fingerprint
        self._known_bad = None
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
        if self._settling.good():
            log.info("certificate files %s are usable again; serving %s", self.files.describe(), self._leaf.describe())
        self._last_error = None
        self._warn_expiry(now)

    def _fail(self, key: str, error: ReloadError, settle: bool, level: int = logging.WARNING) -> Outcome:
        outcome = self._settling.bad(key, settle)
        if outcome is Outcome.PENDING:
            log.debug("certificate files not usable yet (%s); checking again", error)
        if outcome is not None:
            return outcome
        self._last_error = str(error)
        self._failures += 1
        log.log(
            level,
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

    @property
    def last_good(self) -> LastGood | None:
        """Where this reloader keeps what it serves for the server's other processes, or ``None``."""
        return self._last_good

    @property
    def newest_context(self) -> ssl.SSLContext:
        """The context new handshakes are moved onto (:attr:`context` until the first reload): what a
        dispatcher of its own hands a connection, as Go's ``GetCertificate`` would."""
        return self._serving[0]

    def status(self) -> Status:
        """A consistent snapshot of the counters and the served certificate; never waits for a check's I/O."""
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
