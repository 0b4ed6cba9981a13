"""gRPC glue: channels that present a :class:`~tlsreload_plugins.client.identity.ClientIdentity`'s newest
certificate, for ``grpc`` (:class:`ReloadingChannel`) and ``grpc.aio`` (:class:`AsyncReloadingChannel`).

gRPC Python has no channel credentials that change: a secure channel keeps the certificate, key and roots it was
made with for its whole life, and its TLS is gRPC's C core, not Python's :mod:`ssl`. So each generation of the
identity gets a channel of its own, made with ``grpc.ssl_channel_credentials`` from exactly the bytes the identity
validated (:attr:`Presented.snapshot <tlsreload_plugins.client.identity.Presented.snapshot>`): new calls go through
the newest, and a replaced one is closed once the calls it carries are done, however long a stream lasts. Only with
``retire_after`` set is a replaced channel still carrying calls that many seconds after the change closed under them;
those calls then fail as gRPC fails a call whose connection is lost: ``UNAVAILABLE``, with details saying why. A stub
is made once from a reloading channel, as from any channel: the multicallables it holds send each call through the
channel that is newest when the call starts. Once a reloading channel is closed, its calls fail with gRPC's own error
for a closed channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

try:
    import grpc  # type: ignore[import-untyped, import-not-found, unused-ignore]
    import grpc.aio  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError as _missing:  # the [grpc] extra: one clear line instead of a bare ModuleNotFoundError
    raise ImportError(
        f"tlsreload_plugins.client.grpc needs grpcio, which is not installed ({_missing}): "
        "pip install 'tlsreload-plugins[grpc]'"
    ) from _missing

from tlsreload_plugins.client.identity import ClientIdentity
from tlsreload_plugins.client.pools import Closed, Pools
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


def _refuse_what_grpc_cannot_do(identity: ClientIdentity) -> None:
    """A key password and an authorizer are settings of Python's ``ssl``, which gRPC's channels do not use."""
    if identity.password is not None:
        keyfile = identity.files.keyfile or identity.files.certfile
        raise ValueError(
            f"gRPC takes an unencrypted private key, and the key in {keyfile} is read with a password: "
            "give gRPC channels a key file without one"
        )
    if identity.authorizer is not None:
        raise ValueError(
            "gRPC channels make their handshakes in gRPC's own TLS stack, which checks the server's host name and "
            f"cannot apply an authorizer ({identity.authorizer.description}): give gRPC channels an identity "
            "without authorize=, and name a DNS name of the server's certificate (grpc.ssl_target_name_override)"
        )


def _cut_details(retire_after: float | None) -> str:
    return (
        f"the channel was closed {retire_after or 0:g} s after its client certificate was replaced "
        "(retire_after): the call was still in flight"
    )


class _Cut:
    """Whether the channel one call went through was cut (closed under it at ``retire_after``) by the time the call
    ended: what tells our cut from any other end of a call, such as the caller's own cancel."""

    def __init__(self, channels: _Channels, channel: Any) -> None:
        self._channels = channels
        self._channel = channel
        self._at_end: bool | None = None

    def ended(self, _call: Any) -> None:
        """The call's done callback: a channel cut later (while other calls still ride it) did not end this call."""
        self._at_end = self._channels.was_cut(self._channel)

    def happened(self) -> bool:
        """Whether the channel was cut before the call ended (as far as known yet: a caller woken by the end of its
        call may look before gRPC runs the done callbacks; the channel was marked before it was closed)."""
        at_end = self._at_end
        return self._channels.was_cut(self._channel) if at_end is None else at_end

    @property
    def details(self) -> str:
        return _cut_details(self._channels.retire_after)


