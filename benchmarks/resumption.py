"""Session resumption, plugin against stock, side by side, alternating A/B, TLS 1.3 and TLS 1.2.

For each server, the stock and the plugin server run at the same time (1 worker each, same
certificate files, same options). The client is N processes, each looping: connect, handshake
offering the session of its previous connection to that server (``wrap_socket(...,
session=previous)``), ``GET /`` with ``Connection: close``, read the whole response (which is what
makes a TLS 1.3 client read the server's NewSessionTicket: ``openssl s_time -reuse``, which sends
no request, never gets one), keep ``tls.session`` for the next connection and count
``tls.session_reused``. Each client process keeps its sessions (one per server and version) from
window to window, so after the warm-up every connection offers one. TLS 1.3 and TLS 1.2 (the
client's ``minimum_version``/``maximum_version``) are separate series of alternating rounds.

Prints, per server and TLS version: the median requests/s per side, the ratio plugin/stock and the
range of the per-round ratios, the share of connections that were resumed on each side, and the
server CPU per connection (user+system of the server's process group over the window, from
``/proc``) of each side and its ratio stock/plugin.

Expected (and checked once): stock gunicorn ``sync`` and ``gthread`` resume no session at all (they
build a new ``SSLContext``, with new ticket keys and an empty session cache, for every connection);
with the plugin they resume every one. The other servers keep one context per worker and resume
on both sides. Targets: the ratios are reported only; per server, the plugin must resume at least
as large a share of the sessions offered as stock, in both versions.

    python benchmarks/resumption.py                # 6 servers x 2 versions, 5 rounds x 3 s per side
    python benchmarks/resumption.py --quick        # 2 rounds x 1 s: a smoke run
    python benchmarks/resumption.py --servers gunicorn-sync uvicorn --tls 1.3
    python benchmarks/resumption.py --baseline 7fac31b   # the plugin at that commit in place of stock

``--baseline COMMIT`` runs the plugin of another commit (its ``src/``, extracted with ``git archive``, first on
``PYTHONPATH``) in place of the stock server: what a change to the plugin costs resumed handshakes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import socket
import ssl
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchkit as kit
import hypercorn_throughput

REPO = kit.BENCH_DIR.parent

SERVERS = ("gunicorn-sync", "gunicorn-gthread", "gunicorn-gevent", "gunicorn-asgi", "uvicorn", "hypercorn-asyncio")
VERSIONS = {"1.3": ssl.TLSVersion.TLSv1_3, "1.2": ssl.TLSVersion.TLSv1_2}
REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

# In each client process: one context per TLS version (a session can only be offered through the
# context that made it), and the last session per (port, server pid, version): a port may be reused
# by a later server of the run.
_contexts: dict[str, ssl.SSLContext] = {}
_sessions: dict[tuple[int, int, str], ssl.SSLSession] = {}


def _context(version: str) -> ssl.SSLContext:
    if version not in _contexts:
        ctx = kit.client_context()
        ctx.minimum_version = ctx.maximum_version = VERSIONS[version]
        _contexts[version] = ctx
    return _contexts[version]


def _quick_ack(sock: socket.socket) -> None:
    # As benchkit's probe: ACK at once, so that a response written as two segments does not wait for
    # the client's delayed ACK.
    if hasattr(socket, "TCP_QUICKACK"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def one_connection(
    port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None
) -> tuple[bool, ssl.SSLSession | None]:
    """Handshake offering ``session``, ``GET /``, read up to the server's close; (resumed, the session)."""
    with socket.create_connection((kit.HOST, port), timeout=10) as raw:
        # Measured: without TCP_NODELAY, a resumed TLS 1.2 handshake stalls 40 ms on every connection
        # (the client's Finished and its request are two writes: Nagle holds the request back until
        # the server's delayed ACK), which caps every server at the same 20 connections/s per client.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with ctx.wrap_socket(raw, session=session) as tls:
            tls.sendall(REQUEST)
            data = b""
            while True:
                _quick_ack(tls)
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data.startswith(b"HTTP/1.1 200"):
                raise ValueError(f"unexpected answer: {data[:80]!r}")
            return tls.session_reused, tls.session


