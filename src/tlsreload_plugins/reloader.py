"""Keep one server :class:`ssl.SSLContext` serving whatever valid identity is on disk: :class:`Reloader`.

On every :meth:`Reloader.check`, a reloader re-reads the files, and when their content changed and is valid,
puts a freshly built context in its place. It does no waiting and owns no thread: the drivers in
:mod:`tlsreload_plugins.drivers` call ``check`` on an interval.

How the swap works: the server keeps the one context object it was handed. Its ``wrap_socket``
and ``wrap_bio`` create each new connection on the newest complete context, whose session cache
and ticket keys are its own: no session made before a reload resumes after it (a resumed session
skips verification, so a removed client CA stays out). Each connection therefore sees either the
old identity or the new one, never a context halfway through ``load_cert_chain`` (which, on a live
context, fails handshakes made at that moment). Its ``sni_callback``, which OpenSSL calls on every
ClientHello, routes a connection to an SNI identity's context.

Also the reloaders' fork safety: a child gets fresh locks.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from tlsreload_plugins.decision import Decision
from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError
from tlsreload_plugins.examine import (
    Examined,
    Recipe,
    build_context,
    examine_files,
    first_leaf,
    load_identity,
    new_content,
)
from tlsreload_plugins.expiry import ExpiryNotice, warn_expiry
from tlsreload_plugins.files import (
    Password,
    Snapshot,
    Stamp,
    TLSFiles,
    fingerprint,
    identity_hash,
    read_files,
    stamp,
)
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.memory_files import RecipeFor, context_from
from tlsreload_plugins.outcome import (
    CRLWarning,
    Outcome,
    Record,
    Status,
    warn_revocation,
    warn_unasked,
    warn_uncovered,
)
from tlsreload_plugins.publication.subscription import Subscription
from tlsreload_plugins.resumption import check_handshakes, refuse_if_resumed
from tlsreload_plugins.settings import resolve_crl, resolve_expiry_warning_days, resolve_interval, resolve_password

# build_context and load_identity: docs/core.md documents them under this module, for start-up checks of one's own.
__all__ = [
    "OnDemand",
    "Offload",
    "Reloader",
    "Route",
    "SNICallback",
    "build_context",
    "create_connections_on",
    "load_identity",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.reloader")

SNICallback = Callable[[ssl.SSLObject, str, ssl.SSLContext], "int | None"]
Route = Callable[["str | None"], "ssl.SSLContext | None"]
"""Picks the context for a handshake's server name (``None``: this reloader's own); see :meth:`Reloader.set_route`."""
T = TypeVar("T")
Offload = Callable[[Callable[[], T]], T]
"""Runs a blocking function elsewhere and returns its result (gevent: ``hub.threadpool.apply``)."""


def create_connections_on(context: ssl.SSLContext, newest: Callable[[], ssl.SSLContext]) -> None:
    """Have ``context`` create each new connection on ``newest()``: its ``wrap_socket`` and ``wrap_bio`` (how every
    server creates its connections: threads, asyncio, uvloop, trio, gevent) become this instance's own.

    A connection resumes sessions from the session cache and ticket keys of the context it was created on, whatever
    context its ClientHello moves it to; so a context that changes what it trusts must be a new one that new
    connections are created on, or sessions made under the old trust resume. ``newest()`` runs once per
    connection: it must be quick and never block.

    Args:
        context: the context the server was handed (it keeps it for its whole life).
        newest: returns the context to create the next connection on (``context`` itself is fine).

    Example::

        current = [build()]
        create_connections_on(server_context, lambda: current[0])
    """

    def wrap_socket(sock: Any, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        target = newest()
        return type(target).wrap_socket(target, sock, *args, **kwargs)

    def wrap_bio(incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        target = newest()
        return type(target).wrap_bio(target, incoming, outgoing, *args, **kwargs)

    context.wrap_socket = wrap_socket  # type: ignore[method-assign]
    context.wrap_bio = wrap_bio  # type: ignore[method-assign]


_reloaders: weakref.WeakSet[Reloader] = weakref.WeakSet()
_trust_of: weakref.WeakKeyDictionary[ssl.SSLContext, bytes | None] = weakref.WeakKeyDictionary()
"""The trust (client-CA and CRL bytes: :attr:`Snapshot.trust <tlsreload_plugins.files.Snapshot.trust>`) each context a
reloader created connections on was built with: a connection created on a context whose trust is no longer the newest
one's (a straddler) is refused if it resumes a session (see ``Reloader._on_client_hello``)."""


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child: give every reloader new ones.
    for reloader in list(_reloaders):
        reloader._lock = threading.Lock()
        reloader._check_lock = threading.Lock()
        demand = reloader._demand
        if demand is not None:
            demand.lock = threading.Lock()
        reloader._record.take()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class OnDemand:
    """How a reloader that builds no context until a handshake needs one (``Reloader(on_demand=)``) builds it, and
    what its owner has already read: for identities that may never be asked for
    (:mod:`tlsreload_plugins.sni.identities`, thousands read at once).

    Args:
        recipe_for: the server's recipe, aimed at other paths (those of the validated bytes, in memory files).
        read: the files' bytes its owner has just read: the reloader does not read them again at construction.
        stamp: the files' :func:`~tlsreload_plugins.files.stamp`, taken just before ``read``: spares
            :meth:`Reloader.sweep` reading them once more to vouch for them.
        shares_trust: its client-CA bundle and CRL are its owner's, which reports what concerns them once for all
            its identities: the reloader logs at DEBUG a reload that changed only them, a failure naming one of them
            and the end of that failure, and warns of no CA without a CRL nor of the CRL's ``nextUpdate``; its
            :meth:`Reloader.status` (and metrics) count those failures and reloads still.

    Attributes:
        lock: one build at a time: a second handshake waits for the first's.
        identity_hash: with ``shares_trust``: :func:`~tlsreload_plugins.files.identity_hash` of the bytes served, to
            tell a reload that changed the shared trust alone (``None``: no trust shared, nothing to tell).

    Example: ``Reloader(certfile, keyfile, recipe=recipe, on_demand=OnDemand(recipe_for, shares_trust=True))``.
    """

    __slots__ = ("identity_hash", "lock", "read", "recipe_for", "shares_trust", "stamp")

    def __init__(
        self,
        recipe_for: RecipeFor,
        *,
        read: Snapshot | None = None,
        stamp: Stamp | None = None,
        shares_trust: bool = False,
    ) -> None:
        self.recipe_for: RecipeFor = recipe_for
        self.read: Snapshot | None = read
        self.stamp: Stamp | None = stamp
        self.shares_trust: bool = shares_trust
        self.lock: threading.Lock = threading.Lock()
        self.identity_hash: int | None = None


