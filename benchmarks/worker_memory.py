"""Memory per worker: RSS and PSS of each serving process, stock against the plugin, for every server.

For each server, three servers run side by side (``--alone``: one after the other), ``--workers`` workers each
(2 by default; 1 is one serving process: uvicorn without ``--workers``, how it runs in most containers; gunicorn
and hypercorn with one worker), the same certificate files (a kubelet-style secret volume): stock, the plugin
with metrics off (the default), and the plugin with metrics on (``TLSRELOAD_METRICS=1``, which imports
``prometheus_client``). Each worker is first made to serve full handshakes and requests (``--requests`` per
server, until every worker has answered), then the script waits two check intervals so that the plugin's
checker has run, and reads ``/proc/PID/smaps_rollup`` of each worker (``start``); then the certificate is
rotated (``..data`` swapped), the script waits until every plugin worker serves the new one, and reads it
again (``reloaded``). A worker of a spawn-based server (uvicorn, hypercorn) takes its parent's verdict on the
files, at start and at each rotation; a process that validates new content itself (uvicorn in one process, a
gunicorn worker) does so in a short-lived child process (``tlsreload_plugins.validation.apart``) and never imports
``cryptography``. A process that parsed in-process would grow at its first reload, which is why both states are
reported.

* RSS: resident pages, shared ones included (what ``ps`` and most dashboards show);
* PSS: each shared page divided among the processes sharing it (the arbiter and its workers share
  what was loaded before the fork): the fair share of the machine's memory a worker costs;
* USS: pages only this worker holds (private clean + private dirty).

Side by side, a library only the plugin servers load has its pages split between them; pages the same Python
and libraries share with other processes on the machine are split with those too. ``--alone`` removes the first;
RSS over stock is what a server alone in a container pays.

Each figure is the mean over the workers, then the median over ``--rounds`` rounds (fresh servers
each round). The app answers which watched modules (``prometheus_client``, ``asyncio``,
``cryptography``) the worker has loaded, so the cause of a difference is measured, not guessed.

Target: plugin with metrics off at most 5 MiB PSS per worker over stock, at start and after a reload;
metrics on: reported.

    python benchmarks/worker_memory.py                 # every server, 3 rounds: about 6.5 minutes
    python benchmarks/worker_memory.py --workers 1 --servers uvicorn gunicorn-sync   # one serving process
    python benchmarks/worker_memory.py --workers 1 --alone --servers uvicorn         # each side on its own
    python benchmarks/worker_memory.py --quick         # 1 round, 40 requests
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchkit as kit

SERVERS = (
    "gunicorn-sync",
    "gunicorn-gthread",
    "gunicorn-gevent",
    "gunicorn-tornado",
    "gunicorn-asgi",
    "gunicorn-uvicorn",
    "uvicorn",
    "hypercorn-asyncio",
    "hypercorn-trio",
)
SIDES = {"stock": None, "plugin": {"TLSRELOAD_METRICS": "0"}, "plugin+metrics": {"TLSRELOAD_METRICS": "1"}}
"""Each side's extra environment (``None``: the stock server)."""
WORKERS = 2
INTERVAL = 0.5
TARGET_MIB = 5.0


