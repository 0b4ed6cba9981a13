"""httpx2's glue in process, where the client matrix cannot look. The matrix runs the httpx2 kinds beside httpx's:
tests/test_clients.py runs examples/httpx2_client.py and httpx2_async_client.py through every rotation, hostile
pair, CA move and SIGTERM; tests/test_client_parity.py sets them beside httpx2 alone. Here: an httpx transport fails
in an httpx2 client where ours presents each rotation; each glue loads its own library only (and the httpx glue
still runs under ``httpx2.alias_httpx()``); a response open across a change reads to its end, or past
``retire_after`` is cut with httpx2's own error saying why; one identity shared by an ``http2=True`` httpx2 client and
an aiohttp session leaks nothing between them; proxies are chosen as httpx2 alone chooses them; the TLS settings
come from the identity. Against the mTLS servers of tests/mtls_servers.py (and hypercorn, which speaks HTTP/2), the
client's files rotated as kubelet does, the identity checked by the test.

httpx2 installs on Python 3.11 and later: elsewhere this module is skipped.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client_local import Here, clear_client_environment, local_world
from connect_proxy import ConnectProxy
from test_client_httpx import http2_server, stock_context
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client import httpx as httpx_glue
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlstest import wait_until

httpx2 = pytest.importorskip("httpx2", reason="httpx2 installs on Python 3.11 and later")
glue = pytest.importorskip("tlsreload_plugins.client.httpx2")

__all__ = ["http2_server"]  # a fixture of test_client_httpx.py's, used here


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
    with local_world(tmp_path) as world:
        yield world


def not_httpx2s(error: BaseException) -> list[BaseException]:
    """The exceptions in ``error``'s chain (causes and contexts) that are neither httpx2's nor what it reads with
    (httpcore2, h11, h2, anyio, the socket, ``ssl``)."""
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    libraries = ("httpx2", "httpcore2", "anyio", "h11", "h2")
    return [
        e
        for e in chain
        if not isinstance(e, (httpx2.HTTPError, OSError, ssl.SSLError))
        and type(e).__module__.split(".")[0] not in libraries
    ]


class Ours:
    """Our transport in an ``httpx2.Client``, or in an ``httpx2.AsyncClient`` on an event loop of its own (in a
    thread), driven from the test's thread, where the identity is checked as its checking thread would (off any
    loop). ``open`` reads a response's first bytes and leaves the rest to ``rest``, which reads it in the
    background."""

    def __init__(self, identity: ClientIdentity, asynchronous: bool, **options: Any) -> None:
        self.loop = asyncio.new_event_loop() if asynchronous else None
        self.background = ThreadPoolExecutor(2)  # a read held open, and a request beside it
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True) if self.loop else None
        if self.thread is not None:
            self.thread.start()
            self.transport = glue.AsyncReloadingTransport(identity, **options)
            self.client = httpx2.AsyncClient(transport=self.transport, timeout=None)
        else:
            self.transport = glue.ReloadingTransport(identity, **options)
            self.client = httpx2.Client(transport=self.transport, timeout=None)
        self.response: Any = None
        self.chunks: Any = None

    def later(self, sync: Callable[[], Any], coroutine: Callable[[], Coroutine[Any, Any, Any]]) -> Future[Any]:
        """``sync`` in the background, or for the async client ``coroutine`` on its loop."""
        if self.loop is None:
            return self.background.submit(sync)
        return asyncio.run_coroutine_threadsafe(coroutine(), self.loop)

    def answer(self, url: str) -> str:
        async def get() -> Any:
            return await self.client.get(url)

        return str(self.later(lambda: self.client.get(url), get).result(10).text.strip())

    def open(self, url: str) -> str:
        request = self.client.build_request("GET", url)

        def sync() -> bytes:
            self.response = self.client.send(request, stream=True)
            self.chunks = self.response.iter_bytes()
            return bytes(next(self.chunks))

        async def coroutine() -> bytes:
            self.response = await self.client.send(request, stream=True)
            self.chunks = self.response.aiter_bytes()
            return bytes(await self.chunks.__anext__())

        return self.later(sync, coroutine).result(10).decode()

    def rest(self) -> Future[bytes]:
        """The rest of the opened response, read and closed in the background."""

        def sync() -> bytes:
            try:
                return b"".join(self.chunks)
            finally:
                self.response.close()

        async def coroutine() -> bytes:
            try:
                return b"".join([chunk async for chunk in self.chunks])
            finally:
                await self.response.aclose()

        return self.later(sync, coroutine)

    def close(self) -> None:
        async def aclose() -> None:
            await self.client.aclose()

        self.later(lambda: self.client.close(), aclose).result(10)
        self.background.shutdown()
        if self.loop is not None and self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(params=[False, True], ids=["Client", "AsyncClient"])
def asynchronous(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_an_httpx_transport_fails_in_httpx2_where_ours_presents_each_rotation(here: Here, asynchronous: bool) -> None:
    """Possible at all: httpx2 asserts that a request's stream is its own kind, so the httpx glue's transport fails
    in an ``httpx2.Client``; ours presents the first certificate, then the rotated one."""
    identity = here.identity()
    with httpx2.Client(transport=httpx_glue.ReloadingTransport(identity)) as theirs, pytest.raises(AssertionError):
        theirs.get(here.url)
    ours = Ours(identity, asynchronous)
    try:
        assert ours.answer(here.url) == here.pair.serial
        new = here.rotate(identity)
        assert ours.answer(here.url) == new.serial
    finally:
        ours.close()


@pytest.mark.parametrize("retire_after", [None, 0.5], ids=["never-cut", "retire_after"])
def test_a_response_open_across_a_change_reads_to_its_end_or_is_cut_with_httpx2s_error(
    here: Here, asynchronous: bool, retire_after: float | None
) -> None:
    """By default a response still being read across a change goes on through the transport it started on, as with
    httpx2 alone, to its end, and that transport is closed once it is. With ``retire_after`` the read is cut that long
    after the change, with ``httpx2.ReadError`` saying why (nothing foreign in its chain), and the cut transport is
    closed."""
    identity = here.identity()
    ours = Ours(identity, asynchronous, retire_after=retire_after)
    try:
        assert ours.open(here.held_url()) == here.pair.serial  # the serial; the newline held back
        new = here.rotate(identity)
        assert ours.answer(here.url) == new.serial  # a new request beside it: the new certificate
        assert ours.transport.retired == 1
        rest = ours.rest()
        if retire_after is None:
            for _ in range(5):  # checks go on, as the checking thread's would: nothing is cut
                identity.check()
            assert not rest.done() and ours.transport.retired == 1
            here.release.touch()
            assert rest.result(10) == b"\n"
        else:
            wait_until(lambda: identity.check() is not None and rest.done(), 10, what="the read to be cut")
            error = rest.exception()
            assert isinstance(error, httpx2.ReadError), repr(error)
            assert "retire_after" in str(error) and not not_httpx2s(error), repr(error)
        wait_until(lambda: ours.transport.retired == 0, 10, what="the replaced transport to be closed")
        assert ours.answer(here.url) == new.serial
    finally:
        here.release.touch()
        ours.close()


def test_one_identity_shared_by_httpx2_http2_and_aiohttp(here: Here, http2_server: str) -> None:
    """httpcore2, as httpcore, sets its ALPN list on the context it is given at every connection: an ``http2=True``
    httpx2 client on the identity's one context makes a later aiohttp connection offer h2, which hypercorn answers
    in HTTP/2. Our transports take a context of their own, so both work, before and after a change."""
    identity = here.identity()

    def aiohttp_status(ssl_context: ssl.SSLContext | None) -> int:
        async def get() -> int:
            connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context else ReloadingConnector(identity)
            async with aiohttp.ClientSession(connector=connector) as session, session.get(http2_server) as response:
                await response.read()
                return response.status

        return asyncio.run(get())

    def http_version() -> str:
        with glue.reloading_client(identity, http2=True) as client:
            return str(client.get(http2_server).http_version)

    wait_until(lambda: http_version() == "HTTP/2", 30, what="hypercorn to answer in HTTP/2")
    with httpx2.Client(verify=identity.context, http2=True) as shared:  # possible at all: the one context, shared
        assert shared.get(http2_server).http_version == "HTTP/2"
    with pytest.raises(aiohttp.ClientError):
        aiohttp_status(identity.context)
    for _ in range(2):  # ours, then ours after a change
        assert http_version() == "HTTP/2"
        assert aiohttp_status(None) == 200
        new = here.rotate(identity)
    assert identity.presented.leaf.serial == new.serial


@pytest.mark.parametrize(
    "environment",
    [
        {"HTTPS_PROXY": "{proxy}"},
        {"HTTPS_PROXY": "{proxy}", "NO_PROXY": "localhost"},
        {"HTTPS_PROXY": "{proxy}", "NO_PROXY": "[::1], *.svc ,localhost"},
        {"HTTPS_PROXY": "{proxy}", "NO_PROXY": "*.svc,10.0.0.0/8,::1"},
        {"HTTPS_PROXY": "{proxy}", "NO_PROXY": "[::1,localhost"},
        {"ALL_PROXY": "{proxy}", "NO_PROXY": "*"},
        {"HTTPS_PROXY": "{proxy}", "trust_env": "False"},
    ],
    ids=["proxy", "localhost", "among-others", "others-only", "unparsable", "star", "trust_env=False"],
)
def test_proxies_chosen_as_httpx2_alone_chooses_them(here: Here, environment: dict[str, str]) -> None:
    """The same environment (and ``trust_env``): ours goes through the proxy where ``httpx2.Client`` alone does,
    reading ``NO_PROXY`` as httpx2 does (not as httpx does: httpx refuses ``[::1`` with ``InvalidURL``, where httpx2
    2.17 drops it), sync and async, presenting the newest certificate through the tunnel."""
    identity = here.identity()

    def route(make: Callable[[], Any], serial: str, asynchronous: bool = False) -> tuple[str, list[str]]:
        """Which way a GET went: the answer (``serial``: "the certificate expected") or the error, and the tunnels
        the proxy opened for it."""
        proxy.tunnels.clear()

        def get() -> str:
            with make() as client:
                return str(client.get(here.url).text.strip())

        async def aget() -> str:
            async with make() as client:
                return str((await client.get(here.url)).text.strip())

        try:
            answer = asyncio.run(aget()) if asynchronous else get()
        except (httpx2.HTTPError, httpx2.InvalidURL) as e:
            answer = type(e).__name__
        return ("the certificate expected" if answer == serial else answer), list(proxy.tunnels)

    with pytest.MonkeyPatch.context() as env, ConnectProxy() as proxy:
        clear_client_environment(env)
        options = {"trust_env": False} if environment.get("trust_env") == "False" else {}
        for name, value in environment.items():
            if name != "trust_env":
                env.setenv(name, value.format(proxy=proxy.url))
        stock = route(lambda: httpx2.Client(verify=stock_context(here), **options), here.pair.serial)
        new = here.rotate(identity)
        assert route(lambda: glue.reloading_client(identity, **options), new.serial) == stock
        assert route(lambda: glue.async_reloading_client(identity, **options), new.serial, asynchronous=True) == stock


@pytest.mark.parametrize("option", ["verify", "cert", "transport"])
def test_tls_settings_and_transport_come_from_the_identity(here: Here, option: str) -> None:
    """``verify`` and ``cert`` are the identity's, and the clients make their own transports: any of them given is a
    ``TypeError`` naming it, never silently dropped."""
    identity = here.identity()
    value = {"verify": False, "cert": ("client.crt", "client.key"), "transport": httpx2.HTTPTransport()}[option]
    makers = [glue.reloading_client, glue.async_reloading_client]
    if option != "transport":
        makers += [glue.ReloadingTransport, glue.AsyncReloadingTransport]
    for make in makers:
        with pytest.raises(TypeError, match=option):
            make(identity, **{option: value})


LOADED = """
import sys
import tlsreload_plugins.client.{glue}
print(" ".join(sorted({{"httpx", "httpx2", "httpcore", "httpcore2"}} & set(sys.modules))))
"""


@pytest.mark.parametrize("module", ["httpx", "httpx2"])
def test_each_glue_loads_its_own_library_only(module: str) -> None:
    """A user of httpx2 alone needs no httpx (nor httpcore), and a user of httpx alone never loads httpx2 (nor
    httpcore2): what the two glues share (``tlsreload_plugins.client.httpx_transports``) names neither."""
    said = subprocess.run(
        [sys.executable, "-c", LOADED.format(glue=module)], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(said.stdout.split())
    other = {"httpx": "httpx2", "httpx2": "httpx"}[module]
    assert module in loaded and not loaded & {other, other.replace("httpx", "httpcore")}, loaded


ALIASED = """
import sys
import httpx2
httpx2.alias_httpx()
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.httpx import reloading_client
cert, key, ca, url = sys.argv[1:]
with ClientIdentity(cert, key, cafile=ca, watch=False) as identity, reloading_client(identity) as client:
    response = client.get(url)
    print(type(client).__module__.split(".")[0], response.text.strip())
"""


def test_the_httpx_glue_runs_on_httpx2_under_alias_httpx(here: Here) -> None:
    """``httpx2.alias_httpx()`` makes ``import httpx`` load httpx2: the httpx glue, imported after it, builds on
    httpx2 and works (how users ran it before this glue, and may go on running it)."""
    if not hasattr(httpx2, "alias_httpx"):
        pytest.skip(f"httpx2 {httpx2.__version__} has no alias_httpx")
    files = here.files
    args = [str(files.cert_path), str(files.key_path), str(files.ca_path), here.url]
    said = subprocess.run([sys.executable, "-c", ALIASED, *args], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    assert said.stdout.split() == ["httpx2", here.pair.serial]
