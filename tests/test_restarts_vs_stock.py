"""Worker restarts cost no more with the plugin than without it: the plugin and the stock server side by side,
in every worker model, while a SIGHUP and ``max_requests`` recycle their workers under client traffic.

Each model starts two servers on free ports at once, 2 workers each, the same certificate: stock and the plugin.
Two client threads per server make a full handshake (a new connection, no session reuse) and a ``GET /`` in a loop
for ``WINDOW`` seconds, both servers in the same window, so that both meet the same load on the machine. A third of
the way in, each server gets one SIGHUP; ``--max-requests 40 --max-requests-jitter 10`` (uvicorn:
``--limit-max-requests``) recycles workers throughout. Two windows:

* good files for both;
* broken files for the plugin (a mismatched pair, then, two thirds of the way in, a torn certificate), good files
  for stock: every answer must carry the plugin's last good certificate, and its failures stay level with stock's.

A failed request is any exception, a connection closed without a response included. The assertion is
:func:`assert_not_clearly_more`; ``pytest -s`` prints one line per model and window, each side's requests served
and failed beside the other's. Not here: tornado, whose restarts test_restarts.py covers.

hypercorn (``--workers 2``, asyncio) has a longer window, and stops itself now and then, stock as well as the
plugin: a worker that recycles closes its connections, and a client's data arriving after the worker's
``close_notify`` raises ``ssl.SSLError: APPLICATION_DATA_AFTER_CLOSE_NOTIFY`` out of hypercorn's own shutdown
(``hypercorn/asyncio/run.py``, ``worker_serve``); the worker exits 1, and hypercorn's parent stops the whole server
(with status 0: ``hypercorn/run.py`` returns the status of the workers it terminated). A window that meets it
is compared all the same, over the span in which both servers ran: it ends as soon as a server is seen stopped,
and each side counts the requests it *started* before the first stop (:func:`stopped_at` says when a server
stopped), so that the dead server's refused connections count for neither side, and both sides are compared over
the same time, load and steps (the SIGHUP, the torn certificate: a side cut short before a step did not meet it).
``-s`` marks such a window "cut short". A server that stopped itself is started again (on the same files) before
the broken-files window, so that each attempt compares both windows; attempts are run again, at most
``HYPERCORN_ATTEMPTS`` in all, until each window has run in full once, and every window run is compared. The
plugin stopping any other way fails.

Both sides start from compiled modules, as an installed package does (:func:`compiled`).
"""

from __future__ import annotations

import compileall
import inspect
import signal
import ssl
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pytest
import trustme
import uvicorn
from gunicorn.workers import SUPPORTED_WORKERS

import tlsreload_plugins
from test_gunicorn import DEADLINE, DROP_IN, TESTS, UVICORN, fetch, gunicorn, start, wait_every_worker
from test_hypercorn import drop_in as hypercorn_drop_in
from test_hypercorn import start as start_hypercorn
from test_restarts import LAST_GOOD, MISMATCH, refusals_said
from test_uvicorn import drop_in
from test_uvicorn import start as start_uvicorn
from tlstest import HOST, Hammer, KubeletLayout, Pair, Server, client_context, free_port, issue, wait_until

