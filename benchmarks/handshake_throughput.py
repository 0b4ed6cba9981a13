"""Full-handshake throughput, plugin against stock, side by side, alternating, against ``openssl s_server``.

For each server, the stock and the plugin server run at the same time (1 worker each, same
certificate files, same options), and so does one ``openssl s_server`` on the same files for the
whole run (the ceiling: OpenSSL's own single-threaded server, no Python at all). Each round
measures the three one after the other (the order rotates every round, so that drift hits all
alike) with two clients:

* ``s_time``: ``openssl s_time -connect 127.0.0.1:PORT -new -time T``: one client, a fresh
  connection and a full handshake each time (``-new``: no session reuse), no HTTP request
  (no ``-www``): the purest measure of what a handshake costs the server. The rate is the
  connection count s_time prints divided by the wall time of the run.
* ``python``: N client processes, each doing full handshakes with :mod:`ssl` in a loop (a new
  socket and a new SSL object per handshake, no session reuse), no request; the rate is the
  total over the window.
* ``paired``: the same N processes, each alternating its handshakes between the stock and the
  plugin server in one window (the two servers share every moment of it, and s_server rests), so
  the server CPU per handshake of both is measured under exactly the same conditions; the figure is
  the median over windows of plugin / stock. On a shared 2-core host the CPU per handshake of one
  server drifts by up to a third between windows seconds apart (measured: 765 to 995 us for stock
  hypercorn in consecutive rounds); measured in the same window, the drift hits both sides alike.
  The rates of this client are equal by construction and are not reported as a comparison.

Prints, per server and client: the median rate of each side and of s_server, the ratio
plugin/stock and the range of the per-round ratios, each side's rate as a fraction of the
s_server rate (the median over rounds of rate / that round's s_server rate), and the server CPU
per handshake of each. Targets: gunicorn sync and gthread plugin/stock >= 1.9x with the python
client (stock rebuilds its context for every connection; s_time: reported only); every other
server: server CPU per handshake of the plugin within 3 % of stock's (paired client; the s_time and
python CPU figures are reported); every server: the plugin's fraction of the s_server ceiling at
least stock's (python client).

    python benchmarks/handshake_throughput.py              # 5 rounds x 3 s per side and client
    python benchmarks/handshake_throughput.py --quick      # 2 rounds x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import math
import multiprocessing
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import benchkit as kit

RATE_TARGETS = {"gunicorn-sync": 1.9, "gunicorn-gthread": 1.9}
"""Servers whose stock side rebuilds its context per connection: plugin/stock rate, python client only."""
RATE_TARGET_CLIENT = "python"
CPU_TARGET = 1.03
"""Every other server: plugin server CPU per handshake at most this times stock's (paired client)."""
CPU_TARGET_CLIENT = "paired"
PAIRED = "paired"
TARGETS = RATE_TARGETS  # the name before round two
SIDES = ("stock", "plugin", "s_server")
CEILING = "s_server"
CLIENT_KINDS = ["s_time", "python", PAIRED]
_S_TIME_COUNT = re.compile(r"(\d+) connections in [\d.]+s")

# One context per client process, made once: the clients measure the server, not themselves.
_client_ctx: ssl.SSLContext | None = None


def target_for(server: str, client: str) -> tuple[str, float | None]:
    """The kind of target of one (server, client) result and its value: ``("rate", 1.9)`` (plugin/stock
    rate at least), ``("cpu", 1.03)`` (plugin CPU per handshake at most that times stock's) or
    ``("report", None)``."""
    if server in RATE_TARGETS:
        return ("rate", RATE_TARGETS[server]) if client == RATE_TARGET_CLIENT else ("report", None)
    return ("cpu", CPU_TARGET) if client == CPU_TARGET_CLIENT else ("report", None)