def memory(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of process ``pid`` in MiB (``/proc/PID/smaps_rollup``, Linux 4.14+)."""
    kib: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kib[name.strip()] = int(value.split()[0])
    return {
        "rss": kib["Rss"] / 1024,
        "pss": kib["Pss"] / 1024,
        "uss": (kib["Private_Clean"] + kib["Private_Dirty"]) / 1024,
    }


STATES = ("start", "reloaded")
"""When each worker is measured: after serving its first requests, and after serving a rotated certificate."""


@contextlib.contextmanager
def started(server: str, side: str, cert: Path, key: Path, tmp: Path, workers: int) -> Iterator[kit.Server]:
    extra_env = SIDES[side]
    with kit.running_server(
        server, extra_env is not None, cert, key, tmp, workers=workers, interval=INTERVAL, extra_env=extra_env
    ) as running:
        yield running


def warm(
    running: kit.Server, requests: int, serial: str | None = None, workers: int = WORKERS
) -> dict[int, frozenset[str]]:
    """Make ``requests`` fresh connections (handshake + request), and more until each of the ``workers`` workers
    answered (and, given ``serial``, answered with that certificate); the modules each worker reported loaded, by
    pid."""
    ctx = kit.client_context()
    seen: dict[int, frozenset[str]] = {}
    deadline = time.monotonic() + 60
    made = 0
    while made < requests or len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{running.label}: only workers {sorted(seen)} answered in 60 s:\n{running.output()}")
        answer = kit.probe(running.port, ctx)
        if serial is None or answer.serial == serial:
            seen[answer.pid] = answer.loaded
        made += 1
    return seen


def measure_round(
    server: str, ca: kit.CA, tmp: Path, requests: int, key_type: str, processes: int = WORKERS, alone: bool = False
) -> dict[str, Any]:
    """One round: the three sides side by side (``alone``: one after the other, so that no side shares pages
    with another), measured at start and after a rotation; per state and side, each worker's memory and the
    modules loaded."""
    if not alone:
        return measure_sides(server, list(SIDES), ca, tmp, requests, key_type, processes)
    parts = [measure_sides(server, [side], ca, tmp, requests, key_type, processes) for side in SIDES]
    return {state: {side: part[state][side] for part, side in zip(parts, SIDES, strict=True)} for state in STATES}


def measure_sides(
    server: str, sides: list[str], ca: kit.CA, tmp: Path, requests: int, key_type: str, processes: int
) -> dict[str, Any]:
    volume = kit.KubeletDir(tmp / f"secret-{server}-{time.monotonic_ns()}")
    volume.install(ca.issue(key_type))
    measured: dict[str, Any] = {}
    with ExitStack() as stack:
        servers = {
            side: stack.enter_context(started(server, side, volume.cert_path, volume.key_path, tmp, processes))
            for side in sides
        }
        rotated = ca.issue(key_type)
        for state in STATES:
            if state == "reloaded":
                volume.install(rotated)
            workers = {
                side: warm(
                    running, requests, rotated.serial if state == "reloaded" and running.plugin else None, processes
                )
                for side, running in servers.items()
            }
            time.sleep(2 * INTERVAL)  # the checker has run in every plugin worker
            measured[state] = {
                side: {"workers": {pid: memory(pid) for pid in pids}, "loaded": sorted(set().union(*pids.values()))}
                for side, pids in workers.items()
            }
    return measured


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize(server: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"server": server, "rounds": rounds}
    for state in STATES:
        for side in SIDES:
            for figure in ("rss", "pss", "uss"):
                per_round = [mean([w[figure] for w in r[state][side]["workers"].values()]) for r in rounds]
                summary[f"{state}_{side}_{figure}"] = kit.median(per_round)
            summary[f"{state}_{side}_loaded"] = sorted(set().union(*(r[state][side]["loaded"] for r in rounds)))
        for side in ("plugin", "plugin+metrics"):
            for figure in ("rss", "pss", "uss"):
                extra = summary[f"{state}_{side}_{figure}"] - summary[f"{state}_stock_{figure}"]
                summary[f"{state}_{side}_extra_{figure}"] = extra
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results = []
    with kit.work_dir("memory") as tmp:
        ca = kit.CA()
        for server in args.servers:
            rounds = []
            for r in range(args.rounds):
                rounds.append(measure_round(server, ca, tmp, args.requests, args.key_type, args.workers, args.alone))
                figures = ", ".join(
                    f"{state} {side} {mean([w['pss'] for w in rounds[-1][state][side]['workers'].values()]):.1f}"
                    for state in STATES
                    for side in SIDES
                )
                kit.log(f"{server} round {r + 1}/{args.rounds}: PSS MiB {figures}")
            results.append(summarize(server, rounds))
    targets = [
        kit.target_row(
            f"{r['server']}: plugin (metrics off) PSS per worker over stock, {state}, <= {TARGET_MIB:g} MiB",
            f"{r[f'{state}_plugin_extra_pss']:+.1f} MiB",
            r[f"{state}_plugin_extra_pss"] <= TARGET_MIB,
        )
        for r in results
        for state in STATES
    ]
    return {
        "benchmark": "worker_memory",
        "settings": {
            "rounds": args.rounds,
            "requests": args.requests,
            "workers": args.workers,
            "alone": args.alone,
            "key type": args.key_type,
            "load average before": load_before,
        },
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]

    def loaded(r: dict[str, Any], state: str) -> str:
        return " / ".join(", ".join(r[f"{state}_{side}_loaded"]) or "-" for side in SIDES)

    rows = [
        (
            r["server"],
            state,
            " / ".join(f"{r[f'{state}_{side}_rss']:.1f}" for side in SIDES),
            " / ".join(f"{r[f'{state}_{side}_pss']:.1f}" for side in SIDES),
            f"**{r[f'{state}_plugin_extra_pss']:+.1f}** / {r[f'{state}_plugin+metrics_extra_pss']:+.1f}",
            f"{r[f'{state}_plugin_extra_uss']:+.1f} / {r[f'{state}_plugin+metrics_extra_uss']:+.1f}",
            loaded(r, state),
        )
        for r in result["results"]
        for state in STATES
    ]
    headers = (
        "server",
        "when",
        "RSS MiB stock / plugin / plugin+metrics",
        "PSS MiB stock / plugin / plugin+metrics",
        "PSS over stock: plugin / +metrics",
        "USS over stock: plugin / +metrics",
        "watched modules loaded (stock / plugin / +metrics)",
    )
    one = "One serving process per server (uvicorn without `--workers`; gunicorn and hypercorn with 1 worker)"
    how_many = one if s["workers"] == 1 else f"{s['workers']} workers per server"
    return (
        "### Memory per worker\n\n"
        f"{how_many}, the three servers {'one after the other' if s.get('alone') else 'side by side'}; "
        "`start`: each worker served full "
        f"handshakes and requests ({s['requests']} per server at least) and its checker ran; `reloaded`: the same "
        "after the certificate was rotated (kubelet `..data` swap) and every plugin worker served the new one. "
        f"`/proc/PID/smaps_rollup`, mean of the workers, median of {s['rounds']} rounds (fresh servers each). PSS "
        "shares each page among the processes that map it (a gunicorn arbiter and its workers share what was "
        "loaded before the fork); USS counts the pages only the worker holds. Metrics on = "
        f"`TLSRELOAD_METRICS=1`. Load average before the run: {s.get('load average before', '?')}.\n\n"
        + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="fresh connections with a request, per server")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="serving processes per server (1: uvicorn in one process)"
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="run stock, plugin and plugin+metrics one after the other, not side by side (as each would run in a "
        "container of its own: no page of one is shared with another, so PSS is not split between them)",
    )
    return kit.run_script(parser, argv, {"rounds": 1, "requests": 40}, run, report)


if __name__ == "__main__":
    sys.exit(main())
