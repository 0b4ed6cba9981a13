"""A client's TLS identity kept fresh: :class:`ClientIdentity`.

The client side of mTLS reads the same kind of files as a server (cert-manager, kubelet's ``..data`` swap,
spiffe-helper, Vault agent): a certificate, its key and the bundle of CAs that server certificates are verified
against. :class:`ClientIdentity` reads, fingerprints and validates them exactly as a server's reloader does (in a
child process, hostile files contained, a failure reported once with the file named and counted) and hands out an
:class:`ssl.SSLContext` that is **replaced, never mutated**: ``load_cert_chain`` on a context in use loads the chain
and the key in two OpenSSL calls, and a handshake in between would present the new chain with the old key.

What a client library's glue needs of it: :meth:`ClientIdentity.own_context` (a context of the client's own, built
from the same validated bytes as every other client's, so that what one library sets on its context, such as
httpcore's ALPN list, never reaches another), :attr:`ClientIdentity.presented` (the newest context with its
generation and the bytes it was built from, one value), and :meth:`ClientIdentity.subscribe` to be told of a change
on the checking thread.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from tlsreload_plugins.authorization import Authorizer, resolve_authorizer
from tlsreload_plugins.decision import Decision, servable
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError
from tlsreload_plugins.examine import Examined, examine_files, load_identity
from tlsreload_plugins.expiry import ExpiryNotice, warn_expiry
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, password_digest
from tlsreload_plugins.identity import Leaf, judge_period
from tlsreload_plugins.memory_files import context_from
from tlsreload_plugins.metrics import observe, observe_authorizer, wanted
from tlsreload_plugins.outcome import Outcome, Record, Status
from tlsreload_plugins.reloader import Offload
from tlsreload_plugins.resumption import authorized
from tlsreload_plugins.settings import resolve_expiry_warning_days, resolve_interval, resolve_password

__all__ = [
    "CLIENT_AUTH",
    "ClientIdentity",
    "ClientRecipe",
    "OwnContext",
    "Presented",
    "client_context",
    "judge_purpose",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.client")

CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"
"""The extended key usage a client certificate needs when it has one (``id-kp-clientAuth``)."""
ANY_PURPOSE = "2.5.29.37.0"
"""The extended key usage that allows every purpose (``anyExtendedKeyUsage``)."""

METRICS_IDENTITY = "client"
"""The ``identity`` label of a client's metrics (a server's configured identity is ``default``)."""

ClientRecipe = Callable[[TLSFiles, Password], ssl.SSLContext]
"""Builds a client context from the files (certificate, key and the CA bundle in ``ca_certs``) and the key
password: :func:`client_context`, or one's own (ciphers, protocol bounds, ALPN)."""


