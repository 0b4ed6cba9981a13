"""How long CherryPy (or bare cheroot) takes to stop on SIGINT and SIGTERM with CPU hogs beside it, plugin against
stock, same run.

Issue 46: the README's test command on a loaded machine once saw CherryPy with ``server.ssl_module 'tlsreload'``
not stop within 20 s of SIGINT, its log without "Bus STOPPING". Each trial starts a stock server (the tests'
stock CherryPy, ``tests/cheroot_apps.py --stock-cherrypy``, or with ``--way cheroot`` this file's ``serve``:
cheroot's builtin SSL adapter) and the plugin's (``examples/cheroot_app.py``, started as
tests/test_cheroot.py starts it) side by side on the same certificate files, with ``--hogs`` busy-loop processes
beside them, sends both the same signal, and measures the seconds from the signal to the exit of each. The moments,
in turn (``--moments``):

* ``start``: a random time up to ``--early`` seconds after both were started (under load, often before or while
  CherryPy starts, in the middle of the adapter's start-up);
* ``served``: each side the moment it has answered its first HTTPS request (CherryPy's HTTP server serves from its
  thread while the main thread is still in ``engine.start()``);
* ``serving``: each side up to 0.5 s after both served;
* ``started``: each side up to 0.5 s after both served and CherryPy logged "Bus STARTED" (as tests/test_cheroot.py
  signals it);
* ``rotated``: right after a rotation of the files (the plugin reloading in its thread) and a few requests.

``--sigint``: how the servers get SIGINT: at its default, as from a terminal (default); ``ignored``, as a job a
non-interactive shell starts in the background (or nohup) gets it, and keeps it: Python leaves an inherited
ignored SIGINT ignored; or ``inherited`` from this process. ``--way cheroot``: bare cheroot, both sides stopping
as the example does (``server.stop()`` from a thread on SIGTERM and SIGINT).

A side that has not stopped within ``--timeout`` seconds is a hang: its Python stacks (``py-spy dump``, when
py-spy is installed) and its log are kept under ``--keep`` (default: a new temporary directory), then its process
group is killed. The table: per side and signal, the trials, the median and maximum stop time, and the hangs; then
plugin/stock ratios of the median and maximum; below them every hang, with the moment and CherryPy's phase at the
signal, from its log (``before start``: no "Bus STARTING" yet; ``starting``: no "Bus STARTED" yet; ``started``).

The servers import tlsreload_plugins as this process would: ``PYTHONPATH=/a/copy/src`` runs another copy of it.

    python benchmarks/stop_under_load.py                        # 2 hogs, 24 trials per signal: 3-5 min
    python benchmarks/stop_under_load.py --quick                # 4 trials per signal
    python benchmarks/stop_under_load.py --sigint ignored --hogs 0 --trials 6 --timeout 10
    python benchmarks/stop_under_load.py --way cheroot --moments start,served

The stock cheroot server (nothing of tlsreload_plugins imported)::

    python benchmarks/stop_under_load.py serve --certfile C --keyfile K --port P
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cheroot_app.py"
INTERVAL = "0.3"  # as tests/test_cheroot.py
SIDES = ("stock", "plugin")
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}
CYCLE = 0.5  # cheroot's HTTPServer.expiration_interval: its stop waits for the select() of that timeout to return


# --- the stock servers ------------------------------------------------------------------------------


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    body = f"pid={os.getpid()} serial=-".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def serve(options: argparse.Namespace) -> None:
    """Stock cheroot's ``wsgi.Server`` with the example's way to stop (its ``stop_on_signals``, copied here so that
    nothing of tlsreload_plugins is imported). Stock CherryPy is the tests' (``tests/cheroot_apps.py
    --stock-cherrypy``), configured as the example's ``--cherrypy``."""
    serve_cheroot(options)


def serve_cheroot(options: argparse.Namespace) -> None:
    from cheroot import wsgi
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    server = wsgi.Server(("127.0.0.1", options.port), app)
    server.ssl_adapter = BuiltinSSLAdapter(options.certfile, options.keyfile)
    stop_on_signals(server)
    server.safe_start()


