"""Thin drivers that call :meth:`Reloader.check` on an interval: one thread, or one asyncio task.

All the deciding happens in :class:`~tlsreload_plugins.reloader.Reloader`; these only wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from types import TracebackType

from .reloader import Outcome, Reloader

log = logging.getLogger("tlsreload_plugins.drivers")


def _tick(reloader: Reloader, already_logged: list[bool]) -> None:
    # A bug must not end the ticker silently: that would freeze the certificate forever.
    try:
        reloader.check()
    except Exception:
        if not already_logged[0]:
            already_logged[0] = True
            log.exception("unexpected error while checking %s; will keep checking", reloader.files.describe())


class ThreadDriver:
    """Checks ``reloader`` every ``reloader.interval`` seconds in a daemon thread.

    Under gevent's monkey-patching the thread is a greenlet and the wait is cooperative, so
    the same driver serves threaded and gevent servers. Use :meth:`start`/:meth:`stop` or
    ``with ThreadDriver(reloader):``.
    """

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error_logged = [False]

    def start(self) -> ThreadDriver:
        """Start checking; returns ``self``. Starting twice is an error."""
        if self._thread is not None:
            raise RuntimeError("ThreadDriver already started")
        self._thread = threading.Thread(target=self._run, name="tlsreload", daemon=True)
        self._thread.start()
        log.info("%s", self.reloader.describe())
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.reloader.interval):
            _tick(self.reloader, self._error_logged)

    def reload_now(self) -> Outcome:
        """Check at once, in the calling thread, reporting any problem immediately."""
        return self.reloader.check(settle=False)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop checking and wait up to ``timeout`` seconds for the thread to end."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ThreadDriver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class AsyncioDriver:
    """Checks ``reloader`` every ``reloader.interval`` seconds in a task on the running loop.

    The check, and so the swap, runs in the loop's own thread. Use ``await start()`` /
    ``await stop()`` or ``async with AsyncioDriver(reloader):``.
    """

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader
        self._task: asyncio.Task[None] | None = None
        self._error_logged = [False]

    async def start(self) -> AsyncioDriver:
        """Start checking on the running loop; returns ``self``."""
        if self._task is not None:
            raise RuntimeError("AsyncioDriver already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tlsreload")
        log.info("%s", self.reloader.describe())
        return self

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.reloader.interval)
            _tick(self.reloader, self._error_logged)

    def reload_now(self) -> Outcome:
        """Check at once, reporting any problem immediately."""
        return self.reloader.check(settle=False)

    async def stop(self) -> None:
        """Cancel the task and wait for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> AsyncioDriver:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
