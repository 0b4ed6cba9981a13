"""gRPC channels that follow a client certificate (tlsreload_plugins.client.grpc), against the real mTLS gRPC server
of tests/mtls_servers.py (it re-reads its files per connection and answers with the serial of the certificate it
saw): what the example matrix (test_clients.py) does not reach. A call or a stream in flight across a change
finishes on the channel it started on, presenting the old certificate, however long it lasts; the next call
presents the new one; the replaced channel is closed once its calls are done, or, only with ``retire_after`` set,
cut under them that long after the change, where they fail as gRPC fails a call whose connection is lost
(``UNAVAILABLE``). Interceptors, sync (``grpc.intercept_channel``) and ``grpc.aio``, work across a change, and a
closed channel fails exactly as gRPC's own closed channel does.

The identity is checked by the test (``watch=False``, ``check()``): each change happens exactly where the test puts
it. The server holds a ``Held`` call, or a ``Twice`` stream between its two answers, until a file exists.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
        self.root = root
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

    def held_until(self, name: str) -> tuple[bytes, Callable[[], None]]:
        """A ``Held`` or ``Twice`` request of its own, and what lets it go (before :meth:`let_go`)."""
        path = self.root / name
        return str(path).encode(), path.touch

    @property
    def target(self) -> str:
        return f"localhost:{self.world.port}"

    def stock_credentials(self) -> Any:
        """Credentials of stock gRPC from the same PEM bytes: what a user without us makes."""
        return grpc.ssl_channel_credentials(self.world.server_ca.cert_pem.bytes(), self.pair.key, self.pair.chain)


def methods(channel: Any) -> tuple[Any, Any, Any]:
    """Who, Held and Twice, made once as a generated stub makes them."""
    return (
        channel.unary_unary("/echo.Echo/Who", _registered_method=True),
        channel.unary_unary("/echo.Echo/Held", _registered_method=True),
        channel.unary_stream("/echo.Echo/Twice", _registered_method=True),
    )


def checked_until(client: Client, channel: Any) -> Callable[[], bool]:
    """What the checking thread does every interval (close or cut what is due), until no replaced channel is left."""

    def closed() -> bool:
        client.identity.check()
        return bool(channel.retired == 0)

    return closed


async def eventually(predicate: Callable[[], object], what: str) -> None:
    """:func:`wait_until` from a coroutine: polled on a thread, the loop left free to close channels."""
    await asyncio.to_thread(wait_until, predicate, 10, what=what)


def raised(act: Callable[[], object]) -> tuple[type[BaseException], str]:
    """The type and message of what ``act`` raises."""
    with pytest.raises(BaseException) as caught:
        act()
    return caught.type, str(caught.value)


async def raised_async(act: Callable[[], Any]) -> tuple[type[BaseException], str]:
    """The type and message of what ``act`` raises, or what awaiting what it returns raises."""
    with pytest.raises(BaseException) as caught:
        result = act()
        if inspect.isawaitable(result):
            await result
    return caught.type, str(caught.value)


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """A sync client interceptor: records the methods it sees and adds metadata, then hands the call on."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def _details(self, details: Any) -> Any:
        self.seen.append(details.method)
        return details._replace(metadata=[*(details.metadata or []), ("x-seen", "1")])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class AioUnaryRecorder(grpc.aio.UnaryUnaryClientInterceptor):
    """A ``grpc.aio`` client interceptor of unary calls: records the methods it sees in ``seen``, then hands the
    call on (``grpc.aio`` takes an interceptor for one kind of call only)."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(details.method.decode())
        return await continuation(details, request)


class AioStreamRecorder(grpc.aio.UnaryStreamClientInterceptor):
    """:class:`AioUnaryRecorder` for unary-stream calls."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(details.method.decode())
        return await continuation(details, request)