def stop_on_signals(server: Any) -> None:
    """examples/cheroot_app.py's."""

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.stop, name=f"stop on {signal.Signals(signum).name}").start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


# --- the loop ---------------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    sent_at: float = 0.0
    stopped_after: float | None = None
    phase: str = ""
    code: int | None = None
    dump: str = ""

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Trial:
    number: int
    sig: str
    moment: str
    sides: dict[str, Side] = field(default_factory=dict)


def phase_of(out: str) -> str:
    """CherryPy's phase, from its log (cheroot logs nothing of its own)."""
    if "Bus STARTED" in out:
        return "started"
    if "Bus STARTING" in out:
        return "starting"
    return "before start"


@contextlib.contextmanager
def sigint_for_children(how: str) -> Iterator[None]:
    """SIGINT as the processes started in the block get it: ``default`` (as from a terminal: Python makes it
    KeyboardInterrupt), ``ignored`` (as a job a non-interactive shell starts in the background, or nohup, gets it:
    Python leaves an ignored SIGINT ignored), or ``inherited`` (whatever this process has)."""
    if how == "inherited":
        yield
        return
    # A handled signal is reset to its default in the child (exec), an ignored one stays ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler if how == "default" else signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int, ctx: ssl.SSLContext, timeout: float = 5.0) -> bool:
    """``GET /`` over HTTPS on a new connection is answered with 200."""
    import socket

    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return tls.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_for(predicate: Callable[[], bool], deadline: float, pause: float = 0.05) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(pause)
    return False


