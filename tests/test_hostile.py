"""Issue 9, end to end: nothing on disk may stop, stall or silently freeze a server.

Hostile cases of :mod:`hostile` are put on disk under real servers while client threads handshake
throughout: every case under one server per way checks are driven (:data:`FULL`), and one case of each
sort under every server (:data:`EVERY_KIND`). The server must keep serving its last good leaf with no failed or stalled
handshake, say so once per worker (a WARNING naming the file), show it in ``/status`` and
``/metrics``, and serve the next good pair within the check interval plus a margin.

One server per kind serves all its cases (a module-scoped fixture); a case that fails leaves its
server to be restarted before the next case, so one broken case does not fail the others.
Servers run with their data segment capped (``RLIMIT_DATA``): a reader that slurps ``/dev/zero``
gets a MemoryError instead of eating the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families

import server_kinds
from hostile import FILE_OF_CASE, HOSTILE, place_good
from test_gunicorn import WAITING, fetch, wait_every_worker
from tlstest import Hammer, RenameEachLayout, Server, client_context, free_port, handshake, run_server, wait_until

T = TypeVar("T")

TESTS = Path(__file__).parent
INTERVAL = "0.3"
WORKERS = server_kinds.WORKERS
REPORT_DEADLINE = 15.0
"""Seconds for every worker to report a hostile file (two checks settle it: about 0.6 s)."""
RELOAD_DEADLINE = 10.0
"""Seconds for every worker to serve the next good pair (interval 0.3 s plus a wide margin)."""
STALL_LIMIT = 1.0
"""No handshake may take this long while hostile files are on disk (a normal one takes milliseconds)."""
MEMORY_GROWTH_LIMIT = 64 * 1024**2
"""How much a worker's peak resident memory may grow during one case: files are read with a 1 MiB cap."""
GROWS_WITH_TRAFFIC = {"asgi"}
"""Worker classes whose memory grows with handshakes alone (gunicorn 27's asgi worker: about 80 KB per
handshake-only connection, to ~800 MB after 10,000, with or without tlsreload): no memory check there."""
MEMORY_GROWTH_LIMITS = {"tlsreload-hypercorn": 192 * 1024**2}
"""Kinds whose workers' peak memory grows with the connections a loaded machine queues: hypercorn's workers grew
by 35 to 100 MiB in every hostile case (fifo, huge, mismatched alike) with four busy loops beside them, with the
plugin of 7fac31b as with today's, and by less than 64 MiB on a quiet machine. A reader that ignored the 1 MiB cap
on a 1 GB file or /dev/zero would still grow far past this (up to the 2 GiB data cap)."""
STARTUP_DEADLINE = 20.0
DATA_LIMIT = 2 * 1024**3
FAILED = "certificate reload failed"
FAILED_TO_BOOT = "Worker failed to boot"

SERVERS = list(server_kinds.KINDS)
CASES = list(HOSTILE)
FULL = ("sync", "gevent", "tlsreload-uvicorn", "tlsreload-hypercorn")
"""Kinds that meet every case: one per way a check is driven (a thread in a forked worker, gevent's hub pool, an
asyncio loop in a spawned process, hypercorn's spawned workers). What a case does is decided by the core, the same
code in every server; what a server adds is how its checks are driven and how its status reaches clients."""
EVERY_KIND = ("fifo", "huge", "mismatched")
"""Cases every kind meets, one of each sort: a read that would block, a file past the size cap, a pair refused by
validation (reported in the log, ``/status`` and ``/metrics``)."""
PAIRS = {(kind, case) for kind in SERVERS for case in CASES if kind in FULL or case in EVERY_KIND}
"""The (server, case) pairs the matrix runs: conftest.py deselects the others, for CI's time."""

# Caps the data segment, then runs the rest of the command line with this Python (limits survive exec).
CAPPED_BOOT = (
    "import os, resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_DATA, ({DATA_LIMIT}, {DATA_LIMIT}))\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def capped(args: list[str]) -> list[str]:
    """``args`` (starting with ``-m``) run by this Python with its data segment capped."""
    assert args[0] == "-m", args
    return [sys.executable, "-c", CAPPED_BOOT, *args]


def cap_data() -> None:  # a preexec_fn
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))


