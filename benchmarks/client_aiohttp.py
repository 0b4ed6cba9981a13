"""aiohttp's client glue against the stock client, side by side in one run: requests per second and client CPU per
request on kept-alive connections and on a new connection per request, and memory per client object.

* ours: ``aiohttp.ClientSession(connector=ReloadingConnector(identity))``, the identity checking its files every
  second in its own thread (its cost is counted: it is in the client process);
* stock: ``aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))``, the same files loaded once into
  one context that every stock client object shares (as the identity's context is shared).

The server is an aiohttp web server requiring a client certificate, in a process of its own (this script with
``--serve``), so that the client's CPU time (``time.process_time`` of this process) is the client's alone. Each
round runs both sides one after the other, the order alternating, ``--concurrency`` tasks making requests one after
another for ``--seconds``; the figures are medians over rounds and the ratio is ours / stock. Kept-alive: every task
reuses its connection; new connection: both connectors with ``force_close=True`` (one full mTLS handshake per
request). Memory, each side in a fresh process of its own: ``--objects`` client objects made (and, in a second
figure, each after one request, its connection kept), the growth of the Python heap (tracemalloc) and of the
resident set, divided by their number; the identity and stock's context, each shared by every client object of a
process, are measured on their own (the first of them pays for the modules it imports).

    python benchmarks/client_aiohttp.py              # 5 rounds x 3 s per side and mode, 200 objects: about 2 min
    python benchmarks/client_aiohttp.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import benchkit as kit
import trustme
from aiohttp import web

from tlsreload_plugins.client import ClientIdentity, client_context
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlsreload_plugins.files import TLSFiles

SIDES = ("stock", "ours")
MODES = ("kept-alive", "new connection")


# --- the server --------------------------------------------------------------------------------


def serve(cert: str, key: str, client_ca: str, port: int) -> int:
    """The mTLS server (``--serve``): ``GET /`` answers ``ok``; SIGTERM stops it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, kit.HOST, port, ssl_context=context).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())
    return 0


# --- the clients -------------------------------------------------------------------------------


class Files:
    """A server certificate for localhost, a client certificate, the CAs of each, on disk."""

    def __init__(self, root: Path, mint: bool = True) -> None:
        self.server_cert, self.server_key = root / "server.crt", root / "server.key"
        self.client_cert, self.client_key = root / "client.crt", root / "client.key"
        self.server_ca, self.client_ca = root / "server-ca.pem", root / "client-ca.pem"
        if mint:
            self.mint()
        self.context = client_context(self.tls())  # stock's: loaded once, shared by its client objects

    def mint(self) -> None:
        server_ca, client_ca = trustme.CA(), trustme.CA()
        server = server_ca.issue_cert("localhost")
        client = client_ca.issue_cert("client.bench")
        server.cert_chain_pems[0].write_to_path(str(self.server_cert))
        server.private_key_pem.write_to_path(str(self.server_key))
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))
        server_ca.cert_pem.write_to_path(str(self.server_ca))
        client_ca.cert_pem.write_to_path(str(self.client_ca))

    def tls(self) -> TLSFiles:
        return TLSFiles(str(self.client_cert), str(self.client_key), str(self.server_ca))

    def identity(self, watch: bool = True) -> ClientIdentity:
        return ClientIdentity(
            str(self.client_cert), str(self.client_key), cafile=str(self.server_ca), interval=1.0, watch=watch
        )


def connector(side: str, files: Files, identity: ClientIdentity, **options: Any) -> aiohttp.BaseConnector:
    """A side's connector (made in the running loop, as aiohttp wants)."""
    if side == "ours":
        return ReloadingConnector(identity, **options)
    return aiohttp.TCPConnector(ssl=files.context, **options)


async def window(
    side: str, files: Files, identity: ClientIdentity, url: str, force_close: bool, concurrency: int, seconds: float
) -> dict[str, float]:
    """``concurrency`` tasks making GETs one after another for ``seconds`` through one session."""
    async with aiohttp.ClientSession(connector=connector(side, files, identity, force_close=force_close)) as session:

        async def get() -> None:
            async with session.get(url) as response:
                if (await response.text()) != "ok\n":
                    raise RuntimeError(f"unexpected answer from {url}")

        await asyncio.gather(*(get() for _ in range(concurrency)))  # connections made before the clock starts
        done = 0
        end = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                await get()
                done += 1

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"requests": done, "rps": done / wall, "cpu_us": cpu / max(done, 1) * 1e6}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def per_object(
    make: Callable[[], Awaitable[Any]], count: int, close: Callable[[Any], Awaitable[None]]
) -> dict[str, float]:
    """Heap and resident growth per object made by ``make``, ``count`` of them alive at once."""
    gc.collect()
    tracemalloc.start()
    heap, rss = tracemalloc.get_traced_memory()[0], rss_bytes()
    objects = [await make() for _ in range(count)]
    gc.collect()
    heap, rss = tracemalloc.get_traced_memory()[0] - heap, rss_bytes() - rss
    tracemalloc.stop()
    for thing in objects:
        await close(thing)
    return {"heap_kib": heap / count / 1024, "rss_kib": rss / count / 1024}


