"""gRPC glue: channels that present a :class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest
certificate, for ``grpc`` (:class:`ReloadingChannel`) and ``grpc.aio`` (:class:`AsyncReloadingChannel`).

gRPC Python has no channel credentials that change: a secure channel keeps the certificate, key and roots it was
made with for its whole life, and its TLS is gRPC's C core, not Python's :mod:`ssl`. So each generation of the
identity gets a channel of its own, made with ``grpc.ssl_channel_credentials`` from exactly the bytes the identity
validated (:attr:`Presented.snapshot <tlsreload_plugins.client.identity.Presented.snapshot>`): new calls go through
the newest, and a replaced one is closed once the calls it carries are done (at the latest ``retire_after`` seconds
after the change, cancelling what is left). A stub is made once from a reloading channel, as from any channel: the
multicallables it holds send each call through the channel that is newest when the call starts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

try:
    import grpc  # type: ignore[import-untyped, import-not-found, unused-ignore]
    import grpc.aio  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError as e:  # the [grpc] extra: one clear line instead of a bare ModuleNotFoundError
    raise ImportError(
        f"tlsreload_plugins.client.grpc needs grpcio, which is not installed ({e}): "
        "pip install 'tlsreload-plugins[grpc]'"
    ) from e

from tlsreload_plugins.client.identity import ClientIdentity
from tlsreload_plugins.client.pools import Pools
from tlsreload_plugins.files import Snapshot

__all__ = ["AsyncReloadingChannel", "ReloadingChannel", "channel_credentials"]


def channel_credentials(snapshot: Snapshot) -> Any:
    """gRPC channel credentials presenting the certificate and key in ``snapshot`` and trusting its CA bundle.

    Args:
        snapshot: validated bytes (:attr:`Presented.snapshot <tlsreload_plugins.client.identity.Presented.snapshot>`);
            a key in the certificate file is found there (gRPC reads the PEM blocks it needs).

    Returns:
        ``grpc.ChannelCredentials``; with no CA bundle, gRPC's default roots are trusted (its own bundle, or the
        file in ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``), not the system's.

    Example::

        credentials = channel_credentials(identity.presented.snapshot)
    """
    return grpc.ssl_channel_credentials(
        root_certificates=snapshot.ca,
        private_key=snapshot.key if snapshot.key is not None else snapshot.cert,
        certificate_chain=snapshot.cert,
    )


def _refuse_password(identity: ClientIdentity) -> None:
    if identity.password is not None:
        keyfile = identity.files.keyfile or identity.files.certfile
        raise ValueError(
            f"gRPC takes an unencrypted private key, and the key in {keyfile} is read with a password: "
            "give gRPC channels a key file without one"
        )


class _Routed:
    """A multicallable handed to a stub: each call goes through the channel that is newest when it starts. The
    channel's own multicallable is made once per channel (the last one kept)."""

    def __init__(self, channels: _Channels, kind: str, method: str, arguments: tuple[Any, ...], options: Any) -> None:
        self._channels = channels
        self._kind = kind
        self._method = method
        self._arguments = arguments
        self._options = options
        self._last: tuple[Any, Any] | None = None  # (a channel, its multicallable): replaced whole

    def _through(self, channel: Any) -> Any:
        last = self._last
        if last is not None and last[0] is channel:
            return last[1]
        inner = getattr(channel, self._kind)(self._method, *self._arguments, **self._options)
        self._last = (channel, inner)
        return inner

    def _blocking(self, attribute: str, *args: Any, **kwargs: Any) -> Any:
        """A call that returns when it is done (``__call__``, ``with_call``): released on return."""
        channels = self._channels
        channel = channels.acquire()
        try:
            return getattr(self._through(channel), attribute)(*args, **kwargs)
        finally:
            channels.release(channel)

    def _started(self, attribute: str, *args: Any, **kwargs: Any) -> Any:
        """A call that returns while it runs (``future``, streams): released when gRPC says it is done."""
        channels = self._channels
        channel = channels.acquire()
        try:
            call = getattr(self._through(channel), attribute)(*args, **kwargs)
        except BaseException:
            channels.release(channel)
            raise
        call.add_done_callback(lambda _: channels.release_from_callback(channel))
        return call


class _Unary(_Routed):
    """Unary-unary and stream-unary: blocking, ``with_call`` and ``future``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._blocking("__call__", *args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._blocking("with_call", *args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._started("future", *args, **kwargs)


class _Streaming(_Routed):
    """Unary-stream and stream-stream, and every ``grpc.aio`` call: the call object, returned while it runs."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._started("__call__", *args, **kwargs)


