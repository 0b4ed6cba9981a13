"""gRPC channels that follow a client certificate (tlsreload_plugins.client.grpc), against the real mTLS gRPC server
of tests/mtls_servers.py (it re-reads its files per connection and answers with the serial of the certificate it
saw): what the example matrix (test_clients.py) does not reach. A call or a stream in flight across a change
finishes on the channel it started on, presenting the old certificate; the next call presents the new one; the
replaced channel is closed once its calls are done, or cancelled under them ``retire_after`` after the change.

The identity is checked by the test (``watch=False``, ``check()``): each change happens exactly where the test puts
it. The server holds a ``Held`` call, or a ``Twice`` stream between its two answers, until a file exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from client_kinds import World, serve  # noqa: E402
from tlsreload_plugins.client import ClientIdentity  # noqa: E402
from tlsreload_plugins.client.grpc import AsyncReloadingChannel, ReloadingChannel  # noqa: E402
from tlsreload_plugins.outcome import Outcome  # noqa: E402
from tlstest import PASSWORD, KubeletLayout, issue, wait_until, with_password  # noqa: E402


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with serve(tmp_path, "grpc") as here:
        yield here


class Client:
    """A client's files (kubelet's layout) and an identity checked by the test."""

    def __init__(self, world: World, root: Path) -> None:
        self.world = world
        self.layout = KubeletLayout(root / "client")
        self.pair = issue(world.client_ca)
        self.write()
        self.identity = ClientIdentity(
            str(self.layout.cert_path), str(self.layout.key_path), cafile=str(self.layout.ca_path), watch=False
        )
        self.release = root / "release"

    def write(self) -> None:
        files = {"tls.crt": self.pair.chain, "tls.key": self.pair.key, "ca.crt": self.world.server_ca.cert_pem.bytes()}
        self.layout.write_files(files)

    def rotate(self) -> str:
        """A new certificate on disk, taken by one check; returns its serial."""
        self.pair = issue(self.world.client_ca)
        self.write()
        assert self.identity.check(settle=False) is Outcome.RELOADED
        return self.pair.serial

    @property
    def held(self) -> bytes:
        """A ``Held`` or ``Twice`` request: the server answers once :meth:`let_go` has been called."""
        return str(self.release).encode()

    def let_go(self) -> None:
        self.release.touch()

    @property
    def target(self) -> str:
        return f"localhost:{self.world.port}"


def methods(channel: Any) -> tuple[Any, Any, Any]:
    """Who, Held and Twice, made once as a generated stub makes them."""
    return (
        channel.unary_unary("/echo.Echo/Who", _registered_method=True),
        channel.unary_unary("/echo.Echo/Held", _registered_method=True),
        channel.unary_stream("/echo.Echo/Twice", _registered_method=True),
    )


def test_calls_in_flight_finish_on_their_channel(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    with ReloadingChannel(client.identity, client.target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)  # connectivity: subscribe and unsubscribe
        who, held, twice = methods(channel)
        assert who(b"", timeout=10).decode() == first
        future = held.future(client.held, timeout=30)
        stream = twice(client.held, timeout=30)
        assert next(stream).decode() == first
        second = client.rotate()
        assert who(b"", timeout=10).decode() == second  # a new call, a new channel
        assert channel.retired == 1  # the old one carries the call and the stream
        client.let_go()
        assert future.result(timeout=30).decode() == first
        assert [answer.decode() for answer in stream] == [first]
        wait_until(lambda: channel.retired == 0, 10, what="the replaced channel to be closed")
        assert who(b"", timeout=10).decode() == second


def test_a_call_past_retire_after_is_cancelled_with_its_channel(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    with ReloadingChannel(client.identity, client.target, retire_after=0.5) as channel:
        who, held, _ = methods(channel)
        who(b"", timeout=10)
        future = held.future(client.held, timeout=30)
        second = client.rotate()
        assert who(b"", timeout=10).decode() == second
        assert channel.retired == 1 and not future.done()

        def closed() -> bool:
            client.identity.check()  # what the checking thread does every interval: close what is overdue
            return channel.retired == 0

        wait_until(closed, 10, what="the replaced channel to be closed at retire_after")
        assert future.exception(timeout=10).code() is grpc.StatusCode.CANCELLED
        assert who(b"", timeout=10).decode() == second


def test_grpc_aio_calls_in_flight_finish_on_their_channel(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial

    async def scenario() -> None:
        async with AsyncReloadingChannel(client.identity, client.target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            who, held, twice = methods(channel)
            assert (await who(b"", timeout=10)).decode() == first
            call = held(client.held, timeout=30)
            stream = twice(client.held, timeout=30)
            assert (await stream.read()).decode() == first
            second = await asyncio.to_thread(client.rotate)  # checks block: never on the loop
            assert (await who(b"", timeout=10)).decode() == second
            assert channel.retired == 1
            client.let_go()
            assert (await call).decode() == first
            assert (await stream.read()).decode() == first
            assert await stream.read() is grpc.aio.EOF
            for _ in range(500):  # the close is a task on this loop
                if channel.retired == 0:
                    break
                await asyncio.sleep(0.02)
            assert channel.retired == 0
            assert (await who(b"", timeout=10)).decode() == second

    asyncio.run(scenario())


def test_a_key_in_the_certificate_file(world: World, tmp_path: Path) -> None:
    pair = issue(world.client_ca)
    combined = tmp_path / "client.pem"
    combined.write_bytes(pair.chain + pair.key)
    cafile = tmp_path / "ca.pem"
    cafile.write_bytes(world.server_ca.cert_pem.bytes())
    identity = ClientIdentity(str(combined), cafile=str(cafile), watch=False)
    with ReloadingChannel(identity, f"localhost:{world.port}") as channel:
        assert methods(channel)[0](b"", timeout=10).decode() == pair.serial


def test_a_key_read_with_a_password_is_refused_at_construction(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    with ReloadingChannel(client.identity, client.target) as channel:  # the same files without a password: served
        assert methods(channel)[0](b"", timeout=10).decode() == client.pair.serial
    client.pair = with_password(client.pair, PASSWORD)
    client.write()
    identity = ClientIdentity(str(client.layout.cert_path), str(client.layout.key_path), password=PASSWORD, watch=False)
    with pytest.raises(ValueError, match="password"):
        ReloadingChannel(identity, client.target)