def start_side(name: str, way: str, sigint: str, work: Path, number: int) -> Side:
    port = free_port()
    files = ["--certfile", str(work / "tls.crt"), "--keyfile", str(work / "tls.key"), "--port", str(port)]
    if name == "plugin":  # as tests/test_cheroot.py starts the example
        command = [sys.executable, str(EXAMPLE), *files, "--host", "127.0.0.1", "--interval", INTERVAL]
        command += ["--cherrypy"] if way == "cherrypy" else []
    elif way == "cherrypy":  # the tests' stock CherryPy (tests/ is on the path below)
        command = [sys.executable, "-m", "cheroot_apps", "--stock-cherrypy", *files]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "serve", *files]
    paths = [str(ROOT / "tests"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TLSRELOAD_INTERVAL": INTERVAL, "PYTHONPATH": os.pathsep.join(paths)}
    log_path = work / f"{number:03d}-{name}.log"
    with open(log_path, "wb") as log_file, sigint_for_children(sigint):
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True
        )
    return Side(name, proc, port, log_path)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def py_spy_dump(pid: int) -> str:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return "(py-spy is not installed: pip install py-spy)"
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(py-spy failed: {e})"
    return done.stdout + done.stderr


def await_exit(side: Side, timeout: float) -> None:
    try:
        side.proc.wait(max(0.0, side.sent_at + timeout - time.monotonic()))
        side.stopped_after = time.monotonic() - side.sent_at
        side.code = side.proc.returncode
    except subprocess.TimeoutExpired:
        side.dump = py_spy_dump(side.proc.pid)
    finally:
        kill_group(side.proc)


def run_trial(args: argparse.Namespace, number: int, sig: str, moment: str, pair: Files, work: Path) -> Trial:
    """Both sides started, signalled at ``moment``, waited for; every process of the trial is gone on return."""
    trial = Trial(number, sig, moment)
    ctx = ssl.create_default_context(cafile=str(work / "ca.pem"))
    started = time.monotonic()
    trial.sides = {name: start_side(name, args.way, args.sigint, work, number) for name in SIDES}
    try:
        if moment == "start":
            delay = random.uniform(0.0, args.early)
            trial.moment = f"start+{delay:.2f}"
            time.sleep(max(0.0, started + delay - time.monotonic()))
            signal_sides(trial.sides.values(), sig, args.way)
        elif moment == "served":  # each side the moment it has answered its first request
            waiting = list(trial.sides.values())
            end = time.monotonic() + 60.0
            while waiting and time.monotonic() < end:
                for side in [side for side in waiting if answers(side.port, ctx, timeout=1.0)]:
                    signal_sides([side], sig, args.way)
                    waiting.remove(side)
                time.sleep(0.01)
            if waiting:
                raise RuntimeError(f"{waiting[0].name} did not serve within 60 s:\n{waiting[0].output()[-2000:]}")
        else:
            for side in trial.sides.values():
                if not wait_for(lambda side=side: answers(side.port, ctx), 60.0):
                    raise RuntimeError(f"{side.name} did not serve within 60 s:\n{side.output()[-2000:]}")
            if moment == "started" and args.way == "cherrypy":  # as the tests signal CherryPy
                for side in trial.sides.values():
                    if not wait_for(lambda side=side: "Bus STARTED" in side.output(), 60.0):
                        raise RuntimeError(f"{side.name}: no 'Bus STARTED' within 60 s:\n{side.output()[-2000:]}")
            if moment == "rotated":
                pair.rotate()
                for _ in range(3):
                    for side in trial.sides.values():
                        answers(side.port, ctx)
            # Each side at a moment of its own: cheroot's stop waits for its connection loop's select() (0.5 s, from
            # the moment it started serving); signalled together, the side that started later would always wait longer.
            for side in random.sample(list(trial.sides.values()), len(trial.sides)):
                time.sleep(random.uniform(0.0, CYCLE))
                signal_sides([side], sig, args.way)
        waiters = [threading.Thread(target=await_exit, args=(side, args.timeout)) for side in trial.sides.values()]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
    finally:
        for side in trial.sides.values():
            kill_group(side.proc)
    return trial


def signal_sides(sides: Iterable[Side], sig: str, way: str) -> None:
    for side in sides:
        side.phase = phase_of(side.output()) if way == "cherrypy" else "-"
        side.sent_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            side.proc.send_signal(SIGNALS[sig])


class Files:
    """The certificate files both sides serve (a kubelet-style directory), rotated on request."""

    def __init__(self, work: Path) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from benchkit import CA, KubeletDir

        self.ca = CA()
        (work / "ca.pem").write_bytes(self.ca.pem)
        self.dir = KubeletDir(work / "tls")
        self.dir.install(self.ca.issue())
        for name in ("tls.crt", "tls.key"):
            link = work / name
            if not link.exists():
                link.symlink_to(self.dir.root / name)

    def rotate(self) -> None:
        self.dir.install(self.ca.issue())


def report(trials: Sequence[Trial], args: argparse.Namespace, keep: Path) -> str:
    import statistics

    timeout = args.timeout
    lines = [
        f"{args.way}, {args.hogs} CPU hogs beside, SIGINT {args.sigint} in the servers "
        f"(this process's: {'ignored' if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 'default'})",
        "",
        f"| side | signal | trials | median stop (s) | max stop (s) | not stopped within {timeout:g} s |",
        "|---|---|---|---|---|---|",
    ]
    for sig in sorted({t.sig for t in trials}):
        for name in SIDES:
            sides = [t.sides[name] for t in trials if t.sig == sig]
            times = [s.stopped_after for s in sides if s.stopped_after is not None]
            hangs = len(sides) - len(times)
            median = f"{statistics.median(times):.2f}" if times else "-"
            worst = f"{max(times):.2f}" if times else "-"
            lines.append(f"| {name} | SIG{sig} | {len(sides)} | {median} | {worst} | {hangs} |")
    lines += ["", "plugin/stock, per signal: median stop, max stop; hangs plugin vs stock", ""]
    for sig in sorted({t.sig for t in trials}):
        stops = {name: [t.sides[name].stopped_after for t in trials if t.sig == sig] for name in SIDES}
        done = {name: [x for x in values if x is not None] for name, values in stops.items()}
        hangs = {name: len(stops[name]) - len(done[name]) for name in SIDES}
        if all(done.values()):
            median = statistics.median(done["plugin"]) / max(statistics.median(done["stock"]), 1e-3)
            worst = max(done["plugin"]) / max(max(done["stock"]), 1e-3)
            lines.append(f"* SIG{sig}: {median:.2f}x, {worst:.2f}x; {hangs['plugin']} vs {hangs['stock']}")
        else:
            lines.append(f"* SIG{sig}: - (a side never stopped); {hangs['plugin']} vs {hangs['stock']}")
    hung = [(t, s) for t in trials for s in t.sides.values() if s.stopped_after is None]
    if hung:
        lines += ["", "Hangs (stacks and logs kept in " + str(keep) + "):", ""]
        lines += [f"* trial {t.number} {s.name} SIG{t.sig} at {t.moment} ({s.phase})" for t, s in hung]
    codes: dict[tuple[str, str, int | None], int] = {}
    for t in trials:
        for s in t.sides.values():
            if s.stopped_after is not None:
                codes[(s.name, t.sig, s.code)] = codes.get((s.name, t.sig, s.code), 0) + 1
    statuses = ", ".join(f"{n} SIG{g} {c}: {k}" for (n, g, c), k in sorted(codes.items()))
    lines += ["", "Exit statuses: " + (statuses or "- (none stopped)")]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: this module is also each server's ``serve`` entry point, which must load neither
    # cryptography nor the package (the stock side is stock).
    import benchkit as kit

    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stop-under-load-"))
    keep.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stop-under-load-work-"))
    moments = [m.strip() for m in args.moments.split(",")]
    trials: list[Trial] = []
    try:
        pair = Files(work)
        with kit.hogs(args.hogs):
            number = 0
            for round_ in range(args.trials):
                for sig in args.signals.split(","):
                    number += 1
                    moment = moments[round_ % len(moments)]
                    trial = run_trial(args, number, sig, moment, pair, work)
                    trials.append(trial)
                    summary = ", ".join(
                        f"{s.name} {'HUNG' if s.stopped_after is None else f'{s.stopped_after:.2f}s'}"
                        for s in trial.sides.values()
                    )
                    print(f"trial {number} SIG{sig} {trial.moment}: {summary}", file=sys.stderr, flush=True)
                    for side in trial.sides.values():
                        if side.stopped_after is None:
                            stem = keep / f"{number:03d}-{side.name}-SIG{sig}"
                            stem.with_suffix(".log").write_text(side.output())
                            stem.with_suffix(".stacks").write_text(side.dump)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(trials, args, keep))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(prog="stop_under_load.py serve")
        parser.add_argument("--certfile", required=True)
        parser.add_argument("--keyfile", required=True)
        parser.add_argument("--port", type=int, required=True)
        serve(parser.parse_args(argv[1:]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=24, help="trials per signal (default 24)")
    parser.add_argument("--signals", default="INT,TERM", help="comma-separated: INT, TERM (default both)")
    parser.add_argument(
        "--moments", default="start,served,serving,started,rotated", help="the moments, in turn (default: all five)"
    )
    parser.add_argument("--early", type=float, default=2.5, help="a start+S moment's S is up to this (default 2.5)")
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside the servers (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds a stop may take (default 20, as the tests)"
    )
    parser.add_argument("--way", choices=("cherrypy", "cheroot"), default="cherrypy", help="default cherrypy")
    parser.add_argument(
        "--sigint",
        choices=("default", "ignored", "inherited"),
        default="default",
        help="SIGINT in the servers: its default, as from a terminal (the default); ignored, as in a job a "
        "non-interactive shell starts in the background; or this process's",
    )
    parser.add_argument("--keep", help="directory for the stacks and logs of hangs (default: a new temporary one)")
    parser.add_argument("--quick", action="store_true", help="4 trials per signal")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = 4
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
