"""What a :class:`~tlsreload_plugins.Reloader` serves and how a handshake gets it: the newest context and
the SNI callback that moves each new connection onto it, the route an SNI table adds, an ``on_demand``
reloader's build on first use, and the state :meth:`~tlsreload_plugins.Reloader.status` reads.
:class:`Served` is :class:`~tlsreload_plugins.Reloader`'s base class, and holds no state of its own: what
changes that state (checks, reloads, failures) is :mod:`tlsreload_plugins.reloader`'s. Also the reloaders'
fork safety: a child gets fresh locks.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles, fingerprint
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.lastgood.last_good import LastGood, bytes_served
from tlsreload_plugins.lastgood.memory_files import RecipeFor, context_from
from tlsreload_plugins.outcome import Outcome, Status

# Its log lines keep the logger they were always written under.
log = logging.getLogger("tlsreload_plugins.reloader")

SNICallback = Callable[[ssl.SSLObject, str, ssl.SSLContext], "int | None"]
Route = Callable[["str | None"], "ssl.SSLContext | None"]
"""Picks the context for a handshake's server name (``None``: this reloader's own); see :meth:`Reloader.set_route`."""
T = TypeVar("T")
Offload = Callable[[Callable[[], T]], T]
"""Runs a blocking function elsewhere and returns its result (gevent: ``hub.threadpool.apply``)."""

_reloaders: weakref.WeakSet[Served] = weakref.WeakSet()
_trust_of: weakref.WeakKeyDictionary[ssl.SSLContext, bytes | None] = weakref.WeakKeyDictionary()
"""The client-CA bytes each context a reloader created connections on was built with: a connection created on a
context whose trust is no longer the newest one's is refused at its ClientHello (see ``Served._on_client_hello``)."""


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child: give every reloader new ones.
    for reloader in list(_reloaders):
        reloader._lock = threading.Lock()
        reloader._check_lock = threading.Lock()
        demand = reloader._demand
        if demand is not None:
            demand.lock = threading.Lock()
        reloader._notices = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(slots=True)
class _OnDemand:
    """What an ``on_demand`` reloader needs to build its context when first asked."""

    recipe_for: RecipeFor
    validated: Snapshot | None = None
    """The bytes the newest context is built from."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """One build at a time: a second handshake waits for the first's."""


