"""The same client code run once with the client library alone (the certificate and the trust given once, from the
files as they are then) and once through our one line around a :class:`ClientIdentity` whose files rotate mid-run:
both must end the same. Where they differ, ours is wrong.

Each scenario below is written once, over a small adapter per client kind (httpx, httpx-async, requests, aiohttp, grpc,
grpc-aio; httpx2 and httpx2-async through httpx's) that makes the STOCK client or OURS and says what a request came to:
an outcome that both must share (``("ok", status, redirects, body)`` with the serial in the body replaced by ``SERIAL``,
or ``("error", type)``, and for gRPC the status code), never the serial itself: after a rotation the stock client goes
on presenting the old certificate, ours the new one. The client's files rotate during every scenario (``Here.rotate``:
for stock they rotate too, it just doesn't notice). A scenario that does not apply to a kind is not generated for it.

Against the mTLS servers of tests/mtls_servers.py (one HTTP and one gRPC server for the module) and, for proxies, the
CONNECT proxy of tests/connect_proxy.py. The async kinds run on an event loop of their own in a thread (a portal),
so that each scenario is one plain function; the rotation's check runs in the test's thread, off that loop.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import grpc.aio
import pytest
import requests
from requests.adapters import HTTPAdapter

from client_kinds import needs, serve
from client_local import Here, clear_client_environment, local_world
from connect_proxy import ConnectProxy
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlsreload_plugins.client.grpc import AsyncReloadingChannel, ReloadingChannel
from tlsreload_plugins.client.requests import ReloadingAdapter
from tlstest import KubeletLayout, issue

T = TypeVar("T")
Outcome = tuple[Any, ...]

SIDES = ("stock", "ours")
HTTP_KINDS = ("httpx", "httpx-async", "httpx2", "httpx2-async", "requests", "aiohttp")
GRPC_KINDS = ("grpc", "grpc-aio")
KINDS = HTTP_KINDS + GRPC_KINDS
ENVIRONMENT = "environment"
"""``proxy=ENVIRONMENT``: the proxy the environment names (the client made as the library reads it)."""
TIMEOUT = 10.0
"""Every request's timeout but the one a scenario means to hit (requests has none by default)."""
_SERIAL = re.compile(r"\b[0-9A-F]{6,}\b")


def shape(body: bytes) -> str:
    """A body with any certificate serial in it replaced by ``SERIAL``."""
    return _SERIAL.sub("SERIAL", body.decode(errors="replace"))


def failed(error: BaseException, message: bool = False) -> Outcome:
    """The outcome of ``error``: its type, for gRPC its status code, and (``message``) what it says, the ports and
    addresses in it made the same for both."""
    code = error.code() if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)) else None
    said = re.sub(r"0x[0-9a-f]+|:\d{2,5}\b|port=\d+", "#", shape(str(error).encode())) if message else None
    return ("error", type(error).__name__, *([code.name] if code is not None else []), *([said] if message else []))


def attempt(act: Callable[..., Outcome], *args: Any, message: bool = False, **kwargs: Any) -> Outcome:
    """What ``act`` comes to: its outcome, or the one of what it raised."""
    try:
        return act(*args, **kwargs)
    except (Exception, asyncio.CancelledError) as e:
        return failed(e, message)


class Portal:
    """An event loop on a thread of its own, for the async kinds: coroutines run there, awaited from the test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="parity-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(3 * TIMEOUT)

    def close(self) -> None:
        async def drain() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        try:
            self.run(drain())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT)
            self.loop.close()


@dataclass
class Opened:
    """A response (a stream) open, its first bytes read: ``head`` what came so far, ``finish`` reads it to its end
    and closes it, and says what came."""

    head: Outcome
    finish: Callable[[], Outcome]


def opened(status: int, chunks: Iterator[bytes], close: Callable[[], object]) -> Opened:
    """A sync library's response open: its first bytes read now, the rest by ``finish``, which closes it."""
    first = next(chunks)

    def finish() -> Outcome:
        try:
            return ("ok", shape(first + b"".join(chunks)))
        finally:
            close()

    return Opened(("open", status, bool(first)), finish)