class _Channels:
    """What both channels share: the pools of channels, one per generation, and the identity's subscriptions
    (weak: a channel nobody holds is collected)."""

    def __init__(self, identity: ClientIdentity, retire_after: float | None) -> None:
        _refuse_password(identity)
        self.identity = identity
        self._pools: Pools[Any] = Pools(self._make, retire_after)
        self._unsubscribe = self._pools.follow(identity, self._close_now, self._close_now)

    def _make(self, generation: int) -> Any:
        raise NotImplementedError

    def _close_now(self, channels: list[Any]) -> None:
        """From the checking thread or a caller's: close ``channels``."""
        raise NotImplementedError

    def acquire(self) -> Any:
        channel, to_close = self._pools.acquire(self.identity.generation)
        self._close_now(to_close)
        return channel

    def release(self, channel: Any) -> None:
        self._close_now(self._pools.release(channel))

    def release_from_callback(self, channel: Any) -> None:
        """A call's done callback (on a thread of gRPC's, or the event loop): release it."""
        self.release(channel)

    @property
    def retired(self) -> int:
        """Replaced channels not closed yet (calls still in flight on them)."""
        return self._pools.retired

    def _stop(self) -> list[Any]:
        self._unsubscribe()
        return self._pools.close()


class ReloadingChannel(_Channels, grpc.Channel):  # type: ignore[misc]
    """A ``grpc.Channel`` presenting ``identity``'s newest client certificate and trusting its newest CA bundle.

    Args:
        identity: the client certificate, key and CA bundle, kept fresh (its key without a password: gRPC's C core
            takes no password).
        target: the server's address, as ``grpc.secure_channel`` takes it.
        options: channel arguments (``grpc.ssl_target_name_override``, keepalive...), for every channel made.
        compression: the channels' default compression.
        retire_after: seconds after a change at which a replaced channel is closed even with calls in flight
            (``None``: only once they are done).

    Raises:
        ValueError: the identity's key is read with a password.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with ReloadingChannel(identity, "service.internal:443") as channel:
            stub = EchoStub(channel)  # once: each call goes through the newest channel
            stub.Who(request)
    """

    def __init__(
        self,
        identity: ClientIdentity,
        target: str,
        options: Sequence[tuple[str, Any]] | None = None,
        compression: Any = None,
        *,
        retire_after: float | None = None,
    ) -> None:
        self.target = target
        self._options = options
        self._compression = compression
        self._watchers: list[tuple[Callable[[Any], object], Any]] = []
        self._watchers_lock = threading.Lock()
        super().__init__(identity, retire_after)

    def _make(self, generation: int) -> Any:
        credentials = channel_credentials(self.identity.presented.snapshot)
        return grpc.secure_channel(self.target, credentials, self._options, self._compression)

    def _close_now(self, channels: list[Any]) -> None:
        for channel in channels:
            channel.close()

    def release_from_callback(self, channel: Any) -> None:
        # A done callback runs on the channel's own polling thread: closing a channel there would close it under
        # the thread that delivers its events, so the closing is a thread's of its own (once per change).
        to_close = self._pools.release(channel)
        if to_close:
            threading.Thread(target=self._close_now, args=(to_close,), name="tlsreload-grpc-close").start()

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.UnaryUnaryMultiCallable`` whose calls go through the newest channel (``options``: what
        ``grpc.Channel.unary_unary`` takes besides, as generated stubs pass it)."""
        return _Unary(self, "unary_unary", method, (request_serializer, response_deserializer), options)

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.UnaryStreamMultiCallable`` whose calls go through the newest channel (released when the
        stream ends)."""
        return _Streaming(self, "unary_stream", method, (request_serializer, response_deserializer), options)

    def stream_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.StreamUnaryMultiCallable`` whose calls go through the newest channel."""
        return _Unary(self, "stream_unary", method, (request_serializer, response_deserializer), options)

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.StreamStreamMultiCallable`` whose calls go through the newest channel (released when the
        stream ends)."""
        return _Streaming(self, "stream_stream", method, (request_serializer, response_deserializer), options)

    def subscribe(self, callback: Callable[[Any], object], try_to_connect: bool = False) -> None:
        """Watch the connectivity of the channel that is newest now (a channel made after a change is not
        watched: subscribe again, e.g. from an ``on_reload`` callback)."""
        channel = self.acquire()
        try:
            channel.subscribe(callback, try_to_connect=try_to_connect)
            with self._watchers_lock:
                self._watchers.append((callback, channel))
        finally:
            self.release(channel)

    def unsubscribe(self, callback: Callable[[Any], object]) -> None:
        """Stop ``callback`` watching any channel it watches."""
        with self._watchers_lock:
            watched = [channel for watcher, channel in self._watchers if watcher is callback]
            self._watchers = [(watcher, channel) for watcher, channel in self._watchers if watcher is not callback]
        for channel in watched:
            channel.unsubscribe(callback)

    def close(self) -> None:
        """Close every channel (cancelling calls in flight) and stop following the identity."""
        self._close_now(self._stop())

    def __enter__(self) -> ReloadingChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncReloadingChannel(_Channels, grpc.aio.Channel):  # type: ignore[misc]
    """:class:`ReloadingChannel` for ``grpc.aio``. Channels are made on the event loop the calls run on, and
    replaced ones are closed there (told from the checking thread with ``call_soon_threadsafe``).

    Args:
        identity: as :class:`ReloadingChannel`.
        target: the server's address, as ``grpc.aio.secure_channel`` takes it.
        options: channel arguments for every channel made.
        compression: the channels' default compression.
        interceptors: client interceptors for every channel made.
        retire_after: as :class:`ReloadingChannel`.

    Raises:
        ValueError: the identity's key is read with a password.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        async with AsyncReloadingChannel(identity, "service.internal:443") as channel:
            stub = EchoStub(channel)
            await stub.Who(request)
    """

    def __init__(
        self,
        identity: ClientIdentity,
        target: str,
        options: Sequence[tuple[str, Any]] | None = None,
        compression: Any = None,
        interceptors: Sequence[Any] | None = None,
        *,
        retire_after: float | None = None,
    ) -> None:
        self.target = target
        self._options = options
        self._compression = compression
        self._interceptors = interceptors
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        super().__init__(identity, retire_after)

    def _make(self, generation: int) -> Any:
        # Called where a call starts, on the event loop: a gRPC aio channel belongs to the loop it is made on.
        self._loop = asyncio.get_running_loop()
        credentials = channel_credentials(self.identity.presented.snapshot)
        return grpc.aio.secure_channel(self.target, credentials, self._options, self._compression, self._interceptors)

    def _close_now(self, channels: list[Any]) -> None:
        """Close ``channels`` on their loop, from it or from the checking thread."""
        loop = self._loop
        if not channels or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._close_on_loop(channels)
        else:
            loop.call_soon_threadsafe(self._close_on_loop, channels)

    def _close_on_loop(self, channels: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(_close_all(channels))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.aio.UnaryUnaryMultiCallable`` whose calls go through the newest channel."""
        return _Streaming(self, "unary_unary", method, (request_serializer, response_deserializer), options)

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.aio.UnaryStreamMultiCallable`` whose calls go through the newest channel."""
        return _Streaming(self, "unary_stream", method, (request_serializer, response_deserializer), options)

    def stream_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.aio.StreamUnaryMultiCallable`` whose calls go through the newest channel."""
        return _Streaming(self, "stream_unary", method, (request_serializer, response_deserializer), options)

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **options: Any
    ) -> Any:
        """A ``grpc.aio.StreamStreamMultiCallable`` whose calls go through the newest channel."""
        return _Streaming(self, "stream_stream", method, (request_serializer, response_deserializer), options)

    def get_state(self, try_to_connect: bool = False) -> Any:
        """The connectivity of the newest channel."""
        channel = self.acquire()
        try:
            return channel.get_state(try_to_connect)
        finally:
            self.release(channel)

    async def wait_for_state_change(self, last_observed_state: Any) -> None:
        """Wait for the newest channel's connectivity to leave ``last_observed_state``."""
        channel = self.acquire()
        try:
            await channel.wait_for_state_change(last_observed_state)
        finally:
            self.release(channel)

    async def channel_ready(self) -> None:
        """Wait until the newest channel is ready."""
        channel = self.acquire()
        try:
            await channel.channel_ready()
        finally:
            self.release(channel)

    async def close(self, grace: float | None = None) -> None:
        """Close every channel (calls in flight get ``grace`` seconds) and stop following the identity."""
        await asyncio.gather(*self._closing, return_exceptions=True)
        await _close_all(self._stop(), grace)

    async def __aenter__(self) -> AsyncReloadingChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _close_all(channels: list[Any], grace: float | None = None) -> None:
    for channel in channels:
        await channel.close(grace)
