"""Which connection pool a client's new request goes through, and when a replaced pool is closed:
:class:`Pools`, plain decisions a client library's glue acts on.

A pool (an httpx transport, a urllib3 pool manager, a gRPC channel) is made for one generation of a
:class:`~tlsreload_plugins.client.identity.ClientIdentity`: its connections present that generation's certificate
for their whole life. When the identity changes, new requests go through a new pool, and the old one is
retired: closed as soon as the requests it carries are done, as the library alone would close a connection once
its response is read. A stream open across a change (server-sent events, a watch, a gRPC subscription) lives on
through its old pool until it ends. Only where ``retire_after`` is set is a replaced pool that still carries requests
that many seconds after the change handed back to be cut. Nothing here does I/O or waits; the glue closes and cuts
what a decision hands back (in its own thread, or on its event loop).
"""

from __future__ import annotations

import inspect
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tlsreload_plugins.client.identity import ClientIdentity, Presented

__all__ = ["Closed", "Pools"]

P = TypeVar("P")


class Closed(RuntimeError):
    """The client was closed (:meth:`Pools.close`): the glue raises its library's own error for this."""


@dataclass
class _Pool(Generic[P]):
    pool: P
    generation: int
    in_flight: int = 0
    retired_at: float | None = None
    cut: bool = False


class Pools(Generic[P]):
    """The pools of one client, one per generation of its identity: the newest carries new requests, the
    replaced ones are closed once idle.

    Every method but :meth:`overdue` returns the pools the caller must close now (each exactly once, outside any
    lock of its own); :meth:`overdue` returns those whose connections the caller must cut. Thread-safe; its lock is
    held for a few assignments, never while a pool is made, closed or cut.

    Args:
        make: makes a pool for a generation (called outside the lock: it may take a moment).
        retire_after: seconds after its replacement at which a pool still carrying requests is due to be cut
            (:meth:`overdue`); ``None`` (the default): never, it is closed once they are done.
        clock: a monotonic clock (tests).

    Example::

        pools = Pools(lambda generation: make_transport(identity.context))
        pool, to_close = pools.acquire(identity.generation)
        ...  # the request, through pool
        to_close += pools.release(pool)
    """

    def __init__(
        self,
        make: Callable[[int], P],
        retire_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self.retire_after = retire_after
        self._clock = clock
        self._lock = threading.Lock()
        self._current: _Pool[P] | None = None
        self._retired: list[_Pool[P]] = []
        self._closed = False

    def acquire(self, generation: int) -> tuple[P, list[P]]:
        """The pool for a new request made while ``generation`` is the identity's newest (made now when there is
        none for it yet; a pool for an older generation is then retired), counted as in flight until
        :meth:`release`. Returns it with the pools to close now.

        Raises:
            Closed: after :meth:`close`.
        """
        with self._lock:
            self._refuse_closed()
            current = self._current
            if current is not None and current.generation >= generation:
                current.in_flight += 1
                return current.pool, self._idle()
        made = self._make(generation)  # outside the lock: a pool may take a moment to make
        with self._lock:
            self._refuse_closed()
            current = self._current
            if current is not None and current.generation >= generation:
                # another request made it first: this one is closed unused
                current.in_flight += 1
                return current.pool, [made, *self._idle()]
            if current is not None:
                self._retire(current)
            self._current = _Pool(made, generation, in_flight=1)
            return made, self._idle()

    def renew(self, generation: int) -> list[P]:
        """The identity changed to ``generation``: retire the current pool if it is older (the next request makes
        a new one). What a subscriber calls on the checking thread, so that idle connections are closed without
        waiting for a request. Returns the pools to close now."""
        with self._lock:
            current = self._current
            if current is not None and current.generation < generation:
                self._retire(current)
                self._current = None
            return self._idle()

    def follow(
        self,
        identity: ClientIdentity,
        close: Callable[[list[P]], object],
        cut: Callable[[list[P]], object] | None = None,
    ) -> Callable[[], None]:
        """Have ``identity``'s checking thread retire the current pool when it changes (:meth:`renew`, handing
        what is idle to ``close``) and, when ``retire_after`` is set, hand what is overdue to ``cut`` after every
        check (:meth:`overdue`): idle connections close without waiting for a request. Neither these pools nor
        ``close``'s or ``cut``'s object (when it is a bound method) are kept alive by the subscriptions: a client
        nobody holds is collected.

        Returns:
            A function that ends the subscriptions.
        """
        pools = weakref.ref(self)

        def weak(act: Callable[[list[P]], object]) -> Callable[[], Callable[[list[P]], object] | None]:
            return weakref.WeakMethod(act) if inspect.ismethod(act) else (lambda: act)

        closer, cutter = weak(close), weak(cut) if cut is not None else None

        def on_change(presented: Presented) -> None:
            held, close_them = pools(), closer()
            if held is not None and close_them is not None:
                close_them(held.renew(presented.generation))

        subscriptions = [identity.subscribe(on_change)]
        if cutter is not None and self.retire_after is not None:

            def on_check(presented: Presented) -> None:
                held, cut_them = pools(), cutter()
                if held is not None and cut_them is not None and held.retired:
                    due = held.overdue()
                    if due:
                        cut_them(due)

            subscriptions.append(identity.subscribe(on_check, every_check=True))

        def unsubscribe() -> None:
            for end in subscriptions:
                end()

        return unsubscribe

    def release(self, pool: P) -> list[P]:
        """A request through ``pool`` is done (its response read or closed). Returns the pools to close now."""
        with self._lock:
            for entry in (self._current, *self._retired):
                if entry is not None and entry.pool is pool:
                    entry.in_flight = max(0, entry.in_flight - 1)
                    break
            return self._idle()

    def overdue(self) -> list[P]:
        """The retired pools past ``retire_after`` that still carry requests: to cut now (their connections closed
        under the requests, each pool handed back once; it is closed as idle once those requests are released)."""
        with self._lock:
            limit, now = self.retire_after, self._clock()
            if limit is None:
                return []
            due = [
                entry
                for entry in self._retired
                if not entry.cut and entry.retired_at is not None and now - entry.retired_at >= limit
            ]
            for entry in due:
                entry.cut = True
            return [entry.pool for entry in due]

    def close(self) -> list[P]:
        """Close everything: the client is closing. Returns every pool still open; later :meth:`acquire` calls
        raise :class:`Closed`."""
        with self._lock:
            self._closed = True
            return self._take_all()

    def clear(self) -> list[P]:
        """Close everything, and go on: the next request makes a new pool (requests' ``HTTPAdapter.close``, after
        which a session still works). Returns every pool still open."""
        with self._lock:
            return self._take_all()

    def _take_all(self) -> list[P]:
        entries = [*self._retired, *([self._current] if self._current is not None else [])]
        self._retired, self._current = [], None
        return [entry.pool for entry in entries]

    @property
    def retired(self) -> int:
        """Replaced pools not closed yet."""
        with self._lock:
            return len(self._retired)

    def _refuse_closed(self) -> None:
        if self._closed:
            raise Closed("the client has been closed")

    def _retire(self, entry: _Pool[P]) -> None:
        entry.retired_at = self._clock()
        self._retired.append(entry)

    def _idle(self) -> list[P]:
        keep: list[_Pool[P]] = []
        close: list[_Pool[P]] = []
        for entry in self._retired:
            (close if entry.in_flight == 0 else keep).append(entry)
        self._retired = keep
        return [entry.pool for entry in close]