class Reloader:
    """Keeps one server :class:`ssl.SSLContext` serving whatever valid identity is on disk.

    ``recipe`` builds a complete server context from the files, exactly the way the server does it (ALPN,
    ciphers, CA bundle included): each reload calls it again. The constructor builds the first context with
    it, which the server must use: :attr:`context`. If the files are not usable at that point, the
    constructor raises :class:`InvalidIdentity` with one clear message. What a rebuilt context can change for
    new connections: the certificate chain and key, the client-CA store, ALPN and the cipher list. Protocol
    bounds, verify mode and options stay those of :attr:`context` (see
    :data:`~tlsreload_plugins.examine.FIXED_SETTINGS`); a rebuilt context that differs in them is logged as a
    warning.

    ``crl`` (else ``$TLSRELOAD_CRL``): a PEM file of certificate revocation lists for the CAs of ``ca_certs``, read
    and validated with the other files (:func:`~tlsreload_plugins.revocation.judge_crls`), so that a bundle and its
    CRLs written together are one change; every context built checks client certificates against the CRLs validated
    (:func:`~tlsreload_plugins.revocation.check_revocation`). A CA of the bundle without a CRL is named at start
    (OpenSSL refuses the clients it issued), a warning comes ahead of the served CRLs' ``nextUpdate``, and an error
    once it has passed (OpenSSL then refuses every client certificate); a CRL that refuses nobody, the server's
    context asking no client for a certificate (``CERT_NONE``), is named at the first check.

    ``on_reload(old_leaf, new_leaf)``, ``on_failure(error)`` and ``on_check(outcome, status)`` are called
    after a reload, after each newly reported failure and after every check. More can be added later with
    :meth:`add_callbacks` (metrics, an adapter's hooks); exceptions they raise are logged and swallowed.

    ``on_demand`` (an :class:`OnDemand`, or just the recipe aimed at other files) makes a reloader that builds no
    context until a handshake needs one: validated files are only described (:attr:`leaf`) and their bytes kept; the
    first :attr:`newest_context` builds the context from them, :meth:`release_context` forgets it. A reload keeps the
    context it built (its owner releases it in turn). For identities that may never be asked for
    (:mod:`tlsreload_plugins.sni.identities`); such a reloader has no :attr:`context` to hand to a server.

    ``last_good``: the identity this process judged at start (its bytes, their leaf and a context built from them by
    the server's recipe), served when what the files hold cannot be used at construction (one WARNING says so and
    why) until they can: a server of one process whose files broke between its start-up check and its serving.

    ``subscription``: the server has a reader (:mod:`tlsreload_plugins.publication`), and this reloader, in one of its
    serving processes, reads what the reader published instead of the files (which it only names): it opens none of
    them and validates nothing, and the reader's refusal of the files is its failure too. When what the files hold
    cannot be used at construction, the newest identity the reader published is served instead (one WARNING says so
    and why), and the reader's next publication as soon as there is one.

    ``logger``: where its lines go (default ``tlsreload_plugins.reloader``).

    Safe to use from several threads and across ``fork()`` (the child gets fresh locks).
    """

    def __init__(
        self,
        certfile: str,
        keyfile: str | None = None,
        *,
        recipe: Recipe,
        ca_certs: str | None = None,
        crl: str | None = None,
        password: Password = None,
        interval: float | None = None,
        expiry_warning_days: float | None = None,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
        clock: Callable[[], float] = time.time,
        on_demand: OnDemand | RecipeFor | None = None,
        last_good: tuple[Snapshot, Leaf, ssl.SSLContext] | None = None,
        subscription: Subscription | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        crl = resolve_crl(crl)
        if crl and not ca_certs:
            raise ValueError(f"a CRL ({crl}) needs the client-CA bundle it revokes certificates of: ca_certs")
        self.files: TLSFiles = TLSFiles(str(certfile), str(keyfile) if keyfile else None, ca_certs or None, crl or None)
        self.recipe: Recipe = recipe
        self.password: Password = resolve_password(password)
        self.interval: float = resolve_interval(interval)
        self.expiry_warning_days: float | None = resolve_expiry_warning_days(expiry_warning_days)
        self._clock = clock
        # What the checks found, and the callbacks: calls decided under _lock, made after it is released (a
        # callback may read status(), as metrics do, without deadlocking the check).
        self._record = Record(logger or log, "certificate", "serving", clock())
        self._record.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
        # _lock guards the state below, held for a few assignments only: status() never waits for file I/O.
        # _check_lock keeps checks one at a time (the ticker and reload_now).
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()

        self._subscription = subscription
        # At most 29 attributes in all: CPython shares one key table among instances of up to 30, and an
        # SNI server holds thousands of reloaders (a shared key table keeps each instance's dict small).
        # The context handed to the server, or what an on_demand reloader builds its contexts from.
        demand = on_demand if isinstance(on_demand, OnDemand) or on_demand is None else OnDemand(on_demand)
        self._origin: ssl.SSLContext | OnDemand | None = demand
        # The newest complete context and the SNI callback its recipe set, swapped as one tuple
        # so a handshake never pairs one context with another's callback. (None, None): not built yet.
        self._serving: tuple[ssl.SSLContext | None, SNICallback | None] = (None, None)
        start_error: InvalidIdentity | None = None
        if demand is not None:
            snapshot, leaf = first_leaf(self.files, self.password, demand.read)
        else:
            if subscription is not None:
                snapshot, leaf, live, start_error = subscription.first(self.files, clock())
            else:
                try:
                    snapshot, leaf, live = load_identity(self.files, recipe, self.password)
                except InvalidIdentity as e:
                    if last_good is None:
                        raise
                    (snapshot, leaf, live), start_error = last_good, e
            self._origin = live
            self._serving = (live, live.sni_callback)
            live.sni_callback = self._on_client_hello
            self._created_on_newest(live, snapshot)
        # What the owner read is not kept twice (the decision holds what is served); its stamp vouches for the
        # files at the first sweep.
        self._stamp = demand.stamp if demand is not None and demand.read is not None else None
        if demand is not None:
            demand.read = demand.stamp = None
        if demand is not None and demand.shares_trust:
            demand.identity_hash = identity_hash(snapshot)
        self._decision = Decision(self.files, self._record, snapshot, leaf)
        self._fixed_warned: tuple[str, ...] = ()
        self._record.last_success = clock()
        # When the expiry warning was last given, and the last CRL warning given for the CRLs served.
        self._warned: tuple[ExpiryNotice | None, CRLWarning | None] = (None, None)
        self._switch_failed_logged = False
        self._route: Route | None = None
        self._warn_expiry(self._record.last_success)
        if self._reports_trust:
            warn_uncovered(self._record.log, leaf, self.files, None)
        _reloaders.add(self)
        if start_error is not None:
            self._started_from_last_good(start_error)

    def _started_from_last_good(self, error: InvalidIdentity) -> None:
        served = f"serving the last good certificate this server served until they can: {self.leaf.describe()}"
        self._record.log.warning("the TLS files cannot be used (%s); %s", error, served)
        self._record.last_error = str(error)
        self._record.failures = 1
        # The first checks will find the same problem: it has been reported just now.
        examined = self.examine(self._clock())
        if examined.error is not None:
            self._record.settling.reported = f"{examined.fingerprint}:{examined.error}"
            if examined.fingerprint is not None:
                self._decision.known_bad = examined

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None:
        """Register more callbacks; each kind is called in the order added."""
        self._record.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)

    def set_route(self, route: Route | None) -> None:
        """Consult ``route(server_name)`` first on every handshake: a context it returns serves the
        connection instead of this reloader's newest one (``None`` to stop). It must be quick (it
        runs inside OpenSSL's ClientHello callback) and never raise; :mod:`tlsreload_plugins.sni.identities`
        uses it to serve several identities by server name."""
        self._route = route

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
                self._record.notify(self._record.on_check, outcome, self._status())
                notices = self._record.take()
        self._record.deliver(notices)
        return outcome

    def sweep(self, offload: Offload[Examined] | None = None) -> Outcome:
        """:meth:`check` at the cost of a ``stat`` per file when nothing changed: when the files hold exactly
        the content served, nothing is pending, no ``on_check`` callback listens and nothing is ``offload``-ed,
        only the counters, the last success and the expiry warning are renewed (UNCHANGED); otherwise a full
        :meth:`check`. The files are read and hashed only when their :func:`~tlsreload_plugins.files.stamp` is not
        the one they had when last found to hold what is served. For the SNI identities' safety-net sweep.
        Blocking; never raises."""
        record = self._record
        decision = self._decision
        if offload is not None or record.on_check or record.last_error is not None or decision.known_bad is not None:
            return self.check(offload=offload)  # (offload: gevent, where even a read must leave the hub)
        now_stamp = stamp(self.files)  # before the read: a change after it is a new stamp next time
        if now_stamp is None or now_stamp != self._stamp:
            try:
                same = fingerprint(read_files(self.files)) == decision.fingerprint
            except Exception:  # unreadable now: the full check reports it
                same = False
            if not same:
                return self.check(offload=offload)
            self._stamp = now_stamp
        with self._lock:
            now = self._clock()
            record.checks += 1
            record.last_success = now
            self._warn_expiry(now)
        return Outcome.UNCHANGED

    def examine(self, now: float) -> Examined:
        """The blocking half of :meth:`check`: read, and when the content is new, validate and build.

        Takes no lock the server's threads wait on and changes no state. Never raises.
        """
        try:
            if self._subscription is not None:
                return self._subscription.examine(
                    self.files, now, served=self._decision.fingerprint, live=self._live, in_use=self._in_use
                )
            return examine_files(
                self.files,
                self.recipe,
                self.password,
                now,
                served=self._decision.fingerprint,
                known_bad=self._decision.known_bad,
                live=self._live,
                in_use=self._in_use,
            )
        except Exception as e:  # a bug or an error nobody foresaw: a reported failure, not a dead ticker
            self._record.log.debug("unexpected error while checking %s", self.files.describe(), exc_info=True)
            error = NotServable(f"unexpected error while checking {self.files.describe()}: {type(e).__name__}: {e}")
            return Examined(fingerprint=None, error=error)

    def _conclude(self, examined: Examined, now: float, settle: bool) -> Outcome:
        """The deciding half of :meth:`check`: the identity's :class:`~tlsreload_plugins.decision.Decision` on
        ``examined``, acted on (new handshakes swapped onto the new context) and said in a server's words. No I/O:
        called with the state lock held; what callbacks are to do is left in the record's notices, for after it."""
        live = self._live
        if self._record.checks == 0 and live is not None:
            # At the first check, not at start: a server may set its verify mode once the context is built
            # (cheroot's adapter is made, then its context told to require client certificates).
            warn_unasked(self._record.log, self.files, live.verify_mode)
        if not self._hook_in_place():
            self._record.checks += 1
            replaced = NotServable(
                f"the server's SSL context no longer calls tlsreload's sni_callback (other code replaced it after "
                f"start): new certificates from {self.files.certfile} cannot be served"
            )
            return self._record.failed("hook replaced", replaced, False, logging.ERROR, self.leaf)
        error = examined.error
        quiet = error is not None and not self._reports_trust and self._names_trust(error)  # its owner says it
        outcome = self._decision.conclude(examined, now, settle, quiet=quiet)
        if outcome is Outcome.UNCHANGED:
            self._warn_expiry(now)
        if (
            outcome is not Outcome.RELOADED
            or examined.context is None
            or examined.snapshot is None
            or examined.leaf is None
        ):
            return outcome
        if examined.fixed_changes and examined.fixed_changes != self._fixed_warned:
            self._fixed_warned = examined.fixed_changes
            self._record.log.warning(
                "the rebuilt SSL context for %s sets %s; connections keep the settings the server started with "
                "(protocol bounds, verify mode and options are fixed at start: restart to change them)",
                self.files.certfile,
                ", ".join(examined.fixed_changes),
            )
        level = logging.INFO
        demand = self._demand
        if demand is not None and demand.shares_trust:
            served = identity_hash(examined.snapshot)
            if served is not None and served == demand.identity_hash:
                level = logging.DEBUG  # the shared trust alone changed: its owner says so
            demand.identity_hash = served
        self._newest_for_connections(examined.context, examined.snapshot)  # on demand too: built, off the loop
        old, leaf = self.leaf, examined.leaf
        self._warned = (None, None)
        if self._reports_trust:
            warn_uncovered(self._record.log, leaf, self.files, old)
        # The same certificate is reloaded when only its key file, the client-CA bundle or the CRL changed.
        change = (
            f"serial {leaf.serial} unchanged (a new key file, client-CA bundle or CRL)"
            if leaf.sha256 == old.sha256
            else f"serial {old.serial} -> {leaf.serial}"
        )
        self._record.log.log(
            level, "reloaded TLS certificate from %s: %s; now serving %s", self.files.certfile, change, leaf.describe()
        )
        self._decision.accept(examined, now)
        self._warn_expiry(now)
        return Outcome.RELOADED

    def _warn_expiry(self, now: float) -> None:
        last_expiry, last_crl = self._warned
        said = self._record.log
        self._warned = (
            warn_expiry(
                said, self.leaf, self.files, now, self.expiry_warning_days, last_expiry, interval=self.interval
            ),
            warn_revocation(said, self.leaf, self.files, now, last_crl) if self._reports_trust else None,
        )

    @property
    def _reports_trust(self) -> bool:
        """Whether this reloader reports what concerns its client-CA bundle and CRL (not one sharing its owner's)."""
        return self._demand is None or not self._demand.shares_trust

    def _names_trust(self, error: ReloadError) -> bool:
        """Whether ``error`` is about the client-CA bundle or the CRL file (not the certificate or key)."""
        path = getattr(error, "path", None)
        return path is not None and path in (self.files.ca_certs, self.files.crl)

    def new_content(self) -> Snapshot | None:
        """What the files hold when a check would validate it, else ``None``
        (:func:`~tlsreload_plugins.examine.new_content`). Blocking (reads); changes nothing."""
        return new_content(self.files, self._decision.fingerprint, self._decision.known_bad)

    # -- what new handshakes get -------------------------------------------------------------

    def _created_on_newest(self, live: ssl.SSLContext, snapshot: Snapshot) -> None:
        """Have the server's context ``live`` create every new connection on the newest context, from now on.

        A session is resumed from the session cache and ticket keys of the context its connection was created
        on, and a resumed session skips certificate verification. Created on ``live`` and moved to the newest
        context at its ClientHello, a connection would resume sessions made under any earlier client-CA
        bundle. Created on the newest context, it resumes only sessions made on that context: a reload gives
        new connections a new session cache and new ticket keys. ``wrap_socket`` and ``wrap_bio`` (how every
        server creates its connections: threads, asyncio, uvloop, trio, gevent) are this instance's own; the
        newest context keeps the settings fixed at start (:func:`~tlsreload_plugins.examine.keep_fixed_settings`).
        """
        _trust_of[live] = snapshot.trust
        check_handshakes(live)
        create_connections_on(live, self._newest_for_a_connection)

    def _newest_for_connections(self, context: ssl.SSLContext, snapshot: Snapshot) -> None:
        """Make ``context`` the one new connections are created on (called with the state lock held)."""
        if self._live is not None and context is not self._live:
            _trust_of[context] = snapshot.trust
            check_handshakes(context)
            callback = context.sni_callback
            context.sni_callback = self._on_client_hello
            self._serving = (context, callback)
        else:
            self._serving = (context, context.sni_callback)

    def _newest_for_a_connection(self) -> ssl.SSLContext:
        return self._serving[0] or self.context

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str, live: ssl.SSLContext) -> int | None:
        serving, user_callback = self._serving
        newest = serving or live
        # Created before the client-CA bundle or its CRLs changed (a straddler): its session cache would resume
        # sessions the new trust may refuse (a revoked client), and moving it cannot change that. Moved like any
        # other, its full handshake is verified against the newest trust, and its handshake refuses a resumed
        # session. One whose handshake is not checked so is refused here; the client's next connection gets the newest.
        straddler = (
            newest is not live and live in _trust_of and _trust_of[live] != _trust_of.get(newest, _trust_of[live])
        )
        if straddler and not refuse_if_resumed(conn, self._refused_resumption):
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        route = self._route
        if route is not None:
            newest = route(server_name) or newest
        if newest is not live:
            try:
                conn.context = newest
            except Exception as e:  # an exotic socket wrapper: keep it on the old identity
                if not self._switch_failed_logged:
                    self._switch_failed_logged = True
                    self._record.log.error(
                        "cannot move a connection onto the new certificate (%s): %r", type(conn).__name__, e
                    )
                if straddler:  # its full handshake would be verified against the old trust
                    return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
                newest, user_callback = live, None
        if user_callback is not None:
            return user_callback(conn, server_name, newest)
        return None

    def _refused_resumption(self) -> None:
        """A straddler's resumed session was refused (in its handshake's thread): counted in :meth:`status`, and said
        once."""
        with self._lock:
            first = self._record.refused_resumption()
        if first:
            self._record.log.info(
                "refused a TLS session resumed from before the client-CA bundle or CRLs of %s changed, on a connection "
                "accepted before: its client's next connection makes a full handshake against the new trust "
                "(refusals are counted in status().refused_resumptions and metrics, not logged again)",
                self.files.describe(),
            )

    @property
    def _live(self) -> ssl.SSLContext | None:
        origin = self._origin
        return origin if isinstance(origin, ssl.SSLContext) else None

    @property
    def _demand(self) -> OnDemand | None:
        origin = self._origin
        return origin if isinstance(origin, OnDemand) else None

    def _hook_in_place(self) -> bool:
        return self._live is None or self._live.sni_callback == self._on_client_hello

    def _in_use(self, context: ssl.SSLContext) -> bool:
        """Whether ``context``, returned by the recipe, is one this reloader already serves."""
        return context is self._live or context is self._serving[0] or context.sni_callback == self._on_client_hello

    # -- reading state ----------------------------------------------------------------------

    @property
    def leaf(self) -> Leaf:
        """The certificate new handshakes get."""
        return self._decision.leaf

    @property
    def subscription(self) -> Subscription | None:
        """The publication this reloader reads instead of its files (a serving process of a server with a reader)."""
        return self._subscription

    @property
    def context(self) -> ssl.SSLContext:
        """The context to hand to the server, once, for its whole life (an ``on_demand`` reloader has
        none of its own: its :attr:`newest_context`)."""
        return self._live if self._live is not None else self.newest_context

    @property
    def newest_context(self) -> ssl.SSLContext:
        """The context new handshakes are moved onto (:attr:`context` until the first reload): what a
        dispatcher of its own hands a connection, as Go's ``GetCertificate`` would. An ``on_demand``
        reloader builds it now when it has none (a concurrent caller waits for that build), from validated bytes in
        memory only: it never reads the files nor validates (it runs inside ClientHello callbacks).

        Raises:
            InvalidIdentity: ``on_demand`` only: the context cannot be built from the validated bytes.
        """
        newest = self._serving[0]
        return newest if newest is not None else self._build_on_demand()

    def _build_on_demand(self) -> ssl.SSLContext:
        demand = self._demand
        if demand is None:
            raise InvalidIdentity(f"no context was built for {self.files.describe()}")
        with demand.lock:
            newest = self._serving[0]
            if newest is not None:
                return newest
            # Never a check here: this runs inside a ClientHello callback, on the server's event loop.
            served = self._decision.served
            context = context_from(served, demand.recipe_for)
            with self._lock:
                if (
                    self._decision.served is served
                ):  # else a reload came meanwhile: this handshake only, the reload's is kept
                    self._serving = (context, context.sni_callback)
            return context

    def release_context(self) -> None:
        """Forget the context an ``on_demand`` reloader built (the next :attr:`newest_context` builds it
        again); keeps a reloader's otherwise."""
        if self._demand is not None:
            with self._lock:
                self._serving = (None, None)

    @property
    def served(self) -> Snapshot:
        """The bytes of the identity new handshakes get, as they were validated (whatever the files hold by now): for a
        server whose TLS takes bytes rather than a context (gRPC's)."""
        return self._decision.served

    @property
    def built(self) -> bool:
        """Whether a context is built (always, but for an ``on_demand`` reloader nobody asked yet)."""
        return self._serving[0] is not None

    def status(self) -> Status:
        """A consistent snapshot of the counters and the served certificate; never waits for a check's I/O."""
        with self._lock:
            return self._status()

    def _status(self) -> Status:
        return self._record.status(self.files, self.interval, self.leaf)

    def describe(self) -> str:
        """One line for the start-up log: what is watched, how often, what is served."""
        return f"watching {self.files.describe()} every {self.interval:g}s; serving {self.leaf.describe()}"
