"""Which connection pool a client's new request goes through, and when a replaced pool is closed:
:class:`Pools`, plain decisions a client library's glue acts on.

A pool (an httpx transport, a urllib3 pool manager, a gRPC channel) is made for one generation of a
:class:`~tlsreload_plugins.client.identity.ClientIdentity`: its connections present that generation's certificate
for their whole life. When the identity changes, new requests go through a new pool, and the old one is
retired: closed as soon as the requests it carries are done, and at the latest ``retire_after`` seconds after it
was replaced. Nothing here does I/O or waits; the glue closes what a decision hands back (in its own thread, or
on its event loop).
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

__all__ = ["DEFAULT_RETIRE_AFTER", "Pools"]

P = TypeVar("P")

DEFAULT_RETIRE_AFTER = 10.0
"""Seconds a replaced pool may keep requests in flight before it is closed under them."""


@dataclass
class _Pool(Generic[P]):
    pool: P
    generation: int
    in_flight: int = 0
    retired_at: float | None = None


class Pools(Generic[P]):
    """The pools of one client, one per generation of its identity: the newest carries new requests, the
    replaced ones are closed once idle or overdue.

    Every method returns the pools the caller must close now (each exactly once, outside any lock of its own).
    Thread-safe; its lock is held for a few assignments, never while a pool is made or closed.

    Args:
        make: makes a pool for a generation (called outside the lock: it may take a moment).
        retire_after: seconds after its replacement at which a pool is closed even with requests in flight
            (``None``: only when they are done).
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
        retire_after: float | None = DEFAULT_RETIRE_AFTER,
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
            RuntimeError: after :meth:`close`.
        """
        with self._lock:
            self._refuse_closed()
            current = self._current
            if current is not None and current.generation >= generation:
                current.in_flight += 1
                return current.pool, self._idle_or_overdue()
        made = self._make(generation)  # outside the lock: a pool may take a moment to make
        with self._lock:
            self._refuse_closed()
            current = self._current
            if current is not None and current.generation >= generation:
                # another request made it first: this one is closed unused
                current.in_flight += 1
                return current.pool, [made, *self._idle_or_overdue()]
            if current is not None:
                self._retire(current)
            self._current = _Pool(made, generation, in_flight=1)
            return made, self._idle_or_overdue()

    def renew(self, generation: int) -> list[P]:
        """The identity changed to ``generation``: retire the current pool if it is older (the next request makes
        a new one). What a subscriber calls on the checking thread, so that idle connections are closed without
        waiting for a request. Returns the pools to close now."""
        with self._lock:
            current = self._current
            if current is not None and current.generation < generation:
                self._retire(current)
                self._current = None
            return self._idle_or_overdue()

    def follow(self, identity: ClientIdentity, close: Callable[[list[P]], object]) -> Callable[[], None]:
        """Have ``identity``'s checking thread retire the current pool when it changes (:meth:`renew`) and hand
        what is idle or overdue to ``close`` after every check (:meth:`overdue`): idle connections close without
        waiting for a request. Neither these pools nor ``close``'s object (when it is a bound method) are kept
        alive by the subscriptions: a client nobody holds is collected.

        Returns:
            A function that ends both subscriptions.
        """
        pools = weakref.ref(self)
        closer: Callable[[], Callable[[list[P]], object] | None]
        closer = weakref.WeakMethod(close) if inspect.ismethod(close) else (lambda: close)

        def act(decide: Callable[[Pools[P]], list[P]]) -> None:
            held, close_them = pools(), closer()
            if held is not None and close_them is not None:
                close_them(decide(held))

        def on_change(presented: Presented) -> None:
            act(lambda held: held.renew(presented.generation))

        def on_check(presented: Presented) -> None:
            act(lambda held: held.overdue() if held.retired else [])

        subscriptions = (identity.subscribe(on_change), identity.subscribe(on_check, every_check=True))

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
            return self._idle_or_overdue()

    def overdue(self) -> list[P]:
        """The retired pools past ``retire_after`` and those idle: to close now (a timer's call)."""
        with self._lock:
            return self._idle_or_overdue()

    def next_deadline(self) -> float | None:
        """When the soonest retired pool is overdue (on the clock given), or ``None``."""
        with self._lock:
            if self.retire_after is None:
                return None
            times = [entry.retired_at for entry in self._retired if entry.retired_at is not None]
            return min(times) + self.retire_after if times else None

    def close(self) -> list[P]:
        """Close everything: the client is closing. Returns every pool still open; later calls raise."""
        with self._lock:
            self._closed = True
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
            raise RuntimeError("the client has been closed")

    def _retire(self, entry: _Pool[P]) -> None:
        entry.retired_at = self._clock()
        self._retired.append(entry)

    def _idle_or_overdue(self) -> list[P]:
        now = self._clock()
        keep, close = [], []
        for entry in self._retired:
            retired_at, limit = entry.retired_at, self.retire_after
            overdue = retired_at is not None and limit is not None and now - retired_at >= limit
            if entry.in_flight == 0 or overdue:
                close.append(entry.pool)
            else:
                keep.append(entry)
        self._retired = keep
        return close