class Run:
    """One side's run of one scenario: the identity (its files rotate), the clients made, the gates that hold
    answers back, and for the async kinds the portal."""

    def __init__(self, kind: str, side: str, here: Here, root: Path, env: pytest.MonkeyPatch) -> None:
        self.kind, self.side, self.here, self.root, self.env = kind, side, here, root, env
        self.identity = here.identity()
        self.portal = Portal() if kind in ("httpx-async", "httpx2-async", "aiohttp", "grpc-aio") else None
        self.clients: list[Any] = []
        self.gates: list[Path] = []

    @property
    def stock(self) -> bool:
        return self.side == "stock"

    def client(self, **options: Any) -> Any:
        """The kind's client, stock or ours (``limit``, ``proxy``, ``intercept``: what a scenario asks for)."""
        client = ADAPTERS[self.kind](self, **options)
        self.clients.append(client)
        return client

    def gate(self, name: str) -> Path:
        """A file whose existence lets a held answer go (touched at the end in any case)."""
        path = self.root / f"{self.side}-{name}"
        self.gates.append(path)
        return path

    def rotate(self) -> None:
        self.here.rotate(self.identity)

    def url(self, path: str = "/") -> str:
        return self.here.url.rstrip("/") + path

    def stock_context(self) -> ssl.SSLContext:
        """The library alone: an SSL context from the files as they are now."""
        files = self.here.files
        context = ssl.create_default_context(cafile=str(files.ca_path))
        context.load_cert_chain(str(files.cert_path), str(files.key_path))
        return context

    def stock_credentials(self) -> Any:
        """gRPC alone: channel credentials from the files' bytes as they are now."""
        files = self.here.files
        return grpc.ssl_channel_credentials(
            files.ca_path.read_bytes(), files.key_path.read_bytes(), files.cert_path.read_bytes()
        )

    def end(self) -> None:
        for gate in self.gates:
            gate.touch()
        for client in reversed(self.clients):
            attempt(client.close)
        if self.portal is not None:
            self.portal.close()
        self.identity.close()


# -- one adapter per kind: get (a path, or a held answer with a read timeout), post, stream, close ----------------


def answered(response: Any) -> Outcome:
    """An httpx or requests response, read."""
    return ("ok", response.status_code, len(response.history), shape(response.content))


def proxy_option(proxy: str | None) -> str | None:
    return None if proxy in (None, ENVIRONMENT) else proxy


def httpx_library(kind: str) -> tuple[Any, Any]:
    """The library of an httpx kind (``httpx``, ``httpx2``, sync or async) and our glue for it, imported when asked:
    httpx2 installs on Python 3.11 and later only."""
    name = kind.split("-")[0]
    return importlib.import_module(name), importlib.import_module(f"tlsreload_plugins.client.{name}")


class HttpxClient:
    """``httpx.Client(verify=context)``; ours ``httpx.Client(transport=ReloadingTransport(identity))``, or with a
    proxy (given, or from the environment) ``reloading_client(identity, proxy=...)``. httpx2 the same way, with its
    glue."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        self.r = r
        self.library, glue = httpx_library(r.kind)
        limits = {"limits": self.library.Limits(max_connections=limit)} if limit else {}
        proxies = {"proxy": proxy_option(proxy)} if proxy_option(proxy) else {}
        if r.stock:
            self.client = self.library.Client(verify=r.stock_context(), **limits, **proxies)
        elif proxy is None:
            self.client = self.library.Client(transport=glue.ReloadingTransport(r.identity, **limits))
        else:
            self.client = glue.reloading_client(r.identity, **limits, **proxies)

    def get(self, path: str = "/", read: float = TIMEOUT) -> Outcome:
        timeout = self.library.Timeout(TIMEOUT, read=read)
        return answered(self.client.get(self.r.url(path), timeout=timeout, follow_redirects=True))

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return self.get(f"/?until={gate}", read)

    def post(self, body: bytes) -> Outcome:
        return answered(self.client.post(self.r.url(), content=body, timeout=TIMEOUT))

    def stream(self, gate: Path) -> Opened:
        request = self.client.build_request("GET", self.r.url(f"/?until={gate}"), timeout=TIMEOUT)
        response = self.client.send(request, stream=True)
        return opened(response.status_code, response.iter_bytes(), response.close)

    def close(self) -> None:
        self.client.close()


class HttpxAsyncClient:
    """:class:`HttpxClient` for ``httpx.AsyncClient`` (``AsyncReloadingTransport``, ``async_reloading_client``) and
    ``httpx2.AsyncClient``."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        self.r = r
        assert r.portal is not None
        self.portal = r.portal
        self.library, glue = httpx_library(r.kind)
        limits = {"limits": self.library.Limits(max_connections=limit)} if limit else {}
        proxies = {"proxy": proxy_option(proxy)} if proxy_option(proxy) else {}

        async def make() -> Any:
            if r.stock:
                return self.library.AsyncClient(verify=r.stock_context(), **limits, **proxies)
            if proxy is None:
                return self.library.AsyncClient(transport=glue.AsyncReloadingTransport(r.identity, **limits))
            return glue.async_reloading_client(r.identity, **limits, **proxies)

        self.client = self.portal.run(make())

    def get(self, path: str = "/", read: float = TIMEOUT) -> Outcome:
        timeout = self.library.Timeout(TIMEOUT, read=read)

        async def get() -> Outcome:
            return answered(await self.client.get(self.r.url(path), timeout=timeout, follow_redirects=True))

        return self.portal.run(get())

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return self.get(f"/?until={gate}", read)

    def post(self, body: bytes) -> Outcome:
        async def post() -> Outcome:
            return answered(await self.client.post(self.r.url(), content=body, timeout=TIMEOUT))

        return self.portal.run(post())

    def stream(self, gate: Path) -> Opened:
        async def open_() -> tuple[Any, Any, bytes]:
            request = self.client.build_request("GET", self.r.url(f"/?until={gate}"), timeout=TIMEOUT)
            response = await self.client.send(request, stream=True)
            chunks = response.aiter_bytes()
            return response, chunks, await chunks.__anext__()

        response, chunks, first = self.portal.run(open_())

        async def finish() -> Outcome:
            try:
                return ("ok", shape(first + b"".join([chunk async for chunk in chunks])))
            finally:
                await response.aclose()

        return Opened(("open", response.status_code, bool(first)), lambda: self.portal.run(finish()))

    def close(self) -> None:
        self.portal.run(self.client.aclose())


