"""Full-handshake throughput and server CPU per handshake for aiohttp, websockets and Tornado, plugin against stock.

The method and the table are those of ``handshake_throughput.py`` (which it imports): for each server, a
stock and a plugin server (:mod:`asyncio_bench_servers`, one process each, same certificate files) run side
by side, with one ``openssl s_server`` on the same files as the ceiling, measured in rotating rounds with
``openssl s_time -new`` and with Python client processes, then with the paired client (both servers in the
same windows); server CPU is the user+system time of each server's process group.

Stock loads its pair once; the plugin builds the same context once and adds one ``sni_callback`` per
handshake and a check of the files every second, in a thread. ``tornado-dict`` compares the plugin with
Tornado given its ``ssl_options`` dictionary, which rebuilds a context (reading the files) for every
connection: the way Tornado's documentation configures TLS. Target (``handshake_throughput.target_for``):
the plugin's server CPU per handshake within 3 % of stock's (paired client), for each server; the plugin's
fraction of the s_server ceiling at least stock's (python client). The rest is reported.

    python benchmarks/asyncio_servers_handshakes.py              # 5 rounds x 3 s per side, 15 paired windows
    python benchmarks/asyncio_servers_handshakes.py --quick      # 2 rounds x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import benchkit as kit
import handshake_throughput

SERVERS = ("aiohttp", "websockets", "tornado", "tornado-dict")
"""``tornado-dict``: stock Tornado given its ``ssl_options`` dictionary, which it turns into a context for every
connection (reading the files each time); ``tornado``: the dictionary turned into a context once."""
PACKAGES = ("aiohttp", "websockets", "tornado")


def command(server: str, plugin: bool, certfile: Path, keyfile: Path, port: int) -> list[str]:
    """The command line of ``server``, with (``plugin``) or without the plugin."""
    script = str(kit.BENCH_DIR / "asyncio_bench_servers.py")
    files = ["--certfile", str(certfile), "--keyfile", str(keyfile)]
    return [sys.executable, script, server, "plugin" if plugin else "stock", *files, "--port", str(port)]


def running(
    server: str, plugin: bool, certfile: Path, keyfile: Path, log_dir: Path
) -> contextlib.AbstractContextManager[kit.Server]:
    """:func:`benchkit.running_command` for aiohttp, websockets and Tornado."""
    return kit.running_command(server, plugin, log_dir, lambda port: command(server, plugin, certfile, keyfile, port))


def run(args: argparse.Namespace) -> dict[str, Any]:
    result = handshake_throughput.run(args, start=running, benchmark="asyncio_servers_handshakes")
    result["settings"].update({name: metadata.version(name) for name in PACKAGES})
    return result


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    versions = ", ".join(f"{name} {s[name]}" for name in PACKAGES)
    title = f"### Full-handshake throughput: {versions}"
    return handshake_throughput.report(result).replace("### Full-handshake throughput", title, 1)


def main(argv: list[str] | None = None) -> int:
    return handshake_throughput.script_main(argv, __doc__, list(SERVERS), SERVERS, run, report)


if __name__ == "__main__":
    sys.exit(main())