WINDOW = 3.0
"""Seconds of traffic per window: enough for several ``max_requests`` recycles per worker at this machine's rate."""
CLIENTS = 2
REQUEST_TIMEOUT = 5.0
"""A request that waits longer (a listen queue nobody accepts from) counts as failed."""
RECYCLE = ["--max-requests", "40", "--max-requests-jitter", "10"]
# uvicorn 0.47 (the floor) may lack the jitter option: use it where the installed uvicorn has it.
UVICORN_RECYCLE = ["--limit-max-requests", "40"] + (
    ["--limit-max-requests-jitter", "10"]
    if "limit_max_requests_jitter" in inspect.signature(uvicorn.Config).parameters
    else []
)
AIOHTTP_WORKER = "aiohttp.GunicornWebWorker"
"""aiohttp's gunicorn worker class, serving :mod:`asyncio_server_apps`' aiohttp app."""
TLSRELOAD_UVICORN = "tlsreload-uvicorn"
"""The model ``tlsreload-uvicorn --workers 2`` against ``uvicorn --workers 2``; the others but hypercorn are
gunicorn's ``--worker-class``."""
TLSRELOAD_HYPERCORN = "tlsreload-hypercorn"
"""The model ``tlsreload-hypercorn --workers 2`` against ``hypercorn --workers 2``, asyncio workers."""
HYPERCORN_WINDOW = 6.0
"""hypercorn's window: a recycled worker is replaced once it has exited, by a new interpreter (about 0.4 s to its
first accept here, twice that under load), so that each worker recycles a few times, as in the others' window."""
HYPERCORN_ATTEMPTS = 3
"""Attempts (both windows, new servers) at running each window in full, beside the windows that hypercorn's own
stop (see the module docstring) cut short; every window run is compared."""
HYPERCORN_STOPS_ITSELF = "APPLICATION_DATA_AFTER_CLOSE_NOTIFY"
"""What a hypercorn worker's traceback says when hypercorn's shutdown stops it (and with it the server)."""
MODELS = [
    "sync",
    "gthread",
    "gevent",
    pytest.param("asgi", marks=pytest.mark.skipif("asgi" not in SUPPORTED_WORKERS, reason="gunicorn without asgi")),
    UVICORN,
    AIOHTTP_WORKER,
    TLSRELOAD_UVICORN,
    TLSRELOAD_HYPERCORN,
]
DROPS_ON_ITS_OWN = {"gevent", "asgi", UVICORN, AIOHTTP_WORKER, TLSRELOAD_UVICORN, TLSRELOAD_HYPERCORN}
"""Worker models whose stock server drops requests by itself while its workers restart: 0 to 5 per window, 9 at
most (measured here in about 120 windows: gevent, ``UvicornWorker`` and ``uvicorn --workers`` close connections
without a response, asgi ends handshakes with ``SSLEOFError``; aiohttp's worker resets connections, 1 to 4 a
window in 6 windows; stock uvicorn's requests also time out when both
workers are down at once). Stock gunicorn sync and gthread dropped none in any window."""
SLACK = 8


def allowed_failures(model: str, plugin: Requests, stock: Requests) -> int:
    """How many failed requests the plugin may have beside stock's in the same window.

    Where stock drops none by design (sync, gthread), the plugin drops none: those restarts are clean, and ours
    must be too. Elsewhere (and where a clean model's stock dropped some anyway), failures are a small random
    count that grows with the number of restarts, and ``max_requests`` restarts a worker every 40 to 50 requests:
    stock's count is first scaled to the requests the plugin made (a side that serves 1.3x as many requests
    recycles 1.3x as often). "Not clearly more" is then at most twice that plus ``SLACK``. The factor 2 absorbs
    the spread of larger counts (stock's own count of one model varies by half from window to window). The
    slack absorbs that of counts near 0: failures come in bursts (a stopping worker drops the connection of
    each client thread at once), so a side that failed 0 in one window fails 5 in the next now and then
    (measured: 9 at most for stock, 8 for the plugin, over about 120 windows of these models). A plugin that
    failed the first connection of each client thread to each new worker (about 10 new workers per window: the
    HUP's and the recycles') would fail about 20 and be caught wherever stock fails 5 or fewer.
    """
    if not stock.failures and model not in DROPS_ON_ITS_OWN:
        return 0
    scale = max(1.0, plugin.attempts / max(stock.attempts, 1))
    return int(2 * len(stock.failures) * scale) + SLACK


def assert_not_clearly_more(what: str, model: str, plugin: Requests, stock: Requests) -> None:
    """Print ``what: plugin served S failed F, stock served S failed F (failures by kind)`` and assert
    :func:`allowed_failures`."""
    line = (
        f"{what}: plugin served {plugin.successes} failed {len(plugin.failures)}, "
        f"stock served {stock.successes} failed {len(stock.failures)} (plugin: {kinds(plugin)}; stock: {kinds(stock)})"
    )
    print(line)
    allowed = allowed_failures(model, plugin, stock)
    assert len(plugin.failures) <= allowed, (
        f"{line}; at most {allowed} allowed. plugin: {plugin.failures[:5]} stock: {stock.failures[:5]}"
    )


def kinds(side: Requests) -> str:
    """The failures of ``side`` by exception type, most frequent first: ``SSLEOFError 3, ConnectionResetError 1``."""
    counted = Counter(failure.split("(", 1)[0] for failure in side.failures)
    return ", ".join(f"{name} {count}" for name, count in counted.most_common()) or "none"