class RequestsClient:
    """A session with ``session.cert`` and ``session.verify``; ours mounts ``ReloadingAdapter(identity)``. A proxy
    given is the session's ``proxies``."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        self.r = r
        self.session = session = requests.Session()
        sizes = {"pool_maxsize": limit} if limit else {}
        files = r.here.files
        if r.stock:
            # Given once: requests (urllib3) loads the paths at every new connection, and a connection made while
            # the files rotate would read one pair's certificate and the next one's key. A copy made now is what
            # a user giving requests their files once gets.
            given = r.root / f"stock-requests-{len(r.clients)}"
            given.mkdir(exist_ok=True)
            for name, path in (("cert", files.cert_path), ("key", files.key_path), ("ca", files.ca_path)):
                (given / name).write_bytes(path.read_bytes())
            session.cert, session.verify = (str(given / "cert"), str(given / "key")), str(given / "ca")
            if sizes:
                session.mount("https://", HTTPAdapter(**sizes))
        else:
            session.mount("https://", ReloadingAdapter(r.identity, **sizes))
        if proxy_option(proxy):
            session.proxies = {"https": proxy_option(proxy)}

    def get(self, path: str = "/", read: float = TIMEOUT) -> Outcome:
        return answered(self.session.get(self.r.url(path), timeout=(TIMEOUT, read)))

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return self.get(f"/?until={gate}", read)

    def post(self, body: bytes) -> Outcome:
        return answered(self.session.post(self.r.url(), data=body, timeout=TIMEOUT))

    def stream(self, gate: Path) -> Opened:
        response = self.session.get(self.r.url(f"/?until={gate}"), stream=True, timeout=TIMEOUT)
        return opened(response.status_code, response.iter_content(1), response.close)

    def close(self) -> None:
        self.session.close()


class AiohttpClient:
    """``ClientSession(connector=TCPConnector(ssl=context))``; ours ``connector=ReloadingConnector(identity)``. A
    proxy given is each request's ``proxy=``; one from the environment, the session's ``trust_env=True``."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        self.r = r
        assert r.portal is not None
        self.portal = r.portal
        self.proxy = proxy_option(proxy)
        sizes = {"limit": limit} if limit else {}

        async def make() -> Any:
            if r.stock:
                connector = aiohttp.TCPConnector(ssl=r.stock_context(), **sizes)
            else:
                connector = ReloadingConnector(r.identity, **sizes)
            return aiohttp.ClientSession(connector=connector, trust_env=proxy == ENVIRONMENT)

        self.session = self.portal.run(make())

    def _request(self, method: str, path: str, read: float = TIMEOUT, **options: Any) -> Any:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT, sock_read=read)
        return self.session.request(method, self.r.url(path), timeout=timeout, proxy=self.proxy, **options)

    def get(self, path: str = "/", read: float = TIMEOUT, method: str = "GET", **options: Any) -> Outcome:
        async def get() -> Outcome:
            async with self._request(method, path, read, **options) as response:
                return ("ok", response.status, len(response.history), shape(await response.read()))

        return self.portal.run(get())

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return self.get(f"/?until={gate}", read)

    def post(self, body: bytes) -> Outcome:
        return self.get("/", method="POST", data=body)

    def stream(self, gate: Path) -> Opened:
        async def open_() -> tuple[Any, bytes]:
            response = await self._request("GET", f"/?until={gate}")
            return response, await response.content.readany()

        response, first = self.portal.run(open_())

        async def finish() -> Outcome:
            try:
                return ("ok", shape(first + await response.read()))
            finally:
                response.release()

        return Opened(("open", response.status, bool(first)), lambda: self.portal.run(finish()))

    def close(self) -> None:
        self.portal.run(self.session.close())