def _client(ports: tuple[int, ...], first: int, start_at: float, seconds: float) -> tuple[list[int], int, str, float]:
    """Runs in a client process: from ``start_at`` for ``seconds``, a fresh connection and full handshake on
    each of ``ports`` in turn, starting with ``ports[first]`` (one port: the python client; stock and plugin:
    the paired one); (ok per port, failed, first error, the process's CPU seconds over the window)."""
    global _client_ctx
    if _client_ctx is None:
        _client_ctx = kit.client_context()
    ctx = _client_ctx
    ok = [0] * len(ports)
    failed = 0
    first_error = ""
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    cpu = time.process_time()
    turn = first
    while time.monotonic() < end:
        try:
            with socket.create_connection((kit.HOST, ports[turn]), timeout=10) as raw, ctx.wrap_socket(raw):
                pass
            ok[turn] += 1
        except OSError as e:
            failed += 1
            first_error = first_error or repr(e)
        turn = (turn + 1) % len(ports)
    return ok, failed, first_error, time.process_time() - cpu


def s_server_command(certfile: Path, keyfile: Path, port: int) -> list[str]:
    """``openssl s_server`` on the servers' files. ``-chainCAfile`` + ``-build_chain`` make it send the
    leaf and the CA from the one file, as the Python servers' ``load_cert_chain`` does (``-cert``
    alone sends the leaf only; ``-cert_chain`` on the same file would send the leaf twice)."""
    cmd = ["openssl", "s_server", "-accept", f"{kit.HOST}:{port}", "-cert", str(certfile), "-key", str(keyfile)]
    return [*cmd, "-chainCAfile", str(certfile), "-build_chain", "-quiet"]


@contextlib.contextmanager
def running_s_server(certfile: Path, keyfile: Path, log_dir: Path, ready_timeout: float = 30.0) -> Iterator[kit.Server]:
    """Start ``openssl s_server`` in its own process group, wait until it completes a handshake, yield
    it (as a :class:`benchkit.Server` named ``s_server``), always stop the group.

    ``-quiet`` implies ``-ign_eof``: stdin at EOF (``/dev/null``) does not stop it. It serves one
    connection at a time, in one thread: after the handshake it waits for the client to close, then
    accepts the next. It writes one error line per connection that ends without close_notify (every
    one here), which is why its output goes to a log file, not a pipe."""
    port = kit.free_port()
    log_path = log_dir / f"s_server-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            s_server_command(certfile, keyfile, port),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=log_dir,
            start_new_session=True,
        )
    handle = kit.Server(CEILING, False, port, proc, log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        ctx = kit.client_context()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"openssl s_server exited with {proc.returncode}:\n{handle.output()}")
            try:
                kit.handshake_only(port, ctx)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"openssl s_server not answering after {ready_timeout}s ({e!r})") from e
                time.sleep(0.1)
        yield handle
    finally:
        kit.stop_process_group(proc)


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
) -> tuple[int, float, int, float]:
    """``clients`` processes handshaking together for ``seconds``: (handshakes, seconds, failures, the
    clients' CPU seconds)."""
    start_at = time.monotonic() + 0.3  # all clients start together, after dispatch
    futures = [pool.submit(_client, (port,), 0, start_at, seconds) for _ in range(clients)]
    results = [f.result(timeout=seconds + 60) for f in futures]
    ok = sum(r[0][0] for r in results)
    failed = sum(r[1] for r in results)
    if failed and not ok:
        raise RuntimeError(f"every handshake failed: {next(r[2] for r in results if r[2])}")
    return ok, seconds, failed, sum(r[3] for r in results)


