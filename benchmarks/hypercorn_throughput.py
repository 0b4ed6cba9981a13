"""Full-handshake throughput and server CPU per handshake for hypercorn, plugin against stock.

The method and the table are those of ``handshake_throughput.py`` (which it imports): for each
worker class, a stock ``hypercorn`` and a ``tlsreload-hypercorn`` (``python -m
tlsreload_plugins.hypercorn``) run side by side with the same files and options (1 worker each),
with one ``openssl s_server`` on the same files as the ceiling, measured in rotating rounds with
``openssl s_time -new`` and with Python client processes; server CPU is the user+system time of
each server's process group (hypercorn's parent and its worker; s_server's one process).

hypercorn builds one context per worker and never rebuilds it, so the plugin can only cost: one
``sni_callback`` per handshake. Targets (``handshake_throughput.target_for``): the plugin's server
CPU per handshake within 3 % of stock's, for every worker class (paired client: both servers in
the same windows); the plugin's fraction of the s_server ceiling at least stock's (python client).
The rate ratios and the other clients' CPU figures are reported.

    python benchmarks/hypercorn_throughput.py              # asyncio and trio, 5 rounds x 3 s per side
    python benchmarks/hypercorn_throughput.py --quick      # 2 rounds x 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import benchkit as kit
import handshake_throughput

SERVERS = ("hypercorn-asyncio", "hypercorn-trio")


def hypercorn_command(server: str, plugin: bool, certfile: Path, keyfile: Path, port: int) -> list[str]:
    """The command line of ``server`` with (``plugin``) or without the plugin, as docs/hypercorn.md documents."""
    module = "tlsreload_plugins.hypercorn" if plugin else "hypercorn"
    app = f"{kit.BENCH_DIR / 'tlsbench_apps.py'}:asgi"
    cmd = [sys.executable, "-m", module, app, "--certfile", str(certfile), "--keyfile", str(keyfile)]
    return [*cmd, "--bind", f"{kit.HOST}:{port}", "--worker-class", server.removeprefix("hypercorn-")]


def running_hypercorn(
    server: str,
    plugin: bool,
    certfile: Path,
    keyfile: Path,
    log_dir: Path,
    extra_env: Mapping[str, str] | None = None,
) -> contextlib.AbstractContextManager[kit.Server]:
    """:func:`benchkit.running_command` for hypercorn."""
    return kit.running_command(
        server, plugin, log_dir, lambda port: hypercorn_command(server, plugin, certfile, keyfile, port), extra_env
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    result = handshake_throughput.run(args, start=running_hypercorn, benchmark="hypercorn_throughput")
    result["settings"].update(hypercorn=metadata.version("hypercorn"), trio=metadata.version("trio"))
    return result


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    title = f"### Full-handshake throughput: hypercorn {s['hypercorn']} (trio {s['trio']})"
    return handshake_throughput.report(result).replace("### Full-handshake throughput", title, 1)


def main(argv: list[str] | None = None) -> int:
    return handshake_throughput.script_main(argv, __doc__, list(SERVERS), SERVERS, run, report)


if __name__ == "__main__":
    sys.exit(main())