# gRPC: "/" is the unary Who, "/status/404" a method the server lacks; held answers are Held (unary) and Twice (unary
# to stream) with the gate's path as the request; an upload is a large request.
GRPC_PATHS = {"/": "/echo.Echo/Who", "/status/404": "/echo.Echo/Nope"}


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """A sync interceptor: notes each method and adds metadata."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def _intercept(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(details.method)
        return continuation(details._replace(metadata=[*(details.metadata or []), ("x-seen", "1")]), request)

    intercept_unary_unary = intercept_unary_stream = _intercept


class AioRecorder(grpc.aio.UnaryUnaryClientInterceptor):
    """A ``grpc.aio`` interceptor: notes each method."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(details.method)
        return await continuation(details, request)


def grpc_options(proxy: str | None) -> list[tuple[str, Any]] | None:
    return [("grpc.http_proxy", proxy_option(proxy))] if proxy_option(proxy) else None


class GrpcClient:
    """``grpc.secure_channel`` with ``ssl_channel_credentials`` from the files' bytes; ours
    ``ReloadingChannel(identity, target)``; ``intercept``: through ``grpc.intercept_channel``. Its methods are made
    once, as a generated stub makes them."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        target = f"localhost:{r.here.port}"
        if r.stock:
            self.channel = grpc.secure_channel(target, r.stock_credentials(), grpc_options(proxy))
        else:
            self.channel = ReloadingChannel(r.identity, target, grpc_options(proxy))
        self.seen: list[str] = []
        channel = grpc.intercept_channel(self.channel, Recorder(self.seen)) if intercept else self.channel
        self.unary = {name: channel.unary_unary(name, _registered_method=True) for name in GRPC_PATHS.values()}
        self.unary["Held"] = channel.unary_unary("/echo.Echo/Held", _registered_method=True)
        self.twice = channel.unary_stream("/echo.Echo/Twice", _registered_method=True)

    def get(self, path: str = "/", read: float = TIMEOUT) -> Outcome:
        return ("ok", shape(self.unary[GRPC_PATHS[path]](b"", timeout=read)))

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return ("ok", shape(self.unary["Held"](str(gate).encode(), timeout=read)))

    def post(self, body: bytes) -> Outcome:
        return ("ok", shape(self.unary[GRPC_PATHS["/"]](body, timeout=TIMEOUT)))

    def stream(self, gate: Path) -> Opened:
        answers = self.twice(str(gate).encode(), timeout=TIMEOUT)
        first = next(answers)
        return Opened(("open", shape(first)), lambda: ("ok", tuple(shape(answer) for answer in answers)))

    def close(self) -> None:
        self.channel.close()


class GrpcAioClient:
    """:class:`GrpcClient` for ``grpc.aio``: ``grpc.aio.secure_channel``, ours ``AsyncReloadingChannel``;
    ``intercept``: the channel's ``interceptors=``."""

    def __init__(self, r: Run, limit: int | None = None, proxy: str | None = None, intercept: bool = False) -> None:
        assert r.portal is not None
        self.portal = r.portal
        self.seen: list[str] = []
        target, options = f"localhost:{r.here.port}", grpc_options(proxy)
        interceptors = [AioRecorder(self.seen)] if intercept else None

        async def make() -> Any:
            if r.stock:
                return grpc.aio.secure_channel(target, r.stock_credentials(), options, None, interceptors)
            return AsyncReloadingChannel(r.identity, target, options, None, interceptors)

        self.channel = self.portal.run(make())
        self.unary = {name: self.channel.unary_unary(name, _registered_method=True) for name in GRPC_PATHS.values()}
        self.unary["Held"] = self.channel.unary_unary("/echo.Echo/Held", _registered_method=True)
        self.twice = self.channel.unary_stream("/echo.Echo/Twice", _registered_method=True)

    def _call(self, method: str, request: bytes, timeout: float) -> Outcome:
        async def call() -> Outcome:
            return ("ok", shape(await self.unary[method](request, timeout=timeout)))

        return self.portal.run(call())

    def get(self, path: str = "/", read: float = TIMEOUT) -> Outcome:
        return self._call(GRPC_PATHS[path], b"", read)

    def held(self, gate: Path, read: float = TIMEOUT) -> Outcome:
        return self._call("Held", str(gate).encode(), read)

    def post(self, body: bytes) -> Outcome:
        return self._call(GRPC_PATHS["/"], body, TIMEOUT)

    def stream(self, gate: Path) -> Opened:
        async def open_() -> tuple[Any, Any]:
            call = self.twice(str(gate).encode(), timeout=TIMEOUT)
            return call, await call.read()

        call, first = self.portal.run(open_())

        async def finish() -> Outcome:
            answers = []
            while (answer := await call.read()) is not grpc.aio.EOF:
                answers.append(shape(answer))
            return ("ok", tuple(answers))

        return Opened(("open", shape(first)), lambda: self.portal.run(finish()))

    def close(self) -> None:
        self.portal.run(self.channel.close())


