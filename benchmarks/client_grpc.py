"""gRPC channels presenting a client certificate: ours (ReloadingChannel, AsyncReloadingChannel) against the same
channel as users make it without us (``grpc.ssl_channel_credentials`` from the files read once), side by side in the
same run, alternating rounds.

The server is tests/mtls_servers.py's gRPC server (client certificate required; unary ``/echo.Echo/Who`` answers the
serial it saw; it rebuilds its TLS configuration per connection, which is server CPU, not counted here). For each
client (``grpc``, ``grpc-aio``) and side:

* kept-alive: calls/s and client CPU per call (this process's user+system: gRPC's threads and, on our side, the
  identity's checking thread included) over one channel and one multicallable, as a stub holds it, calls made one
  after another;
* new connection: the same with a new channel per call (a TCP connection and a full TLS handshake each), closed
  after it; ours makes a new reloading channel on one identity each time;
* memory: resident memory per channel, N channels made and one call through each: stock; ours with a
  ClientIdentity each; ours sharing one identity.

    python benchmarks/client_grpc.py               # 5 rounds x 2 s per side and mode
    python benchmarks/client_grpc.py --quick       # 2 rounds x 0.5 s
    python benchmarks/client_grpc.py --clients grpc
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import trustme

from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.grpc import AsyncReloadingChannel, ReloadingChannel

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("grpc", "grpc-aio")
METHOD = "/echo.Echo/Who"


class Files:
    """A client certificate, key and server CA on disk, and the server's files."""

    def __init__(self, directory: Path) -> None:
        server_ca, client_ca = trustme.CA(), trustme.CA()
        self.cert, self.key, self.cacert = directory / "c.crt", directory / "c.key", directory / "ca.crt"
        client = client_ca.issue_cert("client.test")
        self.cert.write_bytes(b"".join(p.bytes() for p in client.cert_chain_pems))
        self.key.write_bytes(client.private_key_pem.bytes())
        self.cacert.write_bytes(server_ca.cert_pem.bytes())
        server = server_ca.issue_cert("localhost")
        self.server = (directory / "s.crt", directory / "s.key", directory / "clientca.crt")
        self.server[0].write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
        self.server[1].write_bytes(server.private_key_pem.bytes())
        self.server[2].write_bytes(client_ca.cert_pem.bytes())

    def stock_credentials(self) -> Any:
        """What users write: the files read once."""
        return grpc.ssl_channel_credentials(self.cacert.read_bytes(), self.key.read_bytes(), self.cert.read_bytes())

    def identity(self) -> ClientIdentity:
        return ClientIdentity(str(self.cert), str(self.key), cafile=str(self.cacert))


def channel_maker(side: str, files: Files, target: str, aio: bool) -> tuple[Callable[[], Any], Callable[[], None]]:
    """How this side makes a channel (stock: from credentials made once; ours: on one identity), and its closer."""
    if side == "stock":
        credentials = files.stock_credentials()
        secure = grpc.aio.secure_channel if aio else grpc.secure_channel
        return (lambda: secure(target, credentials)), (lambda: None)
    identity = files.identity()
    reloading = AsyncReloadingChannel if aio else ReloadingChannel
    return (lambda: reloading(identity, target)), identity.close


def measure(side: str, files: Files, target: str, new_connection: bool, seconds: float) -> tuple[float, float]:
    """(calls/s, client CPU µs per call) through grpc."""
    make, done = channel_maker(side, files, target, aio=False)
    try:
        channel = make()
        who = channel.unary_unary(METHOD)
        who(b"", timeout=10)
        count, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if new_connection:
                with make() as fresh:
                    fresh.unary_unary(METHOD)(b"", timeout=10)
            else:
                who(b"", timeout=10)
            count += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        channel.close()
    finally:
        done()
    return count / wall, cpu / count * 1e6


