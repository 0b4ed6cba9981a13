"""gRPC servers for tests/test_grpc.py, on :func:`tlsreload_plugins.grpc.server_credentials`.

``python tests/grpc_apps.py --certfile C --keyfile K --port P [--aio] [every option of server_credentials]``
serves ``grpc.health.v1.Health`` (SERVING) and ``/tlsreload.test.Status/Get``, which answers JSON bytes
(no protobuf): the pid, the served serial, the reloader's counters, and how many configurations gRPC
took. A thread-pool ``grpc.server``, or ``grpc.aio.server`` with ``--aio``. SIGTERM and SIGINT stop it
cleanly (exit 0); unusable files at start-up: one ERROR line, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tlsreload_plugins import InvalidIdentity
from tlsreload_plugins.grpc import ReloadingCredentials, reloaders, server_credentials
from tlsreload_plugins.sni import identities as sni

STATUS_METHOD = "/tlsreload.test.Status/Get"

log = logging.getLogger("grpc_apps")


def status(credentials: ReloadingCredentials) -> bytes:
    (reloader,) = reloaders()  # the glue's registry: the one reloader this process serves
    now = reloader.status()
    identities = sni.for_reloader(reloader)
    answer: dict[str, Any] = {
        "pid": os.getpid(),
        "serial": now.leaf.serial,
        "checks": now.checks,
        "reloads": now.reloads,
        "failures": now.failures,
        "last_error": now.last_error,
        "configurations": credentials.configurations,
        "handed": credentials.handed,
        "sni": {name: s.leaf.serial for name, s in identities.status().items()} if identities else {},
    }
    return json.dumps(answer).encode()


def status_service(credentials: ReloadingCredentials, asynchronous: bool) -> grpc.GenericRpcHandler:
    def get(request: bytes, context: Any) -> bytes:
        return status(credentials)

    async def get_async(request: bytes, context: Any) -> bytes:
        return status(credentials)

    handler = grpc.unary_unary_rpc_method_handler(get_async if asynchronous else get)
    return grpc.method_handlers_generic_handler("tlsreload.test.Status", {"Get": handler})


def serve_threads(credentials: ReloadingCredentials, address: str) -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    health_service = health.HealthServicer()
    health_service.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    server.add_generic_rpc_handlers((status_service(credentials, False),))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    server.add_secure_port(address, credentials)
    server.start()
    log.info("grpc.server serving on %s", address)
    while not stop.wait(0.5):  # a signal gRPC's threads receive is handled when the main thread runs Python code
        pass
    server.stop(5).wait()


async def serve_aio(credentials: ReloadingCredentials, address: str) -> None:
    server = grpc.aio.server()
    health_service = health.aio.HealthServicer()
    await health_service.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    server.add_generic_rpc_handlers((status_service(credentials, True),))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    server.add_secure_port(address, credentials)
    await server.start()
    log.info("grpc.aio.server serving on %s", address)
    await stop.wait()
    await server.stop(5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile")
    parser.add_argument("--ca-certs")
    parser.add_argument("--require-client-auth", choices=["yes", "no"])
    parser.add_argument("--password-file")
    parser.add_argument("--sni", action="append")
    parser.add_argument("--interval", type=float)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--aio", action="store_true")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")
    try:
        credentials = server_credentials(
            options.certfile,
            options.keyfile,
            ca_certs=options.ca_certs,
            require_client_auth=None if options.require_client_auth is None else options.require_client_auth == "yes",
            password_file=options.password_file,
            sni=options.sni,
            interval=options.interval,
        )
    except (InvalidIdentity, ValueError) as e:
        log.error("cannot serve TLS: %s", e)
        sys.exit(1)
    address = f"127.0.0.1:{options.port}"
    with credentials:
        if options.aio:
            asyncio.run(serve_aio(credentials, address))
        else:
            serve_threads(credentials, address)
    log.info("stopped; checks running: %s", credentials.running)


if __name__ == "__main__":
    main()
