"""httpx's glue in process, where the client matrix (tests/test_clients.py) cannot look: a response still being read
across a change goes on through the transport it started on, as with httpx alone, until it ends; with
``retire_after`` set it is cut with httpx's own error saying why; one identity shared by an ``http2=True`` httpx
client and an aiohttp session leaks nothing between them. Against the mTLS servers of tests/mtls_servers.py (and
hypercorn, which speaks HTTP/2), the client's files rotated as kubelet does, the identity checked by the test.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from client_local import Here, clear_client_environment, local_world, rotate
from connect_proxy import ConnectProxy
from tlsreload_plugins.client import ClientIdentity, client_context
from tlsreload_plugins.client.aiohttp import ReloadingConnector
from tlsreload_plugins.client.httpx import (
    AsyncReloadingTransport,
    ReloadingTransport,
    async_reloading_client,
    environment_proxies,
    reloading_client,
)
from tlsreload_plugins.files import Password, TLSFiles
from tlsreload_plugins.outcome import Outcome
from tlstest import free_port, issue, run_server, wait_until


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
    with local_world(tmp_path) as world:
        yield world


def foreign(error: BaseException) -> list[BaseException]:
    """The exceptions in ``error``'s chain that are not httpx's own (httpx, httpcore and what they read with: h11,
    h2, anyio, the socket): anyio's ``IndexError`` was one."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    own = (httpx.HTTPError, OSError, ssl.SSLError)
    return [
        e
        for e in seen
        if not isinstance(e, own) and not type(e).__module__.startswith(("httpcore", "anyio", "h11", "h2"))
    ]


def test_a_stream_open_across_a_rotation_reads_to_its_end(here: Here) -> None:
    identity = here.identity()
    first = here.pair.serial
    transport = ReloadingTransport(identity)  # the default: never cut, as httpx alone
    with httpx.Client(transport=transport) as client:
        with client.stream("GET", here.held_url()) as held:
            chunks = held.iter_bytes()
            assert next(chunks).decode() == first  # the serial, then the newline held back
            new = here.rotate(identity)
            assert client.get(here.url).text.strip() == new.serial
            for _ in range(5):  # checks go on: what the checking thread does every interval
                assert identity.check() is Outcome.UNCHANGED
            assert transport.retired == 1
            here.release.touch()
            assert b"".join(chunks) == b"\n"
        assert transport.retired == 0  # closed once the stream was
        assert client.get(here.url).text.strip() == new.serial


