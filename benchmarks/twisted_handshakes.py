"""Full-handshake throughput and server CPU per handshake under Twisted: ``tlsreload:`` against ``ssl:``.

The method and the table are those of ``handshake_throughput.py`` (which it imports): for each server, one
process listening on ``ssl:`` (stock: Twisted's own endpoint, its ``CertificateOptions`` built once) and
one on ``tlsreload:`` (the plugin), same files and options, run side by side, with one ``openssl s_server``
on the same files as the ceiling; measured in rotating rounds with ``openssl s_time -new``, with Python
client processes, and with the paired client (both servers in the same windows). Server CPU is the
user+system time of each server's process.

* ``daphne``: ``daphne -e ssl:...`` against ``daphne -e tlsreload:...``, serving tlsbench_apps' ASGI app.
* ``twistd-web``: ``twistd -n web --listen ssl:...`` against ``--listen tlsreload:...``, serving
  tlsbench_apps' WSGI app (``--wsgi``).

What ``tlsreload:`` adds to a handshake: a dictionary lookup and one attribute read to find the newest
``CertificateOptions`` when the connection is made; the handshake itself runs on the same kind of context,
built by the same ``ssl:`` recipe. Target (``handshake_throughput.target_for``): the plugin's server CPU per
handshake within 3 % of stock's (paired client). The rate ratios and the other clients' CPU are reported.

    python benchmarks/twisted_handshakes.py              # daphne and twistd web, 5 rounds x 3 s per side
    python benchmarks/twisted_handshakes.py --quick      # 2 rounds x 1 s: a smoke run
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

SERVERS = ("daphne", "twistd-web")
TWISTD = str(Path(sys.executable).parent / "twistd")


def quote(value: object) -> str:
    """An endpoint string argument with its backslashes and colons escaped (Twisted's quoteStringArgument)."""
    return str(value).replace("\\", "\\\\").replace(":", "\\:")


def twisted_command(server: str, plugin: bool, certfile: Path, keyfile: Path, port: int) -> list[str]:
    """The command line of ``server`` on ``tlsreload:`` (``plugin``) or ``ssl:``, as docs/twisted.md documents."""
    prefix = "tlsreload" if plugin else "ssl"
    endpoint = f"{prefix}:{port}:interface={kit.HOST}:privateKey={quote(keyfile)}:certKey={quote(certfile)}"
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-e", endpoint, "tlsbench_apps:asgi"]
    return [TWISTD, "-n", "--pidfile=", "web", "--listen", endpoint, "--wsgi", "tlsbench_apps.wsgi"]


def running_twisted(
    server: str, plugin: bool, certfile: Path, keyfile: Path, log_dir: Path
) -> contextlib.AbstractContextManager[kit.Server]:
    """:func:`benchkit.running_command` for daphne and twistd."""
    return kit.running_command(
        server, plugin, log_dir, lambda port: twisted_command(server, plugin, certfile, keyfile, port)
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    result = handshake_throughput.run(args, start=running_twisted, benchmark="twisted_handshakes")
    result["settings"].update(
        twisted=metadata.version("twisted"), daphne=metadata.version("daphne"), pyopenssl=metadata.version("pyopenssl")
    )
    return result


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    title = (
        f"### Full-handshake throughput: Twisted {s['twisted']} (daphne {s['daphne']}, pyOpenSSL {s['pyopenssl']}); "
        "stock = `ssl:`, plugin = `tlsreload:`"
    )
    return handshake_throughput.report(result).replace("### Full-handshake throughput", title, 1)


def main(argv: list[str] | None = None) -> int:
    return handshake_throughput.script_main(argv, __doc__, list(SERVERS), SERVERS, run, report)


if __name__ == "__main__":
    sys.exit(main())