def _resuming_client(port: int, pid: int, version: str, start_at: float, seconds: float) -> dict[str, Any]:
    """Runs in a client process: connections until the window closes; counts and the first error."""
    ctx = _context(version)
    counts = {"ok": 0, "resumed": 0, "offered": 0, "failed": 0}
    first_error = ""
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    key = (port, pid, version)
    while time.monotonic() < end:
        previous = _sessions.get(key)
        try:
            resumed, session = one_connection(port, ctx, previous)
        except (OSError, ValueError) as e:
            counts["failed"] += 1
            first_error = first_error or repr(e)
            _sessions.pop(key, None)
            continue
        counts["ok"] += 1
        counts["offered"] += previous is not None
        counts["resumed"] += resumed
        if session is not None:
            _sessions[key] = session
        else:
            _sessions.pop(key, None)
    return {**counts, "first_error": first_error}


def measure(
    pool: concurrent.futures.Executor, clients: int, server: kit.Server, version: str, seconds: float
) -> dict[str, Any]:
    """``clients`` processes for ``seconds`` against ``server``: rate, counts, server CPU per connection."""
    cpu_before = kit.group_cpu_seconds(server.proc.pid)
    start_at = time.monotonic() + 0.3  # all clients start together, after dispatch
    futures = [
        pool.submit(_resuming_client, server.port, server.proc.pid, version, start_at, seconds) for _ in range(clients)
    ]
    results = [f.result(timeout=seconds + 60) for f in futures]
    cpu = kit.group_cpu_seconds(server.proc.pid) - cpu_before
    counts = {k: sum(r[k] for r in results) for k in ("ok", "resumed", "offered", "failed")}
    if counts["failed"] and not counts["ok"]:
        raise RuntimeError(f"{server.label}: every connection failed: {next(r['first_error'] for r in results)}")
    return {
        **counts,
        "rate": counts["ok"] / seconds,
        "cpu_us": cpu / counts["ok"] * 1e6 if counts["ok"] else float("nan"),
    }


