"""Handshakes during rotation: client threads handshaking non-stop through 100 rotations.

Each server runs with the plugin, 2 workers, a short ``TLSRELOAD_INTERVAL`` (default 0.2 s),
over a kubelet-style secret volume. Client threads each loop: fresh connection, full
handshake, ``GET /``, read the answer; every exception counts as a failure. Per rotation: swap
``..data`` to a new pair, wait until some client has been served the new serial (deadline 10 s),
then a random pause of 0..interval. Reported: handshakes, failures, how many of the rotated
serials were served.

``--stock`` adds the stock servers for contrast, where a comparison makes sense (gunicorn sync
and gthread re-read the files on every connection; the other stock servers never rotate).

Target: zero failed handshakes with the plugin.

    python benchmarks/rotation_handshakes.py             # 100 rotations per server
    python benchmarks/rotation_handshakes.py --quick     # 10 rotations per server
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any

import benchkit as kit

ROTATING_STOCK = ("gunicorn-sync", "gunicorn-gthread")


class Clients:
    """Client threads that probe in a loop and count everything, until stopped."""

    def __init__(self, port: int, threads: int) -> None:
        self.port = port
        self.ok = 0
        self.seconds: list[float] = []
        self.failures: list[str] = []
        self.serials: set[str] = set()
        self.seen = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        ctx = kit.client_context()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                answer = kit.probe(self.port, ctx)
            except (OSError, ValueError) as e:
                with self.seen:
                    self.failures.append(repr(e))
                continue
            took = time.monotonic() - started
            with self.seen:
                self.ok += 1
                self.seconds.append(took)
                if answer.serial not in self.serials:
                    self.serials.add(answer.serial)
                    self.seen.notify_all()

    def wait_for(self, serial: str, timeout: float) -> bool:
        with self.seen:
            return self.seen.wait_for(lambda: serial in self.serials, timeout)

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


def measure(
    server: str, plugin: bool, rotations: int, interval: float, workers: int, threads: int, key_type: str
) -> dict[str, Any]:
    pairs = kit.CA().issue_many(rotations + 1, key_type)
    unserved = 0
    with kit.work_dir("rotating") as tmp:
        volume = kit.KubeletDir(tmp / "secret")
        volume.install(pairs[0])
        with kit.running_server(
            server, plugin, volume.cert_path, volume.key_path, tmp, workers=workers, interval=interval
        ) as srv:
            start = time.monotonic()
            with Clients(srv.port, threads) as clients:
                for i, pair in enumerate(pairs[1:], 1):
                    volume.install(pair)
                    if not clients.wait_for(pair.serial, 10.0):
                        unserved += 1
                    time.sleep(random.uniform(0, interval))
                    if i % 25 == 0 or i == rotations:
                        kit.log(
                            f"  {srv.label}: {i}/{rotations} rotations, {clients.ok} handshakes, "
                            f"{len(clients.failures)} failed"
                        )
            elapsed = time.monotonic() - start
            if srv.proc.poll() is not None:
                raise RuntimeError(f"{srv.label} died during the run:\n{srv.output()}")
    rotated = {p.serial for p in pairs[1:]}
    return {
        "server": server,
        "side": "plugin" if plugin else "stock",
        "workers": workers,
        "rotations": rotations,
        "seconds": elapsed,
        "handshakes": clients.ok,
        "failures": len(clients.failures),
        "failure_sample": sorted(set(clients.failures))[:5],
        "rotations_served": len(rotated & clients.serials),
        "unserved": unserved,
        "probe_ms_median": kit.median(clients.seconds) * 1000,
        "probe_ms_p99": kit.percentile(clients.seconds, 99) * 1000,
        "probe_ms_max": max(clients.seconds, default=float("nan")) * 1000,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = [(server, True) for server in args.servers]
    if args.stock:
        runs += [(server, False) for server in args.servers if server in ROTATING_STOCK]
    results = []
    for server, plugin in runs:
        kit.log(f"handshakes during rotation: {server} ({'plugin' if plugin else 'stock'})")
        results.append(
            measure(server, plugin, args.rotations, args.interval, args.workers, args.threads, args.key_type)
        )
    targets = [
        kit.target_row(
            f"{r['server']} (plugin): failed handshakes during {r['rotations']} rotations == 0",
            f"{r['failures']} of {r['handshakes'] + r['failures']}",
            r["failures"] == 0,
        )
        for r in results
        if r["side"] == "plugin"
    ]
    return {
        "benchmark": "rotation_handshakes",
        "settings": {
            "interval": args.interval,
            "workers": args.workers,
            "client threads": args.threads,
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
            r["side"],
            r["rotations"],
            f"{r['rotations_served']}",
            r["handshakes"],
            f"**{r['failures']}**",
            f"{r['seconds']:.0f}",
            f"{r['probe_ms_median']:.1f} / {r['probe_ms_p99']:.0f} / {r['probe_ms_max']:.0f}",
            "; ".join(r["failure_sample"])[:120] or "-",
        )
        for r in result["results"]
    ]
    headers = (
        "server",
        "side",
        "rotations",
        "served",
        "handshakes ok",
        "failed",
        "s",
        "probe ms median / p99 / max",
        "failure sample",
    )
    return (
        "### Handshakes during rotation\n\n"
        f"{s['workers']} workers, interval {s['interval']:g} s, {s['key type']} pairs, kubelet `..data` swaps, "
        f"{s['client threads']} client threads each looping fresh connection + full handshake + `GET /`; 'served' = "
        "rotated serials seen by a client; 'probe ms' = time of one connection + handshake + request (a reload "
        "that holds a worker shows in the max).\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(kit.SERVERS), choices=kit.ALL_SERVERS)
    parser.add_argument("--rotations", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.2, help="TLSRELOAD_INTERVAL for the servers")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    parser.add_argument("--stock", action="store_true", help="also run stock gunicorn sync/gthread for contrast")
    return kit.run_script(parser, argv, {"rotations": 10}, run, report)


if __name__ == "__main__":
    sys.exit(main())