def client_context(files: TLSFiles, password: Password = None) -> ssl.SSLContext:
    """The default client recipe: Python's defaults for a client (``ssl.create_default_context``: hostname
    checked, certificates verified, TLS 1.2 or later), trusting the CAs in ``files.ca_certs`` (the system's
    when ``None``) and presenting the certificate and key of ``files``.

    Args:
        files: the certificate, its key (``None``: in the certificate file) and the CA bundle.
        password: the key password, as :meth:`ssl.SSLContext.load_cert_chain` takes it.

    Returns:
        A new context (never one already in use).

    Raises:
        ssl.SSLError, OSError: the files cannot be loaded.

    Example::

        context = client_context(TLSFiles("client.crt", "client.key", "ca.crt"))
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca_certs)
    context.load_cert_chain(files.certfile, files.keyfile, password)
    return context


def judge_purpose(leaf: Leaf, files: TLSFiles) -> None:
    """Refuse a certificate whose extended key usage leaves out client authentication: a server verifying
    client certificates refuses it (OpenSSL checks the purpose), so presenting it would fail every handshake.

    Raises:
        InvalidIdentity: naming the certificate file.
    """
    if leaf.purposes is not None and CLIENT_AUTH not in leaf.purposes and ANY_PURPOSE not in leaf.purposes:
        raise InvalidIdentity(
            f"certificate file {files.certfile} holds a certificate (serial {leaf.serial}) whose extended key usage "
            "leaves out client authentication (clientAuth): servers refuse it as a client certificate",
            path=files.certfile,
        )


@dataclass(frozen=True)
class Presented:
    """What new connections present: a context and the certificate in it, with the generation that changes with
    them (0 for the first), and the bytes they were built from. One value, swapped whole: a context is never paired
    with another's generation or another's bytes."""

    generation: int
    context: ssl.SSLContext
    leaf: Leaf
    snapshot: Snapshot
    """The certificate, key and CA bytes validated and built into :attr:`context`: for a client whose TLS is not
    Python's (gRPC's C core takes PEM bytes, not an :class:`ssl.SSLContext`)."""


class OwnContext:
    """One client's own context of a :class:`ClientIdentity` (:meth:`ClientIdentity.own_context`): the same
    certificate, key and CA bundle as the identity's, built from the same validated bytes into a context no other
    client holds. Client libraries set things on the context they are given (httpcore sets its ALPN list at every
    connection, urllib3 its own): through a context of its own, nothing one client sets reaches another.

    :attr:`presented` is replaced whole by the identity's checking thread at every change, just before the
    identity's own (a client that sees the identity's new generation finds its own context of it) and before
    subscribers are told; its generation is the identity's (one made during a check catches up before the check
    ends).
    """

    __slots__ = ("__weakref__", "presented")

    def __init__(self, presented: Presented) -> None:
        self.presented: Presented = presented

    @property
    def context(self) -> ssl.SSLContext:
        """This client's newest context (:attr:`presented`'s)."""
        return self.presented.context

    @property
    def generation(self) -> int:
        """The generation of :attr:`context`."""
        return self.presented.generation


class ClientIdentity:
    """A client certificate, its key and a CA bundle, kept fresh: each check re-reads the files, and new, valid
    content becomes a new :class:`Presented` (a new context, the next generation); invalid content keeps the last
    good one, is reported once with the file named, counted in :meth:`status`, and tried again on every check.

    The files are checked every ``interval`` seconds in a daemon thread (``watch=False``: only when :meth:`check`
    is called). A certificate whose extended key usage leaves out client authentication, an expired one and one
    not valid yet are refused like a mismatched pair.

    Args:
        certfile: the client certificate (its chain after it).
        keyfile: its key; ``None`` when it is in ``certfile``.
        cafile: the CAs that server certificates are verified against (the system's when ``None``); it reloads
            with the rest.
        password: the key password (a string, bytes or a callable), else ``TLSRELOAD_KEY_PASSWORD_FILE``'s.
        interval: seconds between checks, else ``TLSRELOAD_INTERVAL``, else 1.
        expiry_warning_days: warn when the certificate presented expires within this many days, else
            ``TLSRELOAD_EXPIRY_WARNING_DAYS``, else within the last sixth of its lifetime (at most 14 days).
        recipe: builds a client context from the files (default :func:`client_context`).
        watch: check in a daemon thread of its own.
        metrics: export Prometheus metrics (the server side's names, labelled ``identity="client"``), else
            ``TLSRELOAD_METRICS``'s choice.
        authorize: which servers may be on the other end, by the SPIFFE ID of their certificate: an
            :class:`~tlsreload_plugins.authorization.Authorizer` (``authorize_id("spiffe://example.org/api")``), a
            matcher, or the syntax of :func:`~tlsreload_plugins.authorization.parse_authorizer`. The server's ID is
            then checked in each handshake instead of its host name (no ``check_hostname = False`` to write); a
            server refused fails the handshake with :class:`~tlsreload_plugins.resumption.Unauthorized`, said once
            per server ID and counted. Default: the host name is checked, as the recipe has it.
        clock: the wall clock (tests).

    Raises:
        InvalidIdentity: the files cannot be used at construction (there is no last good identity yet).

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        context = identity.presented.context  # for one new connection; the next may get a newer one
        identity.close()
    """

    def __init__(
        self,
        certfile: str,
        keyfile: str | None = None,
        *,
        cafile: str | None = None,
        password: Password = None,
        interval: float | None = None,
        expiry_warning_days: float | None = None,
        recipe: ClientRecipe = client_context,
        watch: bool = True,
        metrics: bool | None = None,
        authorize: Authorizer | Callable[[str], bool] | str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.files: TLSFiles = TLSFiles(
            str(certfile), str(keyfile) if keyfile else None, str(cafile) if cafile else None
        )
        self.password: Password = resolve_password(password)
        self.interval: float = resolve_interval(interval)
        self.expiry_warning_days: float | None = resolve_expiry_warning_days(expiry_warning_days)
        # Not from $TLSRELOAD_SPIFFE_AUTHORIZE: that names a server's clients, not the servers its own clients reach.
        self.authorizer: Authorizer | None = resolve_authorizer(authorize) if authorize is not None else None
        self._recipe = authorized(recipe, self.authorizer, server_side=False)
        self._clock = clock
        self._lock = threading.Lock()  # the state below, for a few assignments: never across I/O
        self._check_lock = threading.Lock()  # one check at a time
        self._subscribers: list[Callable[[Presented], object]] = []
        self._every_check: list[Callable[[Presented], object]] = []
        self._owners: weakref.WeakSet[OwnContext] = weakref.WeakSet()
        snapshot, leaf, context = load_identity(self.files, self._build, self.password)
        now = clock()
        judge_period(leaf, self.files, datetime.fromtimestamp(now, timezone.utc))
        judge_purpose(leaf, self.files)
        self._presented = Presented(0, context, leaf, snapshot)
        self._record = Record(log, "client certificate", "presenting", now)
        self._decision = Decision(self.files, self._record, snapshot, leaf)
        self._expiry: ExpiryNotice | None = None
        self._warn_expiry(now)
        if wanted(metrics):
            observe(self, identity=METRICS_IDENTITY)
            if self.authorizer is not None:
                observe_authorizer(self.authorizer, "client")
        self._driver = ThreadDriver(self).start() if watch else None

    @classmethod
    def from_files(cls, files: TLSFiles, **options: Any) -> ClientIdentity:
        """A :class:`ClientIdentity` of ``files``: a :class:`~tlsreload_plugins.TLSFiles` as a source hands them
        (:class:`~tlsreload_plugins.sources.PushedIdentity`, :class:`~tlsreload_plugins.sources.spiffe.SpiffeSource`),
        its ``ca_certs`` the bundle that servers are verified against.

        Args:
            files: the certificate, key and CA bundle.
            options: the constructor's keyword arguments (``interval``, ``recipe``, ``watch``, ...).

        Raises:
            InvalidIdentity: the files cannot be used.

        Example: ``identity = ClientIdentity.from_files(SpiffeSource().files)``.
        """
        return cls(files.certfile, files.keyfile, cafile=files.ca_certs, **options)

    def _build(self) -> ssl.SSLContext:
        return self._recipe(self.files, self.password)

    # -- what connections get -----------------------------------------------------------------

    @property
    def presented(self) -> Presented:
        """The context new connections present, with its generation (read once per new pool or connection)."""
        return self._presented

    @property
    def context(self) -> ssl.SSLContext:
        """The newest context: :attr:`presented`'s."""
        return self._presented.context

    @property
    def generation(self) -> int:
        """Changes (by one) with every new context: :attr:`presented`'s."""
        return self._presented.generation

    def own_context(self) -> OwnContext:
        """A context of the caller's own, kept as fresh as :attr:`context`: what a client library's glue hands its
        library, so that what one library sets on its context never reaches another client of this identity. Made
        now from the validated bytes presented (no file is read; it builds a context, so call it where a client is
        made, not per request); at every change the checking thread builds the next one before subscribers hear of
        it. Held weakly: a client nobody holds costs nothing.

        Raises:
            InvalidIdentity: the context could not be built from the bytes (the recipe refused them).

        Example::

            own = identity.own_context()
            transport = httpx.HTTPTransport(verify=own.context)
        """
        own = OwnContext(self._copy(self._presented))
        with self._lock:
            self._owners.add(own)
        return own

    def _copy(self, presented: Presented) -> Presented:
        """``presented`` with a context of its own, built from its bytes (blocking: memory files and a build)."""
        return Presented(presented.generation, self._built(presented.snapshot), presented.leaf, presented.snapshot)

    def _built(self, snapshot: Snapshot) -> ssl.SSLContext:
        """A new context from ``snapshot``'s validated bytes (blocking: memory files and a build)."""
        return context_from(snapshot, lambda files: self._recipe(files, self.password))

    def _contexts_for(self, owners: list[OwnContext], snapshot: Snapshot) -> list[tuple[OwnContext, ssl.SSLContext]]:
        """A context of its own from ``snapshot`` for each of ``owners`` (blocking: outside the state lock). One that
        cannot be built is left out, said, and tried again (the client keeps its last context meanwhile)."""
        built = []
        for own in owners:
            try:
                built.append((own, self._built(snapshot)))
            except Exception as e:
                log.warning("client certificate: a client's own context could not be built (%s); trying again", e)
        return built

    def _refresh_owners(self, behind: list[OwnContext], presented: Presented) -> None:
        """Give each of ``behind`` a context of ``presented``'s generation."""
        for own, context in self._contexts_for(behind, presented.snapshot):
            with self._lock:
                if own.presented.generation < presented.generation:
                    own.presented = Presented(presented.generation, context, presented.leaf, presented.snapshot)

    def subscribe(self, callback: Callable[[Presented], object], *, every_check: bool = False) -> Callable[[], None]:
        """Call ``callback(presented)`` after every change (with ``every_check``: after every check, changed or
        not, e.g. to close what is overdue), on the checking thread. It must not block for long (an asyncio client
        hands it to its loop with ``call_soon_threadsafe``); exceptions it raises are logged.

        Returns:
            A function that unsubscribes it (safe to call from the callback).

        Example::

            unsubscribe = identity.subscribe(lambda presented: print("now", presented.leaf.serial))
        """
        listeners = self._every_check if every_check else self._subscribers
        with self._lock:
            listeners.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in listeners:
                    listeners.remove(callback)

        return unsubscribe

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None:
        """Register callbacks as :meth:`Reloader.add_callbacks <tlsreload_plugins.reloader.Reloader.add_callbacks>`
        takes them (what :func:`tlsreload_plugins.metrics.observe` uses)."""
        self._record.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)

    # -- one check ----------------------------------------------------------------------------

    def check(self, *, settle: bool = True, offload: Offload[Any] | None = None) -> Outcome:
        """Read the files once and act on what is there. Blocking: call it from a thread, not an event loop.

        ``settle``: report unusable content only when the previous check found it too (a rotation caught between
        the certificate and the key is no failure); ``offload`` runs the reading, validating and building
        elsewhere (gevent's pool of native threads). Never raises: every problem is a reported failure.
        """
        with self._check_lock:
            now = self._clock()
            examined = offload(lambda: self.examine(now)) if offload is not None else self.examine(now)
            copies: list[tuple[OwnContext, ssl.SSLContext]] = []
            if servable(examined) and examined.snapshot is not None:
                # each client's own context of the new content, built before it is presented: they change together
                with self._lock:
                    owners = list(self._owners)
                snapshot = examined.snapshot

                def build() -> list[tuple[OwnContext, ssl.SSLContext]]:
                    return self._contexts_for(owners, snapshot)

                copies = offload(build) if offload is not None else build()
            with self._lock:
                outcome = self._conclude(examined, now, settle, copies)
                presented = self._presented
                behind = [own for own in self._owners if own.presented.generation < presented.generation]
            if behind:  # a client made during this check, or whose copy failed: caught up before anyone is told
                if offload is not None:
                    offload(lambda: self._refresh_owners(behind, presented))
                else:
                    self._refresh_owners(behind, presented)
            with self._lock:
                self._record.notify(self._every_check, self._presented)
                self._record.notify(self._record.on_check, outcome, self._status())
                notices = self._record.take()
        self._record.deliver(notices)
        return outcome

    def examine(self, now: float) -> Examined:
        """The blocking half of :meth:`check`: read, and when the content is new, validate (in a child process)
        and build. Changes no state; never raises."""
        try:
            examined = examine_files(
                self.files,
                self._build,
                self.password,
                now,
                served=self._decision.fingerprint,
                known_bad=self._decision.known_bad,
                live=None,
                in_use=lambda context: context is self._presented.context,
            )
        except Exception as e:  # a bug or an error nobody foresaw: a reported failure, not a dead ticker
            log.debug("unexpected error while checking %s", self.files.describe(), exc_info=True)
            error = NotServable(f"unexpected error while checking {self.files.describe()}: {type(e).__name__}: {e}")
            return Examined(fingerprint=None, error=error)
        return refuse_wrong_purpose(examined, self.files, self.password)

    def _conclude(
        self, examined: Examined, now: float, settle: bool, copies: list[tuple[OwnContext, ssl.SSLContext]]
    ) -> Outcome:
        """The deciding half of :meth:`check` (state lock held, no I/O): the identity's
        :class:`~tlsreload_plugins.decision.Decision` on ``examined``, acted on: the new context presented (each
        client's own ``copies`` first, so that one who sees the identity's new generation finds its own context of
        it)."""
        outcome = self._decision.conclude(examined, now, settle)
        if outcome is Outcome.UNCHANGED:
            self._warn_expiry(now)
        if (
            outcome is not Outcome.RELOADED
            or examined.context is None
            or examined.leaf is None
            or examined.snapshot is None
        ):
            return outcome
        old = self._presented
        new = Presented(old.generation + 1, examined.context, examined.leaf, examined.snapshot)
        for own, context in copies:
            own.presented = Presented(new.generation, context, new.leaf, new.snapshot)
        self._presented = new
        log.info(
            "reloaded client certificate from %s: serial %s -> %s; new connections present %s",
            self.files.certfile,
            old.leaf.serial,
            examined.leaf.serial,
            examined.leaf.describe(),
        )
        self._record.notify(self._subscribers, self._presented)
        self._decision.accept(examined, now)
        self._warn_expiry(now)
        return Outcome.RELOADED

    def _warn_expiry(self, now: float) -> None:
        self._expiry = warn_expiry(
            log,
            self._presented.leaf,
            self.files,
            now,
            self.expiry_warning_days,
            self._expiry,
            interval=self.interval,
            what="the client certificate presented",
        )

    # -- reading state and stopping ------------------------------------------------------------

    def status(self) -> Status:
        """A consistent snapshot of the counters and the certificate presented; never waits for a check's I/O."""
        with self._lock:
            return self._status()

    def _status(self) -> Status:
        return self._record.status(self.files, self.interval, self._presented.leaf)

    def describe(self) -> str:
        """One line for the start-up log: what is watched, how often, what is presented."""
        return (
            f"watching client certificate {self.files.describe()} every {self.interval:g}s; "
            f"presenting {self._presented.leaf.describe()}"
        )

    def close(self) -> None:
        """Stop checking (the context stays usable)."""
        if self._driver is not None:
            self._driver.stop()

    def __enter__(self) -> ClientIdentity:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def refuse_wrong_purpose(examined: Examined, files: TLSFiles, password: Password) -> Examined:
    """``examined``, or when its certificate cannot authenticate a client (:func:`judge_purpose`), a refusal of
    its content (no leaf: content known bad is not parsed again while the files hold it)."""
    if examined.leaf is None or examined.error is not None:
        return examined
    try:
        judge_purpose(examined.leaf, files)
    except InvalidIdentity as e:
        return examined._replace(context=None, snapshot=None, leaf=None, error=e, password=password_digest(password))
    return examined
