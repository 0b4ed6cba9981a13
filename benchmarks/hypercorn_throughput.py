"""Full-handshake throughput and server CPU per handshake for hypercorn, plugin against stock.

The method and the table are those of ``handshake_throughput.py`` (which it imports): for each
worker class, a stock ``hypercorn`` and a ``tlsreload-hypercorn`` (``python -m
tlsreload_plugins.hypercorn``) run side by side with the same files and options (1 worker each),
measured alternately with ``openssl s_time -new`` and with Python client processes; server CPU is
the user+system time of each server's process group (hypercorn's parent and its worker).

hypercorn builds one context per worker and never rebuilds it, so the plugin can only cost: one
``sni_callback`` per handshake. Target: >= 0.98x for every worker class.

    python benchmarks/hypercorn_throughput.py              # asyncio and trio, 5 rounds x 3 s per side
    python benchmarks/hypercorn_throughput.py --quick      # 2 rounds x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import benchkit as kit
import handshake_throughput

SERVERS = ("hypercorn-asyncio", "hypercorn-trio")
TARGET = 0.98


def hypercorn_command(server: str, plugin: bool, certfile: Path, keyfile: Path, port: int) -> list[str]:
    """The command line of ``server`` with (``plugin``) or without the plugin, as docs/hypercorn.md documents."""
    module = "tlsreload_plugins.hypercorn" if plugin else "hypercorn"
    app = f"{kit.BENCH_DIR / 'tlsbench_apps.py'}:asgi"
    cmd = [sys.executable, "-m", module, app, "--certfile", str(certfile), "--keyfile", str(keyfile)]
    return [*cmd, "--bind", f"{kit.HOST}:{port}", "--worker-class", server.removeprefix("hypercorn-")]


@contextlib.contextmanager
def running_hypercorn(server: str, plugin: bool, certfile: Path, keyfile: Path, log_dir: Path) -> Iterator[kit.Server]:
    """:func:`benchkit.running_server` for hypercorn: start, wait until it answers over TLS (and says
    whether the plugin is loaded), yield, always stop the whole process group."""
    port = kit.free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_path = log_dir / f"{server}-{'plugin' if plugin else 'stock'}-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            hypercorn_command(server, plugin, certfile, keyfile, port),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_dir,
            start_new_session=True,
        )
    handle = kit.Server(server, plugin, port, proc, log_path)
    try:
        kit.wait_ready(handle, 60.0)
        yield handle
    finally:
        kit.stop_process_group(proc)


def run(args: argparse.Namespace) -> dict[str, Any]:
    methods = [m for m in args.clients_kind if m != "s_time" or shutil.which("openssl")]
    if len(methods) < len(args.clients_kind):
        kit.log("openssl not found: skipping the s_time client")
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        pool = None
        if "python" in methods:
            mp = multiprocessing.get_context("spawn")
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        tmp = stack.enter_context(kit.work_dir("hypercorn"))
        pair = kit.CA().issue(args.key_type)
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        for server in args.servers:
            kit.log(f"{server}: starting stock and plugin servers (1 worker each)")
            with ExitStack() as servers:
                sides = {
                    side: servers.enter_context(running_hypercorn(server, side == "plugin", cert, key, tmp))
                    for side in ("stock", "plugin")
                }
                for method in methods:
                    result = handshake_throughput.compare(
                        server, method, sides, args.rounds, args.seconds, args.clients, pool
                    )
                    results.append({**result, "target": TARGET})
    targets = [
        kit.target_row(
            f"{r['server']} handshakes/s plugin/stock ({r['client']}) >= {r['target']}",
            f"{r['ratio']:.3f}x",
            r["ratio"] >= r["target"],
        )
        for r in results
    ]
    return {
        "benchmark": "hypercorn_throughput",
        "settings": {
            "rounds": args.rounds,
            "seconds per side per round": args.seconds,
            "python client processes": args.clients,
            "server workers": 1,
            "key type": args.key_type,
            "hypercorn": metadata.version("hypercorn"),
            "trio": metadata.version("trio"),
        },
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    title = f"### Full-handshake throughput: hypercorn {s['hypercorn']} (trio {s['trio']})"
    return handshake_throughput.report(result).replace("### Full-handshake throughput", title, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--clients-kind", nargs="+", default=["s_time", "python"], choices=["s_time", "python"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side per round (s_time rounds to whole s)")
    parser.add_argument("--clients", type=int, default=2, help="python client processes")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"rounds": 2, "seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
