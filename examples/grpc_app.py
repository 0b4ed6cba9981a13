"""A gRPC server whose TLS certificate follows its files, in one line::

    python examples/grpc_app.py --certfile tls.crt --keyfile tls.key --host 0.0.0.0 --port 8443

It serves the standard health service (``grpc.health.v1.Health``, from grpcio-health-checking), which
answers SERVING, on a thread-pool ``grpc.server``. :func:`tlsreload_plugins.grpc.server_credentials`
gives ``add_secure_port`` credentials whose files are checked in a daemon thread (every second, or
``$TLSRELOAD_INTERVAL``): new connections get each new valid pair, established ones keep theirs, and a
bad pair is logged once while the last good one keeps serving. SIGTERM or SIGINT stops it cleanly:
health turns NOT_SERVING, calls in flight get 5 seconds to finish, the checks stop, exit status 0.
Unusable files at start-up: one error line, exit status 1.

Try it::

    grpc_health_probe -addr localhost:8443 -tls -tls-ca-cert ca.crt
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tlsreload_plugins import InvalidIdentity
from tlsreload_plugins.grpc import server_credentials

log = logging.getLogger("grpc_app")

GRACE = 5.0
"""Seconds calls in flight get to finish when the server is asked to stop."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    options = parser.parse_args()
    # The package logs through logging.getLogger("tlsreload_plugins...."): configuring the root logger shows it.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")

    try:
        credentials = server_credentials(options.certfile, options.keyfile)
    except (InvalidIdentity, ValueError) as e:
        log.error("cannot serve TLS: %s", e)
        sys.exit(1)

    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    health_service = health.HealthServicer()
    health_service.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    with credentials:  # leaving the block stops the checks
        address = f"{options.host}:{options.port}"
        server.add_secure_port(address, credentials)
        server.start()
        log.info("serving grpc.health.v1.Health over TLS on %s", address)
        # With a timeout: a signal the kernel delivers to one of gRPC's threads runs its Python handler only when
        # the main thread next runs Python code, which an untimed wait never does.
        while not stop.wait(0.5):
            pass
        log.info("stopping: calls in flight get %g seconds", GRACE)
        health_service.enter_graceful_shutdown()
        server.stop(GRACE).wait()
    log.info("stopped")


if __name__ == "__main__":
    main()
