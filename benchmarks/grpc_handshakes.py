"""Server CPU per new connection for gRPC: tlsreload's credentials against gRPC's own, and against a naive fetcher.

Four ``grpc.server`` processes (a thread pool of 4, the standard health service) on the same files:

* ``stock``: ``grpc.ssl_server_credentials([(key, chain)])``, the files read once: a server that never
  reloads, the floor.
* ``seam``: ``grpc.dynamic_ssl_server_credentials`` with a fetcher that always answers ``None``: what
  gRPC's reloading seam costs by itself (its C core takes the GIL and calls Python before every
  handshake), whatever the fetcher does.
* ``plugin``: ``tlsreload_plugins.grpc.server_credentials(certfile, keyfile)``: the same seam, with a
  fetcher that answers ``None`` from memory until the files change.
* ``naive``: the fetcher users write when they find the seam: it re-reads both files and returns a new
  configuration on every call, so gRPC rebuilds its TLS context for every connection (and hands it
  whatever is on disk, valid or not).

The paired method of ``handshake_throughput.py``: in each window every client process cycles through
the four servers, one new connection to each per round, in an order shuffled every round, so all
share every moment of the window; each server's CPU over the window, divided by the connections it
served in it. The CPU is the server's own ``time.process_time()`` (every thread, to the nanosecond),
asked over one channel kept open to it, since ``/proc`` counts 10 ms ticks, a tenth of a window's CPU
here. The figures are the medians over windows of each side's CPU per connection and of the
per-window ratios. Two clients:

* ``grpc``: a new channel per call (its own subchannel pool: a new TCP connection and a full TLS
  handshake), one ``Health/Check``, the channel closed: what a client that does not keep its channel
  costs the server.
* ``tls``: a plain TLS handshake offering ``h2`` and nothing else: the handshake alone.

Targets (``grpc`` client): the plugin's server CPU per connection at most 3 % above the seam's (what
the plugin itself adds) and at most 3 % above stock's (what reloading through gRPC's seam costs; the
seam alone is the floor of any fetcher). The ``tls`` client's ratios and the naive fetcher's are reported.

    python benchmarks/grpc_handshakes.py              # 10 windows x 3 s, both clients: about 2 minutes
    python benchmarks/grpc_handshakes.py --quick      # 2 windows x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import benchkit as kit
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SIDES = ("stock", "seam", "plugin", "naive")
CLIENT_KINDS = ["grpc", "tls"]
CPU_TARGET = 1.03
"""The plugin's server CPU per connection at most this times the seam's and stock's (``grpc`` client)."""
TARGET_CLIENT = "grpc"


# --- the servers ----------------------------------------------------------------------------------


def credentials(side: str, certfile: str, keyfile: str) -> Any:
    """The server credentials of ``side`` for these files."""
    if side == "plugin":
        from tlsreload_plugins.grpc import server_credentials

        return server_credentials(certfile, keyfile)

    def read() -> tuple[bytes, bytes]:
        return Path(keyfile).read_bytes(), Path(certfile).read_bytes()

    if side == "stock":
        return grpc.ssl_server_credentials([read()])

    def naive_fetcher() -> Any:  # what the seam invites: the files again, on every connection
        return grpc.ssl_server_certificate_configuration([read()])

    if side == "seam":  # gRPC's seam alone: a fetcher that never has anything new
        return grpc.dynamic_ssl_server_credentials(naive_fetcher(), lambda: None)
    return grpc.dynamic_ssl_server_credentials(naive_fetcher(), naive_fetcher)


def serve(side: str, certfile: str, keyfile: str, port: int) -> None:
    """One server process (``--serve``): until SIGTERM."""
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    service = health.HealthServicer()
    service.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(service, server)
    # This process's CPU time, to the nanosecond and including threads that ended (/proc counts 10 ms ticks).
    cpu = grpc.unary_unary_rpc_method_handler(lambda request, context: repr(time.process_time()).encode())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Cpu", {"Get": cpu}),))
    server.add_secure_port(f"{kit.HOST}:{port}", credentials(side, certfile, keyfile))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    server.start()
    stop.wait()
    server.stop(None)


@dataclass
class Running:
    """A server process, and one channel kept open to it (a single handshake) that asks its CPU time."""

    server: kit.Server
    channel: Any

    def cpu_seconds(self) -> float:
        return float(self.channel.unary_unary("/bench.Cpu/Get")(b"", timeout=10))


