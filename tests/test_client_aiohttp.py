"""aiohttp's glue in process, where the client matrix (tests/test_clients.py) cannot look: a connection lent across
a change (a response not read yet) keeps its connector until it is released, then that connector and its
connections are closed; one still lent ``retire_after`` seconds after the change is cut. Against the mTLS server
of tests/mtls_servers.py, the client's files rotated as kubelet does, the identity checked on a thread of its own.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme

from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlsreload_plugins.outcome import Outcome
from tlstest import KubeletLayout, Pair, free_port, issue, run_server, wait_until


@dataclass
class Here:
    client_ca: trustme.CA
    files: KubeletLayout
    trusted: bytes
    url: str
    release: Path

    def held_url(self) -> str:
        """A request whose answer ends only once :attr:`release` exists (its connection lent until then)."""
        return f"{self.url}?until={self.release}"

    def install(self, pair: Pair) -> None:
        self.files.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": self.trusted})

    def identity(self) -> ClientIdentity:
        files = self.files
        return ClientIdentity(str(files.cert_path), str(files.key_path), cafile=str(files.ca_path), watch=False)


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
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
        here = Here(client_ca, KubeletLayout(tmp_path / "client"), server_ca.cert_pem.bytes(), url, tmp_path / "go")
        here.install(issue(client_ca))
        yield here


async def answer(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        return (await response.text()).strip()


async def rotate(here: Here, identity: ClientIdentity) -> Pair:
    """A new pair on disk, and the check that takes it in (on a thread: it reads files and validates)."""
    pair = issue(here.client_ca)
    here.install(pair)
    assert await asyncio.to_thread(identity.check, settle=False) is Outcome.RELOADED
    return pair


def unclosed(run: Callable[[], object]) -> list[str]:
    """Run ``run``; the ResourceWarnings it left (a connector or connection dropped unclosed, closed by the
    garbage collector rather than by the glue)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        run()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def closing(transport: asyncio.BaseTransport, seconds: float) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while not transport.is_closing():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_a_lent_connection_keeps_its_connector_until_released(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        first = identity.presented.leaf.serial
        connector = ReloadingConnector(identity, retire_after=None)
        async with aiohttp.ClientSession(connector=connector) as session:
            assert await answer(session, here.url) == first
            held = await session.get(here.held_url())  # its body not all there: the connection stays lent
            assert held.connection is not None and held.connection.transport is not None
            transport = held.connection.transport
            # Possible at all: with no change, the connection goes back to a pool that stays open.
            assert connector.retired == 0
            new = await rotate(here, identity)
            assert await answer(session, here.url) == new.serial
            assert connector.retired == 1 and not transport.is_closing()
            here.release.touch()
            assert (await held.text()).strip() == first  # read, then released: the old connector is idle
            assert await closing(transport, 10), "the replaced connector's connection was not closed once idle"
            assert connector.retired == 0
            assert await answer(session, here.url) == new.serial

    assert not unclosed(lambda: asyncio.run(main()))


def test_a_connection_still_lent_after_retire_after_is_cut(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        connector = ReloadingConnector(identity, retire_after=0.5)
        async with aiohttp.ClientSession(connector=connector) as session:
            held = await session.get(here.held_url())
            assert held.connection is not None and held.connection.transport is not None
            transport = held.connection.transport
            socket = transport.get_extra_info("socket")
            new = await rotate(here, identity)
            assert await answer(session, here.url) == new.serial
            assert not transport.is_closing()
            deadline = asyncio.get_running_loop().time() + 10
            while not transport.is_closing():  # each check closes what is overdue
                assert asyncio.get_running_loop().time() < deadline, "the lent connection was never cut"
                await asyncio.to_thread(identity.check)
                await asyncio.sleep(0.05)
            assert connector.retired == 0
            here.release.touch()
            # The server may answer now, and read the client's close_notify (aiohttp 3.10 closes TLS gracefully,
            # and Python 3.10 has no shutdown timeout): the socket goes before the loop does.
            here.release.touch()
            deadline = asyncio.get_running_loop().time() + 10
            while socket.fileno() != -1:
                assert asyncio.get_running_loop().time() < deadline, "the cut connection's socket stayed open"
                await asyncio.sleep(0.02)
            # Reading it fails (aiohttp 3.14: at once; 3.10: only at the request's timeout, aiohttp's own behaviour
            # for a response whose connector was closed under it): let it go.
            held.release()

    assert not unclosed(lambda: asyncio.run(main()))


def test_ssl_settings_come_from_the_identity(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        with pytest.raises(TypeError, match="ssl"):
            ReloadingConnector(identity, ssl=False)

    asyncio.run(main())
