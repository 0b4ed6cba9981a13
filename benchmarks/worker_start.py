"""Worker start: from a worker's fork (or spawn) to the first handshake it serves, plugin against stock.

For each server, a stock and a plugin server run side by side, 2 workers each, each on its own
kubelet-style secret volume holding a good pair. One measurement: two client threads make fresh
connections to one of the two servers without pause (full handshake, no session reuse, ``GET /``; the
app answers with its pid); once both workers have answered, one worker gets SIGTERM. gunicorn's
arbiter forks a replacement as soon as it has reaped it; uvicorn's supervisor spawns one at its next
check (every 0.5 s). The clock starts when the new pid appears among the parent's children (polled
every millisecond in ``/proc/PID/task/PID/children``: the fork itself; for uvicorn, whose workers are
``multiprocessing`` spawns, the fork before the new interpreter's exec) and stops at the end of the
first handshake that worker answers (its pid in the body). Everything in between is the worker's
start: gunicorn's post-fork set-up and the plugin's hooks, or a new interpreter, its imports, the
app, uvicorn's start-up and the plugin's; plus the wait for a connection the new worker wins from
the one still serving: with connections arriving every few milliseconds, about one probe's time
(printed, ``probe ms``).

Two cases, alternating stock and plugin measurements round by round so that drift hits both:

* good files: both servers restart a worker on good files;
* last good: the plugin's files hold a mismatched pair (the plugin has logged the failed reload), so
  the new worker starts on its last good identity, which it must serve (checked: every first
  handshake carries the last good serial). Stock cannot start a worker on those files at all; its
  column is stock on good files, measured in the same rounds, as the reference.

Targets: the plugin's new workers serve the last good certificate in every round; the ratios
plugin/stock are reported (no target: a worker's start is dominated by imports and, for uvicorn, by
the interpreter).

    python benchmarks/worker_start.py                 # 6 servers, 10 rounds per case: about 4.5 minutes
    python benchmarks/worker_start.py --quick         # 2 rounds: about 1 minute
    python benchmarks/worker_start.py --servers gunicorn-sync uvicorn --rounds 15
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import benchkit as kit

SERVERS = ("gunicorn-sync", "gunicorn-gthread", "gunicorn-gevent", "gunicorn-asgi", "gunicorn-uvicorn", "uvicorn")
WORKERS = 2
CLIENTS = 2
INTERVAL = 0.5
"""``TLSRELOAD_INTERVAL`` of the plugin servers: how soon they see the broken files."""
DEADLINE = 60.0
CASES = ("good files", "last good")
FAILED = "reload failed"
"""What the plugin logs when it sees files it cannot use (gunicorn and uvicorn alike)."""


def children(pid: int) -> set[int]:
    """The live children of ``pid`` (Linux 3.5+, ``CONFIG_PROC_CHILDREN``; one small read, no scan of ``/proc``)."""
    try:
        return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


class Served:
    """What the client threads saw: the first handshake each pid answered, the serials, the failures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: dict[int, kit.Probe] = {}
        self.probe_seconds: list[float] = []
        self.failures: list[str] = []

    def record(self, answer: kit.Probe, started: float) -> None:
        with self.lock:
            self.probe_seconds.append(answer.handshake_done - started)
            self.first.setdefault(answer.pid, answer)

    def first_of(self, pid: int) -> kit.Probe | None:
        with self.lock:
            return self.first.get(pid)


def clients(port: int, served: Served, stop: threading.Event) -> None:
    ctx = kit.client_context()
    while not stop.is_set():
        started = time.monotonic()
        try:
            served.record(kit.probe(port, ctx), started)
        except (OSError, ValueError) as e:  # a stopping worker may close a connection it took
            with served.lock:
                served.failures.append(repr(e))