class Request(NamedTuple):
    """One request of :class:`Requests`: when it started (``time.monotonic()``) and how it ended."""

    start: float
    failure: str | None
    """``repr`` of the exception, ``None`` when served."""
    refused: bool
    """The connection was refused: nothing listened on the port."""
    serial: str = ""
    pid: int = 0


@dataclass
class Requests(Hammer):
    """:class:`tlstest.Hammer`'s client threads, each connection a full handshake and a ``GET /`` whose answer
    names the serving pid; each request is also kept with its start time (``log``), for :meth:`before`."""

    pids: set[int] = field(default_factory=set)
    log: list[Request] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return self.successes + len(self.failures)

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                serial, pid = fetch(self.port, self.ctx, timeout=REQUEST_TIMEOUT)
            except Exception as e:  # any failure counts, a connection closed without a response included
                with self._lock:
                    self.failures.append(repr(e))
                    self.log.append(Request(start, repr(e), isinstance(e, ConnectionRefusedError)))
            else:
                with self._lock:
                    self.successes += 1
                    self.serials.add(serial)
                    self.pids.add(pid)
                    self.log.append(Request(start, None, False, serial, pid))

    def before(self, moment: float) -> Requests:
        """The requests that started before ``moment``, counted alike (the threads are not started)."""
        kept = Requests(self.port, self.ctx, threads=self.threads)
        with self._lock:
            log = sorted(self.log, key=lambda request: request.start)
        for request in log:
            if request.start >= moment:
                continue
            kept.log.append(request)
            if request.failure is None:
                kept.successes += 1
                kept.serials.add(request.serial)
                kept.pids.add(request.pid)
            else:
                kept.failures.append(request.failure)
        return kept


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    """The bytecode of the tlsreload_plugins under test, written before any server starts: stock servers import
    the bytecode pip wrote at install, and a source tree under ``PYTHONDONTWRITEBYTECODE`` would otherwise be
    compiled again by every worker the plugin's servers start (a cost of the test's set-up, not of the plugin)."""
    compileall.compile_dir(Path(tlsreload_plugins.__file__).parent, quiet=1)