def server_env() -> dict[str, str]:
    # PYTHONPATH from the environment is kept, so the suite can run against another copy of the package.
    paths = [str(TESTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), "TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_METRICS": "1"}


def server_args(kind: str, port: int, layout: RenameEachLayout, *extra: str) -> list[str]:
    """The command line for one server kind (see :mod:`server_kinds`)."""
    return server_kinds.args(kind, port, layout, *extra)


# --- clients ------------------------------------------------------------------------------------


def get(port: int, ctx: ssl.SSLContext, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One HTTPS GET of ``path`` on a new connection: (the answering worker's pid, body)."""
    with handshake(port, ctx, timeout) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        response = b""
        while chunk := tls.recv(65536):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), response[:500]
    match = re.search(rb"(?im)^x-worker-pid: *(\d+)", head)
    assert match, head
    return int(match.group(1)), body


def peak_rss(pid: int) -> int | None:
    """The peak resident memory of ``pid`` in bytes (``VmHWM``), or ``None`` when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return int(match.group(1)) * 1024 if match else None


class Probe:
    """One client making a full handshake every 20 ms and recording the slowest (failures included)."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.port, self.ctx = port, ctx
        self.worst = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            start = time.monotonic()
            with contextlib.suppress(Exception), handshake(self.port, self.ctx):
                pass
            self.worst = max(self.worst, time.monotonic() - start)
            self.count += 1

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# --- one server per kind ------------------------------------------------------------------------


class Running:
    """A server of one kind on a plain cert/key pair, restartable, serving ``serial``."""

    def __init__(self, kind: str, root: Path, ca: trustme.CA) -> None:
        self.kind, self.root, self.ca = kind, root, ca
        self.layout = RenameEachLayout(root / "tls")
        self.cert_path, self.key_path = self.layout.cert_path, self.layout.key_path
        self.ctx = client_context(ca)
        self.port = 0
        self.serial = ""
        self.clean = False
        """True when the last case passed: the server is known to serve a good pair."""
        self._starts = 0
        self._stack = contextlib.ExitStack()
        self._server: Server | None = None

    @property
    def workers(self) -> int:
        """How many processes serve this kind."""
        return server_kinds.workers(self.kind)

    @property
    def server(self) -> Server:
        assert self._server is not None
        return self._server

    def start(self) -> None:
        self._starts += 1
        self.serial = place_good(self.cert_path, self.key_path, self.ca)
        self.port = free_port()
        log_dir = self.root / f"run{self._starts}"
        log_dir.mkdir()
        args = capped(server_args(self.kind, self.port, self.layout))
        self._server = self._stack.enter_context(
            run_server(args, log_dir / "server.log", self.port, env=server_env(), cwd=log_dir)
        )
        wait_every_worker(self.port, self.ctx, self.serial, self.workers)
        self.clean = True

    def stop(self) -> None:
        # SIGTERM, then the process group is killed; AssertionError: it did not stop in time (killed anyway).
        with contextlib.suppress(AssertionError):
            self._stack.close()
        self._server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return self.server.output()

    def sweep(self, path: str, parse: Callable[[int, bytes], T], accept: Callable[[int, T], bool]) -> dict[int, T]:
        """GET ``path`` until ``accept`` holds for the latest answer of every serving process."""
        latest: dict[int, T] = {}

        def enough() -> bool:
            pid, body = get(self.port, self.ctx, path)
            latest[pid] = parse(pid, body)
            return sum(accept(p, value) for p, value in latest.items()) >= self.workers

        wait_until(enough, REPORT_DEADLINE, what=f"{self.workers} workers answering {path} as expected")
        return latest

    def failure_counts(self) -> dict[int, tuple[int, float]]:
        """Per worker: (``status().failures``, ``tlsreload_reload_failures_total``)."""
        statuses = self.sweep("/status", lambda pid, body: only_status(body), lambda pid, status: True)
        counted = self.sweep("/metrics", self.failures_metric, lambda pid, value: True)
        return {pid: (statuses[pid]["failures"], counted.get(pid, 0.0)) for pid in statuses}

    def failures_metric(self, pid: int, body: bytes) -> float:
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == "tlsreload_reload_failures_total" and sample.labels.get("certfile") == str(
                    self.cert_path
                ):
                    return float(sample.value)
        raise AssertionError(f"no tlsreload_reload_failures_total for {self.cert_path} in worker {pid}:\n{body!r}")


def only_status(body: bytes) -> dict[str, Any]:
    statuses = json.loads(body)["reloaders"]
    assert len(statuses) == 1, statuses
    status: dict[str, Any] = statuses[0]
    return status


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    kind: str = request.param
    running = Running(kind, tmp_path_factory.mktemp(kind.replace(".", "-")), trustme.CA())
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def served(server: Running) -> Running:
    """The module's server, restarted on a good pair unless the previous case left it serving one."""
    if not server.clean or server.server.proc.poll() is not None:
        server.restart()
    server.clean = False
    return server


# --- every case on every server -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_hostile_file_is_reported_once_and_never_served(served: Running, case: str) -> None:
    run = served
    named = run.key_path if FILE_OF_CASE.get(case) == "key" else run.cert_path
    good = run.serial
    before = run.failure_counts()
    peaks_before = {pid: peak_rss(pid) for pid in before}
    offset = len(run.output())

    def lines_naming_the_file() -> list[str]:
        return [line for line in run.output()[offset:].splitlines() if str(named) in line]

    with Hammer(run.port, run.ctx, threads=2) as hammer, Probe(run.port, run.ctx) as probe:
        HOSTILE[case](run.cert_path, run.key_path, run.ca)

        wait_until(lambda: len(lines_naming_the_file()) >= run.workers, REPORT_DEADLINE, what="every worker's report")

        def reported(pid: int, status: dict[str, Any]) -> bool:
            return str(named) in (status["last_error"] or "") and status["failures"] > before.get(pid, (0, 0))[0]

        run.sweep("/status", lambda pid, body: only_status(body), reported)
        run.sweep("/metrics", run.failures_metric, lambda pid, value: value > before.get(pid, (0, 0.0))[1])
        reports = lines_naming_the_file()  # after the sweeps: several more checks have run
        assert all(fetch(run.port, run.ctx)[0] == good for _ in range(4))
        served_while_hostile = set(hammer.serials)

        new = place_good(run.cert_path, run.key_path, run.ca)
        started = time.monotonic()
        wait_every_worker(run.port, run.ctx, new, run.workers)
        reload_seconds = time.monotonic() - started
        wait_until(lambda: new in hammer.serials, RELOAD_DEADLINE, what="the hammer on the new leaf")

    # Figures for the record (shown with -s): the slowest handshake and the time to serve the next pair.
    print(f"\n{run.kind} {case}: slowest of {probe.count} probe handshakes {probe.worst * 1000:.0f} ms; ", end="")
    print(f"{hammer.successes} hammer handshakes; every worker on the next pair after {reload_seconds:.2f}s")
    assert len(reports) == run.workers and all(FAILED in line and "WARNING" in line for line in reports), reports
    if run.kind in server_kinds.LOG_LINES_NAME_THE_WORKER:  # gunicorn's and hypercorn's: one each
        assert len({re.findall(r"\[(\d+)\] \[WARNING\]", line)[0] for line in reports}) == run.workers, reports
    assert hammer.failures == [], hammer.failures[:5]
    assert served_while_hostile == {good}, served_while_hostile
    assert hammer.serials == {good, new}
    assert probe.count > 0 and probe.worst < STALL_LIMIT, f"slowest handshake {probe.worst:.2f}s"
    assert reload_seconds < RELOAD_DEADLINE, reload_seconds
    if run.kind not in GROWS_WITH_TRAFFIC:
        peaks = {pid: (before, peak_rss(pid)) for pid, before in peaks_before.items()}
        grown = {pid: b - a for pid, (a, b) in peaks.items() if a is not None and b is not None}
        limit = MEMORY_GROWTH_LIMITS.get(run.kind, MEMORY_GROWTH_LIMIT)
        assert all(growth < limit for growth in grown.values()), f"peak RSS (before, after): {peaks}"
    assert run.server.proc.poll() is None
    output = run.output()[offset:]
    assert "Traceback" not in output and FAILED_TO_BOOT not in output, output
    run.serial = new
    run.clean = True


# --- start-up and worker restarts ---------------------------------------------------------------


def lines_with(out: str, text: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


def run_capped(args: list[str], cwd: Path, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run to completion with the data segment capped; a hang is a test failure, not a stuck suite."""
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **server_env()}
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        pytest.fail(f"{args[3:6]} still running after {timeout}s (killed):\n{out}")


def test_fifo_at_start_up_stops_gunicorn_promptly_with_one_error(tmp_path: Path, ca: trustme.CA) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    HOSTILE["fifo"](layout.cert_path, layout.key_path, ca)
    port = free_port()
    args = capped(server_args("sync", port, layout))
    with run_server(args, tmp_path / "gunicorn.log", port, env=server_env()) as server:
        wait_until(lambda: server.proc.poll() is not None, STARTUP_DEADLINE, what="gunicorn to stop by itself")
    output = server.output()
    assert server.proc.returncode == 1, output
    assert "Traceback" not in output and "Booting worker" not in output, output
    naming = lines_with(output, str(layout.cert_path))
    assert len(naming) == 1 and "[ERROR]" in naming[0], output


@pytest.mark.parametrize("case", ["fifo", "bad_san"])
def test_hostile_file_at_start_up_stops_tlsreload_uvicorn_with_exit_3(
    tmp_path: Path, ca: trustme.CA, case: str
) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    HOSTILE[case](layout.cert_path, layout.key_path, ca)
    result = run_capped(capped(server_args("tlsreload-uvicorn", free_port(), layout)), tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "Traceback" not in out, out
    naming = lines_with(out, str(layout.cert_path))
    assert len(naming) == 1 and naming[0].startswith("ERROR:"), out


def test_bad_san_across_a_max_requests_restart_keeps_gunicorn_running(tmp_path: Path, ca: trustme.CA) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    good = place_good(layout.cert_path, layout.key_path, ca)
    port = free_port()
    ctx = client_context(ca)
    args = capped(server_args("sync", port, layout, "--max-requests", "20"))
    with run_server(args, tmp_path / "gunicorn.log", port, env=server_env()) as server:
        wait_every_worker(port, ctx, good, WORKERS)
        offset = len(server.output())
        HOSTILE["bad_san"](layout.cert_path, layout.key_path, ca)
        served: list[tuple[str, int]] = []

        def a_replacement_booted_and_settled() -> bool:
            # A worker started while the bad file is on disk either serves the last good leaf or waits
            # for usable files; it must never fail to boot (which stops gunicorn).
            with contextlib.suppress(OSError, AssertionError):  # no worker may be serving now: do not wait long
                served.append(fetch(port, ctx, timeout=1))
            new = server.output()[offset:]
            booted = set(map(int, re.findall(r"Booting worker with pid: (\d+)", new)))
            serving = booted & {pid for _, pid in served}
            settled = bool(serving) or WAITING in new or FAILED_TO_BOOT in new
            return (bool(booted) and settled) or server.proc.poll() is not None

        wait_until(a_replacement_booted_and_settled, 60, interval=0.01, what="a worker restart on the bad file")
        assert server.proc.poll() is None, server.output()
        assert FAILED_TO_BOOT not in server.output(), server.output()
        assert served and {serial for serial, _ in served} == {good}, served

        new_serial = place_good(layout.cert_path, layout.key_path, ca)
        wait_every_worker(port, ctx, new_serial, WORKERS)
        assert server.proc.poll() is None
        output = server.output()
    assert FAILED_TO_BOOT not in output and "Traceback" not in output, output


# --- tlsreload check ----------------------------------------------------------------------------

TLSRELOAD = str(Path(sys.executable).parent / "tlsreload")


@pytest.mark.parametrize(
    "case", ["system_bundle", "many_certs", "bad_san", "fifo", "dev_zero", "expired", "not_yet_valid"]
)
def test_tlsreload_check_refuses(tmp_path: Path, ca: trustme.CA, case: str) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    place_good(cert, key, ca)
    HOSTILE[case](cert, key, ca)
    try:
        result = subprocess.run(
            [TLSRELOAD, "check", "--cert", str(cert), "--key", str(key)],
            capture_output=True,
            text=True,
            timeout=30,
            preexec_fn=cap_data,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"tlsreload check still running after 30s on {case} (killed)")
    assert "Traceback" not in result.stderr, result.stderr
    if case in ("expired", "not_yet_valid"):
        assert result.returncode != 0, result
        return
    assert result.returncode == 1, result
    assert "NOT USABLE" in result.stderr and str(cert) in result.stderr, result.stderr