ADAPTERS: dict[str, Callable[..., Any]] = {
    "httpx": HttpxClient,
    "httpx-async": HttpxAsyncClient,
    "httpx2": HttpxClient,
    "httpx2-async": HttpxAsyncClient,
    "requests": RequestsClient,
    "aiohttp": AiohttpClient,
    "grpc": GrpcClient,
    "grpc-aio": GrpcAioClient,
}


# -- the scenarios: each written once, run with each side ---------------------------------------------------------


def plain(r: Run) -> Outcome:
    """A GET (gRPC: a unary call), the files rotated, another."""
    client = r.client()
    before = attempt(client.get)
    r.rotate()
    return before, attempt(client.get)


def stream_across_rotation(r: Run) -> Outcome:
    """A stream open across a rotation (gRPC: ``Twice``), a request beside it after the rotation and several checks,
    then read to its end."""
    client = r.client()
    gate = r.gate("stream")
    opened = client.stream(gate)
    r.rotate()
    beside = attempt(client.get)
    checks = tuple(r.identity.check().name for _ in range(5))
    gate.touch()
    return opened.head, beside, checks, attempt(opened.finish), attempt(client.get)


UPLOAD = bytes(range(256)) * 256  # 64 KiB


def upload(r: Run) -> Outcome:
    """A POST with a body (the HTTP server reads it and answers its length; gRPC: a large request), the files
    rotated, another."""
    client = r.client()
    before = attempt(client.post, UPLOAD)
    r.rotate()
    return before, attempt(client.post, UPLOAD)


def redirect(r: Run) -> Outcome:
    """A redirect followed, the files rotated, another."""
    client = r.client()
    before = attempt(client.get, "/redirect")
    r.rotate()
    return before, attempt(client.get, "/redirect")


def error_status(r: Run) -> Outcome:
    """An error status (HTTP 404; gRPC: a method the server lacks, UNIMPLEMENTED), the files rotated, another."""
    client = r.client()
    before = attempt(client.get, "/status/404")
    r.rotate()
    return before, attempt(client.get, "/status/404"), attempt(client.get)


def read_timeout(r: Run) -> Outcome:
    """The files rotated, then an answer held past the read timeout (gRPC: a ``Held`` call past its 0.3 s
    deadline), then a request that is answered."""
    client = r.client()
    gate = r.gate("timeout")
    r.rotate()
    timed_out = attempt(client.held, gate, 0.3)
    gate.touch()
    return timed_out, attempt(client.get)


def concurrent_under_limit(r: Run) -> Outcome:
    """One connection at most (httpx ``max_connections=1``, aiohttp ``limit=1``, requests ``pool_maxsize=1``; gRPC:
    one channel's connection): a stream holds it while a second request is made, the files rotate, the stream ends;
    both succeed."""
    client = r.client(limit=1)
    gate = r.gate("first")
    opened = client.stream(gate)
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(attempt, client.get)
        r.rotate()
        gate.touch()
        return opened.head, attempt(opened.finish), second.result(3 * TIMEOUT)