def _share(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


def compare(
    server: str,
    version: str,
    sides: dict[str, kit.Server],
    rounds: int,
    seconds: float,
    clients: int,
    pool: concurrent.futures.Executor,
) -> dict[str, Any]:
    for side in ("stock", "plugin"):  # warm-up: lazy imports, first connections, a session per client
        measure(pool, clients, sides[side], version, 1.0)
    windows: dict[str, list[dict[str, Any]]] = {"stock": [], "plugin": []}
    for r in range(rounds):
        for side in ("stock", "plugin") if r % 2 == 0 else ("plugin", "stock"):
            windows[side].append(measure(pool, clients, sides[side], version, seconds))
        kit.log(
            f"  {server} TLS {version} round {r + 1}/{rounds}: "
            + ", ".join(
                f"{name} {w[-1]['rate']:.0f}/s ({_share(w[-1]['resumed'], w[-1]['ok']):.0%} resumed)"
                for name, w in zip(SIDE_NAMES, windows.values(), strict=True)
            )
        )
    rates = {side: [w["rate"] for w in ws] for side, ws in windows.items()}
    cpu_us = {side: [w["cpu_us"] for w in ws] for side, ws in windows.items()}
    totals = {
        side: {k: sum(w[k] for w in ws) for k in ("ok", "resumed", "offered", "failed")} for side, ws in windows.items()
    }
    stock, plugin = kit.median(rates["stock"]), kit.median(rates["plugin"])
    per_round = [p / s for p, s in zip(rates["plugin"], rates["stock"], strict=True) if s]
    stock_cpu, plugin_cpu = kit.median(cpu_us["stock"]), kit.median(cpu_us["plugin"])
    result: dict[str, Any] = {
        "server": server,
        "tls": version,
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
        "counts": totals,
        "failures": {side: t["failed"] for side, t in totals.items()},
    }
    for side, t in totals.items():
        # Of all the connections measured (the table), and of those that offered a session (the check).
        result[f"{side}_resumed_fraction"] = _share(t["resumed"], t["ok"])
        result[f"{side}_resumed_of_offered"] = _share(t["resumed"], t["offered"])
    return result


def targets_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    targets = [
        kit.target_row(
            f"{r['server']} TLS {r['tls']} resumed-handshake ratio plugin/stock reported (no target)",
            f"{r['ratio']:.3f}x (resumed {r['stock_resumed_fraction']:.0%} stock, {r['plugin_resumed_fraction']:.0%} "
            "plugin)",
            True,
        )
        for r in results
    ]
    for server in dict.fromkeys(r["server"] for r in results):
        mine = [r for r in results if r["server"] == server]
        # nan (nothing offered) compares false: a FAIL, as it should be.
        ok = all(r["plugin_resumed_of_offered"] >= r["stock_resumed_of_offered"] for r in mine)
        measured = "; ".join(
            f"TLS {r['tls']}: {r['plugin_resumed_of_offered']:.3f} vs {r['stock_resumed_of_offered']:.3f}" for r in mine
        )
        targets.append(
            kit.target_row(
                f"{server} plugin resumes at least as many sessions as stock (share of offered sessions resumed, "
                "plugin vs stock)",
                measured,
                ok,
            )
        )
    return targets


SIDE_NAMES = ["stock", "plugin"]
"""What the two sides are called in the output (the first is the plugin at ``--baseline`` when given)."""


def extract(commit: str, into: Path) -> Path:
    """``commit``'s ``src/`` under ``into`` (``git archive``, no work tree, no install); its path."""
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.baseline:
        SIDE_NAMES[0] = f"plugin at {args.baseline}"
    machine = kit.machine()
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        mp = multiprocessing.get_context("spawn")
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        tmp = stack.enter_context(kit.work_dir("resumption"))
        pair = kit.CA().issue(args.key_type)
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        baseline_env = {"PYTHONPATH": str(extract(args.baseline, tmp))} if args.baseline else None
        for server in args.servers:
            start = hypercorn_throughput.running_hypercorn if server.startswith("hypercorn-") else kit.running_server
            kit.log(f"{server}: starting {SIDE_NAMES[0]} and plugin servers (1 worker each)")
            with ExitStack() as servers:
                sides = {
                    "stock": servers.enter_context(
                        start(server, baseline_env is not None, cert, key, tmp, extra_env=baseline_env)
                    ),
                    "plugin": servers.enter_context(start(server, True, cert, key, tmp)),
                }
                for version in args.tls:
                    results.append(compare(server, version, sides, args.rounds, args.seconds, args.clients, pool))
    return {
        "benchmark": "resumption",
        "settings": {
            "rounds": args.rounds,
            "seconds per side per round": args.seconds,
            "client processes": args.clients,
            "server workers": 1,
            "key type": args.key_type,
            "TLS versions": list(args.tls),
            "quick": bool(args.quick),
            "sides": list(SIDE_NAMES),
        },
        "machine": machine,
        "results": results,
        "targets": targets_of(results),
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        (
            r["server"],
            r["tls"],
            f"{r['stock_median']:.0f}",
            f"{r['plugin_median']:.0f}",
            f"**{r['ratio']:.2f}x**",
            f"{r['round_ratio_min']:.2f}-{r['round_ratio_max']:.2f}",
            f"{r['stock_resumed_fraction']:.1%} / {r['plugin_resumed_fraction']:.1%}",
            f"{r['stock_cpu_us']:.0f} / {r['plugin_cpu_us']:.0f}",
            f"{r['cpu_ratio']:.2f}x",
            f"{r['failures']['stock']}/{r['failures']['plugin']}",
        )
        for r in result["results"]
    ]
    a, b = s.get("sides", ["stock", "plugin"])
    headers = (
        "server",
        "TLS",
        f"{a} req/s (median)",
        f"{b} req/s (median)",
        f"ratio {b}/{a}",
        "per-round ratios",
        f"connections resumed {a} / {b}",
        f"server CPU us/conn {a} / {b}",
        f"CPU ratio {a}/{b}",
        f"failed ({a}/{b})",
    )
    return (
        "### Session resumption\n\n"
        f"1 server worker each; {s['rounds']} alternating A/B rounds of {s['seconds per side per round']} s per side "
        f"and TLS version; {s['client processes']} client processes, each connection offering the session of the "
        "client's previous connection to that server, then `GET /` (`Connection: close`) read to the end (so a "
        "TLS 1.3 client reads the server's tickets); "
        f"{s['key type']} certificate. Resumed = `session_reused` as the client saw it, over every connection "
        "measured. Server CPU = user+system time of the server's processes during the window per connection "
        "(medians). Stock gunicorn `sync` and `gthread` build a new context per connection, so they cannot "
        "resume a session.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    choices = [*kit.ALL_SERVERS, *hypercorn_throughput.SERVERS]
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=choices)
    parser.add_argument("--tls", nargs="+", default=list(VERSIONS), choices=list(VERSIONS), help="TLS versions")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side per round")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    parser.add_argument("--baseline", metavar="COMMIT", help="the plugin at COMMIT in place of the stock server")
    return kit.run_script(parser, argv, {"rounds": 2, "seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