def wait_for(what: str, predicate: Any, interval: float = 0.001) -> Any:
    """Poll ``predicate`` until it returns something truthy, for at most ``DEADLINE`` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {DEADLINE:.0f} s")
        time.sleep(interval)
    return value


def restart_one(srv: kit.Server) -> tuple[float, kit.Probe, Served]:
    """SIGTERM one worker of ``srv`` under client traffic; seconds from its replacement's fork to the end of
    the first handshake the replacement served, that handshake, and what the clients saw."""
    parent = srv.proc.pid
    served, stop = Served(), threading.Event()
    threads = [threading.Thread(target=clients, args=(srv.port, served, stop), daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:

        def serving_workers() -> set[int]:
            with served.lock:
                workers = children(parent) & served.first.keys()
            return workers if len(workers) == WORKERS else set()

        workers = wait_for(f"{srv.label}: both workers serving", serving_workers)
        before = children(parent)  # any other child (a resource tracker) stays out of "new" too
        os.kill(min(workers), signal.SIGTERM)
        new = wait_for(f"{srv.label}: a new worker", lambda: children(parent) - before)
        forked_at = time.monotonic()
        first = wait_for(f"{srv.label}: a handshake from worker {min(new)}", lambda: served.first_of(min(new)))
        if srv.proc.poll() is not None:
            raise RuntimeError(f"{srv.label} exited:\n{srv.output()}")
        return first.handshake_done - forked_at, first, served
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)


def started(server: str, plugin: bool, volume: kit.KubeletDir, tmp: Path) -> AbstractContextManager[kit.Server]:
    return kit.running_server(server, plugin, volume.cert_path, volume.key_path, tmp, WORKERS, INTERVAL)


def measure(server: str, rounds: int) -> dict[str, Any]:
    ca = kit.CA()
    good, other = ca.issue_many(2)
    times: dict[str, dict[str, list[float]]] = {case: {"stock": [], "plugin": []} for case in CASES}
    probe_seconds: list[float] = []
    failures = 0
    wrong_serials: list[str] = []
    with kit.work_dir("worker-start") as tmp:
        volumes = {side: kit.KubeletDir(tmp / side) for side in ("stock", "plugin")}
        for volume in volumes.values():
            volume.install(good)
        with (
            started(server, False, volumes["stock"], tmp) as stock,
            started(server, True, volumes["plugin"], tmp) as plugin,
        ):
            for case in CASES:
                if case == "last good":
                    # A mismatched pair: the new certificate with the old key. Wait until the plugin has seen it.
                    volumes["plugin"].install(kit.Pair(other.chain, good.key, other.serial))
                    wait_for(f"{plugin.label}: the failed reload", lambda: FAILED in plugin.output(10**7), 0.05)
                for i in range(rounds):
                    for srv in (stock, plugin) if i % 2 == 0 else (plugin, stock):
                        side = "plugin" if srv.plugin else "stock"
                        seconds, first, served = restart_one(srv)
                        times[case][side].append(seconds)
                        probe_seconds += served.probe_seconds
                        failures += len(served.failures)
                        if first.serial != good.serial:
                            wrong_serials.append(f"{case}, {side}: {first.serial}")
                    kit.log(
                        f"  {server}, {case}: round {i + 1}/{rounds}: stock {times[case]['stock'][-1] * 1000:.0f} ms, "
                        f"plugin {times[case]['plugin'][-1] * 1000:.0f} ms"
                    )
    return {
        "server": server,
        "rounds": rounds,
        "times": times,
        "probe_median": kit.median(probe_seconds),
        "probe_failures": failures,
        "wrong_serials": wrong_serials,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for server in args.servers:
        kit.log(f"worker start: {server}, {WORKERS} workers, {args.rounds} rounds per case")
        results.append(measure(server, args.rounds))
    targets = []
    for r in results:
        targets.append(
            kit.target_row(
                f"{r['server']}: every new worker served the pair it should, the last good one on broken files",
                "; ".join(r["wrong_serials"]) or f"all {r['rounds'] * 2 * len(CASES)} first handshakes",
                not r["wrong_serials"],
            )
        )
        for case in CASES:
            t = r["times"][case]
            ratio = kit.median(t["plugin"]) / kit.median(t["stock"])
            targets.append(
                kit.target_row(
                    f"{r['server']}, {case}: start time plugin/stock reported (no target)", f"{ratio:.2f}x", True
                )
            )
    return {
        "benchmark": "worker_start",
        "machine": kit.machine(),
        "settings": {"rounds": args.rounds, "workers": WORKERS, "clients": CLIENTS, "interval": INTERVAL},
        "results": results,
        "targets": targets,
    }


def _ms(values: list[float]) -> str:
    return f"{kit.median(values) * 1000:.0f}"


def _range(values: list[float]) -> str:
    return f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f}"


def report(result: dict[str, Any]) -> str:
    rows = []
    for r in result["results"]:
        for case in CASES:
            t = r["times"][case]
            rows.append(
                (
                    r["server"],
                    case,
                    r["rounds"],
                    _ms(t["stock"]),
                    _ms(t["plugin"]),
                    f"**{kit.median(t['plugin']) / kit.median(t['stock']):.2f}**",
                    _range(t["stock"]),
                    _range(t["plugin"]),
                    f"{r['probe_median'] * 1000:.1f}",
                    r["probe_failures"],
                )
            )
    headers = (
        "server",
        "case",
        "rounds",
        "stock ms",
        "plugin ms",
        "plugin/stock",
        "stock range ms",
        "plugin range ms",
        "probe ms",
        "probe failures",
    )
    m = result["machine"]
    return (
        "### Worker start: fork to first served handshake\n\n"
        f"{m['date (UTC)']} UTC, {m['CPU']}, {m['cores']} cores, load {m['load average (1/5/15 min) at start']}; "
        f"Python {m['Python']}, gunicorn {m['gunicorn']}, uvicorn {m['uvicorn']}. {WORKERS} workers per server, "
        f"{CLIENTS} client threads; medians over the rounds. 'last good': the plugin's files hold a mismatched "
        "pair and the new worker serves its last good certificate; stock, which cannot start on those files, "
        "restarts on good files in the same rounds. 'probe ms': the median time of one probe (the resolution); "
        "'probe failures': connections a stopping worker closed, over all rounds.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=kit.ALL_SERVERS)
    parser.add_argument("--rounds", type=int, default=10, help="restarts per side and case")
    return kit.run_script(parser, argv, {"rounds": 2}, run, report)


if __name__ == "__main__":
    sys.exit(main())