def after_close(r: Run) -> Outcome:
    """A request, the files rotated, the client closed, then a request and a stream (methods made before the close,
    as a stub's): they work or fail the same (type and message)."""
    client = r.client()
    before = attempt(client.get)
    r.rotate()
    client.close()
    gate = r.gate("closed")

    def streamed() -> Outcome:
        opened = client.stream(gate)
        gate.touch()
        return opened.head, opened.finish()

    return before, attempt(client.get, message=True), attempt(streamed, message=True)


def through_proxy(r: Run, by: str) -> Outcome:
    """Through a CONNECT proxy given ``by`` option or by environment: the files rotated after the client was made,
    two requests; how many tunnels the proxy opened (one: the second request reuses the connection)."""
    with ConnectProxy() as proxy:
        if by == ENVIRONMENT:
            # gRPC reads the lower-case variable only; httpx, requests and aiohttp read either.
            r.env.setenv("https_proxy" if r.kind in GRPC_KINDS else "HTTPS_PROXY", proxy.url)
        client = r.client(proxy=ENVIRONMENT if by == ENVIRONMENT else proxy.url)
        r.rotate()
        first, second = attempt(client.get), attempt(client.get)
        return first, second, len(proxy.tunnels)


def proxy_by_option(r: Run) -> Outcome:
    return through_proxy(r, "option")


def proxy_by_environment(r: Run) -> Outcome:
    return through_proxy(r, ENVIRONMENT)


def intercepted(r: Run) -> Outcome:
    """gRPC through an interceptor (``grpc.intercept_channel``; aio ``interceptors=``) across a rotation: the calls
    succeed and the interceptor sees each."""
    client = r.client(intercept=True)
    before = attempt(client.get)
    r.rotate()
    return before, attempt(client.get), tuple(client.seen)


SCENARIOS: dict[str, tuple[Callable[[Run], Outcome], tuple[str, ...]]] = {
    "plain": (plain, KINDS),
    "stream": (stream_across_rotation, KINDS),
    "upload": (upload, KINDS),
    "redirect": (redirect, HTTP_KINDS),
    "error-status": (error_status, KINDS),
    "read-timeout": (read_timeout, KINDS),
    "concurrent": (concurrent_under_limit, KINDS),
    "after-close": (after_close, KINDS),
    "proxy-option": (proxy_by_option, KINDS),
    "proxy-environment": (proxy_by_environment, KINDS),
    "intercepted": (intercepted, GRPC_KINDS),
}

PAIRS = [
    pytest.param(kind, name, id=f"{kind}-{name}", marks=needs(kind))
    for name, (_, kinds) in SCENARIOS.items()
    for kind in kinds
]


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_client_environment(monkeypatch)


@pytest.fixture(scope="module")
def http_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Here]:
    with local_world(tmp_path_factory.mktemp("http")) as here:
        yield here


@pytest.fixture(scope="module")
def grpc_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Here]:
    """The gRPC server, with the client's files as :func:`local_world` gives them for HTTP."""
    root = tmp_path_factory.mktemp("grpc")
    with serve(root, "grpc") as world:
        first = issue(world.client_ca)
        trusted = world.server_ca.cert_pem.bytes()
        here = Here(world.client_ca, world.server_ca, KubeletLayout(root / "client"), trusted, "", root / "go", first)
        here.url = f"https://localhost:{world.port}/"
        here.install(first)
        yield here


def play(kind: str, side: str, scenario: Callable[[Run], Outcome], here: Here, root: Path) -> Outcome:
    with pytest.MonkeyPatch.context() as env:
        r = Run(kind, side, here, root, env)
        try:
            return scenario(r)
        except Exception as e:  # a step the scenario does not expect to fail: its outcome all the same
            return ("scenario failed", *failed(e, message=True))
        finally:
            r.end()


@pytest.mark.parametrize(("kind", "scenario"), PAIRS)
def test_stock_and_ours_agree(kind: str, scenario: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    here: Here = request.getfixturevalue("grpc_here" if kind in GRPC_KINDS else "http_here")
    run = SCENARIOS[scenario][0]
    outcomes = {side: play(kind, side, run, here, tmp_path) for side in SIDES}
    assert outcomes["ours"] == outcomes["stock"], (
        f"{kind} {scenario}: stock and ours differ\n  stock: {outcomes['stock']}\n  ours:  {outcomes['ours']}"
    )