async def measure_aio(
    side: str, files: Files, target: str, new_connection: bool, seconds: float
) -> tuple[float, float]:
    """(calls/s, client CPU µs per call) through grpc.aio."""
    make, done = channel_maker(side, files, target, aio=True)
    try:
        channel = make()
        who = channel.unary_unary(METHOD)
        await who(b"", timeout=10)
        count, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if new_connection:
                fresh = make()
                await fresh.unary_unary(METHOD)(b"", timeout=10)
                await fresh.close()
            else:
                await who(b"", timeout=10)
            count += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await channel.close()
    finally:
        done()
    return count / wall, cpu / count * 1e6


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_per_channel(side: str, files: Files, target: str, count: int) -> float:
    """KiB of resident memory per channel (with one call made through each, so each holds a connection)."""
    gc.collect()
    before = rss()
    closers: list[Callable[[], None]] = []
    if side == "ours, shared identity":
        identity = files.identity()
        channels = [ReloadingChannel(identity, target) for _ in range(count)]
        closers.append(identity.close)
    elif side == "ours":
        identities = [files.identity() for _ in range(count)]
        channels = [ReloadingChannel(identity, target) for identity in identities]
        closers += [identity.close for identity in identities]
    else:
        channels = [grpc.secure_channel(target, files.stock_credentials()) for _ in range(count)]
    for channel in channels:
        channel.unary_unary(METHOD)(b"", timeout=10)
    gc.collect()
    after = rss()
    for channel in channels:
        channel.close()
    for close in closers:
        close()
    return (after - before) / count / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--objects", type=int, default=50)
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.objects = 2, 0.5, 10
    with tempfile.TemporaryDirectory() as directory:
        files = Files(Path(directory))
        port = free_port()
        cert, key, client_ca = files.server
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "mtls_servers.py"), "grpc", "--cert", str(cert), "--key", str(key),
             "--client-ca", str(client_ca), "--port", str(port)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            target = f"localhost:{port}"
            load = os.getloadavg()[0]
            print(f"{os.cpu_count()} CPUs, load {load:.2f}; grpcio {grpc.__version__}; "
                  f"{args.rounds} rounds x {args.seconds} s per side")  # fmt: skip
            print(f"{'client':10} {'mode':10} {'stock call/s':>12} {'ours call/s':>11} {'ratio':>6} "
                  f"{'stock µs':>9} {'ours µs':>8} {'ratio':>6}  (CPU per call; ratio ours/stock)")  # fmt: skip
            for kind in args.clients:
                for mode, new_connection in (("kept-alive", False), ("new conn", True)):
                    results: dict[str, list[tuple[float, float]]] = {"stock": [], "ours": []}
                    for number in range(args.rounds):
                        for side in ("stock", "ours") if number % 2 == 0 else ("ours", "stock"):
                            if kind == "grpc-aio":
                                figures = asyncio.run(measure_aio(side, files, target, new_connection, args.seconds))
                            else:
                                figures = measure(side, files, target, new_connection, args.seconds)
                            results[side].append(figures)
                    stock_rate = statistics.median(r for r, _ in results["stock"])
                    ours_rate = statistics.median(r for r, _ in results["ours"])
                    stock_cpu = statistics.median(c for _, c in results["stock"])
                    ours_cpu = statistics.median(c for _, c in results["ours"])
                    print(f"{kind:10} {mode:10} {stock_rate:12.0f} {ours_rate:11.0f} {ours_rate / stock_rate:6.2f} "
                          f"{stock_cpu:9.0f} {ours_cpu:8.0f} {ours_cpu / stock_cpu:6.2f}", flush=True)  # fmt: skip
            print(f"\nresident memory per grpc channel ({args.objects} channels, one call each), KiB:")
            for side in ("stock", "ours", "ours, shared identity"):
                figure = memory_per_channel(side, files, target, args.objects)
                note = {"ours": " (a ClientIdentity each)", "ours, shared identity": " (one ClientIdentity)"}
                print(f"{side:22} {figure:7.0f}{note.get(side, '')}", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
