"""Decide and act on one check: changed? valid? swap?

:class:`Reloader` holds the live :class:`ssl.SSLContext` a server was given and, on every
:meth:`Reloader.check`, re-reads the files, and when their content changed and is valid,
puts a freshly built context in its place. It does no waiting and owns no thread: the
drivers in :mod:`tlsreload_plugins.drivers` call ``check`` on an interval.

How the swap works: the server keeps the one context object it was handed. Its ``wrap_socket``
and ``wrap_bio`` create each new connection on the newest complete context, whose session cache
and ticket keys are its own: no session made before a reload resumes after it (a resumed session
skips verification, so a removed client CA stays out). Each connection therefore sees either the
old identity or the new one, never a context halfway through ``load_cert_chain`` (which, on a live
context, fails handshakes made at that moment). Its ``sni_callback``, which OpenSSL calls on every
ClientHello, routes a connection to an SNI identity's context.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from tlsreload_plugins import identity
from tlsreload_plugins.conclude import _JUDGED_AT_FIRST_CHECK as _JUDGED_AT_FIRST_CHECK
from tlsreload_plugins.conclude import Concluding
from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError

# `X as X`: names that moved out of this module, imported back so `from tlsreload_plugins.reloader import X` works.
from tlsreload_plugins.examine import FIXED_SETTINGS as FIXED_SETTINGS
from tlsreload_plugins.examine import Examined as Examined
from tlsreload_plugins.examine import NotJudged, examine_files, first_identity, first_verdict, new_content
from tlsreload_plugins.examine import Recipe as Recipe
from tlsreload_plugins.examine import build_context as build_context
from tlsreload_plugins.examine import fixed_setting_changes as fixed_setting_changes
from tlsreload_plugins.examine import load_identity as load_identity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, fingerprint, read_files
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.lastgood.last_good import LastGood
from tlsreload_plugins.lastgood.memory_files import RecipeFor
from tlsreload_plugins.outcome import Outcome as Outcome
from tlsreload_plugins.outcome import Settling as Settling
from tlsreload_plugins.outcome import Status as Status
from tlsreload_plugins.outcome import warn_expiry as warn_expiry
from tlsreload_plugins.served import Offload as Offload
from tlsreload_plugins.served import Route as Route
from tlsreload_plugins.served import Served as Served
from tlsreload_plugins.served import SNICallback as SNICallback
from tlsreload_plugins.served import T as T
from tlsreload_plugins.served import _after_fork_in_child as _after_fork_in_child
from tlsreload_plugins.served import _OnDemand as _OnDemand
from tlsreload_plugins.served import _reloaders as _reloaders
from tlsreload_plugins.settings import DEFAULT_EXPIRY_WARNING_DAYS as DEFAULT_EXPIRY_WARNING_DAYS
from tlsreload_plugins.settings import DEFAULT_INTERVAL as DEFAULT_INTERVAL
from tlsreload_plugins.settings import EXPIRY_WARNING_ENV as EXPIRY_WARNING_ENV
from tlsreload_plugins.settings import INTERVAL_ENV as INTERVAL_ENV
from tlsreload_plugins.settings import MIN_INTERVAL as MIN_INTERVAL
from tlsreload_plugins.settings import PASSWORD_FILE_ENV as PASSWORD_FILE_ENV
from tlsreload_plugins.settings import _number as _number
from tlsreload_plugins.settings import resolve_expiry_warning_days as resolve_expiry_warning_days
from tlsreload_plugins.settings import resolve_interval as resolve_interval
from tlsreload_plugins.settings import resolve_password as resolve_password

# What a check validates with: identity.validate's contract, run where validate_apart says (a child process,
# unless this one has loaded cryptography). Under the name the reloader always called (tests count its calls).
from tlsreload_plugins.validation.apart import judge as validate

log = logging.getLogger("tlsreload_plugins.reloader")


class Reloader(Concluding):
    """Keeps one server :class:`ssl.SSLContext` serving whatever valid identity is on disk.

    ``recipe`` builds a complete server context from the files, exactly the way the server does it (ALPN,
    ciphers, CA bundle included): each reload calls it again. The constructor builds the first context with
    it, which the server must use: :attr:`context`. If the files are not usable at that point, the
    constructor raises :class:`InvalidIdentity` with one clear message. What a rebuilt context can change for
    new connections: the certificate chain and key, the client-CA store, ALPN and the cipher list. Protocol
    bounds, verify mode and options stay those of :attr:`context` (see :data:`FIXED_SETTINGS`); a rebuilt
    context that differs in them is logged as a warning.

    ``on_reload(old_leaf, new_leaf)``, ``on_failure(error)`` and ``on_check(outcome, status)`` are called
    after a reload, after each newly reported failure and after every check. More can be added later with
    :meth:`add_callbacks` (metrics, an adapter's hooks); exceptions they raise are logged and swallowed.

    ``last_good`` keeps the identity this reloader serves where the server's other processes find it
    (:mod:`tlsreload_plugins.lastgood.last_good`): when the files cannot be used at construction, a valid identity kept
    there is served instead (one WARNING says so and why), and the files on disk are used as soon as they are
    usable. The verdicts (and refusals) found for the files' bytes are kept there too, for the others to take.

    ``on_demand`` (``recipe`` aimed at other files) makes a reloader that builds no context until a handshake
    needs one: validated files are only described (:attr:`leaf`) and their bytes kept; the first
    :attr:`newest_context` builds the context from them, :meth:`release_context` forgets it. For identities
    that may never be asked for (:mod:`tlsreload_plugins.sni.identities`); such a reloader does not keep its first
    identity in ``last_good`` (its owner keeps many at once) and has no :attr:`context` to hand to a server;
    ``read``, the files' bytes its owner has just read (it reads thousands at once), are not read again; with
    ``judged``, the leaf its owner found ``last_good`` keeping for exactly those bytes, nor looked up again.

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
        on_demand: RecipeFor | None = None,
        read: Snapshot | None = None,
        judged: Leaf | None = None,
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
        # _lock guards the state below, held for a few assignments only: status() never waits for file I/O.
        # _check_lock keeps checks one at a time (the ticker and reload_now).
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()
        # on_reload/on_failure calls decided under the lock, made after it is released: a callback
        # may read status() (metrics do) without deadlocking the check.
        self._notices: list[tuple[list[Callable[..., object]], tuple[Any, ...]]] = []

        self._last_good = last_good
        # At most 29 attributes in all: CPython shares one key table among instances of up to 30, and an
        # SNI server holds thousands of reloaders (330 bytes each, not 1.6 KiB).
        # The context handed to the server, or what an on_demand reloader builds its contexts from.
        demand = _OnDemand(on_demand) if on_demand is not None else None
        self._origin: ssl.SSLContext | _OnDemand | None = demand
        # The newest complete context and the SNI callback its recipe set, swapped as one tuple
        # so a handshake never pairs one context with another's callback. (None, None): not built yet.
        self._serving: tuple[ssl.SSLContext | None, SNICallback | None] = (None, None)
        if demand is not None and read is not None and judged is not None and last_good is not None:
            snapshot, leaf, start_error = read, judged, None  # the verdict kept for them, as first_verdict takes it
            demand.validated = snapshot
        elif demand is not None:
            snapshot, leaf, start_error = first_verdict(self.files, self.password, last_good, clock, read)
            demand.validated = snapshot
        else:
            snapshot, leaf, live, start_error = first_identity(self.files, recipe, self.password, last_good, clock)
            self._origin = live
            self._serving = (live, live.sni_callback)
            live.sni_callback = self._on_client_hello
            self._created_on_newest(live, snapshot)
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
        served = f"serving the last good certificate this server served until they can: {self._leaf.describe()}"
        if isinstance(error, NotJudged):  # judged by the first check, which reports a refusal at once
            log.info("%s; %s", error, served)
            self._known_bad = _JUDGED_AT_FIRST_CHECK
            return
        log.warning("the TLS files cannot be used (%s); %s", error, served)
        self._last_error = str(error)
        self._failures = 1
        # The first checks will find the same problem: it has been reported just now.
        examined = self.examine(self._clock())
        if examined.error is not None:
            self._settling.reported = f"{examined.fingerprint}:{examined.error}"
            if examined.fingerprint is not None:
                self._known_bad = examined
            if examined.refused is not None and self._last_good is not None:  # for the server's other processes
                self._last_good.store.refuse(self._last_good.name, examined.content_key, examined.refused)

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

    # -- one check --------------------------------------------------------------------------

    def check(self, *, settle: bool = True, offload: Offload[Examined] | None = None) -> Outcome:
        """Read the files once and act on what is there. Blocking: call it from a thread, not an event loop.

        With ``settle`` (what the drivers use), content that is unusable is only reported when the same content
        was unusable on the previous check too: rotations that write the certificate and the key at different
        moments are not failures. ``settle=False`` reports at once. ``offload`` runs the blocking part (reading,
        parsing, building the context) elsewhere, as gevent's ``hub.threadpool.apply`` does; the decision is
        then made in the calling thread.

        Never raises: unusable files, a recipe that raises or returns something else, and any error nobody
        foresaw are all reported failures (log line, :attr:`Status.last_error`, ``on_failure``). Only a
        callback's own bug reaches the log as a traceback.
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

    def sweep(self, offload: Offload[Examined] | None = None) -> Outcome:
        """:meth:`check` at the cost of a read and a hash when nothing changed: when the files hold exactly
        the content served, nothing is pending, no ``on_check`` callback listens and nothing is ``offload``-ed,
        only the counters, the last success and the expiry warning are renewed (UNCHANGED); otherwise a full
        :meth:`check`. For the SNI identities' safety-net sweep. Blocking; never raises."""
        if offload is not None or self._on_check or self._last_error is not None or self._known_bad is not None:
            return self.check(offload=offload)  # (offload: gevent, where even a read must leave the hub)
        try:
            same = fingerprint(read_files(self.files)) == self._fingerprint
        except Exception:  # unreadable now: the full check reports it
            same = False
        if not same:
            return self.check(offload=offload)
        with self._lock:
            now = self._clock()
            self._checks += 1
            self._last_success = now
            self._warn_expiry(now)
        return Outcome.UNCHANGED

    def examine(self, now: float) -> Examined:
        """The blocking half of :meth:`check`: read, and when the content is new, validate and build.

        Takes no lock the server's threads wait on and changes no state. Never raises.
        """
        try:
            return examine_files(
                self.files,
                self.recipe,
                self.password,
                now,
                served=self._fingerprint,
                known_bad=self._known_bad,
                judge=self._judge,
                live=self._live,
                in_use=self._in_use,
            )
        except Exception as e:  # a bug or an error nobody foresaw: a reported failure, not a dead ticker
            log.debug("unexpected error while checking %s", self.files.describe(), exc_info=True)
            error = NotServable(f"unexpected error while checking {self.files.describe()}: {type(e).__name__}: {e}")
            return Examined(fingerprint=None, error=error)

    def _judge(self, snapshot: Snapshot) -> Leaf:
        """The leaf of ``snapshot`` if it is a usable identity: the verdict another process of the server found
        for exactly these bytes when the last good store has one (a spawn server's parent validates for its
        workers), else the refusal kept there for them, else this process's own validation (validate_apart)."""
        if self._last_good is not None:
            judged, refused = self._last_good.verdict_for(snapshot)
            if judged is not None:
                return judged
            if refused:  # by the keeper (a spawn server's parent): judged here, as test_footprint and test_lastgood
                # assert (such a worker loads cryptography). Moving this apart too is left open (issue 25, part 2).
                return identity.validate(snapshot, self.password)
            kept = self._last_good.refusal(snapshot, self.password)
            if kept is not None:
                raise kept
        return validate(snapshot, self.password)

    def new_content(self) -> Snapshot | None:
        """What the files hold when a check would validate it, else ``None``
        (:func:`~tlsreload_plugins.examine.new_content`). Blocking (reads); changes nothing."""
        return new_content(self.files, self._fingerprint, self._known_bad)

    def _call(self, callbacks: list[Callable[..., object]], *args: Any) -> None:
        for callback in callbacks:
            try:
                callback(*args)
            except Exception:
                log.exception("tlsreload callback %r raised", callback)
