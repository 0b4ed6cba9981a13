"""aiohttp's glue in process, where the client matrix (tests/test_clients.py) cannot look: a connection lent across
a change (a response not read yet) keeps its connector until it is released, then that connector and its
connections are closed; one still lent ``retire_after`` seconds after the change is cut. Against the mTLS server
of tests/mtls_servers.py, the client's files rotated as kubelet does, the identity checked on a thread of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from client_local import Here, local_world, rotate, unclosed
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlsreload_plugins.outcome import Outcome


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
    with local_world(tmp_path) as world:
        yield world


async def answer(session: aiohttp.ClientSession, url: str, used: list[asyncio.BaseTransport] | None = None) -> str:
    """``GET url``'s answer; the connection's transport goes to ``used`` (see :func:`sockets_closed`)."""
    async with session.get(url) as response:
        if used is not None and response.connection is not None and response.connection.transport is not None:
            used.append(response.connection.transport)
        return (await response.text()).strip()


async def sockets_closed(transports: list[asyncio.BaseTransport], seconds: float = 10) -> None:
    """Wait until the sockets of ``transports`` are closed. A closed session closes its TLS connections with a
    close_notify first, and their sockets a few loop iterations later: the loop must run until then (aiohttp's own
    advice on a graceful shutdown), or the socket is left to the garbage collector (a ResourceWarning, with aiohttp
    alone as with the glue, seen in CI under load at aiohttp 3.10)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while any((sock := t.get_extra_info("socket")) is not None and sock.fileno() != -1 for t in transports):
        assert asyncio.get_running_loop().time() < deadline, "a closed session's socket was never closed"
        await asyncio.sleep(0.02)


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
        connector = ReloadingConnector(identity)  # the default: never cut, as aiohttp alone
        async with aiohttp.ClientSession(connector=connector) as session:
            assert await answer(session, here.url) == first
            held = await session.get(here.held_url())  # its body not all there: the connection stays lent
            assert held.connection is not None and held.connection.transport is not None
            transport = held.connection.transport
            # Possible at all: with no change, the connection goes back to a pool that stays open.
            assert connector.retired == 0
            new = await rotate(here, identity)
            assert await answer(session, here.url) == new.serial
            for _ in range(5):  # checks go on: what the checking thread does every interval
                assert await asyncio.to_thread(identity.check) is Outcome.UNCHANGED
            assert connector.retired == 1 and not transport.is_closing()
            here.release.touch()
            assert (await held.text()).strip() == first  # read, then released: the old connector is idle
            assert await closing(transport, 10), "the replaced connector's connection was not closed once idle"
            assert connector.retired == 0
            assert await answer(session, here.url) == new.serial

    assert not unclosed(lambda: asyncio.run(main()))


def test_a_connection_still_lent_after_retire_after_is_cut_with_aiohttps_own_error(here: Here) -> None:
    """With ``retire_after`` set, a response still being read then is cut: its read raises aiohttp's own error for
    a connection lost under it, at once, with no timeout set (closing the connector under it left it hanging)."""

    async def main() -> None:
        identity = here.identity()
        connector = ReloadingConnector(identity, retire_after=0.5)
        no_timeout = aiohttp.ClientTimeout(total=None)
        used: list[asyncio.BaseTransport] = []
        async with aiohttp.ClientSession(connector=connector, timeout=no_timeout) as session:
            held = await session.get(here.held_url())
            assert held.connection is not None and held.connection.transport is not None
            transport = held.connection.transport
            new = await rotate(here, identity)
            assert await answer(session, here.url, used) == new.serial
            assert not transport.is_closing()
            read = asyncio.ensure_future(held.text())
            deadline = asyncio.get_running_loop().time() + 10
            while not read.done():  # each check cuts what is overdue
                assert asyncio.get_running_loop().time() < deadline, "the lent connection was never cut"
                await asyncio.to_thread(identity.check)
                await asyncio.sleep(0.05)
            with pytest.raises(aiohttp.ClientPayloadError):
                await read
            assert transport.is_closing()
            deadline = asyncio.get_running_loop().time() + 10
            while connector.retired:  # the response let go of it: the replaced connector is closed
                assert asyncio.get_running_loop().time() < deadline, "the cut connector was never closed"
                await asyncio.sleep(0.02)
            assert await answer(session, here.url, used) == new.serial
        await sockets_closed([transport, *used])
        here.release.touch()

    assert not unclosed(lambda: asyncio.run(main()))


def test_ssl_settings_come_from_the_identity(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        with pytest.raises(TypeError, match="ssl"):
            ReloadingConnector(identity, ssl=False)

    asyncio.run(main())
