"""Full-handshake throughput and server CPU per handshake for cheroot and Sanic, plugin against stock, same run.

The method and the table are those of ``handshake_throughput.py`` (which it imports): for each server, a stock
and a plugin server (one serving process each, same certificate files) run side by side, with one
``openssl s_server`` on the same files as the ceiling, measured in rotating rounds with ``openssl s_time -new``
and with Python client processes, then with the paired client (both servers in the same windows: the figure
the project trusts); server CPU is the user+system time of each server's process group.

* ``cheroot``: ``cheroot.wsgi.Server`` with its ``BuiltinSSLAdapter`` (stock: the pair loaded once, in the
  adapter's constructor) or with ``ReloadingSSLAdapter`` (plugin), serving :mod:`tlsbench_apps`' WSGI app.
  CherryPy's server is this same cheroot server.
* ``sanic``: ``app.run(ssl={"cert": ..., "key": ...}, workers=1)`` under Sanic's worker manager (stock: Sanic's
  ``CertSimple`` context, built once in the worker), plus ``reloading(app)`` (plugin: the same
  ``CertSimple``, the checks in a thread of the worker, the last good store kept by the main process). The
  process group is Sanic's main process, its worker and its multiprocessing manager, on both sides.

Target (``handshake_throughput.target_for``): the plugin's server CPU per handshake within 3 % of stock's
(paired client), for each server; the plugin's fraction of the s_server ceiling at least stock's (python client).

    python benchmarks/cheroot_sanic_handshakes.py              # 5 rounds x 3 s per side, 15 paired windows
    python benchmarks/cheroot_sanic_handshakes.py --quick      # 2 rounds x 1 s: a smoke run

This file is also the servers it measures (it imports nothing of tlsreload_plugins on the stock side)::

    python benchmarks/cheroot_sanic_handshakes.py serve cheroot|sanic stock|plugin --certfile C --keyfile K --port P
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

SERVERS = ("cheroot", "sanic")
PACKAGES = ("cheroot", "sanic")
SANIC_SIDE = "TLSBENCH_SANIC_SIDE"
"""Set for a Sanic server: its worker imports this file again and finds the app made below by its name."""


# --- the servers ------------------------------------------------------------------------------------


def serve_cheroot(options: argparse.Namespace) -> None:
    import tlsbench_apps
    from cheroot import wsgi

    server = wsgi.Server(("127.0.0.1", options.port), tlsbench_apps.wsgi)
    if options.side == "plugin":
        from tlsreload_plugins.cheroot import ReloadingSSLAdapter

        server.ssl_adapter = ReloadingSSLAdapter(options.certfile, options.keyfile)
    else:
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        server.ssl_adapter = BuiltinSSLAdapter(options.certfile, options.keyfile)

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(0)  # safe_start() stops the server, then re-raises

    signal.signal(signal.SIGTERM, leave)
    server.safe_start()


def sanic_app(side: str) -> Any:
    import tlsbench_apps
    from sanic import Request, Sanic
    from sanic.response import HTTPResponse, raw

    app = Sanic("tlsbench")
    if side == "plugin":
        from tlsreload_plugins.sanic import reloading

        reloading(app)

    @app.get("/")
    async def home(request: Request) -> HTTPResponse:
        return raw(tlsbench_apps._body(), content_type="text/plain")

    return app


if os.environ.get(SANIC_SIDE):  # in Sanic's main process and again in its worker, which imports this file
    sanic_bench_app = sanic_app(os.environ[SANIC_SIDE])


def serve_sanic(options: argparse.Namespace) -> None:
    ssl = {"cert": options.certfile, "key": options.keyfile}
    sanic_bench_app.run(host="127.0.0.1", port=options.port, ssl=ssl, workers=1, access_log=False, motd=False)


def serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="cheroot_sanic_handshakes.py serve")
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("side", choices=("stock", "plugin"))
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(argv)
    (serve_cheroot if options.server == "cheroot" else serve_sanic)(options)


# --- the measurement ----------------------------------------------------------------------------------


def running(server: str, plugin: bool, certfile: Path, keyfile: Path, log_dir: Path) -> Any:
    """:func:`benchkit.running_command` for cheroot and Sanic (this script serves them: ``serve``)."""
    import benchkit as kit

    side = "plugin" if plugin else "stock"
    args = [sys.executable, __file__, "serve", server, side, "--certfile", str(certfile), "--keyfile", str(keyfile)]
    extra_env = {SANIC_SIDE: side} if server == "sanic" else {}
    return kit.running_command(server, plugin, log_dir, lambda port: [*args, "--port", str(port)], extra_env)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from importlib import metadata

    import handshake_throughput

    result = handshake_throughput.run(args, start=running, benchmark="cheroot_sanic_handshakes")
    result["settings"].update({name: metadata.version(name) for name in PACKAGES})
    return result


def report(result: dict[str, Any]) -> str:
    import handshake_throughput

    s = result["settings"]
    title = "### Full-handshake throughput: " + ", ".join(f"{name} {s[name]}" for name in PACKAGES)
    return handshake_throughput.report(result).replace("### Full-handshake throughput", title, 1)


def main(argv: list[str] | None = None) -> int:
    import handshake_throughput

    return handshake_throughput.script_main(argv, __doc__, list(SERVERS), SERVERS, run, report)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
    else:
        sys.exit(main())