def compare_paired(
    server: str,
    sides: dict[str, kit.Server],
    rounds: int,
    seconds: float,
    clients: int,
    pool: concurrent.futures.Executor,
    labels: tuple[str, str] = ("stock", "plugin"),
) -> dict[str, Any]:
    """Stock and plugin measured together: in each window every client alternates between them (half the
    clients starting with each); per window, each side's server CPU per handshake. ``labels`` name the two
    sides in the progress lines only (``against_commit.py`` pairs an old and a new plugin)."""
    names = ["stock", "plugin"]
    ports = tuple(sides[side].port for side in names)
    rates: dict[str, list[float]] = {side: [] for side in names}
    cpu_us: dict[str, list[float]] = {side: [] for side in names}
    failures = dict.fromkeys(names, 0)
    for r in range(rounds + 1):  # the first window warms both up and is not counted
        duration = 1.0 if r == 0 else seconds
        before = {side: kit.group_cpu_seconds(sides[side].proc.pid) for side in names}
        start_at = time.monotonic() + 0.3
        futures = [pool.submit(_client, ports, c % 2, start_at, duration) for c in range(clients)]
        results = [f.result(timeout=duration + 60) for f in futures]
        counts = [sum(res[0][i] for res in results) for i in range(len(names))]
        if not all(counts):
            raise RuntimeError(f"{server}: a side served no handshake: {next((res[2] for res in results), '')}")
        if r == 0:
            continue
        for i, side in enumerate(names):
            used = kit.group_cpu_seconds(sides[side].proc.pid) - before[side]
            rates[side].append(counts[i] / duration)
            cpu_us[side].append(used / counts[i] * 1e6)
        failures["plugin"] += sum(res[1] for res in results)  # not attributable to a side: counted once
        kit.log(
            f"  {server} paired window {r}/{rounds}: server CPU us/hs {labels[0]} {cpu_us['stock'][-1]:.0f}, "
            f"{labels[1]} {cpu_us['plugin'][-1]:.0f}"
        )
    per_window = [p / s for p, s in zip(cpu_us["plugin"], cpu_us["stock"], strict=True) if s]
    stock, plugin = kit.median(rates["stock"]), kit.median(rates["plugin"])
    kind, value = target_for(server, PAIRED)
    return {
        "server": server,
        "client": PAIRED,
        "stock_median": stock,
        "plugin_median": plugin,
        "ratio": plugin / stock if stock else float("nan"),
        "round_ratio_min": min(p / s for p, s in zip(rates["plugin"], rates["stock"], strict=True)),
        "round_ratio_max": max(p / s for p, s in zip(rates["plugin"], rates["stock"], strict=True)),
        "rates": rates,
        "stock_cpu_us": kit.median(cpu_us["stock"]),
        "plugin_cpu_us": kit.median(cpu_us["plugin"]),
        # The paired statistic: the median over windows of plugin / stock in the same window.
        "cpu_plugin_over_stock": kit.median(per_window),
        "cpu_ratio": 1 / kit.median(per_window),
        "cpu_window_min": min(per_window),
        "cpu_window_max": max(per_window),
        "cpu_us": cpu_us,
        "failures": failures,
        "target_kind": kind,
        "target": None,
        "cpu_target": value if kind == "cpu" else None,
    }


def round_order(sides: list[str], r: int) -> list[str]:
    """The order of round ``r``: rotated by one each round (with two sides: A/B, B/A, ...)."""
    k = r % len(sides)
    return sides[k:] + sides[:k]


