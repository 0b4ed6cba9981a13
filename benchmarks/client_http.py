"""HTTP clients presenting a client certificate: ours (httpx's ReloadingTransport, AsyncReloadingTransport,
requests' ReloadingAdapter) against the same client as users run it without us (the certificate loaded once into
one context), side by side in the same run, alternating rounds.

The server is tests/mtls_servers.py (HTTP/1.1 keep-alive, client certificate required; it rebuilds its context per
connection, which is server CPU, not counted here). For each client and side:

* kept-alive: requests/s and client CPU per request (this process's user+system, the identity's checking thread
  included) over one client object making requests one after another;
* new connection: the same with ``Connection: close`` on every request (a handshake each);
* memory: resident memory per client object, 50 objects made (each with its own identity on our side) and one
  request through each.

    python benchmarks/client_http.py               # 5 rounds x 2 s per side and mode
    python benchmarks/client_http.py --quick       # 2 rounds x 0.5 s
    python benchmarks/client_http.py --clients requests
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import requests
import trustme

from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.httpx import AsyncReloadingTransport, ReloadingTransport
from tlsreload_plugins.client.requests import ReloadingAdapter

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("httpx", "httpx-async", "requests")


class Files:
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

    def stock_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cacert))
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def identity(self) -> ClientIdentity:
        return ClientIdentity(str(self.cert), str(self.key), cafile=str(self.cacert))


def sync_client(kind: str, side: str, files: Files) -> tuple[Callable[[str, dict[str, str]], int], Callable[[], None]]:
    """A client object and how to GET through it; its closer."""
    identity = files.identity() if side == "ours" else None
    if kind == "httpx":
        if identity is not None:
            client = httpx.Client(transport=ReloadingTransport(identity))
        else:
            client = httpx.Client(verify=files.stock_context())

        def get(url: str, headers: dict[str, str]) -> int:
            return client.get(url, headers=headers).status_code

        def close() -> None:
            client.close()
            if identity is not None:
                identity.close()

        return get, close
    session = requests.Session()
    if identity is not None:
        session.mount("https://", ReloadingAdapter(identity))
    else:
        session.cert = (str(files.cert), str(files.key))
    # Stock: the CA bundle given with each request, as REQUESTS_CA_BUNDLE in the environment would override the
    # session's (both sides keep trust_env on, as users do: its proxy lookups cost the same on both).
    verify: str | bool = str(files.cacert) if identity is None else True

    def session_get(url: str, headers: dict[str, str]) -> int:
        return session.get(url, headers=headers, verify=verify).status_code

    def session_close() -> None:
        session.close()
        if identity is not None:
            identity.close()

    return session_get, session_close


def measure(
    kind: str, side: str, files: Files, url: str, headers: dict[str, str], seconds: float
) -> tuple[float, float]:
    """(requests/s, client CPU µs per request)."""
    if kind == "httpx-async":
        return asyncio.run(measure_async(side, files, url, headers, seconds))
    get, close = sync_client(kind, side, files)
    try:
        get(url, headers)
        count, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            assert get(url, headers) == 200
            count += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        close()
    return count / wall, cpu / count * 1e6


async def measure_async(
    side: str, files: Files, url: str, headers: dict[str, str], seconds: float
) -> tuple[float, float]:
    identity = files.identity() if side == "ours" else None
    if identity is not None:
        client = httpx.AsyncClient(transport=AsyncReloadingTransport(identity))
    else:
        client = httpx.AsyncClient(verify=files.stock_context())
    try:
        await client.get(url, headers=headers)
        count, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            assert (await client.get(url, headers=headers)).status_code == 200
            count += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await client.aclose()
        if identity is not None:
            identity.close()
    return count / wall, cpu / count * 1e6


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_per_object(kind: str, side: str, files: Files, url: str, count: int) -> float:
    """KiB of resident memory per client object (with one request made through each)."""
    if kind == "httpx-async":
        kind = "httpx"  # the same transport objects; the loop adds nothing per object
    gc.collect()
    before = rss()
    clients = [sync_client(kind, side, files) for _ in range(count)]
    for get, _ in clients:
        get(url, {})
    gc.collect()
    after = rss()
    for _, close in clients:
        close()
    return (after - before) / count / 1024


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
            [sys.executable, str(ROOT / "tests" / "mtls_servers.py"), "http", "--cert", str(cert), "--key", str(key),
             "--client-ca", str(client_ca), "--port", str(port)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            url = f"https://localhost:{port}/"
            load = os.getloadavg()[0]
            print(f"{os.cpu_count()} CPUs, load {load:.2f}; {args.rounds} rounds x {args.seconds} s per side")
            print(f"{'client':12} {'mode':10} {'stock req/s':>11} {'ours req/s':>10} {'ratio':>6} "
                  f"{'stock µs':>9} {'ours µs':>8} {'ratio':>6}  (CPU per request; ratio ours/stock)")  # fmt: skip
            for kind in args.clients:
                for mode, headers in (("kept-alive", {}), ("new conn", {"Connection": "close"})):
                    results: dict[str, list[tuple[float, float]]] = {"stock": [], "ours": []}
                    for number in range(args.rounds):
                        for side in ("stock", "ours") if number % 2 == 0 else ("ours", "stock"):
                            results[side].append(measure(kind, side, files, url, headers, args.seconds))
                    stock_rate = statistics.median(r for r, _ in results["stock"])
                    ours_rate = statistics.median(r for r, _ in results["ours"])
                    stock_cpu = statistics.median(c for _, c in results["stock"])
                    ours_cpu = statistics.median(c for _, c in results["ours"])
                    print(f"{kind:12} {mode:10} {stock_rate:11.0f} {ours_rate:10.0f} {ours_rate / stock_rate:6.2f} "
                          f"{stock_cpu:9.0f} {ours_cpu:8.0f} {ours_cpu / stock_cpu:6.2f}", flush=True)  # fmt: skip
            print(f"\nresident memory per client object ({args.objects} objects, one request each), KiB:")
            for kind in args.clients:
                if kind == "httpx-async":
                    continue
                stock = memory_per_object(kind, "stock", files, url, args.objects)
                ours = memory_per_object(kind, "ours", files, url, args.objects)
                print(f"{kind:12} stock {stock:7.0f}  ours {ours:7.0f}  (ours includes a ClientIdentity each)")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)
    return 0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