def test_the_methods_take_what_grpcs_take() -> None:
    def parameters(function: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        assert parameters(getattr(ReloadingChannel, kind)) == parameters(getattr(grpc.Channel, kind))
        assert parameters(getattr(AsyncReloadingChannel, kind)) == parameters(getattr(grpc.aio.Channel, kind))


def test_calls_in_flight_finish_on_their_channel(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    with ReloadingChannel(client.identity, client.target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)  # connectivity: subscribe and unsubscribe
        who, held, twice = methods(channel)
        assert who(b"", timeout=10).decode() == first
        future = held.future(client.held, timeout=60)
        stream = twice(client.held, timeout=60)
        assert type(future).__module__ == type(stream).__module__ == "grpc._channel"  # gRPC's own, untouched
        assert next(stream).decode() == first
        second = client.rotate()
        assert who(b"", timeout=10).decode() == second  # a new call, a new channel
        # By default nothing is cut however long it lasts: every check leaves the old channel open, as it was
        # left open past the former 10 s default (where retire_after is set, the check cuts it: below).
        for _ in range(5):
            assert client.identity.check() is Outcome.UNCHANGED
            assert channel.retired == 1  # the old one carries the call and the stream
            assert not future.done() and stream.is_active()
        client.let_go()
        assert future.result(timeout=30).decode() == first
        assert [answer.decode() for answer in stream] == [first]
        wait_until(lambda: channel.retired == 0, 10, what="the replaced channel to be closed")
        assert who(b"", timeout=10).decode() == second


def test_an_intercepted_channel_across_a_change(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    recorder = Recorder()
    with ReloadingChannel(client.identity, client.target) as reloading:
        channel = grpc.intercept_channel(reloading, recorder)
        who, _, twice = methods(channel)  # _registered_method, handed on by position
        assert who(b"", timeout=10).decode() == first
        response, call = who.with_call(b"", timeout=10)
        assert response.decode() == first and call.code() is grpc.StatusCode.OK
        assert who.future(b"", timeout=10).result().decode() == first
        stream = twice(client.held, timeout=60)
        assert next(stream).decode() == first
        second = client.rotate()
        assert who(b"", timeout=10).decode() == second
        assert who.future(b"", timeout=10).result().decode() == second
        answered, let_go = client.held_until("answered")
        let_go()
        assert [answer.decode() for answer in twice(answered, timeout=10)] == [second, second]
        client.let_go()
        assert [answer.decode() for answer in stream] == [first]  # on its own channel, to its end
    assert recorder.seen == ["/echo.Echo/Who"] * 3 + ["/echo.Echo/Twice"] + ["/echo.Echo/Who"] * 2 + [
        "/echo.Echo/Twice"
    ]


def test_grpc_aio_calls_in_flight_finish_on_their_channel(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial

    async def scenario() -> None:
        async with AsyncReloadingChannel(client.identity, client.target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            who, held, twice = methods(channel)
            assert (await who(b"", timeout=10)).decode() == first
            call = held(client.held, timeout=60)
            stream = twice(client.held, timeout=60)
            assert type(call).__module__ == type(stream).__module__ == "grpc.aio._call"  # gRPC's own, untouched
            assert (await stream.read()).decode() == first
            second = await asyncio.to_thread(client.rotate)  # checks block: never on the loop
            assert (await who(b"", timeout=10)).decode() == second
            for _ in range(5):  # by default, no check cuts the old channel
                assert await asyncio.to_thread(client.identity.check) is Outcome.UNCHANGED
                assert channel.retired == 1 and not call.done() and not stream.done()
            client.let_go()
            assert (await call).decode() == first
            assert (await stream.read()).decode() == first
            assert await stream.read() is grpc.aio.EOF
            await eventually(lambda: channel.retired == 0, "the replaced channel to be closed")
            assert (await who(b"", timeout=10)).decode() == second

    asyncio.run(scenario())


def test_grpc_aio_interceptors_across_a_change(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    seen: list[str] = []
    interceptors = [AioUnaryRecorder(seen), AioStreamRecorder(seen)]

    async def scenario() -> None:
        async with AsyncReloadingChannel(client.identity, client.target, interceptors=interceptors) as channel:
            who, _, twice = methods(channel)
            assert (await who(b"", timeout=10)).decode() == first
            stream = twice(client.held, timeout=60)
            assert (await stream.read()).decode() == first
            second = await asyncio.to_thread(client.rotate)
            assert (await who(b"", timeout=10)).decode() == second
            answered, let_go = client.held_until("answered")
            let_go()
            assert [answer.decode() async for answer in twice(answered, timeout=10)] == [second, second]
            client.let_go()
            assert (await stream.read()).decode() == first
            assert await stream.read() is grpc.aio.EOF

    asyncio.run(scenario())
    assert seen == ["/echo.Echo/Who", "/echo.Echo/Twice", "/echo.Echo/Who", "/echo.Echo/Twice"]


def test_a_call_past_retire_after_fails_as_its_connection_lost(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    on_channel = threading.Semaphore(0)

    def serialize(request: bytes) -> bytes:  # gRPC serializes a request once the call has its channel
        on_channel.release()
        return request

    # the pool outermost: should the test fail, the channel is closed (ending the blocked calls) before it is joined
    with ThreadPoolExecutor(2) as pool, ReloadingChannel(client.identity, client.target, retire_after=0.5) as channel:
        who, held, twice = methods(channel)
        blocking = channel.unary_unary("/echo.Echo/Held", serialize, None, True)
        intercepted = grpc.intercept_channel(channel, Recorder()).unary_unary("/echo.Echo/Held", serialize, None, True)
        # Working: what will be cut answers on this channel when let go in time, through the same objects.
        request, let_go = client.held_until("early")
        early_future, early_stream = held.future(request, timeout=60), twice(request, timeout=60)
        assert next(early_stream).decode() == first
        let_go()
        assert early_future.result(timeout=30).decode() == first and early_future.code() is grpc.StatusCode.OK
        assert [answer.decode() for answer in early_stream] == [first]
        assert blocking(request, timeout=10).decode() == intercepted(request, timeout=10).decode() == first
        assert on_channel.acquire(timeout=0) and on_channel.acquire(timeout=0)

        # In flight across the change: a future, a stream, blocking calls (plain and intercepted), and a future
        # the caller cancels itself.
        future = held.future(client.held, timeout=60)
        stream = twice(client.held, timeout=60)
        assert next(stream).decode() == first
        mine = held.future(client.held, timeout=60)
        blocked = pool.submit(blocking, client.held, timeout=60)
        blocked_intercepted = pool.submit(intercepted, client.held, timeout=60)
        assert on_channel.acquire(timeout=10) and on_channel.acquire(timeout=10)
        second = client.rotate()
        assert who(b"", timeout=10).decode() == second
        assert mine.cancel() and mine.cancelled()
        assert channel.retired == 1 and not future.done() and not blocked.done()
        wait_until(checked_until(client, channel), 10, what="the replaced channel to be cut at retire_after")
        blocked_error = blocked.exception(timeout=10)
        intercepted_error = blocked_intercepted.exception(timeout=10)
        why = "closed 0.5 s after its client certificate was replaced (retire_after)"
        for error in (future.exception(timeout=10), blocked_error, intercepted_error):
            assert isinstance(error, grpc.RpcError), error
            assert error.code() is grpc.StatusCode.UNAVAILABLE and why in error.details()
        with pytest.raises(grpc.RpcError) as caught:
            future.result(timeout=10)
        assert caught.value is future and not future.cancelled()  # the future is the error, as gRPC's
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
        assert caught.value is stream and stream.code() is grpc.StatusCode.UNAVAILABLE and why in stream.details()
        assert mine.code() is grpc.StatusCode.CANCELLED and mine.cancelled()  # the caller's own cancel: as gRPC's
        assert who(b"", timeout=10).decode() == second


def test_a_grpc_aio_call_past_retire_after_fails_as_its_connection_lost(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)
    first = client.pair.serial
    why = "closed 0.5 s after its client certificate was replaced (retire_after)"

    async def scenario() -> None:
        async with AsyncReloadingChannel(client.identity, client.target, retire_after=0.5) as channel:
            who, held, twice = methods(channel)
            # Working: what will be cut answers on this channel when let go in time, through the same objects.
            request, let_go = client.held_until("early")
            early_call, early_stream = held(request, timeout=60), twice(request, timeout=60)
            assert (await early_stream.read()).decode() == first
            let_go()
            assert (await early_call).decode() == first and await early_call.code() is grpc.StatusCode.OK
            assert (await early_stream.read()).decode() == first
            assert await early_stream.read() is grpc.aio.EOF

            # In flight across the change: awaited (by the caller, and by a task), read and iterated; and calls the
            # caller cancels itself (the call, or the task awaiting it).
            call = held(client.held, timeout=60)
            awaiting = asyncio.ensure_future(held(client.held, timeout=60))
            stream, iterated = twice(client.held, timeout=60), twice(client.held, timeout=60)
            assert (await stream.read()).decode() == first
            responses = iterated.__aiter__()
            assert (await responses.__anext__()).decode() == first
            mine, task = held(client.held, timeout=60), asyncio.ensure_future(held(client.held, timeout=60))
            second = await asyncio.to_thread(client.rotate)
            assert (await who(b"", timeout=10)).decode() == second
            assert mine.cancel()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await mine
            with pytest.raises(asyncio.CancelledError):
                await task
            assert channel.retired == 1 and not call.done()
            # A read pending in a task of its own at the cut (grpcio 1.66's close finds the call to cancel in such a
            # task's frame: there, our own call object); the other stream is read by nobody when cut.
            reading = asyncio.ensure_future(stream.read())
            await eventually(checked_until(client, channel), "the replaced channel to be cut at retire_after")
            for act in (lambda: call, lambda: awaiting, lambda: reading, stream.read, responses.__anext__):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await act()
                assert caught.value.code() is grpc.StatusCode.UNAVAILABLE and why in caught.value.details()
            for cut in (call, stream, iterated):
                assert await cut.code() is grpc.StatusCode.UNAVAILABLE and why in await cut.details()
                assert cut.done() and not cut.cancelled()
            assert await mine.code() is grpc.StatusCode.CANCELLED and mine.cancelled()  # the caller's: as gRPC's
            assert (await who(b"", timeout=10)).decode() == second

    asyncio.run(scenario())


def test_a_closed_channel_fails_as_grpcs_own(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)

    def attempts(channel: Any, registered: bool) -> list[Callable[[], object]]:
        who = channel.unary_unary("/echo.Echo/Who", None, None, registered)
        twice = channel.unary_stream("/echo.Echo/Twice", None, None, registered)
        intercepted = grpc.intercept_channel(channel, Recorder()).unary_unary("/echo.Echo/Who", None, None, registered)
        stream_unary = channel.stream_unary("/echo.Echo/Who", None, None, registered)
        stream_stream = channel.stream_stream("/echo.Echo/Twice", None, None, registered)
        return [
            lambda: who(b"", timeout=10),
            lambda: who.with_call(b"", timeout=10),
            lambda: who.future(b"", timeout=10),
            lambda: next(twice(b"", timeout=10)),
            lambda: intercepted(b"", timeout=10),
            lambda: stream_unary(iter([b""]), timeout=10),
            lambda: stream_unary.future(iter([b""]), timeout=10),
            lambda: next(stream_stream(iter([b""]), timeout=10)),
        ]

    outcomes = []
    for retire_after in (None, 0.5):
        stock = grpc.secure_channel(client.target, client.stock_credentials())
        ours = ReloadingChannel(client.identity, client.target, retire_after=retire_after)
        for channel in (stock, ours):
            assert methods(channel)[0](b"", timeout=10).decode() == client.pair.serial  # working, until closed
            made_before = attempts(channel, registered=True)  # as a generated stub makes them
            channel.close()
            # made after: not registered, as stock gRPC crashes the process registering a method once closed
            outcomes.append([raised(act) for act in [*made_before, *attempts(channel, registered=False)]])
        # Stock subscribe() raises nothing, and starts a thread that dies on the closed channel: ours raises nothing
        # either, and watches nothing.
        assert ours.subscribe(lambda state: None) is None
        # ours does not crash there: its stub made after close fails as the others
        assert [raised(act) for act in attempts(ours, registered=True)] == outcomes[-1][len(made_before) :]
    assert outcomes[0] == outcomes[1] == outcomes[2] == outcomes[3]
    assert {kind for kind, _ in outcomes[1]} == {ValueError}
    assert (ValueError, "Cannot invoke RPC on closed channel!") in outcomes[1]


def test_a_closed_grpc_aio_channel_fails_as_grpcs_own(world: World, tmp_path: Path) -> None:
    client = Client(world, tmp_path)

    def attempts(channel: Any) -> list[Callable[[], Any]]:
        who, _, twice = methods(channel)
        stream_unary = channel.stream_unary("/echo.Echo/Who")
        stream_stream = channel.stream_stream("/echo.Echo/Twice")
        return [
            lambda: who(b"", timeout=10),
            lambda: twice(b"", timeout=10).read(),
            lambda: stream_unary(timeout=10),
            lambda: stream_stream(timeout=10).read(),
            channel.channel_ready,
            lambda: channel.wait_for_state_change(grpc.ChannelConnectivity.IDLE),
        ]

    async def scenario() -> list[Any]:
        outcomes = []
        for retire_after in (None, 0.5):
            stock = grpc.aio.secure_channel(client.target, client.stock_credentials())
            ours = AsyncReloadingChannel(client.identity, client.target, retire_after=retire_after)
            for channel in (stock, ours):
                assert (await methods(channel)[0](b"", timeout=10)).decode() == client.pair.serial  # working
                made_before = attempts(channel)
                await channel.close()
                outcome = [await raised_async(act) for act in [*made_before, *attempts(channel)]]
                outcomes.append((outcome, channel.get_state(), channel.get_state(try_to_connect=True)))
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == outcomes[1] == outcomes[2] == outcomes[3]
    calls, state, connecting = outcomes[1]
    assert state is connecting is grpc.ChannelConnectivity.SHUTDOWN
    assert set(calls) == {(grpc.aio.UsageError, "Channel is closed.")}


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