def compare(
    server: str,
    method: str,
    sides: dict[str, kit.Server],
    rounds: int,
    seconds: float,
    clients: int,
    pool: concurrent.futures.Executor | None,
) -> dict[str, Any]:
    """Measure ``sides`` (``stock``, ``plugin`` and, if given, ``s_server``) in rotating rounds."""

    def once(side: str, duration: float) -> tuple[float, float, int, float]:
        """(handshakes/s, server CPU us per handshake, failures, client CPU us per handshake or NaN)."""
        port, pgid = sides[side].port, sides[side].proc.pid
        cpu_before = kit.group_cpu_seconds(pgid)
        client_cpu = float("nan")
        if method == "s_time":
            count, elapsed, failed = measure_s_time(port, duration)
        else:
            assert pool is not None
            count, elapsed, failed, client_cpu = measure_python(pool, clients, port, duration)
        cpu = kit.group_cpu_seconds(pgid) - cpu_before
        per = (lambda seconds: seconds / count * 1e6) if count else (lambda seconds: float("nan"))
        return count / elapsed, per(cpu), failed, per(client_cpu)

    names = [side for side in SIDES if side in sides]
    for side in names:  # warm-up: lazy imports, first-connection costs
        once(side, 1.0)
    rates: dict[str, list[float]] = {side: [] for side in names}
    cpu_us: dict[str, list[float]] = {side: [] for side in names}
    client_us: dict[str, list[float]] = {side: [] for side in names}
    failures = dict.fromkeys(names, 0)
    for r in range(rounds):
        for side in round_order(names, r):
            rate, cpu, failed, client = once(side, seconds)
            rates[side].append(rate)
            cpu_us[side].append(cpu)
            client_us[side].append(client)
            failures[side] += failed
        kit.log(f"  {server} {method} round {r + 1}/{rounds}: " + ", ".join(f"{s} {rates[s][-1]:.0f}/s" for s in names))
    stock, plugin = kit.median(rates["stock"]), kit.median(rates["plugin"])
    per_round = [p / s for p, s in zip(rates["plugin"], rates["stock"], strict=True) if s]
    stock_cpu, plugin_cpu = kit.median(cpu_us["stock"]), kit.median(cpu_us["plugin"])
    kind, value = target_for(server, method)
    result: dict[str, Any] = {
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
        "cpu_plugin_over_stock": plugin_cpu / stock_cpu if stock_cpu else float("nan"),
        "cpu_us": cpu_us,
        # The python clients' own CPU per handshake: on a worker that serves one connection at a time
        # (sync, gthread with 1 thread) it lies on each handshake's critical path, beside the server's.
        "client_cpu_us": {side: kit.median(values) for side, values in client_us.items()},
        "failures": failures,
        "target_kind": kind,
        # "target" keeps its old meaning (a minimum plugin/stock rate), where there is one.
        "target": value if kind == "rate" else None,
        "cpu_target": value if kind == "cpu" else None,
    }
    if CEILING in sides:
        ceiling = rates[CEILING]
        fractions = {
            side: [rate / c for rate, c in zip(rates[side], ceiling, strict=True) if c] for side in ("stock", "plugin")
        }
        result.update(
            s_server_median=kit.median(ceiling),
            s_server_cpu_us=kit.median(cpu_us[CEILING]),
            # The median over rounds of (rate / that round's s_server rate), not a ratio of medians.
            stock_fraction=kit.median(fractions["stock"]),
            plugin_fraction=kit.median(fractions["plugin"]),
            round_fractions=fractions,
        )
    return result


