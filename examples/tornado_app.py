"""Tornado with certificate reload, in one process or several (``tornado.process.fork_processes``)::

    python examples/tornado_app.py --certfile tls.crt --keyfile tls.key --host 127.0.0.1 --port 8443 [--processes 2]

The one line is ``tls = reloading(ssl_options)`` where the server starts (before ``fork_processes``),
then ``HTTPServer(app, ssl_options=tls.context())`` in each process that serves, before its loop runs. New
connections get each new valid pair; established ones keep theirs; a bad pair is logged once (by each
process) and the last good one keeps serving. A process ``fork_processes`` restarts while the files are
unusable serves the last good certificate any process served. ``--ca-certs`` asks for client
certificates (mutual TLS), verified against a bundle reloaded too.

SIGTERM and SIGINT stop every process cleanly. ``fork_processes`` forwards no signal to its children, so
with ``--processes`` the parent holds the write end of a pipe each child watches: when the parent is
asked to stop (or dies), every child sees the pipe close and stops, and ``fork_processes`` then exits the
parent with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import select
import signal
import ssl
import sys
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.process import fork_processes
from tornado.web import Application, RequestHandler

from tlsreload_plugins.serving.start import CannotServe
from tlsreload_plugins.tornado import reloading

log = logging.getLogger("tornado_app")


class Home(RequestHandler):
    def get(self) -> None:
        self.write({"pid": os.getpid()})


def fork_with_lifeline(processes: int) -> int:
    """``fork_processes(processes)``; returns, in each child, the read end of a pipe that closes when the
    parent stops. Only the children return: the parent exits when they all have."""
    read_end, write_end = os.pipe()
    closed: list[bool] = []

    def stop_children(signum: int, frame: Any) -> None:
        if not closed:
            closed.append(True)
            os.close(write_end)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_children)
    fork_processes(processes)
    os.close(write_end)  # in the child: only the parent's copy keeps the pipe open
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return read_end


def closed(pipe: int) -> bool:
    """Whether the other end of ``pipe`` has closed (nothing is ever written: readable means end of file)."""
    return bool(select.select([pipe], [], [], 0)[0])


async def serve(sockets: list[Any], context: ssl.SSLContext, lifeline: int | None) -> None:
    server = HTTPServer(Application([(r"/", Home)]), ssl_options=context)
    server.add_sockets(sockets)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if lifeline is not None:

        def parent_stopped() -> None:
            loop.remove_reader(lifeline)
            stopping.set()

        loop.add_reader(lifeline, parent_stopped)
    host, port = sockets[0].getsockname()[:2]
    log.info("process %s serving https://%s:%s/", os.getpid(), host, port)
    await stopping.wait()
    server.stop()
    await server.close_all_connections()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--ca-certs", help="require client certificates signed by these CAs (mutual TLS)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--processes", type=int, default=1, help="serving processes (fork_processes when above 1)")
    parser.add_argument("--interval", type=float, default=None, help="seconds between checks (default 1)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")

    ssl_options: dict[str, Any] = {"certfile": options.certfile, "keyfile": options.keyfile}
    if options.ca_certs:
        ssl_options.update(ca_certs=options.ca_certs, cert_reqs=ssl.CERT_REQUIRED)
    try:
        tls = reloading(ssl_options, interval=options.interval)  # before the fork: checked once, kept for all
    except (CannotServe, ValueError) as e:
        parser.exit(1, f"{e}\n")
    sockets = bind_sockets(options.port, options.host)
    lifeline = fork_with_lifeline(options.processes) if options.processes > 1 else None
    try:
        # In each serving process, before its loop. A process restarted with nothing valid to serve waits
        # for usable files there: it stops, too, when the parent does.
        context = tls.context(stopped=lambda: lifeline is not None and closed(lifeline))
    except CannotServe as e:
        log.error("%s", e)
        sys.exit(1)
    asyncio.run(serve(sockets, context, lifeline))
    tls.close()


if __name__ == "__main__":
    main()