def command(model: str, plugin: bool, port: int, layout: KubeletLayout) -> list[str]:
    """The server of ``model`` with or without the plugin, 2 workers, recycled by max requests."""
    if model == TLSRELOAD_HYPERCORN:
        # hypercorn 0.18 sets the jitter from --max-requests (hypercorn/__main__.py): 40 to 80 requests either way.
        options = ["--workers", "2", "--worker-class", "asyncio", *RECYCLE]
        if plugin:
            return hypercorn_drop_in(port, layout, *options)
        args = ["-m", "hypercorn", str(TESTS / "gunicorn_apps.py") + ":asgi", "--bind", f"{HOST}:{port}"]
        return [*args, "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path), *options]
    if model == TLSRELOAD_UVICORN:
        options = ["--workers", "2", "--no-access-log", *UVICORN_RECYCLE]
        if plugin:
            return drop_in(port, layout, *options, app="gunicorn_apps:asgi")
        args = ["-m", "uvicorn", "gunicorn_apps:asgi", "--app-dir", str(TESTS), "--host", HOST, "--port", str(port)]
        args += ["--ssl-certfile", str(layout.cert_path), "--ssl-keyfile", str(layout.key_path)]
        return [*args, *options]
    extra = ["-c", DROP_IN] if plugin else []
    args = gunicorn(port, layout.cert_path, layout.key_path, *extra, *RECYCLE, worker_class=model)
    if model == AIOHTTP_WORKER:
        args[-1] = "asyncio_server_apps:aiohttp_app"
    return args


def started(model: str, plugin: bool, layout: KubeletLayout, root: Path) -> AbstractContextManager[Server]:
    """Start (without waiting) the server of ``model`` on ``layout``'s files, its log and working directory
    ``root``."""
    args = command(model, plugin, free_port(), layout)
    root.mkdir(parents=True, exist_ok=True)
    if model == TLSRELOAD_UVICORN:
        return start_uvicorn(args, root, int(args[args.index("--port") + 1]))
    if model == TLSRELOAD_HYPERCORN:
        return start_hypercorn(args, root, int(args[args.index("--bind") + 1].rsplit(":", 1)[1]))
    return start(args, root)


def stopped_itself(side: str, server: Server) -> str:
    """How ``server``, which has exited or is stopping (it refused a connection), stopped: hypercorn's own stop (see
    the module docstring), stock's behaviour, in either server; any other exit, or none, raises an
    ``AssertionError`` with the server's output."""
    wait_until(lambda: server.proc.poll() is not None, DEADLINE, what=f"the {side} server, which refused, to exit")
    output = server.output()
    if HYPERCORN_STOPS_ITSELF not in output:
        raise AssertionError(output)
    return f"{side} stopped itself (exit {server.proc.returncode})"


def at(moment: float, seconds: float, stop: Callable[[], bool]) -> bool:
    """Return ``True`` at ``moment`` (``time.monotonic()``): the measured window's own clock, not a wait for a
    state; or ``False`` as soon as ``stop()`` says a server has stopped, before or at ``moment``."""
    wait_until(lambda: stop() or time.monotonic() >= moment, seconds + 1, interval=0.01, what="the window's next step")
    return not stop()


def stopped_at(requests: Requests, seen: float) -> float:
    """When the server that ``requests`` went to stopped: the start of the first request it refused (nothing
    listened on its port any more: the parent holds the listening sockets until it stops, so that a running server
    never refuses), else ``seen``, when the window first saw its process gone (no request started after the
    sockets closed)."""
    return min([seen, *(request.start for request in requests.log if request.refused)])


@dataclass
class Window:
    """One window as compared: each side's requests, and the servers that stopped themselves within it."""

    plugin: Requests
    stock: Requests
    seconds: float
    """The span compared: the whole window, or from its start to the first server's stop."""
    stops: list[str]
    """Each server that stopped itself within the window, how and when; none when the window ran in full."""
    new_plugin_worker: bool
    """A worker that started within the window served the plugin's clients (before or after a stop)."""

    def label(self) -> str:
        """``""`` for a full window, else how it was cut short."""
        return f" [cut short at {self.seconds:.1f} s: {'; '.join(self.stops)}]" if self.stops else ""


def window(
    plugin: Server,
    stock: Server,
    ctx: ssl.SSLContext,
    steps: list[tuple[float, Callable[[], None]]],
    seconds: float = WINDOW,
) -> Window:
    """Client threads on both servers for ``seconds``, and on until a worker started within the window has
    served on both (a spawned uvicorn worker can take longer than the window to start under load); each step runs
    once its share of the window has passed. The servers share the window, so it lasts as long for both.

    A server that stops within it must have stopped itself (:func:`stopped_itself`); the window then ends, and
    both sides keep the requests that started before the first server stopped (:func:`stopped_at`)."""
    servers = {"plugin": plugin, "stock": stock}
    seen: dict[str, float] = {}  # side: when the window first saw its server's process gone

    def a_stop() -> bool:
        now = time.monotonic()
        for side, server in servers.items():
            # Gone, or refusing: its parent has closed the listening sockets, and is stopping (a parent that
            # closes a reader of its files first takes a little longer to exit, and is refused for that long).
            refusing = side in traffic and any(request.refused for request in traffic[side].log)
            if side not in seen and (server.proc.poll() is not None or refusing):
                seen[side] = now
        return bool(seen)

    traffic: dict[str, Requests] = {}
    begin = time.monotonic()
    with ExitStack() as threads:
        traffic.update((side, Requests(server.port, ctx, threads=CLIENTS)) for side, server in servers.items())
        for requests in traffic.values():
            threads.enter_context(requests)
        for share, step in steps:
            if not at(begin + share * seconds, seconds, a_stop):
                break
            step()
        else:
            if at(begin + seconds, seconds, a_stop):
                # Two workers serve as the window opens: a third pid is a worker that started within it.
                def new_workers_or_a_stop() -> bool:
                    return all(len(t.pids) >= 3 for t in traffic.values()) or a_stop()

                wait_until(new_workers_or_a_stop, DEADLINE, what="a new worker on every server")
        end = time.monotonic()
    a_stop()  # a server that stopped as the window ended
    stops = {side: stopped_at(traffic[side], moment) for side, moment in seen.items()}
    described = [f"{stopped_itself(side, servers[side])} at {stops[side] - begin:.1f} s" for side in sorted(stops)]
    cut = min(stops.values(), default=None)
    compared = {side: t.before(cut) if cut is not None else t for side, t in traffic.items()}
    span = (end if cut is None else cut) - begin
    new_worker = len(traffic["plugin"].pids) >= 3
    return Window(compared["plugin"], compared["stock"], span, described, new_worker)


def hup(*servers: Server) -> Callable[[], None]:
    """A step that sends SIGHUP to each of ``servers``."""

    def send() -> None:
        for server in servers:
            server.proc.send_signal(signal.SIGHUP)

    return send


@dataclass
class SideBySide:
    """The two windows, as compared, and the output of the plugin's server that ran the broken-files one."""

    good: Window
    broken: Window
    output: str


def side_by_side(model: str, ca: trustme.CA, good: Pair, root: Path) -> SideBySide:
    """Stock and the plugin's server of ``model`` at once, in ``root``: the good-files window, then the
    broken-files one (see the module docstring); a server that stopped itself in between is started again first."""
    ctx = client_context(ca)
    seconds = HYPERCORN_WINDOW if model == TLSRELOAD_HYPERCORN else WINDOW
    layouts = {side: KubeletLayout(root / side) for side in ("stock", "plugin")}
    for layout in layouts.values():
        layout.install(good)
    with ExitStack() as stack:
        servers: dict[str, Server] = {}

        def start_all(sides: list[str], where: str) -> None:
            for side in sides:
                run = started(model, side == "plugin", layouts[side], root / f"{side}{where}")
                servers[side] = stack.enter_context(run)
            for side in sides:
                wait_every_worker(servers[side].port, ctx, good.serial)

        start_all(["stock", "plugin"], "")
        steps = [(1 / 3, hup(*servers.values()))]
        good_files = window(servers["plugin"], servers["stock"], ctx, steps, seconds)

        gone = [side for side, server in servers.items() if server.proc.poll() is not None]
        for side in gone:
            stopped_itself(side, servers[side])
        start_all(gone, "-again")
        other, layout = issue(ca), layouts["plugin"]
        plugin = servers["plugin"]
        before = refusals_said(plugin.output(), MISMATCH)
        layout.write_raw(other.chain, good.key)  # a mismatched pair: the new certificate, the old key
        # The window opens once the server's reader has refused them: a worker started from then on starts on broken
        # files (one started before it looked serves the same certificate, from the same publication, and has
        # nothing to say about them).
        wait_until(lambda: refusals_said(plugin.output(), MISMATCH) > before, DEADLINE, what="the mismatch reported")
        torn = other.chain[: len(other.chain) // 2]  # a certificate cut off in the middle of its base64
        steps = [(1 / 3, hup(*servers.values())), (2 / 3, lambda: layout.write_raw(torn, other.key))]
        broken_files = window(servers["plugin"], servers["stock"], ctx, steps, seconds)
        return SideBySide(good_files, broken_files, servers["plugin"].output())


@pytest.mark.parametrize("model", MODELS)
def test_restarts_fail_no_more_requests_than_stock(tmp_path: Path, ca: trustme.CA, model: str) -> None:
    good = issue(ca)
    runs: list[SideBySide] = []
    for attempt in range(HYPERCORN_ATTEMPTS if model == TLSRELOAD_HYPERCORN else 1):
        runs.append(side_by_side(model, ca, good, tmp_path / f"attempt-{attempt}"))
        if any(not run.good.stops for run in runs) and any(not run.broken.stops for run in runs):
            break

    for number, run in enumerate(runs, 1):
        name = model if len(runs) == 1 else f"{model}, attempt {number}"
        for measured in (run.good, run.broken):
            for side in (measured.plugin, measured.stock):
                # Every answer carried the good certificate; a window run in full served on both sides.
                assert side.serials <= {good.serial}, side.serials
                assert side.successes or measured.stops, side.failures[:5]
        good_files, broken_files = run.good, run.broken
        assert_not_clearly_more(f"{name}, good files{good_files.label()}", model, good_files.plugin, good_files.stock)
        broken = f"{name}, broken files (plugin){broken_files.label()}"
        assert_not_clearly_more(broken, model, broken_files.plugin, broken_files.stock)
        if broken_files.new_plugin_worker:  # always, in a window run in full
            assert LAST_GOOD in run.output, run.output  # workers did start on the broken files