def targets_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets rows of ``results`` (see :func:`target_for`), then the ceiling rows: per server, the
    plugin's fraction of the s_server rate at least stock's, with the python client (or, without it,
    the first client measured)."""
    targets = []
    for r in results:
        if r["target_kind"] == "rate":
            target = f"{r['server']} handshakes/s plugin/stock ({r['client']}) >= {r['target']}"
            targets.append(kit.target_row(target, f"{r['ratio']:.3f}x", r["ratio"] >= r["target"]))
        elif r["target_kind"] == "cpu":
            target = (
                f"{r['server']} server CPU per handshake ({r['client']}) plugin <= {r['cpu_target']} x stock "
                "(within 3 %)"
            )
            spread = (
                f"windows {r['cpu_window_min']:.3f}-{r['cpu_window_max']:.3f}"
                if "cpu_window_min" in r
                else f"rate {r['ratio']:.3f}x"
            )
            measured = (
                f"{r['cpu_plugin_over_stock']:.3f}x ({r['plugin_cpu_us']:.0f} vs {r['stock_cpu_us']:.0f} us; {spread})"
            )
            targets.append(kit.target_row(target, measured, r["cpu_plugin_over_stock"] <= r["cpu_target"]))
    for server in dict.fromkeys(r["server"] for r in results):
        mine = [r for r in results if r["server"] == server and "plugin_fraction" in r]
        chosen = next((r for r in mine if r["client"] == RATE_TARGET_CLIENT), mine[0] if mine else None)
        if chosen is None:
            continue
        target = f"{server} plugin's fraction of the s_server ceiling >= stock's ({chosen['client']})"
        measured = f"{chosen['plugin_fraction']:.3f} vs {chosen['stock_fraction']:.3f}"
        targets.append(kit.target_row(target, measured, chosen["plugin_fraction"] >= chosen["stock_fraction"]))
    return targets


def run(
    args: argparse.Namespace,
    *,
    start: Callable[..., AbstractContextManager[Any]] = kit.running_server,
    benchmark: str = "handshake_throughput",
) -> dict[str, Any]:
    """Measure ``args.servers``, each started by ``start(server, plugin, cert, key, tmp)`` (hypercorn_throughput.py
    passes its own), each against the one ``openssl s_server`` of the run."""
    machine = kit.machine()
    have_openssl = shutil.which("openssl") is not None
    methods = [m for m in args.clients_kind if m != "s_time" or have_openssl]
    paired_rounds = getattr(args, "paired_rounds", args.rounds)
    if len(methods) < len(args.clients_kind):
        kit.log("openssl not found: skipping the s_time client")
    if not have_openssl:
        kit.log("openssl not found: no s_server ceiling")
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        pool = None
        if "python" in methods or PAIRED in methods:
            mp = multiprocessing.get_context("spawn")
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        tmp = stack.enter_context(kit.work_dir("throughput"))
        pair = kit.CA().issue(args.key_type)
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        ceiling: dict[str, kit.Server] = {}
        if have_openssl:
            kit.log("starting openssl s_server on the same files (the ceiling, shared by every server)")
            ceiling[CEILING] = stack.enter_context(running_s_server(cert, key, tmp))
        for server in args.servers:
            kit.log(f"{server}: starting stock and plugin servers (1 worker each)")
            with ExitStack() as servers:
                sides = {
                    side: servers.enter_context(start(server, side == "plugin", cert, key, tmp))
                    for side in ("stock", "plugin")
                }
                for method in methods:
                    if method == PAIRED:
                        assert pool is not None
                        results.append(compare_paired(server, sides, paired_rounds, args.seconds, args.clients, pool))
                        continue
                    results.append(
                        compare(server, method, {**sides, **ceiling}, args.rounds, args.seconds, args.clients, pool)
                    )
    return {
        "benchmark": benchmark,
        "settings": {
            "rounds": args.rounds,
            "paired windows": paired_rounds,
            "seconds per side per round": args.seconds,
            "python client processes": args.clients,
            "server workers": 1,
            "key type": args.key_type,
            "ceiling": "openssl s_server" if have_openssl else "none (openssl not found)",
            "quick": bool(getattr(args, "quick", False)),
        },
        "machine": machine,
        "results": results,
        "targets": targets_of(results),
    }


def _target_cell(r: dict[str, Any]) -> str:
    kind = r.get("target_kind", "rate")
    if kind == "rate":
        return f"rate >= {r['target']}x"
    if kind == "cpu":
        return f"CPU <= {r['cpu_target']}x"
    return "reported"


def _client_cpu_cell(r: dict[str, Any]) -> str:
    client = r.get("client_cpu_us", {})
    if not all(math.isfinite(client.get(side, float("nan"))) for side in ("stock", "plugin")):
        return "-"
    return f"{client['stock']:.0f} / {client['plugin']:.0f}"


def report(result: dict[str, Any]) -> str:
    s = result["settings"]

    def ceiling(r: dict[str, Any], spec: str, *keys: str) -> str:
        return " / ".join(format(r[k], spec) for k in keys) if all(k in r for k in keys) else "-"

    def ratio_cells(r: dict[str, Any]) -> tuple[str, str]:
        if r["client"] == PAIRED:  # equal rates by construction: the windows' CPU ratios instead
            return "(same window)", f"CPU {r['cpu_window_min']:.2f}-{r['cpu_window_max']:.2f}"
        return f"**{r['ratio']:.2f}x**", f"{r['round_ratio_min']:.2f}-{r['round_ratio_max']:.2f}"

    rows = [
        (
            r["server"],
            r["client"],
            f"{r['stock_median']:.0f}",
            f"{r['plugin_median']:.0f}",
            ceiling(r, ".0f", "s_server_median"),
            *ratio_cells(r),
            ceiling(r, ".2f", "stock_fraction", "plugin_fraction"),
            f"{r['stock_cpu_us']:.0f} / {r['plugin_cpu_us']:.0f} / " + ceiling(r, ".0f", "s_server_cpu_us"),
            f"**{r['cpu_ratio']:.3f}x**" if r["client"] == PAIRED else f"{r['cpu_ratio']:.2f}x",
            _client_cpu_cell(r),
            "/".join(str(r["failures"].get(side, "-")) for side in SIDES),
            _target_cell(r),
        )
        for r in result["results"]
    ]
    headers = (
        "server",
        "client",
        "stock hs/s (median)",
        "plugin hs/s (median)",
        "s_server hs/s (median)",
        "ratio plugin/stock",
        "per-round ratios",
        "fraction of s_server stock / plugin",
        "server CPU us/hs stock / plugin / s_server",
        "CPU ratio stock/plugin",
        "client CPU us/hs stock / plugin",
        "failed (stock/plugin/s_server)",
        "target",
    )
    return (
        f"### Full-handshake throughput\n\n"
        f"1 server worker each; {s['rounds']} rounds of {s['seconds per side per round']} s per side, the order of "
        f"stock, plugin and `openssl s_server` rotating every round; "
        f"`s_time` = `openssl s_time -new` (1 client, no request); `python` = {s['python client processes']} "
        f"client processes doing full handshakes (no session reuse, no request); {s['key type']} certificate. "
        "`openssl s_server` (single-threaded, same files, started once per run and measured in every server's "
        "rounds) is the ceiling: a side's fraction is the median over rounds of its rate / that round's "
        "s_server rate. Server CPU = user+system time of the server's processes during the window per "
        "handshake (medians): its ratio is the throughput ratio a CPU-bound server would show, and is less "
        "disturbed by other load on the machine. `paired` = the same client processes alternating their "
        f"handshakes between stock and plugin in one window ({s.get('paired windows', '-')} windows of "
        f"{s['seconds per side per round']} s after a warm-up): both sides' CPU per handshake measured under the "
        "same conditions, the CPU ratio being the median over windows of stock/plugin in the same window (its "
        "per-window range in the per-round column). Client CPU = the python client processes' own CPU time per "
        "handshake. Targets: `rate` = plugin/stock handshakes/s (python client), "
        "`CPU` = plugin's server CPU per handshake relative to stock's (paired client).\n\n" + kit.table(headers, rows)
    )


def script_main(
    argv: list[str] | None,
    description: str | None,
    servers: list[str],
    choices: list[str] | tuple[str, ...],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of this script and of every script that measures other servers its way
    (``--servers``, ``--clients-kind``, ``--rounds``, ...; ``--quick``), running ``run`` and printing ``report``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=servers, choices=choices)
    parser.add_argument("--clients-kind", nargs="+", default=CLIENT_KINDS, choices=CLIENT_KINDS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paired-rounds", type=int, default=15, help="windows of the paired client")
    parser.add_argument("--seconds", type=float, default=3.0, help="per side per round (s_time rounds to whole s)")
    parser.add_argument("--clients", type=int, default=2, help="python client processes")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"rounds": 2, "paired_rounds": 2, "seconds": 1.0}, run, report)


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, __doc__, [*kit.SERVERS, "gunicorn-tornado"], kit.ALL_SERVERS, run, report)


if __name__ == "__main__":
    sys.exit(main())
