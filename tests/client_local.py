"""An mTLS server of tests/mtls_servers.py and a client's files, for the tests that drive client libraries in
process (test_client_aiohttp.py, test_client_httpx.py, test_client_requests.py, test_client_parity.py):
:func:`local_world` starts the server, :class:`Here` writes the client's files as kubelet does and makes identities
checked by the test, :func:`rotate` installs a new pair and checks it in, :func:`clear_client_environment` keeps the
machine's proxies out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.outcome import Outcome
from tlstest import KubeletLayout, Pair, free_port, issue, run_server, wait_until


@dataclass
class Here:
    """The server's address and CAs, and the client's files."""

    client_ca: trustme.CA
    server_ca: trustme.CA
    files: KubeletLayout
    trusted: bytes
    url: str
    release: Path
    pair: Pair

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].rstrip("/"))

    @property
    def target(self) -> str:
        """``host:port``: what a proxy is asked to CONNECT to."""
        return f"localhost:{self.port}"

    def held_url(self) -> str:
        """A request whose answer ends only once :attr:`release` exists (its connection lent until then)."""
        return f"{self.url}?until={self.release}"

    def install(self, pair: Pair) -> None:
        self.pair = pair
        self.files.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": self.trusted})

    def identity(self) -> ClientIdentity:
        files = self.files
        return ClientIdentity(str(files.cert_path), str(files.key_path), cafile=str(files.ca_path), watch=False)

    def rotate(self, identity: ClientIdentity) -> Pair:
        """A new pair on disk, and the check that takes it in (blocking: from a thread under asyncio)."""
        pair = issue(self.client_ca)
        self.install(pair)
        assert identity.check(settle=False) is Outcome.RELOADED
        return pair


@contextlib.contextmanager
def local_world(tmp_path: Path) -> Iterator[Here]:
    """The HTTP mTLS server of tests/mtls_servers.py on files of its own, listening, and the client's files."""
    server_ca, client_ca, port = trustme.CA(), trustme.CA(), free_port()
    server = issue(server_ca)
    (tmp_path / "server.crt").write_bytes(server.chain)
    (tmp_path / "server.key").write_bytes(server.key)
    (tmp_path / "client-ca.pem").write_bytes(client_ca.cert_pem.bytes())
    args = [
        str(Path(__file__).parent / "mtls_servers.py"),
        "http",
        *("--cert", str(tmp_path / "server.crt"), "--key", str(tmp_path / "server.key")),
        *("--client-ca", str(tmp_path / "client-ca.pem"), "--port", str(port)),
    ]
    with run_server([sys.executable, *args], tmp_path / "server.log", port) as running:
        wait_until(lambda: "ready" in running.output(), 30, what="the mTLS server to listen")
        url = f"https://localhost:{port}/"
        files = KubeletLayout(tmp_path / "client")
        first = issue(client_ca)
        here = Here(client_ca, server_ca, files, server_ca.cert_pem.bytes(), url, tmp_path / "go", first)
        here.install(first)
        try:
            yield here
        finally:
            here.release.touch()  # no answer held past the test


async def rotate(here: Here, identity: ClientIdentity) -> Pair:
    """:meth:`Here.rotate` from an event loop (the check on a thread: it reads files and validates)."""
    return await asyncio.to_thread(here.rotate, identity)


def unclosed(run: Callable[[], object]) -> list[str]:
    """Run ``run``; the ResourceWarnings it left (a connector or connection dropped unclosed, closed by the
    garbage collector rather than by the glue)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        run()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


CLIENT_ENVIRONMENT = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "GRPC_PROXY",
    "NO_GRPC_PROXY",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
"""What clients read from the environment about proxies and trust (upper and lower case, as urllib reads both)."""


def clear_client_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Nothing of the machine's proxy or CA bundle settings reaches the test: it sets what it means."""
    for name in CLIENT_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch
