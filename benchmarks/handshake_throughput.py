"""Full-handshake throughput, plugin against stock, side by side, alternating A/B.

For each server, the stock and the plugin server run at the same time (1 worker each, same
certificate files, same options). Each round measures one side then the other (the order
alternates every round) with two clients:

* ``s_time``: ``openssl s_time -connect 127.0.0.1:PORT -new -time T``: one client, a fresh
  connection and a full handshake each time (``-new``: no session reuse), no HTTP request
  (no ``-www``): the purest measure of what a handshake costs the server. The rate is the
  connection count s_time prints divided by the wall time of the run.
* ``python``: N client processes, each doing full handshakes with :mod:`ssl` in a loop (a new
  socket and a new SSL object per handshake, no session reuse), no request; the rate is the
  total over the window.

Prints, per server and client: the median rate per side, the ratio plugin/stock, and the
range of the per-round ratios. Targets: gunicorn sync and gthread >= 1.9x (stock rebuilds its
context for every connection), every other server >= 0.98x.

    python benchmarks/handshake_throughput.py              # 5 rounds x 3 s per side and client
    python benchmarks/handshake_throughput.py --quick      # 2 rounds x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import benchkit as kit

TARGETS = {"gunicorn-sync": 1.9, "gunicorn-gthread": 1.9}
DEFAULT_TARGET = 0.98
_S_TIME_COUNT = re.compile(r"(\d+) connections in [\d.]+s")

# One context per client process, made once: the clients measure the server, not themselves.
_client_ctx: ssl.SSLContext | None = None


def _python_client(port: int, start_at: float, seconds: float) -> tuple[int, int, str]:
    """Runs in a client process: full handshakes until the window closes; (ok, failed, first error)."""
    global _client_ctx
    if _client_ctx is None:
        _client_ctx = kit.client_context()
    ctx = _client_ctx
    ok = failed = 0
    first_error = ""
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    while time.monotonic() < end:
        try:
            with socket.create_connection((kit.HOST, port), timeout=10) as raw, ctx.wrap_socket(raw):
                pass
            ok += 1
        except OSError as e:
            failed += 1
            first_error = first_error or repr(e)
    return ok, failed, first_error


def measure_s_time(port: int, seconds: float) -> tuple[int, float, int]:
    """One ``openssl s_time -new`` run: (handshakes, wall seconds, failures).

    s_time stops at the first failed connection and exits non-zero: that aborts the benchmark
    with its output, so a completed run has no failures."""
    cmd = ["openssl", "s_time", "-connect", f"{kit.HOST}:{port}", "-new", "-time", str(max(1, round(seconds)))]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    match = _S_TIME_COUNT.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"openssl s_time failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return int(match.group(1)), elapsed, 0


def measure_python(
    pool: concurrent.futures.Executor, clients: int, port: int, seconds: float
) -> tuple[int, float, int]:
    """``clients`` processes handshaking together for ``seconds``: (handshakes, seconds, failures)."""
    start_at = time.monotonic() + 0.3  # all clients start together, after dispatch
    futures = [pool.submit(_python_client, port, start_at, seconds) for _ in range(clients)]
    results = [f.result(timeout=seconds + 60) for f in futures]
    failed = sum(r[1] for r in results)
    if failed and not sum(r[0] for r in results):
        raise RuntimeError(f"every handshake failed: {next(r[2] for r in results if r[2])}")
    return sum(r[0] for r in results), seconds, failed


def compare(
    server: str,
    method: str,
    sides: dict[str, kit.Server],
    rounds: int,
    seconds: float,
    clients: int,
    pool: concurrent.futures.Executor | None,
) -> dict[str, Any]:
    def once(side: str, duration: float) -> tuple[float, float, int]:
        """(handshakes/s, server CPU us per handshake, failures)."""
        port, pgid = sides[side].port, sides[side].proc.pid
        cpu_before = kit.group_cpu_seconds(pgid)
        if method == "s_time":
            count, elapsed, failed = measure_s_time(port, duration)
        else:
            assert pool is not None
            count, elapsed, failed = measure_python(pool, clients, port, duration)
        cpu = kit.group_cpu_seconds(pgid) - cpu_before
        return count / elapsed, cpu / count * 1e6 if count else float("nan"), failed

    for side in ("stock", "plugin"):  # warm-up: lazy imports, first-connection costs
        once(side, 1.0)
    rates: dict[str, list[float]] = {"stock": [], "plugin": []}
    cpu_us: dict[str, list[float]] = {"stock": [], "plugin": []}
    failures = {"stock": 0, "plugin": 0}
    for r in range(rounds):
        for side in ("stock", "plugin") if r % 2 == 0 else ("plugin", "stock"):
            rate, cpu, failed = once(side, seconds)
            rates[side].append(rate)
            cpu_us[side].append(cpu)
            failures[side] += failed
        kit.log(
            f"  {server} {method} round {r + 1}/{rounds}: stock {rates['stock'][-1]:.0f}/s, "
            f"plugin {rates['plugin'][-1]:.0f}/s"
        )
    stock, plugin = kit.median(rates["stock"]), kit.median(rates["plugin"])
    per_round = [p / s for p, s in zip(rates["plugin"], rates["stock"], strict=True) if s]
    stock_cpu, plugin_cpu = kit.median(cpu_us["stock"]), kit.median(cpu_us["plugin"])
    return {
        "server": server,
        "client": method,
        "stock_median": stock,
        "plugin_median": plugin,
        "ratio": plugin / stock if stock else float("nan"),
        "round_ratio_min": min(per_round, default=float("nan")),
        "round_ratio_max": max(per_round, default=float("nan")),
        "rates": rates,
        "stock_cpu_us": stock_cpu,
        "plugin_cpu_us": plugin_cpu,
        "cpu_ratio": stock_cpu / plugin_cpu if plugin_cpu else float("nan"),
        "cpu_us": cpu_us,
        "failures": failures,
        "target": TARGETS.get(server, DEFAULT_TARGET),
    }


def run(
    args: argparse.Namespace,
    *,
    start: Callable[..., AbstractContextManager[Any]] = kit.running_server,
    benchmark: str = "handshake_throughput",
    target: float | None = None,
) -> dict[str, Any]:
    """Measure ``args.servers``, each started by ``start(server, plugin, cert, key, tmp)`` (hypercorn_throughput.py
    passes its own); ``target`` replaces the per-server targets of this script."""
    methods = [m for m in args.clients_kind if m != "s_time" or shutil.which("openssl")]
    if len(methods) < len(args.clients_kind):
        kit.log("openssl not found: skipping the s_time client")
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        pool = None
        if "python" in methods:
            mp = multiprocessing.get_context("spawn")
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        tmp = stack.enter_context(kit.work_dir("throughput"))
        pair = kit.CA().issue(args.key_type)
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        for server in args.servers:
            kit.log(f"{server}: starting stock and plugin servers (1 worker each)")
            with ExitStack() as servers:
                sides = {
                    side: servers.enter_context(start(server, side == "plugin", cert, key, tmp))
                    for side in ("stock", "plugin")
                }
                for method in methods:
                    result = compare(server, method, sides, args.rounds, args.seconds, args.clients, pool)
                    results.append(result if target is None else {**result, "target": target})
    targets = [
        kit.target_row(
            f"{r['server']} handshakes/s plugin/stock ({r['client']}) >= {r['target']}",
            f"{r['ratio']:.3f}x",
            r["ratio"] >= r["target"],
        )
        for r in results
    ]
    return {
        "benchmark": benchmark,
        "settings": {
            "rounds": args.rounds,
            "seconds per side per round": args.seconds,
            "python client processes": args.clients,
            "server workers": 1,
            "key type": args.key_type,
        },
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        (
            r["server"],
            r["client"],
            f"{r['stock_median']:.0f}",
            f"{r['plugin_median']:.0f}",
            f"**{r['ratio']:.2f}x**",
            f"{r['round_ratio_min']:.2f}-{r['round_ratio_max']:.2f}",
            f"{r['stock_cpu_us']:.0f} / {r['plugin_cpu_us']:.0f}",
            f"{r['cpu_ratio']:.2f}x",
            f"{r['failures']['stock']}/{r['failures']['plugin']}",
            f">= {r['target']}",
        )
        for r in result["results"]
    ]
    headers = (
        "server",
        "client",
        "stock hs/s (median)",
        "plugin hs/s (median)",
        "ratio plugin/stock",
        "per-round ratios",
        "server CPU us/hs stock / plugin",
        "CPU ratio stock/plugin",
        "failed (stock/plugin)",
        "target",
    )
    return (
        f"### Full-handshake throughput\n\n"
        f"1 server worker each; {s['rounds']} alternating A/B rounds of {s['seconds per side per round']} s per side; "
        f"`s_time` = `openssl s_time -new` (1 client, no request); `python` = {s['python client processes']} "
        f"client processes doing full handshakes (no session reuse, no request); {s['key type']} certificate. "
        "Server CPU = user+system time of the server's processes during the window per handshake (medians): "
        "its ratio is the throughput ratio a CPU-bound server would show, and is less disturbed by other load "
        "on the machine; the targets use the measured throughput.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(kit.SERVERS), choices=kit.ALL_SERVERS)
    parser.add_argument("--clients-kind", nargs="+", default=["s_time", "python"], choices=["s_time", "python"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side per round (s_time rounds to whole s)")
    parser.add_argument("--clients", type=int, default=2, help="python client processes")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"rounds": 2, "seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
