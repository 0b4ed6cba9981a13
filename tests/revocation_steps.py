"""Mutual TLS with a certificate revocation list on disk (:class:`Mtls`), and the steps an end-to-end CRL test
takes against a running HTTPS server (:func:`revocation_holds`): the holder of a client certificate gets in, its
certificate is revoked in the CRL file, new handshakes refuse it while a client nobody revoked keeps getting in.

Imports no test module (each server's test file imports this one; test_crl.py too)."""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme

from tls_server import make_recipe
from tlsreload_plugins import Reloader
from tlsreload_plugins.files import TLSFiles
from tlstest import Pair, client_context, crl_pem, get, issue, replace_file, wait_until

DEADLINE = 30.0
"""Seconds for a server to start, or for its handshakes to take a new CRL (a loaded 2-core machine)."""
REFUSALS = 8
"""New connections of the revoked holder that must be refused in a row before it counts as refused."""
ANSWERS = 4
"""New connections of a client nobody revoked that must all get in."""


class Mtls:
    """A server identity, a client-CA bundle, its CRL file (revoking nobody), and two clients of that CA, on disk
    in ``root``: ``holder`` (the one a test revokes) and ``other``."""

    def __init__(self, root: Path, ca: trustme.CA) -> None:
        self.ca = ca
        self.client_ca = trustme.CA()
        self.cert, self.key = root / "tls.crt", root / "tls.key"
        self.bundle, self.crl = root / "ca.crt", root / "clients.crl"
        pair = issue(ca, "localhost")
        self.cert.write_bytes(pair.chain)
        self.key.write_bytes(pair.key)
        self.bundle.write_bytes(self.client_ca.cert_pem.bytes())
        self.crl.write_bytes(crl_pem(self.client_ca))
        self.holder = issue(self.client_ca, "holder.example")
        self.other = issue(self.client_ca, "other.example")

    @property
    def files(self) -> TLSFiles:
        return TLSFiles(str(self.cert), str(self.key), str(self.bundle), str(self.crl))

    def reloader(self, **kwargs: object) -> Reloader:
        recipe = make_recipe(str(self.cert), str(self.key), str(self.bundle))
        return Reloader(
            str(self.cert), str(self.key), ca_certs=str(self.bundle), crl=str(self.crl), recipe=recipe, **kwargs
        )

    def client(self, holder: Pair, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> ssl.SSLContext:
        """A client presenting ``holder``'s certificate, trusting the server's CA, speaking only ``version``."""
        return client_context(self.ca, holder, minimum_version=version, maximum_version=version)

    def revoke(self, *revoked: Pair) -> None:
        """Publish a new CRL revoking ``revoked`` (nobody: un-revoke), as a CA's tooling does (renamed into place)."""
        replace_file(self.crl, crl_pem(self.client_ca, *revoked))


def admitted(port: int, ctx: ssl.SSLContext, server_name: str = "localhost") -> bool:
    """Whether ``GET /`` on a new connection of ``ctx`` sending ``server_name`` gets an HTTP 200. A refusal at the
    handshake, or after it (TLS 1.3 reports a refused client certificate once the client has finished), is not."""
    try:
        _, response = get(port, ctx, server_name=server_name)
    except OSError:
        return False
    return response.startswith(b"HTTP/1.1 200")


def revocation_holds(port: int, mtls: Mtls, server_name: str = "localhost") -> None:
    """On a server requiring client certificates of ``mtls``'s bundle checked against its CRL file: the holder
    gets in (refusing it is possible at all; waits for the server to be up); once the CRL revokes it, new
    handshakes refuse it :data:`REFUSALS` times in a row within :data:`DEADLINE`; the other client keeps getting in.

    Raises:
        AssertionError: naming the step that failed.
    """
    holder, other = mtls.client(mtls.holder), mtls.client(mtls.other)
    wait_until(lambda: admitted(port, holder, server_name), DEADLINE, what="the holder in, before any revocation")
    assert admitted(port, other, server_name), "a client nobody revoked was refused before any revocation"

    mtls.revoke(mtls.holder)
    wait_until(
        lambda: not any(admitted(port, holder, server_name) for _ in range(REFUSALS)),
        DEADLINE,
        what=f"{REFUSALS} new handshakes of the revoked holder in a row refused",
    )
    assert all(admitted(port, other, server_name) for _ in range(ANSWERS)), "a client nobody revoked was refused"