class _Call(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc]
    """A sync call object of gRPC's own (a future, a response stream, or the error a blocking call raised), handed
    on as it is but for one thing: when our cut ended it (gRPC says ``CANCELLED``, "Channel closed!"), it reports
    ``UNAVAILABLE`` and why, as for a connection lost under a call. Like gRPC's own, it is the error it raises."""

    def __init__(self, inner: Any, cut: _Cut) -> None:
        super().__init__()
        self._inner = inner
        self._cut = cut
        self._cancelled_here = False

    def _by_cut(self) -> bool:
        # code() waits for the end of the call: only asked once it is over (or where gRPC's own would wait).
        return not self._cancelled_here and self._inner.code() is grpc.StatusCode.CANCELLED and self._cut.happened()

    def code(self) -> Any:
        """The status code: ``UNAVAILABLE`` when the channel was cut under the call, else gRPC's."""
        return grpc.StatusCode.UNAVAILABLE if self._by_cut() else self._inner.code()

    def details(self) -> Any:
        """The status details: why the channel was closed when it was cut under the call, else gRPC's."""
        return self._cut.details if self._by_cut() else self._inner.details()

    def initial_metadata(self) -> Any:
        """gRPC's."""
        return self._inner.initial_metadata()

    def trailing_metadata(self) -> Any:
        """gRPC's."""
        return self._inner.trailing_metadata()

    def is_active(self) -> Any:
        """gRPC's."""
        return self._inner.is_active()

    def time_remaining(self) -> Any:
        """gRPC's."""
        return self._inner.time_remaining()

    def add_callback(self, callback: Callable[[], object]) -> Any:
        """gRPC's."""
        return self._inner.add_callback(callback)

    def cancel(self) -> Any:
        """Cancel the call, as gRPC does: it ends ``CANCELLED``, never reported as a cut."""
        if not self._inner.done():
            self._cancelled_here = True
        return self._inner.cancel()

    def cancelled(self) -> Any:
        """gRPC's, but false for a call our cut ended (it did not end ``CANCELLED``)."""
        return self._inner.cancelled() and not (self._inner.done() and self._by_cut())

    def running(self) -> Any:
        """gRPC's."""
        return self._inner.running()

    def done(self) -> Any:
        """gRPC's."""
        return self._inner.done()

    def result(self, timeout: float | None = None) -> Any:
        """The response, as gRPC's; a call that failed raises this very object, as gRPC's raises itself."""
        try:
            return self._inner.result(timeout)
        except grpc.RpcError as error:
            if error is self._inner:
                raise self from None
            raise

    def exception(self, timeout: float | None = None) -> Any:
        """The error, as gRPC's: this very object when the call failed."""
        error = self._inner.exception(timeout)
        return self if error is self._inner else error

    def traceback(self, timeout: float | None = None) -> Any:
        """gRPC's."""
        return self._inner.traceback(timeout)

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(call)`` with this object once the call is done, as gRPC's calls it with its own."""
        self._inner.add_done_callback(lambda _: fn(self))

    def __iter__(self) -> _Call:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._inner)
        except grpc.RpcError as error:
            if error is self._inner:  # a stream that failed raises itself
                raise self from None
            raise

    def next(self) -> Any:
        """The next response, as gRPC's ``next()``."""
        return self.__next__()

    def __str__(self) -> str:
        if self._inner.done() and self._by_cut():
            return (
                f"<{type(self).__name__} of RPC that terminated with:\n\tstatus = {grpc.StatusCode.UNAVAILABLE}\n"
                f'\tdetails = "{self._cut.details}"\n>'
            )
        return str(self._inner)

    __repr__ = __str__

    def __getattr__(self, name: str) -> Any:
        # What else gRPC's object has (debug_error_string()...); never the attributes of our own making.
        if name.startswith("__") or name in ("_inner", "_cut", "_cancelled_here"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _cancelling() -> bool:
    """Whether the running task is being cancelled (``Task.cancel``): a ``CancelledError`` that is the caller's own.
    Python 3.10 cannot tell: there, a task cancelled as its channel is cut sees the cut."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


class _AioCall(grpc.aio.Call):  # type: ignore[misc]
    """A ``grpc.aio`` call object of gRPC's own, handed on as it is but for one thing: closing a ``grpc.aio``
    channel cancels its calls, so where our cut ended a call gRPC raises a bare ``asyncio.CancelledError`` into
    the caller; this raises ``grpc.aio.AioRpcError`` instead, ``UNAVAILABLE`` with why, and reports that code.
    The caller's own cancel (the call's, or its task's) stays a ``CancelledError``."""

    def __init__(self, inner: Any, cut: _Cut) -> None:
        self._inner = inner
        self._cut = cut
        self._cancelled_here = False

    def _by_cut(self) -> bool:
        return not self._cancelled_here and self._inner.cancelled() and self._cut.happened()

    async def _guard(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._by_cut() and not _cancelling():
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details=self._cut.details
                ) from None
            raise

    async def code(self) -> Any:
        """The status code: ``UNAVAILABLE`` when the channel was cut under the call, else gRPC's."""
        code = await self._inner.code()
        return grpc.StatusCode.UNAVAILABLE if code is grpc.StatusCode.CANCELLED and self._by_cut() else code

    async def details(self) -> Any:
        """The status details: why the channel was closed when it was cut under the call, else gRPC's."""
        details = await self._inner.details()
        return self._cut.details if self._by_cut() else details

    async def initial_metadata(self) -> Any:
        """gRPC's."""
        return await self._inner.initial_metadata()

    async def trailing_metadata(self) -> Any:
        """gRPC's."""
        return await self._inner.trailing_metadata()

    async def wait_for_connection(self) -> None:
        """gRPC's, raising the cut as :meth:`__await__` does."""
        await self._guard(self._inner.wait_for_connection())

    def cancel(self) -> Any:
        """Cancel the call, as gRPC does: a ``CancelledError``, never reported as a cut."""
        if not self._inner.done():
            self._cancelled_here = True
        return self._inner.cancel()

    def cancelled(self) -> Any:
        """gRPC's, but false for a call our cut ended (it failed ``UNAVAILABLE``)."""
        return self._inner.cancelled() and not self._by_cut()

    def done(self) -> Any:
        """gRPC's."""
        return self._inner.done()

    def time_remaining(self) -> Any:
        """gRPC's."""
        return self._inner.time_remaining()

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        """Call ``callback(call)`` with this object once the call is done, as gRPC's calls it with its own."""
        self._inner.add_done_callback(lambda _: callback(self))

    def __str__(self) -> str:
        return str(self._inner)

    def __repr__(self) -> str:
        return repr(self._inner)

    def __getattr__(self, name: str) -> Any:
        # What else gRPC's object has (debug_error_string()...); never the attributes of our own making.
        if name.startswith("__") or name in ("_inner", "_cut", "_cancelled_here"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _AioResponse(_AioCall):
    """A call with one response: awaited for it."""

    def __await__(self) -> Generator[Any, None, Any]:
        return self._guard(self._inner).__await__()


class _AioResponses(_AioCall):
    """A call with a stream of responses: read, or iterated."""

    async def read(self) -> Any:
        """The next response, or ``grpc.aio.EOF``, as gRPC's."""
        return await self._guard(self._inner.read())

    def __aiter__(self) -> _AioIterator:
        return _AioIterator(self, self._inner.__aiter__())


class _AioRequests(_AioCall):
    """A call with a stream of requests: written to."""

    async def write(self, request: Any) -> None:
        """Send ``request``, as gRPC's."""
        await self._guard(self._inner.write(request))

    async def done_writing(self) -> None:
        """Half-close, as gRPC's."""
        await self._guard(self._inner.done_writing())


class _AioIterator:
    """``async for`` over a call's responses: gRPC's iterator, raising the cut as the call does."""

    def __init__(self, call: _AioCall, responses: Any) -> None:
        self._call = call
        self._responses = responses

    def __aiter__(self) -> _AioIterator:
        return self

    async def __anext__(self) -> Any:
        return await self._call._guard(self._responses.__anext__())


class _AioUnaryUnaryCall(_AioResponse, grpc.aio.UnaryUnaryCall):  # type: ignore[misc]
    pass


class _AioUnaryStreamCall(_AioResponses, grpc.aio.UnaryStreamCall):  # type: ignore[misc]
    pass


class _AioStreamUnaryCall(_AioRequests, _AioResponse, grpc.aio.StreamUnaryCall):  # type: ignore[misc]
    pass


class _AioStreamStreamCall(_AioRequests, _AioResponses, grpc.aio.StreamStreamCall):  # type: ignore[misc]
    pass


_AIO_CALLS: dict[str, Callable[[Any, _Cut], _AioCall]] = {
    "unary_unary": _AioUnaryUnaryCall,
    "unary_stream": _AioUnaryStreamCall,
    "stream_unary": _AioStreamUnaryCall,
    "stream_stream": _AioStreamStreamCall,
}


class _Routed:
    """A multicallable handed to a stub: each call goes through the channel that is newest when it starts. The
    channel's own multicallable is made once per channel (the last one kept)."""

    def __init__(
        self,
        channels: _Channels,
        kind: str,
        method: str,
        request_serializer: Any,
        response_deserializer: Any,
        registered_method: bool | None,
    ) -> None:
        self._channels = channels
        self._kind = kind
        self._method = method
        self._arguments = (request_serializer, response_deserializer, registered_method)
        self._last: tuple[Any, Any] | None = None  # (a channel, its multicallable): replaced whole

    def _through(self, channel: Any) -> Any:
        last = self._last
        if last is not None and last[0] is channel:
            return last[1]
        # by position, as grpc.intercept_channel passes them: the same four in every grpcio supported
        inner = getattr(channel, self._kind)(self._method, *self._arguments)
        self._last = (channel, inner)
        return inner

    def _closed(self, channel: Any) -> Any:
        """The multicallable of gRPC's own closed channel, whose calls fail with gRPC's own error. Not registered:
        sync gRPC crashes the process (a segmentation fault, grpcio 1.85) registering a method on a closed channel,
        and the call fails the same without."""
        request_serializer, response_deserializer, _ = self._arguments
        return getattr(channel, self._kind)(self._method, request_serializer, response_deserializer)

    def _blocking(self, attribute: str, *args: Any, **kwargs: Any) -> Any:
        """A call that returns when it is done (``__call__``, ``with_call``): released on return."""
        channels = self._channels
        channel, counted = channels.route()
        if not counted:  # closed: gRPC's own closed channel raises its own error
            return getattr(self._closed(channel), attribute)(*args, **kwargs)
        try:
            return getattr(self._through(channel), attribute)(*args, **kwargs)
        except grpc.RpcError as error:
            cut = channels.cut_error(error, channel)
            if cut is None:
                raise
            raise cut from error
        finally:
            channels.release(channel)

    def _started(self, attribute: str, *args: Any, **kwargs: Any) -> Any:
        """A call that returns while it runs (``future``, streams): released when gRPC says it is done."""
        channels = self._channels
        channel, counted = channels.route()
        if not counted:
            return getattr(self._closed(channel), attribute)(*args, **kwargs)
        try:
            call = getattr(self._through(channel), attribute)(*args, **kwargs)
        except BaseException:
            channels.release(channel)
            raise
        call.add_done_callback(lambda _: channels.release_from_callback(channel))
        return channels.wrap(self._kind, call, channel)


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
    """What both channels share: the pools of channels, one per generation, the identity's subscriptions (weak: a
    channel nobody holds is collected), and the multicallables a stub is made of. ``_unary``: what a call with a
    single response is (sync gRPC's blocking, ``with_call`` and ``future``; a ``grpc.aio`` call object)."""

    _unary: type[_Routed] = _Streaming

    def __init__(self, identity: ClientIdentity, retire_after: float | None) -> None:
        _refuse_what_grpc_cannot_do(identity)
        self.identity = identity
        self.retire_after = retire_after
        self._pools: Pools[Any] = Pools(self._make, retire_after)
        self._cut_channels: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cut_lock = threading.Lock()
        # A channel of gRPC's own, closed as soon as made (it never connects): what a call after close() goes
        # through, so that it fails with exactly gRPC's error for a closed channel. Set before the pools refuse.
        self._tomb: Any = None
        self._unsubscribe = self._pools.follow(identity, self._close_now, self._cut)

    def _make(self, generation: int) -> Any:
        raise NotImplementedError

    def _close_now(self, channels: list[Any]) -> None:
        """From the checking thread or a caller's: close ``channels``."""
        raise NotImplementedError

    def _cut(self, channels: list[Any]) -> None:
        """From the checking thread: close ``channels``, overdue (``retire_after``), under the calls they carry."""
        with self._cut_lock:
            # before the close: a call it ends finds its channel cut, and fails as a lost connection
            self._cut_channels.update(channels)
        self._close_now(channels)

    def was_cut(self, channel: Any) -> bool:
        """Whether ``channel`` was cut at ``retire_after``."""
        with self._cut_lock:
            return channel in self._cut_channels

    def wrap(self, kind: str, call: Any, channel: Any) -> Any:
        """The call object handed to the caller: gRPC's own, or (where ``retire_after`` may cut its channel) one
        that reports the cut as a lost connection."""
        return call

    def cut_error(self, error: Any, channel: Any) -> BaseException | None:
        """What a blocking call whose channel was cut under it raises instead of ``error`` (``None``: ``error``)."""
        return None

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-unary multicallable (``grpc.UnaryUnaryMultiCallable``, or ``grpc.aio``'s) whose calls go through
        the newest channel.

        Args:
            method: the RPC's name, ``/package.Service/Method``.
            request_serializer: turns a request into bytes (``None``: requests are bytes).
            response_deserializer: turns bytes into a response (``None``: responses are bytes).
            _registered_method: gRPC's own (generated stubs pass it): handed on to every channel.
        """
        return self._unary(self, "unary_unary", method, request_serializer, response_deserializer, _registered_method)

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-stream multicallable whose calls go through the newest channel (released when the stream
        ends). Arguments as :meth:`unary_unary`."""
        return _Streaming(self, "unary_stream", method, request_serializer, response_deserializer, _registered_method)

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-unary multicallable whose calls go through the newest channel. Arguments as
        :meth:`unary_unary`."""
        return self._unary(self, "stream_unary", method, request_serializer, response_deserializer, _registered_method)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-stream multicallable whose calls go through the newest channel (released when the stream
        ends). Arguments as :meth:`unary_unary`."""
        return _Streaming(self, "stream_stream", method, request_serializer, response_deserializer, _registered_method)

    def route(self) -> tuple[Any, bool]:
        """The channel a call starts on, and whether it is counted in flight (to :meth:`release` when done): the
        newest, or after close gRPC's own closed channel (not counted)."""
        try:
            return self.acquire(), True
        except Closed:
            return self._tomb, False

    @contextlib.contextmanager
    def routed(self) -> Iterator[Any]:
        """The channel :meth:`route` gives, released at the end of the block when it was counted."""
        channel, counted = self.route()
        try:
            yield channel
        finally:
            if counted:
                self.release(channel)

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

    def _stop(self, tomb: Any) -> list[Any]:
        if self._tomb is None:
            self._tomb = tomb
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
        retire_after: seconds after a change at which a replaced channel still carrying calls is closed under them,
            which then fail with ``grpc.StatusCode.UNAVAILABLE``; ``None`` (the default): never, it is closed once
            they are done.

    Raises:
        ValueError: the identity's key is read with a password.

    Example::

        identity = ClientIdentity("client.crt", "client.key", cafile="ca.crt")
        with ReloadingChannel(identity, "service.internal:443") as channel:
            stub = EchoStub(channel)  # once: each call goes through the newest channel
            stub.Who(request)
    """

    _unary = _Unary

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

    def wrap(self, kind: str, call: Any, channel: Any) -> Any:
        if self.retire_after is None:  # nothing is ever cut: gRPC's own object, untouched
            return call
        cut = _Cut(self, channel)
        call.add_done_callback(cut.ended)
        return _Call(call, cut)

    def cut_error(self, error: Any, channel: Any) -> BaseException | None:
        if self.retire_after is None or not isinstance(error, grpc.Call) or not self.was_cut(channel):
            return None
        translated = _Call(error, _Cut(self, channel))
        return translated if translated.code() is grpc.StatusCode.UNAVAILABLE else None

    def release_from_callback(self, channel: Any) -> None:
        # A done callback runs on the channel's own polling thread: closing a channel there would close it under
        # the thread that delivers its events, so the closing is a thread's of its own (once per change).
        to_close = self._pools.release(channel)
        if to_close:
            threading.Thread(target=self._close_now, args=(to_close,), name="tlsreload-grpc-close").start()

    def subscribe(self, callback: Callable[[Any], object], try_to_connect: bool = False) -> None:
        """Watch the connectivity of the channel that is newest now (a channel made after a change is not
        watched: subscribe again, e.g. from an ``on_reload`` callback). After :meth:`close`, nothing is watched
        and nothing raised, as with gRPC's own closed channel (whose callback is never called)."""
        channel, counted = self.route()
        if not counted:
            # gRPC's own would start a thread that dies on the closed channel: nothing else is seen of it
            return
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
        """Close every channel (cancelling calls in flight) and stop following the identity. Calls made after
        fail as on gRPC's own closed channel (``ValueError``)."""
        tomb = None
        if self._tomb is None:
            tomb = self._make(self.identity.generation)
            tomb.close()
        self._close_now(self._stop(tomb))

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
        interceptors: client interceptors (``grpc.aio.UnaryUnaryClientInterceptor``...) for every channel made.
        retire_after: as :class:`ReloadingChannel`: the calls cut fail with ``grpc.aio.AioRpcError``,
            ``UNAVAILABLE`` (not the bare ``asyncio.CancelledError`` of a ``grpc.aio`` channel closed under them).

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
        # The calls not done yet on each channel a cut may close (with retire_after; touched on the loop only).
        self._in_flight: dict[Any, set[Any]] = {}
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
        for channel in channels:
            if self.was_cut(channel):
                # A cut cancels the channel's calls itself, before closing it. Older grpcio's close (1.66) cancels
                # only the calls it finds in the frames of running tasks: a stream nobody is reading is not there,
                # and the C core's close does not end it, so it would never be done nor released (the channel
                # retired for ever). And a task awaiting our call object has it in its frame: gRPC's close would
                # call our cancel(), taken for the caller's own. Newer grpcio tracks its calls; done is done.
                for call in list(self._in_flight.pop(channel, ())):
                    call.cancel()
        task = asyncio.get_running_loop().create_task(_close_all(channels))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _landed(self, channel: Any, call: Any) -> None:
        calls = self._in_flight.get(channel)
        if calls is not None:
            calls.discard(call)
            if not calls:
                del self._in_flight[channel]

    def wrap(self, kind: str, call: Any, channel: Any) -> Any:
        if self.retire_after is None:  # nothing is ever cut: gRPC's own object, untouched
            return call
        cut = _Cut(self, channel)
        call.add_done_callback(cut.ended)
        self._in_flight.setdefault(channel, set()).add(call)
        call.add_done_callback(lambda _: self._landed(channel, call))
        return _AIO_CALLS[kind](call, cut)

    def get_state(self, try_to_connect: bool = False) -> Any:
        """The connectivity of the newest channel (after :meth:`close`, gRPC's ``SHUTDOWN``)."""
        with self.routed() as channel:
            return channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: Any) -> None:
        """Wait for the newest channel's connectivity to leave ``last_observed_state``.

        Raises:
            grpc.aio.UsageError: after :meth:`close`, as gRPC's own closed channel raises.
        """
        with self.routed() as channel:
            await channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        """Wait until the newest channel is ready.

        Raises:
            grpc.aio.UsageError: after :meth:`close`, as gRPC's own closed channel raises.
        """
        with self.routed() as channel:
            await channel.channel_ready()

    async def close(self, grace: float | None = None) -> None:
        """Close every channel (calls in flight get ``grace`` seconds) and stop following the identity. Calls
        made after fail as on gRPC's own closed channel (``grpc.aio.UsageError``)."""
        tomb = None
        if self._tomb is None:
            tomb = self._make(self.identity.generation)
            await tomb.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await _close_all(self._stop(tomb), grace)

    async def __aenter__(self) -> AsyncReloadingChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _close_all(channels: list[Any], grace: float | None = None) -> None:
    for channel in channels:
        await channel.close(grace)