def test_an_async_stream_open_across_a_rotation_reads_to_its_end(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        first = here.pair.serial
        transport = AsyncReloadingTransport(identity)
        async with httpx.AsyncClient(transport=transport) as client:
            async with client.stream("GET", here.held_url()) as held:
                chunks = held.aiter_bytes()
                assert (await chunks.__anext__()).decode() == first
                new = await rotate(here, identity)
                assert (await client.get(here.url)).text.strip() == new.serial
                for _ in range(5):
                    assert await asyncio.to_thread(identity.check) is Outcome.UNCHANGED
                assert transport.retired == 1
                here.release.touch()
                assert b"".join([chunk async for chunk in chunks]) == b"\n"
            assert transport.retired == 0
            assert (await client.get(here.url)).text.strip() == new.serial

    asyncio.run(main())


def test_a_stream_past_retire_after_is_cut_with_httpx_own_error(here: Here) -> None:
    identity = here.identity()
    transport = ReloadingTransport(identity, retire_after=0.5)
    with httpx.Client(transport=transport, timeout=None) as client:
        with client.stream("GET", here.held_url()) as held:
            chunks = held.iter_bytes()
            next(chunks)
            new = here.rotate(identity)
            assert client.get(here.url).text.strip() == new.serial
            ended = threading.Event()
            failure: list[BaseException] = []

            def read() -> None:
                try:
                    b"".join(chunks)
                except BaseException as e:
                    failure.append(e)
                ended.set()

            threading.Thread(target=read, daemon=True).start()
            wait_until(lambda: identity.check() is not None and ended.is_set(), 10, what="the stream to be cut")
        assert failure and isinstance(failure[0], httpx.ReadError), failure
        assert "retire_after" in str(failure[0]) and not foreign(failure[0]), repr(failure[0])
        wait_until(lambda: transport.retired == 0, 10, what="the cut transport to be closed")
        assert client.get(here.url).text.strip() == new.serial


def test_an_async_stream_past_retire_after_is_cut_with_httpx_own_error(here: Here) -> None:
    async def main() -> None:
        identity = here.identity()
        transport = AsyncReloadingTransport(identity, retire_after=0.5)
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            async with client.stream("GET", here.held_url()) as held:
                chunks = held.aiter_bytes()
                await chunks.__anext__()
                new = await rotate(here, identity)
                assert (await client.get(here.url)).text.strip() == new.serial
                read = asyncio.ensure_future(chunks.__anext__())
                deadline = asyncio.get_running_loop().time() + 10
                while not read.done():
                    assert asyncio.get_running_loop().time() < deadline, "the stream was never cut"
                    await asyncio.to_thread(identity.check)
                    await asyncio.sleep(0.05)
                error = read.exception()
            assert isinstance(error, httpx.ReadError), repr(error)
            assert "retire_after" in str(error) and not foreign(error), repr(error)
            for _ in range(500):  # the close is a task on this loop
                if transport.retired == 0:
                    break
                await asyncio.sleep(0.02)
            assert transport.retired == 0
            assert (await client.get(here.url)).text.strip() == new.serial

    asyncio.run(main())


@pytest.fixture
def http2_server(here: Here, tmp_path: Path) -> Iterator[str]:
    """Hypercorn (HTTP/2 and HTTP/1.1, client certificates required) on the same CAs as ``here``."""
    port = free_port()
    pair = issue(here.server_ca)
    (tmp_path / "h2.crt").write_bytes(pair.chain)
    (tmp_path / "h2.key").write_bytes(pair.key)
    args = [
        *("-m", "hypercorn", "hostile_apps:asgi", "--bind", f"127.0.0.1:{port}"),
        *("--certfile", str(tmp_path / "h2.crt"), "--keyfile", str(tmp_path / "h2.key")),
        *("--ca-certs", str(tmp_path / "client-ca.pem"), "--verify-mode", "CERT_REQUIRED"),
    ]
    with run_server(args, tmp_path / "hypercorn.log", port, cwd=Path(__file__).parent):
        yield f"https://localhost:{port}/"


def test_one_identity_shared_by_httpx_http2_and_aiohttp(here: Here, http2_server: str) -> None:
    """httpcore sets its ALPN list on the context it is given at every connection: an ``http2=True`` client on the
    identity's one context makes a later aiohttp connection offer h2, and hypercorn answers in HTTP/2 ("400, Bad
    status line"). Each glue takes a context of its own, so both work, as each library alone."""
    identity = here.identity()
    shared = identity.context

    async def aiohttp_get(ssl_context: ssl.SSLContext | None, connector: aiohttp.BaseConnector | None) -> None:
        made = connector or aiohttp.TCPConnector(ssl=ssl_context)
        async with aiohttp.ClientSession(connector=made) as session, session.get(http2_server) as response:
            await response.read()
            assert response.status == 200

    wait_until(lambda: _answers(http2_server, shared), 30, what="hypercorn to answer")
    # Possible at all: one context handed to both libraries breaks aiohttp once httpx has connected with HTTP/2.
    with httpx.Client(verify=shared, http2=True) as client:
        assert client.get(http2_server).http_version == "HTTP/2"
    with pytest.raises(aiohttp.ClientError):  # 3.14: "400, Bad status line"; 3.10: "0, message=''"
        asyncio.run(aiohttp_get(shared, None))

    with httpx.Client(transport=ReloadingTransport(identity, http2=True)) as client:
        assert client.get(http2_server).http_version == "HTTP/2"

    async def ours() -> None:
        await aiohttp_get(None, ReloadingConnector(identity))

    asyncio.run(ours())
    new = here.rotate(identity)  # and after a change, each its own again
    with httpx.Client(transport=ReloadingTransport(identity, http2=True)) as client:
        assert client.get(http2_server).http_version == "HTTP/2"
    asyncio.run(ours())
    assert identity.presented.leaf.serial == new.serial


def _answers(url: str, context: ssl.SSLContext) -> bool:
    try:
        with httpx.Client(verify=context) as client:
            return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    return clear_client_environment(monkeypatch)


def stock_context(here: Here) -> ssl.SSLContext:
    """httpx alone: the client's files loaded once."""
    context = ssl.create_default_context(cafile=str(here.files.ca_path))
    context.load_cert_chain(str(here.files.cert_path), str(here.files.key_path))
    return context


@pytest.mark.parametrize("given", ["option", "environment", "no_proxy", "trust_env=False"])
def test_proxies_as_httpx_alone(here: Here, no_proxy_environment: pytest.MonkeyPatch, given: str) -> None:
    """httpx alone goes through a proxy given by ``proxy=`` or by ``HTTPS_PROXY`` (not when ``NO_PROXY`` names the
    host, nor with ``trust_env=False``); so does the client :func:`reloading_client` makes, presenting the newest
    certificate through the tunnel. (An ``httpx.Client(transport=ReloadingTransport(...))`` goes direct, silently.)
    """
    identity = here.identity()
    with ConnectProxy() as proxy:
        options: dict[str, Any] = {"proxy": proxy.url} if given == "option" else {}
        if given != "option":
            no_proxy_environment.setenv("HTTPS_PROXY", proxy.url)
        if given == "no_proxy":
            no_proxy_environment.setenv("NO_PROXY", "localhost")
        if given == "trust_env=False":
            options["trust_env"] = False
        through = given in ("option", "environment")

        with httpx.Client(verify=stock_context(here), **options) as stock:
            assert stock.get(here.url).text.strip() == here.pair.serial
        assert bool(proxy.tunnels) is through, proxy.tunnels
        proxy.tunnels.clear()

        with reloading_client(identity, **options) as ours:
            assert ours.get(here.url).text.strip() == here.pair.serial
            assert bool(proxy.tunnels) is through, proxy.tunnels
            new = here.rotate(identity)
            assert ours.get(here.url).text.strip() == new.serial  # the new certificate, through the tunnel too
        assert bool(proxy.tunnels) is through and len(proxy.tunnels) in ((2,) if through else (0,)), proxy.tunnels

        async def main() -> list[str]:
            async with async_reloading_client(identity, **options) as client:
                return [(await client.get(here.url)).text.strip()]

        proxy.tunnels.clear()
        assert asyncio.run(main()) == [new.serial]
        assert bool(proxy.tunnels) is through, proxy.tunnels


def test_environment_proxies_read_as_httpx_reads_them(no_proxy_environment: pytest.MonkeyPatch) -> None:
    no_proxy_environment.setenv("HTTPS_PROXY", "proxy.internal:3128")
    no_proxy_environment.setenv("ALL_PROXY", "http://all.internal:3128")
    no_proxy_environment.setenv("NO_PROXY", "localhost, .svc,cluster.local,10.0.0.0/8,::1,http://direct.internal")
    assert environment_proxies() == {
        "https://": "http://proxy.internal:3128",
        "all://": "http://all.internal:3128",
        "all://localhost": None,
        "all://*.svc": None,
        "all://*cluster.local": None,
        "all://10.0.0.0/8": None,
        "all://[::1]": None,
        "http://direct.internal": None,
    }
    no_proxy_environment.setenv("NO_PROXY", "example.com,*")
    assert environment_proxies() == {}


def test_ssl_settings_and_transport_come_from_the_identity(here: Here) -> None:
    identity = here.identity()
    with pytest.raises(TypeError, match="verify"):
        reloading_client(identity, verify=False)
    with pytest.raises(TypeError, match="transport"):
        reloading_client(identity, transport=httpx.HTTPTransport())
    with pytest.raises(TypeError, match="cert"):
        ReloadingTransport(identity, cert=("a", "b"))


def test_async_clients_build_no_context_on_the_event_loop(here: Here) -> None:
    """A context is built from the CA bundle (the system's takes tens of milliseconds): the async glues build theirs
    on worker threads, at the first request and at every change, never on the loop's thread."""
    built_on: list[str] = []

    def recipe(files: TLSFiles, password: Password) -> ssl.SSLContext:
        built_on.append(threading.current_thread().name)
        return client_context(files, password)

    files = here.files
    identity = ClientIdentity(
        str(files.cert_path), str(files.key_path), cafile=str(files.ca_path), watch=False, recipe=recipe
    )

    async def main() -> None:
        loop_thread = threading.current_thread().name
        built_on.clear()
        transport, connector = AsyncReloadingTransport(identity), ReloadingConnector(identity)
        async with httpx.AsyncClient(transport=transport) as client, aiohttp.ClientSession(connector=connector) as s:
            assert (await client.get(here.url)).text.strip() == here.pair.serial
            async with s.get(here.url) as response:
                assert (await response.text()).strip() == here.pair.serial
            assert len(built_on) == 2  # possible at all: one context each, made for them
            new = await rotate(here, identity)
            assert (await client.get(here.url)).text.strip() == new.serial
            async with s.get(here.url) as response:
                assert (await response.text()).strip() == new.serial
        assert len(built_on) == 2 + 3 and loop_thread not in built_on, built_on  # the identity's, then one each

    asyncio.run(main())
