"""Memory per worker: RSS and PSS of each serving process, stock against the plugin, for every server.

For each server, three servers run side by side, 2 workers each, the same certificate files: stock,
the plugin with metrics off (the default), and the plugin with metrics on (``TLSRELOAD_METRICS=1``,
which imports ``prometheus_client``). Each worker is first made to serve full handshakes and requests
(``--requests`` per server, until both workers have answered), then the script waits two check
intervals so that the plugin's checker has run, and reads ``/proc/PID/smaps_rollup`` of each worker:

* RSS: resident pages, shared ones included (what ``ps`` and most dashboards show);
* PSS: each shared page divided among the processes sharing it (the arbiter and its workers share
  what was loaded before the fork): the fair share of the machine's memory a worker costs;
* USS: pages only this worker holds (private clean + private dirty).

Each figure is the mean over the 2 workers, then the median over ``--rounds`` rounds (fresh servers
each round). The app answers which watched modules (``prometheus_client``, ``asyncio``) the worker has
loaded, so the cause of a difference is measured, not guessed.

Target: plugin with metrics off at most 5 MiB PSS per worker over stock; metrics on: reported.

    python benchmarks/worker_memory.py                 # every server, 3 rounds: about 3 minutes
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


@contextlib.contextmanager
def started(server: str, side: str, cert: Path, key: Path, tmp: Path) -> Iterator[kit.Server]:
    extra_env = SIDES[side]
    with kit.running_server(
        server, extra_env is not None, cert, key, tmp, workers=WORKERS, interval=INTERVAL, extra_env=extra_env
    ) as running:
        yield running


def warm(running: kit.Server, requests: int) -> dict[int, frozenset[str]]:
    """Make ``requests`` fresh connections (handshake + request), and more until every worker answered;
    the modules each worker reported loaded, by pid."""
    ctx = kit.client_context()
    seen: dict[int, frozenset[str]] = {}
    deadline = time.monotonic() + 60
    made = 0
    while made < requests or len(seen) < WORKERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{running.label}: only workers {sorted(seen)} answered in 60 s:\n{running.output()}")
        answer = kit.probe(running.port, ctx)
        seen[answer.pid] = answer.loaded
        made += 1
    return seen


def measure_round(server: str, cert: Path, key: Path, tmp: Path, requests: int) -> dict[str, Any]:
    """One round: the three sides side by side; per side, each worker's memory and loaded modules."""
    with ExitStack() as stack:
        servers = {side: stack.enter_context(started(server, side, cert, key, tmp)) for side in SIDES}
        workers = {side: warm(running, requests) for side, running in servers.items()}
        time.sleep(2 * INTERVAL)  # the checker has run in every plugin worker
        return {
            side: {
                "workers": {pid: memory(pid) for pid in pids},
                "loaded": sorted(set().union(*pids.values())),
            }
            for side, pids in workers.items()
        }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize(server: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"server": server, "rounds": rounds}
    for side in SIDES:
        for figure in ("rss", "pss", "uss"):
            per_round = [mean([w[figure] for w in r[side]["workers"].values()]) for r in rounds]
            summary[f"{side}_{figure}"] = kit.median(per_round)
        summary[f"{side}_loaded"] = sorted(set().union(*(r[side]["loaded"] for r in rounds)))
    for side in ("plugin", "plugin+metrics"):
        for figure in ("rss", "pss", "uss"):
            summary[f"{side}_extra_{figure}"] = summary[f"{side}_{figure}"] - summary[f"stock_{figure}"]
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    with kit.work_dir("memory") as tmp:
        pair = kit.CA().issue(args.key_type)
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        for server in args.servers:
            rounds = []
            for r in range(args.rounds):
                rounds.append(measure_round(server, cert, key, tmp, args.requests))
                pss = {side: mean([w["pss"] for w in rounds[-1][side]["workers"].values()]) for side in SIDES}
                kit.log(
                    f"{server} round {r + 1}/{args.rounds}: PSS MiB "
                    + ", ".join(f"{s} {v:.1f}" for s, v in pss.items())
                )
            results.append(summarize(server, rounds))
    targets = [
        kit.target_row(
            f"{r['server']}: plugin (metrics off) PSS per worker over stock <= {TARGET_MIB:g} MiB",
            f"{r['plugin_extra_pss']:+.1f} MiB",
            r["plugin_extra_pss"] <= TARGET_MIB,
        )
        for r in results
    ]
    return {
        "benchmark": "worker_memory",
        "settings": {"rounds": args.rounds, "requests": args.requests, "workers": WORKERS, "key type": args.key_type},
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]

    def loaded(r: dict[str, Any], side: str) -> str:
        return ", ".join(r[f"{side}_loaded"]) or "-"

    rows = [
        (
            r["server"],
            f"{r['stock_rss']:.1f} / {r['plugin_rss']:.1f} / {r['plugin+metrics_rss']:.1f}",
            f"{r['stock_pss']:.1f} / {r['plugin_pss']:.1f} / {r['plugin+metrics_pss']:.1f}",
            f"**{r['plugin_extra_pss']:+.1f}** / {r['plugin+metrics_extra_pss']:+.1f}",
            f"{r['plugin_extra_uss']:+.1f} / {r['plugin+metrics_extra_uss']:+.1f}",
            f"{loaded(r, 'stock')} / {loaded(r, 'plugin')} / {loaded(r, 'plugin+metrics')}",
        )
        for r in result["results"]
    ]
    headers = (
        "server",
        "RSS MiB stock / plugin / plugin+metrics",
        "PSS MiB stock / plugin / plugin+metrics",
        "PSS over stock: plugin / +metrics",
        "USS over stock: plugin / +metrics",
        "watched modules loaded (stock / plugin / +metrics)",
    )
    return (
        "### Memory per worker\n\n"
        f"{s['workers']} workers per server, the three servers side by side; each worker served full handshakes "
        f"and requests ({s['requests']} per server at least) and its checker ran; `/proc/PID/smaps_rollup`, mean "
        f"of the workers, median of {s['rounds']} rounds (fresh servers each). PSS shares each page among the "
        "processes that map it (a gunicorn arbiter and its workers share what was loaded before the fork); USS "
        "counts the pages only the worker holds. Metrics on = `TLSRELOAD_METRICS=1`.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="fresh connections with a request, per server")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"rounds": 1, "requests": 40}, run, report)


if __name__ == "__main__":
    sys.exit(main())