@contextlib.contextmanager
def running(side: str, certfile: Path, keyfile: Path, ca_pem: bytes, log_dir: Path) -> Iterator[Running]:
    """Start ``side``'s server, wait until it answers a health check, yield it, always stop its process group."""
    port = kit.free_port()
    log_path = log_dir / f"grpc-{side}-{port}.log"
    cmd = [sys.executable, __file__, "--serve", side, str(certfile), str(keyfile), str(port)]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=log_dir, start_new_session=True)
    handle = kit.Server(f"grpc-{side}", side == "plugin", port, proc, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{side} exited with {proc.returncode}:\n{handle.output()}")
            try:
                connect(port, "grpc", ca_pem)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        options = [("grpc.ssl_target_name_override", "localhost")]
        with grpc.secure_channel(f"{kit.HOST}:{port}", grpc.ssl_channel_credentials(ca_pem), options=options) as ch:
            yield Running(handle, ch)
    finally:
        kit.stop_process_group(proc)


# --- the clients ----------------------------------------------------------------------------------

_tls_ctx: ssl.SSLContext | None = None


def connect(port: int, kind: str, ca_pem: bytes) -> None:
    """One new connection to ``port``: a gRPC call on a new channel, or a bare TLS handshake offering h2."""
    global _tls_ctx
    if kind == "grpc":
        options = [("grpc.ssl_target_name_override", "localhost"), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.secure_channel(f"{kit.HOST}:{port}", grpc.ssl_channel_credentials(ca_pem), options=options) as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return
    if _tls_ctx is None:
        _tls_ctx = kit.client_context()
        _tls_ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((kit.HOST, port), timeout=10) as raw, _tls_ctx.wrap_socket(raw):
        pass


def _client(
    kind: str, ports: tuple[int, ...], seed: int, start_at: float, seconds: float, ca_pem: bytes
) -> tuple[list[int], int, str]:
    """In a client process: from ``start_at`` for ``seconds``, rounds of one connection to each of ``ports``,
    in an order shuffled every round (no server always follows another); (connections per port, failures,
    the first error)."""
    ok = [0] * len(ports)
    failed, first_error = 0, ""
    order, shuffle = list(range(len(ports))), random.Random(seed).shuffle
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    while time.monotonic() < end:
        shuffle(order)
        for turn in order:
            try:
                connect(ports[turn], kind, ca_pem)
                ok[turn] += 1
            except (OSError, grpc.RpcError) as e:
                failed += 1
                first_error = first_error or repr(e)
    return ok, failed, first_error


class Fleet:
    """The four servers; one that dies is started again, and counted (the naive fetcher's does: gRPC's
    ``add_handshakers`` reads its handshaker factory outside the lock under which a new configuration
    replaces and frees it, so a fetcher that answers a new configuration on every connection races other
    connections' handshakes: a use-after-free, SIGSEGV within seconds under concurrent clients)."""

    def __init__(self, files: kit.KubeletDir, ca_pem: bytes, log_dir: Path) -> None:
        self.files, self.ca_pem, self.log_dir = files, ca_pem, log_dir
        self.servers: dict[str, Running] = {}
        self.deaths: dict[str, list[int]] = {side: [] for side in SIDES}
        self._stacks: dict[str, ExitStack] = {}
        for side in SIDES:
            self._start(side)

    def _start(self, side: str) -> None:
        stack = ExitStack()
        self.servers[side] = stack.enter_context(
            running(side, self.files.cert_path, self.files.key_path, self.ca_pem, self.log_dir)
        )
        self._stacks[side] = stack

    def restart_the_dead(self) -> list[str]:
        """Start again every server that died; their names."""
        dead = [side for side, run in self.servers.items() if run.server.proc.poll() is not None]
        for side in dead:
            code = self.servers[side].server.proc.returncode
            self.deaths[side].append(code)
            kit.log(f"  {side} died (exit status {code}): started again; the window is not counted")
            self._stacks[side].close()
            self._start(side)
        return dead

    def close(self) -> None:
        for stack in self._stacks.values():
            stack.close()


def measure(kind: str, fleet: Fleet, args: argparse.Namespace, pool: Any) -> dict[str, Any]:
    """Paired windows: every side's server CPU per connection, in the same windows. A window in which a
    server died is not counted (another is run, up to three times as many as asked for)."""
    cpu_us: dict[str, list[float]] = {side: [] for side in SIDES}
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    failures = attempts = 0
    while len(cpu_us["stock"]) < args.windows:
        attempts += 1
        if attempts > 3 * args.windows + 1:
            raise RuntimeError(f"{kind}: servers died in too many windows: {fleet.deaths}")
        fleet.restart_the_dead()
        warm_up = attempts == 1  # the first window: client processes start and import; not counted
        duration = 2.0 if warm_up else args.seconds
        servers = dict(fleet.servers)
        ports = tuple(servers[side].server.port for side in SIDES)
        before = {side: servers[side].cpu_seconds() for side in SIDES}
        start_at = time.monotonic() + 0.3
        futures = [
            pool.submit(_client, kind, ports, attempts * args.clients + c, start_at, duration, fleet.ca_pem)
            for c in range(args.clients)
        ]
        results = [f.result(timeout=duration + 120) for f in futures]
        counts = [sum(r[0][i] for r in results) for i in range(len(SIDES))]
        if fleet.restart_the_dead() or warm_up:
            continue
        if not all(counts):
            raise RuntimeError(f"{kind}: a side served no connection: {next((r[2] for r in results if r[2]), '')}")
        failures += sum(r[1] for r in results)
        for i, side in enumerate(SIDES):
            used = servers[side].cpu_seconds() - before[side]
            cpu_us[side].append(used / counts[i] * 1e6)
            rates[side].append(counts[i] / duration)
        kit.log(
            f"  {kind} window {len(cpu_us['stock'])}/{args.windows}: server CPU us per connection "
            + ", ".join(f"{side} {cpu_us[side][-1]:.0f}" for side in SIDES)
        )

    def ratios(side: str, base: str = "stock") -> list[float]:
        return [a / b for a, b in zip(cpu_us[side], cpu_us[base], strict=True) if b]

    over_seam = ratios("plugin", "seam")
    return {
        "client": kind,
        "cpu_us": {side: kit.median(values) for side, values in cpu_us.items()},
        "plugin_over_stock": kit.median(ratios("plugin")),
        "plugin_range": (min(ratios("plugin")), max(ratios("plugin"))),
        "plugin_over_seam": kit.median(over_seam),
        "plugin_seam_range": (min(over_seam), max(over_seam)),
        "naive_over_stock": kit.median(ratios("naive")),
        "naive_range": (min(ratios("naive")), max(ratios("naive"))),
        "connections_per_second": {side: kit.median(values) for side, values in rates.items()},
        "windows": cpu_us,
        "failures": failures,
        "deaths": {side: list(codes) for side, codes in fleet.deaths.items()},
        "attempts": attempts,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    machine = kit.machine()
    results = []
    with ExitStack() as stack:
        mp = multiprocessing.get_context("spawn")
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        tmp = stack.enter_context(kit.work_dir("grpc"))
        ca = kit.CA()
        files = kit.KubeletDir(tmp / "tls")
        files.install(ca.issue(args.key_type))
        kit.log(f"starting the {', '.join(SIDES)} gRPC servers on the same files")
        fleet = Fleet(files, ca.pem, tmp)
        stack.callback(fleet.close)
        for kind in args.clients_kind:
            results.append(measure(kind, fleet, args, pool))
            fleet.deaths = {side: [] for side in SIDES}
    targets = []
    for r in results:
        if r["client"] != TARGET_CLIENT:
            continue
        for base in ("seam", "stock"):
            ratio = r[f"plugin_over_{base}"]
            targets.append(
                kit.target_row(
                    f"gRPC ({r['client']} client): plugin server CPU per connection <= {CPU_TARGET:g}x {base}'s",
                    f"{ratio:.3f}x",
                    ratio <= CPU_TARGET,
                )
            )
    return {
        "benchmark": "grpc_handshakes",
        "settings": {
            "windows": args.windows,
            "seconds per window": args.seconds,
            "client processes": args.clients,
            "key type": args.key_type,
            "grpcio": metadata.version("grpcio"),
            "quick": bool(args.quick),
        },
        "machine": machine,
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    head = (
        f"### gRPC: server CPU per new connection (grpcio {s['grpcio']}, {s['key type']}, "
        f"{s['windows']} paired windows x {s['seconds per window']:g} s, {s['client processes']} client processes)"
    )
    rows = []
    for r in result["results"]:
        cpu, rate = r["cpu_us"], r["connections_per_second"]
        rows.append(
            (
                r["client"],
                *(f"{cpu[side]:.0f} us ({rate[side]:.0f}/s)" for side in SIDES),
                f"{r['plugin_over_stock']:.3f}x ({r['plugin_range'][0]:.2f}-{r['plugin_range'][1]:.2f})",
                f"{r['plugin_over_seam']:.3f}x ({r['plugin_seam_range'][0]:.2f}-{r['plugin_seam_range'][1]:.2f})",
                f"{r['naive_over_stock']:.2f}x ({r['naive_range'][0]:.2f}-{r['naive_range'][1]:.2f})",
                r["failures"],
                ", ".join(
                    f"{side} {len(codes)} ({', '.join(map(str, sorted(set(codes))))})"
                    for side, codes in r["deaths"].items()
                    if codes
                )
                or "none",
            )
        )
    headers = ("client", *SIDES, "plugin / stock", "plugin / seam", "naive / stock", "failed", "servers died (status)")
    return head + "\n\n" + kit.table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        side, certfile, keyfile, port = argv[1:5]
        serve(side, certfile, keyfile, int(port))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients-kind", nargs="+", default=CLIENT_KINDS, choices=CLIENT_KINDS)
    parser.add_argument("--windows", type=int, default=10, help="paired windows (one more warms up)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per window")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"windows": 2, "seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