class Served:
    """The serving half of :class:`~tlsreload_plugins.Reloader`, its base class: never used alone. The
    attributes below are set by ``Reloader.__init__`` and changed by its checks."""

    files: TLSFiles
    interval: float
    _lock: threading.Lock
    _check_lock: threading.Lock
    _notices: list[tuple[list[Callable[..., object]], tuple[Any, ...]]]
    _last_good: LastGood | None
    _origin: ssl.SSLContext | _OnDemand | None
    _serving: tuple[ssl.SSLContext | None, SNICallback | None]
    _route: Route | None
    _switch_failed_logged: bool
    _fingerprint: str
    _leaf: Leaf
    _last_error: str | None
    _last_success: float
    _last_reload: float | None
    _checks: int
    _reloads: int
    _failures: int
    check: Callable[..., Outcome]  # Reloader.check: an on_demand build judges files that moved on

    # -- the swap ---------------------------------------------------------------------------

    def set_route(self, route: Route | None) -> None:
        """Consult ``route(server_name)`` first on every handshake: a context it returns serves the
        connection instead of this reloader's newest one (``None`` to stop). It must be quick (it
        runs inside OpenSSL's ClientHello callback) and never raise; :mod:`tlsreload_plugins.sni.identities`
        uses it to serve several identities by server name."""
        self._route = route

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
        _trust_of[live] = snapshot.ca
        live.wrap_socket = self._wrap_socket  # type: ignore[method-assign]
        live.wrap_bio = self._wrap_bio  # type: ignore[method-assign]

    def _newest_for_connections(self, context: ssl.SSLContext, snapshot: Snapshot | None) -> None:
        """Make ``context`` the one new connections are created on (called with the state lock held)."""
        if self._live is not None and context is not self._live:
            _trust_of[context] = snapshot.ca if snapshot is not None else _trust_of.get(self._live)
            callback = context.sni_callback
            context.sni_callback = self._on_client_hello
            self._serving = (context, callback)
        else:
            self._serving = (context, context.sni_callback)

    def _wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        newest = self._serving[0] or self.context
        return type(newest).wrap_socket(newest, sock, *args, **kwargs)

    def _wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        newest = self._serving[0] or self.context
        return type(newest).wrap_bio(newest, incoming, outgoing, *args, **kwargs)

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str, live: ssl.SSLContext) -> int | None:
        serving, user_callback = self._serving
        newest = serving or live
        if newest is not live and live in _trust_of and _trust_of[live] != _trust_of.get(newest, _trust_of[live]):
            # Created before the client-CA bundle changed: its session cache would resume sessions the new
            # bundle may no longer trust, and moving it cannot change that. Refused; the client's next
            # connection gets the newest context.
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
                    log.error("cannot move a connection onto the new certificate (%s): %r", type(conn).__name__, e)
                newest, user_callback = live, None
        if user_callback is not None:
            return user_callback(conn, server_name, newest)
        return None

    @property
    def _live(self) -> ssl.SSLContext | None:
        origin = self._origin
        return origin if isinstance(origin, ssl.SSLContext) else None

    @property
    def _demand(self) -> _OnDemand | None:
        origin = self._origin
        return origin if isinstance(origin, _OnDemand) else None

    def _hook_in_place(self) -> bool:
        return self._live is None or self._live.sni_callback == self._on_client_hello

    def _in_use(self, context: ssl.SSLContext) -> bool:
        """Whether ``context``, returned by the recipe, is one this reloader already serves."""
        return context is self._live or context is self._serving[0] or context.sni_callback == self._on_client_hello

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
    def context(self) -> ssl.SSLContext:
        """The context to hand to the server, once, for its whole life (an ``on_demand`` reloader has
        none of its own: its :attr:`newest_context`)."""
        return self._live if self._live is not None else self.newest_context

    @property
    def newest_context(self) -> ssl.SSLContext:
        """The context new handshakes are moved onto (:attr:`context` until the first reload): what a
        dispatcher of its own hands a connection, as Go's ``GetCertificate`` would. An ``on_demand``
        reloader builds it now when it has none (a concurrent caller waits for that build).

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
            validated = demand.validated or bytes_served(self.files, self._fingerprint, self._last_good)
            if validated is None:  # the files moved on, and the store with them: judge them now
                self.check(settle=False)
                newest = self._serving[0]
                if newest is not None:
                    return newest
                validated = demand.validated or bytes_served(self.files, self._fingerprint, self._last_good)
            if validated is None:
                raise InvalidIdentity(f"the files of {self.files.describe()} changed since they were validated")
            context = context_from(validated, demand.recipe_for)
            with self._lock:
                if self._fingerprint == fingerprint(validated):  # else a reload came in meanwhile: build again
                    self._serving = (context, context.sni_callback)
            return context

    def release_context(self) -> None:
        """Forget the context an ``on_demand`` reloader built (the next :attr:`newest_context` builds it
        again); keeps a reloader's otherwise."""
        if self._demand is not None:
            with self._lock:
                self._serving = (None, None)

    def forget_bytes(self) -> None:
        """An ``on_demand`` reloader whose ``last_good`` store keeps exactly the bytes it serves drops its own
        copy: a build reads them from the store (or from the files, while they hold them)."""
        demand = self._demand
        if demand is not None and self._last_good is not None:
            with self._lock:
                demand.validated = None

    @property
    def validated(self) -> Snapshot | None:
        """The bytes an ``on_demand`` reloader serves (its context is built from them); ``None`` for others."""
        return self._demand.validated if self._demand is not None else None

    @property
    def built(self) -> bool:
        """Whether a context is built (always, but for an ``on_demand`` reloader nobody asked yet)."""
        return self._serving[0] is not None

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