async def memory(side: str, files: Files, url: str, count: int) -> dict[str, dict[str, float]]:
    """One side's figures, in a process of its own (``--memory``): what is shared by every client object of a
    process (stock's context, our identity), then client objects made, then client objects after one request."""
    result: dict[str, dict[str, float]] = {}
    shared: list[ClientIdentity] = []

    async def a_context() -> ssl.SSLContext:
        return await asyncio.to_thread(client_context, files.tls())

    async def an_identity() -> ClientIdentity:
        identity = await asyncio.to_thread(files.identity, False)
        shared.append(identity)
        return identity

    async def nothing(thing: object) -> None:
        pass

    if side == "ours":
        result["our identity (one per process)"] = await per_object(an_identity, max(1, count // 10), nothing)
    else:
        result["stock's context (one per process)"] = await per_object(a_context, max(1, count // 10), nothing)
    identity = shared[0] if shared else files.identity(watch=False)

    async def made() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=connector(side, files, identity))

    async def used() -> aiohttp.ClientSession:
        session = await made()
        async with session.get(url) as response:
            await response.read()
        return session

    async def close(session: aiohttp.ClientSession) -> None:
        await session.close()

    result[f"{side}, made"] = await per_object(made, count, close)
    result[f"{side}, after one request"] = await per_object(used, count, close)
    return result


def memory_in_a_process(side: str, root: Path, port: int, count: int) -> dict[str, dict[str, float]]:
    command = [sys.executable, __file__, "--memory", side, str(root), str(port), str(count)]
    done = subprocess.run(command, capture_output=True, check=True, timeout=600)
    figures: dict[str, dict[str, float]] = json.loads(done.stdout)
    return figures


async def measure(args: argparse.Namespace, files: Files, port: int) -> dict[str, Any]:
    url = f"https://localhost:{port}/"
    identity = await asyncio.to_thread(files.identity)
    rounds: list[dict[str, Any]] = []
    try:
        for number in range(args.rounds):
            for mode in MODES:
                order = SIDES if number % 2 == 0 else SIDES[::-1]
                for side in order:
                    figures = await window(
                        side, files, identity, url, mode == "new connection", args.concurrency, args.seconds
                    )
                    rounds.append({"round": number, "mode": mode, "side": side, **figures})
                    kit.log(f"round {number + 1}/{args.rounds} {mode} {side}: {figures['rps']:.0f} req/s")
    finally:
        identity.close()
    return {"rounds": rounds}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with kit.work_dir("client-aiohttp") as root:
        files = Files(root)
        port = kit.free_port()
        command = [
            sys.executable, __file__, "--serve", str(files.server_cert), str(files.server_key), str(files.client_ca),
            str(port),
        ]  # fmt: skip
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError("the benchmark's server did not start")
            loadavg = os.getloadavg()
            result = asyncio.run(measure(args, files, port))
            result["memory"] = {}
            for side in SIDES:
                kit.log(f"memory: {side}")
                result["memory"].update(memory_in_a_process(side, root, port, args.objects))
        finally:
            kit.stop_process_group(proc)
    result.update(
        machine=kit.machine(),
        load_before=loadavg,
        load_after=os.getloadavg(),
        aiohttp=aiohttp.__version__,
        settings={"rounds": args.rounds, "seconds": args.seconds, "concurrency": args.concurrency},
        targets=targets(result),
    )
    return result


def medians(result: dict[str, Any], mode: str, side: str, key: str) -> float:
    return kit.median([r[key] for r in result["rounds"] if r["mode"] == mode and r["side"] == side])


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Equal within noise: ours within 10 % of stock, per mode, in requests/s and CPU per request."""
    rows = []
    for mode in MODES:
        rps = medians(result, mode, "ours", "rps") / medians(result, mode, "stock", "rps")
        cpu = medians(result, mode, "ours", "cpu_us") / medians(result, mode, "stock", "cpu_us")
        rows.append(kit.target_row(f"{mode}: requests/s ours/stock >= 0.90", f"{rps:.3f}", rps >= 0.90))
        rows.append(kit.target_row(f"{mode}: client CPU/request ours/stock <= 1.10", f"{cpu:.3f}", cpu <= 1.10))
    return rows


def report(result: dict[str, Any]) -> str:
    rows = []
    for mode in MODES:
        stock_rps, ours_rps = (medians(result, mode, side, "rps") for side in SIDES)
        stock_cpu, ours_cpu = (medians(result, mode, side, "cpu_us") for side in SIDES)
        rows.append(
            (
                mode,
                f"{stock_rps:.0f}",
                f"{ours_rps:.0f}",
                f"{ours_rps / stock_rps:.3f}",
                f"{stock_cpu:.0f}",
                f"{ours_cpu:.0f}",
                f"{ours_cpu / stock_cpu:.3f}",
            )
        )
    speed = kit.table(
        ("mode", "stock req/s", "ours req/s", "ratio", "stock CPU us/req", "ours CPU us/req", "ratio"), rows
    )
    memory = kit.table(
        ("client object", "Python heap KiB each", "RSS KiB each"),
        [(name, f"{m['heap_kib']:.1f}", f"{m['rss_kib']:.1f}") for name, m in result["memory"].items()],
    )
    s = result["settings"]
    load = ", ".join(f"{x:.2f}" for x in result["load_before"])
    return (
        f"aiohttp {result['aiohttp']}; {s['rounds']} rounds x {s['seconds']} s per side and mode, "
        f"{s['concurrency']} concurrent requests; load average before: {load}\n\n{speed}\n\n{memory}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        cert, key, client_ca, port = argv[1:5]
        return serve(cert, key, client_ca, int(port))
    if argv[:1] == ["--memory"]:
        side, root, port, count = argv[1:5]
        url = f"https://localhost:{port}/"
        print(json.dumps(asyncio.run(memory(side, Files(Path(root), mint=False), url, int(count)))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each: both sides, both modes)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per side, mode and round")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--objects", type=int, default=200, help="client objects alive at once for the memory")
    quick = {"rounds": 1, "seconds": 0.5, "objects": 20}
    return kit.run_script(parser, argv, quick, run, report)


if __name__ == "__main__":
    sys.exit(main())
