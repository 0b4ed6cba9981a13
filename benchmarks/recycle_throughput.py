"""Requests served while workers recycle: the plugin against stock, side by side, in the spawn servers.

For each server (hypercorn's asyncio workers, ``uvicorn --workers``), one round starts a stock and a plugin server at
once, 2 workers each, on good files, their workers recycled every 40 requests (hypercorn ``--max-requests 40``,
uvicorn ``--limit-max-requests 40``). Two client threads per server make new connections without pause (a full
handshake and ``GET /`` each, no session reuse) for ``--seconds``, both servers in the same window, so that both meet
the same load on the machine. Counted per side: requests answered, requests failed, and the CPU its processes used
(the workers it reaped included: a new worker is a new interpreter, whose start is most of what a recycle costs), per
request answered. Which server starts first alternates round by round.

Stock hypercorn 0.18 stops the whole server now and then while its workers recycle, with or without the plugin (a
client's data after a stopping worker's ``close_notify`` raises out of hypercorn's own shutdown; see
docs/restarts.md). A round in which either server stopped is counted apart and run again (at most twice as many
attempts as rounds): the longer the window, the more rounds meet it (10-second windows: 11 and 12 of 16 attempts).

Targets (issue 46, item 6): hypercorn, requests answered plugin/stock at least 0.95x (median of the rounds), and
requests failed at most stock's x 1.5 + 2 (over all rounds), on a quiet machine and with two CPU hogs beside
(``--hogs 2``: busy-loop processes for the whole run). uvicorn's figures are reported beside them.

    python benchmarks/recycle_throughput.py                      # both servers, 8 rounds of 6 s: about 5 minutes
    python benchmarks/recycle_throughput.py --quick              # 2 rounds of 4 s
    python benchmarks/recycle_throughput.py --servers hypercorn-asyncio --rounds 12
    python benchmarks/recycle_throughput.py --servers hypercorn-asyncio --hogs 2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import benchkit as kit

SERVERS = ("hypercorn-asyncio", "uvicorn")
WORKERS = 2
CLIENTS = 2
MAX_REQUESTS = "40"
TARGET = 0.95
FAILED_TARGET = (1.5, 2)
"""Requests failed by the plugin at most stock's x 1.5 + 2."""
INTERVAL = 1.0
"""``TLSRELOAD_INTERVAL`` of the plugin servers: the default."""


def recycled_command(server: str, plugin: bool, volume: kit.KubeletDir) -> Any:
    """The server's command line as :func:`benchkit.server_command` gives it, its workers recycled."""
    option = "--limit-max-requests" if server == "uvicorn" else "--max-requests"

    def command(port: int) -> list[str]:
        base = kit.server_command(server, plugin, volume.cert_path, volume.key_path, port, WORKERS)
        return [*base, option, MAX_REQUESTS]

    return command


