"""A server and a client kept fresh on certificates that code fetches, not files: the push API.

A dict stands in for a secret manager (Vault, a cloud secret store): whatever fetches from it hands each identity
to a :class:`~tlsreload_plugins.sources.PushedIdentity` with one call, ``push(cert, key, ca)``. The server (the
standard library's ``http.server`` on ``fresh_context``) and the client (httpx on a ``ClientIdentity``) are
configured once with the pushed identities' ``files``; every push after that is a reload on both sides, judged as
a file would be (a bad push is refused while the last good identity keeps serving).

    python examples/push_from_secret_manager.py --rounds 3

Prints one JSON line per request: the serial the client saw the server present and the one the server saw the
client present, and, after each round, the serials the secret manager now holds.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from cryptography import x509

from tlsreload_plugins import fresh_context
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.httpx import ReloadingTransport
from tlsreload_plugins.demo.certs import Authority, mint_ca, mint_leaf
from tlsreload_plugins.fresh import FreshContext
from tlsreload_plugins.identity import serial_hex
from tlsreload_plugins.sources import PushedIdentity

SECRET_MANAGER: dict[str, dict[str, bytes]] = {}
"""Stands in for Vault or a cloud secret store: a secret's path to what reading it returns."""


def issue_into_secret_manager(path: str, ca: Authority, *, client: bool) -> str:
    """What a certificate issuer does on rotation: a new certificate and key stored under ``path``; its serial."""
    pair = mint_leaf(ca, client=client)
    SECRET_MANAGER[path] = {"certificate": pair.chain, "private_key": pair.key, "issuing_ca": ca.pem}
    return pair.serial


def push_from_secret_manager(path: str, pushed: PushedIdentity, trusted: dict[str, bytes]) -> bool:
    """The one call that keeps an identity fresh: read the secret, push it (with the CAs to trust). Whether it
    changed."""
    secret = SECRET_MANAGER[path]
    return pushed.push(secret["certificate"], secret["private_key"], b"".join(trusted.values()))


def push_everywhere(
    server_side: PushedIdentity,
    client_side: PushedIdentity,
    trust_clients: dict[str, bytes],
    trust_servers: dict[str, bytes],
    fresh: FreshContext,
    identity: ClientIdentity,
) -> None:
    """Push both identities from the secret manager, and wait (10 s at most) until both sides serve what changed."""
    before = reloaded(fresh, identity)
    changed = (
        push_from_secret_manager("web/server", server_side, trust_clients),
        push_from_secret_manager("web/client", client_side, trust_servers),
    )
    deadline = time.monotonic() + 10
    while any(changed[i] and now <= before[i] for i, now in enumerate(reloaded(fresh, identity))):
        if time.monotonic() > deadline:
            raise SystemExit("the pushed identities were not served within 10 s")
        time.sleep(0.05)


def reloaded(fresh: FreshContext, identity: ClientIdentity) -> tuple[int, int]:
    return fresh.status().reloads, identity.status().reloads


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive: the client still holds the connection when it asks whom it met

    def do_GET(self) -> None:
        der = self.connection.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        body = serial_hex(x509.load_der_x509_certificate(der).serial_number).encode() if der else b"-"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def request(client: httpx.Client, url: str) -> dict[str, object]:
    try:
        response = client.get(url)
        response.raise_for_status()
        peer = response.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(True)
        served = serial_hex(x509.load_der_x509_certificate(peer).serial_number)
        return {"ok": True, "server_serial": served, "client_serial": response.text}
    except Exception as e:
        return {"ok": False, "error": repr(e)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rotations in the secret manager")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between checks of the pushed files")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    issue_into_secret_manager("web/server", mint_ca(), client=False)
    issue_into_secret_manager("web/client", mint_ca(), client=True)
    # Each side trusts the other's issuing CA: the server verifies clients, the client verifies the server.
    trust_clients = {"client-ca": SECRET_MANAGER["web/client"]["issuing_ca"]}
    trust_servers = {"server-ca": SECRET_MANAGER["web/server"]["issuing_ca"]}
    with PushedIdentity() as server_side, PushedIdentity() as client_side:
        push_from_secret_manager("web/server", server_side, trust_clients)
        push_from_secret_manager("web/client", client_side, trust_servers)
        files = server_side.files
        fresh = fresh_context(files.certfile, files.keyfile, ca_certs=files.ca_certs, interval=args.interval)
        with fresh as context, ClientIdentity.from_files(client_side.files, interval=args.interval) as identity:
            httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            url = f"https://localhost:{httpd.server_address[1]}/"
            with httpx.Client(transport=ReloadingTransport(identity), timeout=5.0) as client:
                print(json.dumps(request(client, url)), flush=True)
                for _ in range(args.rounds):
                    # A rotation to certificates of new CAs: each side first trusts the new CA beside the old one
                    # (pushed with the certificate it has), so that no handshake fails while one side has rotated
                    # and the other not yet; then the new certificates; then the old CAs are dropped.
                    next_server_ca, next_client_ca = mint_ca(), mint_ca()
                    trust_clients["next"], trust_servers["next"] = next_client_ca.pem, next_server_ca.pem
                    push_everywhere(server_side, client_side, trust_clients, trust_servers, fresh, identity)
                    server_serial = issue_into_secret_manager("web/server", next_server_ca, client=False)
                    client_serial = issue_into_secret_manager("web/client", next_client_ca, client=True)
                    print(json.dumps({"rotated": {"server": server_serial, "client": client_serial}}), flush=True)
                    push_everywhere(server_side, client_side, trust_clients, trust_servers, fresh, identity)
                    line = request(client, url)
                    print(json.dumps(line), flush=True)
                    trust_clients = {"client-ca": trust_clients.pop("next")}
                    trust_servers = {"server-ca": trust_servers.pop("next")}
                    push_everywhere(server_side, client_side, trust_clients, trust_servers, fresh, identity)
            httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
