"""The ASGI app :mod:`loop_lag` serves: ``GET /`` answers ``pid=N``, and from its lifespan start-up to its
shutdown a task on the server's event loop ticks every millisecond and keeps, for each tick, how late it woke
(less the time the loop's thread waited for a CPU, read from ``/proc/thread-self/schedstat``: a loaded machine's
run queue is not a stall of the loop), and the garbage collections of the process with their durations. At
shutdown it writes them to ``$LOOP_LAG_OUT/<pid>.json`` (the benchmark keeps the ticks of its measuring window).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
import traceback
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

TICK = 0.001


def _run_queue_wait(fd: int) -> float:
    """Seconds this thread has waited on a run queue so far (Linux schedstat's second field)."""
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


class Record:
    """What the ticker and the collector hooks keep, for one process."""

    def __init__(self) -> None:
        self.at = array("d")  # wall clock of each tick
        self.stall = array("d")  # seconds the tick woke late, less the run-queue wait meanwhile
        self.collections: list[tuple[float, int, float]] = []  # wall clock, generation, seconds
        self.thread = ""
        self.stacks: list[tuple[float, str]] = []  # with $LOOP_LAG_WATCH: where the loop's thread was, in a stall
        self._last = time.perf_counter()
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.collections.append((time.time(), int(info["generation"]), time.perf_counter() - self._gc_started))

    def watch(self, loop_thread: int, threshold: float) -> None:
        """Every millisecond, when the loop has not ticked for ``threshold`` seconds, keep where its thread is
        (once per stall): what a stall is spent on."""
        seen = 0.0
        while True:
            time.sleep(0.001)
            last = self._last
            if time.perf_counter() - last > threshold and last != seen:
                seen = last
                frame = sys._current_frames().get(loop_thread)
                if frame is not None:
                    self.stacks.append((time.time(), "".join(traceback.format_stack(frame)[-8:])))

    async def tick(self) -> None:
        self.thread = threading.current_thread().name
        threshold = float(os.environ.get("LOOP_LAG_WATCH", "0")) / 1000
        if threshold > 0:
            args = (threading.get_ident(), threshold)
            threading.Thread(target=self.watch, args=args, daemon=True, name="loop-lag-watch").start()
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        waited = _run_queue_wait(fd) if fd >= 0 else 0.0
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            now_waited = _run_queue_wait(fd) if fd >= 0 else 0.0
            self.at.append(time.time())
            self.stall.append(max(0.0, (now - last - TICK) - (now_waited - waited)))
            last, waited = now, now_waited
            self._last = now

    def dump(self) -> None:
        out = os.environ.get("LOOP_LAG_OUT")
        if not out:
            return
        data = {
            "pid": os.getpid(),
            "at": list(self.at),
            "stall": list(self.stall),
            "collections": self.collections,
            "stacks": self.stacks,
            "tlsreload": "tlsreload_plugins" in sys.modules,
        }
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump(data, f)


async def app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] == "lifespan":
        record = Record()
        ticker: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                ticker = asyncio.get_running_loop().create_task(record.tick())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if ticker is not None:
                    ticker.cancel()
                record.dump()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = f"pid={os.getpid()} tlsreload={int('tlsreload_plugins' in sys.modules)}\n".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