class Side:
    """What the client threads of one server saw in a window."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = 0
        self.failed = 0


def clients(port: int, side: Side, stop: threading.Event) -> None:
    ctx = kit.client_context()
    while not stop.is_set():
        try:
            kit.probe(port, ctx, timeout=5.0)
        except (OSError, ValueError):  # a stopping worker may close a connection it took
            with side.lock:
                side.failed += 1
        else:
            with side.lock:
                side.answered += 1


def started(server: str, plugin: bool, volumes: dict[bool, kit.KubeletDir], tmp: Path) -> Any:
    return kit.running_command(server, plugin, tmp, recycled_command(server, plugin, volumes[plugin]))


def one_round(server: str, plugin_first: bool, volumes: dict[bool, kit.KubeletDir], tmp: Path, seconds: float) -> Any:
    """One window with both servers: per side (answered, failed, CPU seconds), or ``None`` when a server stopped."""
    first, second = (True, False) if plugin_first else (False, True)
    with started(server, first, volumes, tmp) as a, started(server, second, volumes, tmp) as b:
        servers = {srv.plugin: srv for srv in (a, b)}
        seen = {plugin: Side() for plugin in servers}
        stop = threading.Event()
        cpu_before = {plugin: kit.group_cpu_seconds(srv.proc.pid, reaped=True) for plugin, srv in servers.items()}
        threads = [
            threading.Thread(target=clients, args=(srv.port, seen[plugin], stop), daemon=True)
            for plugin, srv in servers.items()
            for _ in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        time.sleep(seconds)  # the measured window itself: traffic for a fixed time, not a wait for a state
        stop.set()
        for thread in threads:
            thread.join(15)
        if any(srv.proc.poll() is not None for srv in servers.values()):
            return None
        return {
            "plugin" if plugin else "stock": {
                "answered": seen[plugin].answered,
                "failed": seen[plugin].failed,
                "cpu": kit.group_cpu_seconds(srv.proc.pid, reaped=True) - cpu_before[plugin],
            }
            for plugin, srv in servers.items()
        }


def measure(server: str, rounds: int, seconds: float) -> dict[str, Any]:
    good = kit.CA().issue()
    kept: list[dict[str, Any]] = []
    stopped = 0
    with kit.work_dir("recycle") as tmp:
        volumes = {plugin: kit.KubeletDir(tmp / ("plugin" if plugin else "stock")) for plugin in (False, True)}
        for volume in volumes.values():
            volume.install(good)
        for attempt in range(2 * rounds):
            if len(kept) == rounds:
                break
            result = one_round(server, attempt % 2 == 1, volumes, tmp, seconds)
            if result is None:
                stopped += 1
                kit.log(f"  {server}: attempt {attempt + 1}: a server stopped itself; run again")
                continue
            kept.append(result)
            ratio = result["plugin"]["answered"] / max(result["stock"]["answered"], 1)
            kit.log(
                f"  {server}: round {len(kept)}/{rounds}: stock {result['stock']['answered']}, "
                f"plugin {result['plugin']['answered']} ({ratio:.2f}x)"
            )
    return {"server": server, "rounds": kept, "stopped": stopped, "seconds": seconds}


def _ratios(r: dict[str, Any], key: str) -> list[float]:
    return [one["plugin"][key] / max(one["stock"][key], 1e-9) for one in r["rounds"]]


def _cpu_per_request(one: dict[str, Any], side: str) -> float:
    return float(one[side]["cpu"]) / max(one[side]["answered"], 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    machine = kit.machine()
    with kit.hogs(args.hogs):
        for server in args.servers:
            kit.log(
                f"recycle throughput: {server}, {WORKERS} workers, {args.rounds} rounds of {args.seconds} s, "
                f"{args.hogs} CPU hogs beside"
            )
            results.append(measure(server, args.rounds, args.seconds))
    targets = []
    times, plus = FAILED_TARGET
    for r in results:
        ratio = kit.median(_ratios(r, "answered"))
        target = r["server"].startswith("hypercorn")
        failed = {side: sum(one[side]["failed"] for one in r["rounds"]) for side in ("stock", "plugin")}
        targets.append(
            kit.target_row(
                f"{r['server']}: requests answered while workers recycle, plugin/stock"
                + (f" >= {TARGET}x" if target else " (reported)"),
                f"{ratio:.3f}x over {len(r['rounds'])} rounds",
                ratio >= TARGET or not target,
            )
        )
        targets.append(
            kit.target_row(
                f"{r['server']}: requests failed, plugin at most stock's x {times} + {plus}"
                + ("" if target else " (reported)"),
                f"{failed['plugin']} against stock's {failed['stock']}",
                failed["plugin"] <= failed["stock"] * times + plus or not target,
            )
        )
    return {
        "benchmark": "recycle_throughput",
        "machine": machine,
        "settings": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "workers": WORKERS,
            "clients": CLIENTS,
            "hogs": args.hogs,
        },
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    rows = []
    for r in result["results"]:
        answered = {side: [one[side]["answered"] for one in r["rounds"]] for side in ("stock", "plugin")}
        failed = {side: sum(one[side]["failed"] for one in r["rounds"]) for side in ("stock", "plugin")}
        cpu = {side: kit.median([_cpu_per_request(one, side) for one in r["rounds"]]) for side in ("stock", "plugin")}
        per_round = [_cpu_per_request(one, "plugin") / _cpu_per_request(one, "stock") for one in r["rounds"]]
        cpu_ratio = kit.median(per_round)
        rows.append(
            (
                r["server"],
                len(r["rounds"]),
                f"{kit.median(answered['stock']):.0f}",
                f"{kit.median(answered['plugin']):.0f}",
                f"**{kit.median(_ratios(r, 'answered')):.3f}**",
                " ".join(f"{x:.2f}" for x in _ratios(r, "answered")),
                f"{failed['stock']} / {failed['plugin']}",
                f"{cpu['stock'] * 1000:.2f} / {cpu['plugin'] * 1000:.2f}",
                f"{cpu_ratio:.2f}",
                r["stopped"],
            )
        )
    headers = (
        "server",
        "rounds",
        "stock requests",
        "plugin requests",
        "plugin/stock",
        "per round",
        "failed stock / plugin",
        "CPU ms per request stock / plugin",
        "CPU per request plugin/stock",
        "rounds a server stopped",
    )
    m = result["machine"]
    s = result["settings"]
    return (
        "### Requests served while workers recycle\n\n"
        f"{m['date (UTC)']} UTC, {m['CPU']}, {m['cores']} cores, load {m['load average (1/5/15 min) at start']}; "
        f"Python {m['Python']}, uvicorn {m['uvicorn']}, hypercorn {m['hypercorn']}. "
        f"Stock and plugin side by side, {s['workers']} workers each, "
        f"recycled every {MAX_REQUESTS} requests, {s['clients']} client threads each, windows of {s['seconds']} s, "
        f"{s.get('hogs', 0)} CPU hogs beside; "
        "requests: medians over the rounds; CPU: the server's processes, reaped workers included.\n\n"
        + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--rounds", type=int, default=8, help="windows kept per server")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one window")
    parser.add_argument("--hogs", type=int, default=0, help="busy-loop processes beside the servers (default 0)")
    return kit.run_script(parser, argv, {"rounds": 2, "seconds": 4.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
