"""Thin drivers that call :meth:`Reloader.check` on an interval: a thread, an asyncio task or a trio task.

All the deciding happens in :class:`~tlsreload_plugins.reloader.Reloader`; these only wait. The
check itself (file I/O, parsing, building a context) never runs on an event loop's thread or on
gevent's hub: the asyncio driver hands it to the loop's executor, and under gevent the thread
driver hands it to the hub's pool of native threads.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from tlsreload_plugins.examine import Examined
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.outcome import Outcome
from tlsreload_plugins.reloader import Offload, Reloader

if TYPE_CHECKING:  # imported where a loop runs: a sync or gevent worker has no use for asyncio
    import asyncio

log: logging.Logger = logging.getLogger("tlsreload_plugins.drivers")


class Checked(Protocol):
    """What a driver drives: something that checks its files when told to, a server's
    :class:`~tlsreload_plugins.reloader.Reloader` or a client's
    :class:`~tlsreload_plugins.client.identity.ClientIdentity`."""

    @property
    def files(self) -> TLSFiles: ...

    @property
    def interval(self) -> float: ...

    def check(self, *, settle: bool = True, offload: Offload[Examined] | None = None) -> Outcome: ...

    def describe(self) -> str: ...


def _tick(reloader: Checked, logged: set[str], offload: Offload[Examined] | None = None) -> None:
    # check() reports every problem itself; this is the last guard, so that a bug can never end the
    # ticker silently (that would freeze the certificate forever). Each distinct error is logged once.
    try:
        reloader.check(offload=offload)
    except Exception as e:
        if repr(e) not in logged:
            logged.add(repr(e))
            log.exception("unexpected error while checking %s; will keep checking", reloader.files.describe())


def gevent_offload() -> Offload[Examined] | None:
    """gevent's pool of native threads when gevent has monkey-patched threading, else ``None``.

    Under monkey-patching a "thread" is a greenlet on the hub: a blocking read or a parse there
    stalls every connection of the worker.
    """
    monkey: Any = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return None
    gevent: Any = importlib.import_module("gevent")  # imported only where it already runs
    pool: Any = gevent.get_hub().threadpool
    apply: Offload[Examined] = pool.apply
    return apply


class ThreadDriver:
    """Checks ``reloader`` (a :class:`Checked`) every ``reloader.interval`` seconds in a daemon thread.

    Under gevent's monkey-patching the thread is a greenlet and the wait is cooperative, so
    the same driver serves threaded and gevent servers. Use :meth:`start`/:meth:`stop` or
    ``with ThreadDriver(reloader):``.
    """

    def __init__(self, reloader: Checked) -> None:
        self.reloader = reloader
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors_logged: set[str] = set()

    def start(self) -> ThreadDriver:
        """Start checking; returns ``self``. Starting twice is an error."""
        if self._thread is not None:
            raise RuntimeError("ThreadDriver already started")
        self._thread = threading.Thread(target=self._run, name="tlsreload", daemon=True)
        self._thread.start()
        log.info("%s", self.reloader.describe())
        return self

    def _run(self) -> None:
        offload = gevent_offload()
        while not self._stop.wait(self.reloader.interval):
            _tick(self.reloader, self._errors_logged, offload)

    def reload_now(self) -> Outcome:
        """Check at once, reporting any problem immediately (blocking: the calling thread waits)."""
        return self.reloader.check(settle=False, offload=gevent_offload())

    def stop(self, timeout: float = 1.0) -> None:
        """Stop checking and wait up to ``timeout`` seconds for the thread to end."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the checking thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ThreadDriver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class AsyncioDriver:
    """Checks ``reloader`` every ``reloader.interval`` seconds in a task on the running loop.

    Each check runs in the loop's default executor (a thread): reading the files, parsing and
    building a context never stall the loop. Use ``await start()`` / ``await stop()`` or
    ``async with AsyncioDriver(reloader):``.
    """

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader
        self._task: asyncio.Task[None] | None = None
        self._errors_logged: set[str] = set()

    async def start(self) -> AsyncioDriver:
        """Start checking on the running loop; returns ``self``."""
        import asyncio

        if self._task is not None:
            raise RuntimeError("AsyncioDriver already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tlsreload")
        log.info("%s", self.reloader.describe())
        return self

    async def _run(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.reloader.interval)
            await loop.run_in_executor(None, _tick, self.reloader, self._errors_logged)

    def reload_now(self) -> Outcome:
        """Check at once, reporting any problem immediately. Blocking: from a coroutine, prefer
        ``await loop.run_in_executor(None, driver.reload_now)``."""
        return self.reloader.check(settle=False)

    async def stop(self) -> None:
        """Cancel the task and wait for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        import asyncio

        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @property
    def running(self) -> bool:
        """Whether the checking task is alive."""
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> AsyncioDriver:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class TrioDriver:
    """Checks ``reloader`` every ``reloader.interval`` seconds from a trio task, each check in a worker
    thread. Run :meth:`run` as a task; cancelled while a check runs, it waits for that check to end
    (``to_thread.run_sync`` does not abandon its thread), so no check outlives the loop.
    """

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader
        self._errors_logged: set[str] = set()

    async def run(self) -> None:
        """Check until cancelled."""
        trio: Any = importlib.import_module("trio")  # imported only where a trio loop runs
        log.info("%s", self.reloader.describe())
        while True:
            await trio.sleep(self.reloader.interval)
            await trio.to_thread.run_sync(_tick, self.reloader, self._errors_logged)


_started: set[Any] = set()
"""The asyncio tasks starting a driver: the loop keeps only weak references to its tasks."""


def check_from_running_loop(reloader: Reloader) -> AsyncioDriver | TrioDriver | None:
    """Check ``reloader`` from the event loop running this (synchronous) call, asyncio's or trio's, until
    that loop ends; ``None`` when no loop runs here. For servers that build their context inside their
    worker's loop and have no hook to run a task of ours: under trio the task is a system task (trio
    cancels it when the main task returns, and waits for it); under asyncio the loop cancels it as it
    shuts down."""
    asyncio: Any = sys.modules.get("asyncio")  # a running asyncio loop has it imported
    if asyncio is not None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            driver = AsyncioDriver(reloader)
            task = loop.create_task(driver.start())  # start() never suspends
            _started.add(task)
            task.add_done_callback(_started.discard)
            return driver
    trio: Any = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            trio_driver = TrioDriver(reloader)
            trio.lowlevel.spawn_system_task(trio_driver.run, name="tlsreload")
            return trio_driver
    return None
