"""How long certificate reloads stall the server's event loop: tlsreload-uvicorn serving 10,000 SNI identities
(kubelet Secrets, as :mod:`sni_scale` mints them), one process and ``--workers 2``, beside stock uvicorn with
one certificate, one process and ``--workers 2``, in the same run, under the same load. Each is compared with
stock in as many processes (two workers and the clients share the cores: a stall there also counts the time a
thread holding the GIL waited for a CPU).

The load, the same for each server: client processes make fresh connections (a full handshake and ``GET /``),
each naming a random identity, or, one time in two, one of the identities rotated in the last round; and every
``--every`` seconds (2) ``--rotate`` identities (100) get a new certificate the way kubelet writes one (a new
timestamped directory, ``..data`` renamed onto it). Stock uvicorn serves its one certificate whatever the name.

The served app (:mod:`loop_lag_app`) ticks every millisecond on the server's event loop and keeps how late each
tick woke, less the time the loop's thread waited for a CPU (``/proc/thread-self/schedstat``): the **stall**.
Reported per server, over the ``--seconds`` window (45) after start-up: the largest stall and its 99.9th
percentile in any worker, the handshakes per second the clients completed, and the full garbage collections
(generation 2) in the serving processes with the longest one; with ``--watch MS``, where the loop's thread was
when a tick was that late, sampled by a thread of the app (its innermost frame, most frequent first): a
diagnosis, off by default, since the sampling thread takes the GIL every millisecond.

    python benchmarks/loop_lag.py                      # 10,000 identities, 45 s per server
    python benchmarks/loop_lag.py --quick              # 1,000 identities, 10 s per server
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import benchkit as kit
import sni_scale

SERVERS = ("stock", "plugin", "stock-w2", "plugin-w2")
WORKERS = {"stock": 1, "plugin": 1, "stock-w2": 2, "plugin-w2": 2}
TARGETS = {"stall_above_stock_ms": 5.0, "handshake_share": 0.5}
"""The largest stall at most 5 ms above stock's; handshakes per second at least half of stock's."""


# --- the load -----------------------------------------------------------------------------------


def _client(port: int, names: list[str], recent: Any, stop: Any, done: Any, failed: Any, threads: int) -> None:
    """One client process: ``threads`` threads, each making fresh connections until ``stop`` is set."""
    ctx = kit.client_context()
    rng = random.Random(os.getpid())

    def loop() -> None:
        ok = bad = 0
        while not stop.is_set():
            rotated = [recent[i] for i in range(len(recent)) if recent[i] >= 0] if rng.random() < 0.5 else []
            name = names[rng.choice(rotated)] if rotated else rng.choice(names)
            try:
                with (
                    socket.create_connection((kit.HOST, port), timeout=10) as raw,
                    ctx.wrap_socket(raw, server_hostname=name) as tls,
                ):
                    tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    while tls.recv(4096):
                        pass
                ok += 1
            except OSError:
                bad += 1
            if ok + bad >= 20:
                with done.get_lock():
                    done.value += ok
                with failed.get_lock():
                    failed.value += bad
                ok = bad = 0
        with done.get_lock():
            done.value += ok
        with failed.get_lock():
            failed.value += bad

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


class Rotations:
    """Every ``every`` seconds, ``count`` random identities of ``root`` get a new certificate (kubelet's way):
    each alternates between its first leaf and a second one minted for the same name (kept in the cache)."""

    def __init__(self, mint: sni_scale.Mint, root: Path, leaves: list[sni_scale.Leaf], count: int, every: float):
        self.mint, self.root, self.leaves, self.count, self.every = mint, root, leaves, count, every
        self.rng = random.Random(37)
        self.second: dict[int, sni_scale.Leaf] = {}
        self.flipped: set[int] = set()
        self.cache = mint.cache / f"second-leaves-{len(leaves)}.jsonl"
        if self.cache.exists():
            for line in self.cache.read_text().splitlines():
                index, name, cert, key, serial = json.loads(line)
                self.second[int(index)] = sni_scale.Leaf(name, cert.encode(), key.encode(), serial)
        self.rotated = 0
        self.among = len(leaves)
        """Rotations pick among the first ``among`` identities."""

    def second_leaf(self, index: int) -> sni_scale.Leaf:
        leaf = self.second.get(index)
        if leaf is None:
            leaf = self.second[index] = self.mint.leaf(self.leaves[index].name)
            with open(self.cache, "a") as out:
                out.write(json.dumps([index, leaf.name, leaf.cert.decode(), leaf.key.decode(), leaf.serial]) + "\n")
        return leaf

    def premint(self, rounds: int) -> list[list[int]]:
        """The identities each of ``rounds`` rounds rotates, second leaves minted for them now (not during a run)."""
        plan = [self.rng.sample(range(self.among), self.count) for _ in range(rounds)]
        for chosen in plan:
            for index in chosen:
                self.second_leaf(index)
        return plan

    def run(self, plan: list[list[int]], recent: Any, stop: threading.Event) -> None:
        for chosen in plan:
            started = time.monotonic()
            for index in chosen:
                leaf = self.leaves[index] if index in self.flipped else self.second[index]
                self.flipped ^= {index}
                sni_scale.kubelet_install(sni_scale.identity_dir(self.root, index), leaf.cert, leaf.key)
                self.rotated += 1
            for i, index in enumerate(chosen[: len(recent)]):
                recent[i] = index
            if stop.wait(max(0.0, self.every - (time.monotonic() - started))):
                return


# --- one server ---------------------------------------------------------------------------------


def command(kind: str, default: Path, port: int) -> list[str]:
    module = "uvicorn" if kind.startswith("stock") else "tlsreload_plugins.uvicorn"
    cmd = [sys.executable, "-m", module, "loop_lag_app:app", "--ssl-certfile", str(default / "tls.crt")]
    cmd += ["--ssl-keyfile", str(default / "tls.key"), "--host", kit.HOST, "--port", str(port), "--no-access-log"]
    return cmd + (["--workers", str(WORKERS[kind])] if WORKERS[kind] > 1 else [])


def measure(kind: str, args: argparse.Namespace, env: dict[str, str], rotations: Rotations, work: Path) -> dict:
    out = work / f"out-{kind}"
    out.mkdir()
    port = kit.free_port()
    server_env = {**env, "LOOP_LAG_OUT": str(out), "LOOP_LAG_WATCH": str(args.watch)}
    log_path = work / f"{kind}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command(kind, args.default, port),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=server_env,
            cwd=work,
            start_new_session=True,
        )
    server = kit.Server(kind, not kind.startswith("stock"), port, proc, log_path)
    names = [leaf.name for leaf in rotations.leaves][: args.asked or None]
    try:
        kit.wait_ready(server, 300.0)
        # Warm: every worker has answered and built its tables.
        deadline = time.monotonic() + 120
        pids: set[int] = set()
        while len(pids) < WORKERS[kind] and time.monotonic() < deadline:
            pids.add(sni_scale.ask(port, random.choice(names))[0])
        plan = rotations.premint(int(args.seconds / args.every) + 1)
        recent = multiprocessing.Array("i", [-1] * args.rotate, lock=False)
        stop_clients, done, failed = (
            multiprocessing.Event(),
            multiprocessing.Value("l", 0),
            multiprocessing.Value("l", 0),
        )
        clients = [
            multiprocessing.Process(
                target=_client, args=(port, names, recent, stop_clients, done, failed, args.threads), daemon=True
            )
            for _ in range(args.clients)
        ]
        cpu_before = kit.cpu_ticks()
        started_wall, started = time.time(), time.monotonic()
        for client in clients:
            client.start()
        stop_rotating = threading.Event()
        rotator = threading.Thread(target=rotations.run, args=(plan, recent, stop_rotating))
        rotated_before = rotations.rotated
        rotator.start()
        time.sleep(args.seconds)  # the measuring window: the load runs meanwhile
        stop_rotating.set()
        stop_clients.set()
        ended_wall, elapsed = time.time(), time.monotonic() - started
        cpu_after = kit.cpu_ticks()
        rotator.join()
        for client in clients:
            client.join(30)
    finally:
        kit.stop_process_group(proc)
    records = [json.loads(p.read_text()) for p in out.glob("*.json")]
    stalls: list[float] = []
    full: list[float] = []
    collections = 0
    where: Counter[str] = Counter()  # the innermost frame of the loop's thread, sampled in stalls over --watch ms
    for record in records:
        for at, stack in record["stacks"]:
            if started_wall <= at <= ended_wall:
                where[stack.strip().splitlines()[-2].strip()] += 1
        stalls += [s for at, s in zip(record["at"], record["stall"], strict=True) if started_wall <= at <= ended_wall]
        window = [c for c in record["collections"] if started_wall <= c[0] <= ended_wall]
        collections += len(window)
        full += [c[2] for c in window if c[1] == 2]
    if not records:
        raise SystemExit(f"{kind}: no worker wrote its ticks; server output:\n{server.output()}")
    return {
        "server": kind,
        "workers": WORKERS[kind],
        "records": len(records),
        "ticks": len(stalls),
        "stall_max_ms": max(stalls) * 1000 if stalls else float("nan"),
        "stall_p999_ms": kit.percentile(stalls, 99.9) * 1000 if stalls else float("nan"),
        "stall_p99_ms": kit.percentile(stalls, 99) * 1000 if stalls else float("nan"),
        "handshakes": done.value,
        "failed": failed.value,
        "per_s": done.value / elapsed,
        "rotated": rotations.rotated - rotated_before,
        "collections": collections,
        "full_collections": len(full),
        "full_max_ms": max(full) * 1000 if full else 0.0,
        "steal": kit.steal_share(cpu_before, cpu_after),
        "stalled_in": where.most_common(5),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    mint = sni_scale.Mint(Path(args.cache))
    root, leaves = sni_scale.tree(mint, args.count)
    args.default = sni_scale.default_identity(mint)
    rotations = Rotations(mint, root, leaves, args.rotate, args.every)
    rotations.among = min(args.asked or len(leaves), len(leaves))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TLSRELOAD_INTERVAL": args.interval, "TLSRELOAD_SNI": str(root)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kit.BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("TLSRELOAD_METRICS", None)
    rows = []
    with kit.work_dir("loop-lag-") as work:
        for kind in args.servers:
            kit.log(f"{kind}: {args.count} identities, {args.seconds:g} s")
            rows.append(measure(kind, args, env, rotations, work))
            kit.log(json.dumps(rows[-1]))
    stocks = {row["workers"]: row for row in rows if row["server"].startswith("stock")}
    targets = []
    for row in rows:
        # Against stock with as many workers, else stock in one process: the same processes on the same cores.
        stock = stocks.get(row["workers"], stocks.get(1))
        if stock is None or row["server"].startswith("stock"):
            continue
        above = row["stall_max_ms"] - stock["stall_max_ms"]
        targets.append(
            kit.target_row(
                f"{row['server']}: largest stall <= {stock['server']}'s + {TARGETS['stall_above_stock_ms']:g} ms",
                f"{row['stall_max_ms']:.1f} ms ({stock['server']} {stock['stall_max_ms']:.1f} ms, {above:+.1f})",
                above <= TARGETS["stall_above_stock_ms"],
            )
        )
        share = row["per_s"] / stock["per_s"] if stock["per_s"] else float("nan")
        targets.append(
            kit.target_row(
                f"{row['server']}: handshakes/s >= {TARGETS['handshake_share']:.0%} of {stock['server']}'s",
                f"{row['per_s']:.0f}/s ({share:.0%} of {stock['per_s']:.0f}/s)",
                share >= TARGETS["handshake_share"],
            )
        )
    return {
        "benchmark": "loop_lag",
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": kit.machine(),
        "rows": rows,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    headers = [
        "server",
        "workers",
        "stall max",
        "p99.9",
        "p99",
        "handshakes/s",
        "failed",
        "rotated",
        "gc",
        "gc2",
        "gc2 max",
        "steal",
    ]
    rows = [
        [
            r["server"],
            r["workers"],
            f"{r['stall_max_ms']:.1f} ms",
            f"{r['stall_p999_ms']:.2f} ms",
            f"{r['stall_p99_ms']:.2f} ms",
            f"{r['per_s']:.0f}",
            r["failed"],
            r["rotated"],
            r["collections"],
            r["full_collections"],
            f"{r['full_max_ms']:.0f} ms",
            r["steal"],
        ]
        for r in result["rows"]
    ]
    lines = [kit.table(headers, rows)]
    for r in result["rows"]:
        if r["stalled_in"]:
            lines.append(f"\n{r['server']}: where the loop's thread was in stalls (samples):")
            lines += [f"  {count:5d}  {frame}" for frame, count in r["stalled_in"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000, help="SNI identities")
    parser.add_argument("--seconds", type=float, default=45.0, help="the measuring window of each server")
    parser.add_argument("--rotate", type=int, default=100, help="identities rotated each round")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process")
    parser.add_argument(
        "--asked",
        type=int,
        default=0,
        help="clients name (and rotations pick) only the first N identities (0: all): with N under the contexts "
        "kept, handshakes build no context and what is left is the cost of the checks",
    )
    parser.add_argument(
        "--interval",
        default=sni_scale.INTERVAL,
        help="TLSRELOAD_INTERVAL of the plugin's servers (1): a long one (600) leaves the rotations unchecked, to "
        "tell what the checks cost from what the load does",
    )
    parser.add_argument(
        "--watch",
        type=float,
        default=0.0,
        help="ms without a tick after which the served app samples where the loop's thread is (0: never, the "
        "default: the sampling thread wakes every millisecond and takes the GIL, which the figures would carry)",
    )
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--cache", default="/tmp/tlsreload-sni-scale", help="minted certificates, kept between runs")
    return kit.run_script(parser, argv, {"count": 1000, "seconds": 10.0}, run, report)


if __name__ == "__main__":
    raise SystemExit(main())
