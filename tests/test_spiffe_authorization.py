"""Authorization by SPIFFE ID, both sides (:mod:`tlsreload_plugins.authorization`): a server refuses, in the
handshake, clients whose SVID's ID its authorizer does not accept, fresh and resumed, in every server of the shared
matrix; a client refuses servers likewise, checking the server's ID instead of its host name.

The decisions are plain code, tested directly; the servers are real ones (subprocesses of :mod:`server_kinds`) and
the clients real TLS clients, their SVIDs minted per test by tests/workload_api_server.py's ``mint_svid``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from prometheus_client import REGISTRY

import server_kinds
from hostile import place_good
from spiffe_matcher import ALLOWED_ENV
from test_hostile import server_env
from test_spiffe import pair_of
from test_trust import ask, resumes, sessions_from_every_worker
from tlsreload_plugins.authorization import (
    AUTHORIZE_ENV,
    Authorizer,
    adapt_matcher,
    authorize_any,
    authorize_id,
    authorize_member_of,
    authorize_one_of,
    parse_authorizer,
    resolve_authorizer,
    spiffe_id_of,
)
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.resumption import Unauthorized, authorizer_of
from tlstest import (
    Pair,
    RenameEachLayout,
    client_context,
    free_port,
    handshake,
    replace_file,
    request,
    run_server,
    serial_of,
    wait_until,
)
from workload_api_server import WorkloadAPI, mint_svid

DEADLINE = 30.0
TESTS = Path(__file__).parent
WEB = "spiffe://example.org/web"
BATCH = "spiffe://example.org/batch"


def peer(*uris: str, dns: str = "") -> dict[str, object]:
    """A peer certificate as ``getpeercert()`` decodes it."""
    names = tuple(("URI", uri) for uri in uris) + ((("DNS", dns),) if dns else ())
    return {"subject": (), "subjectAltName": names}


# --- the decisions --------------------------------------------------------------------------------


def test_authorizers_accept_what_go_spiffes_accept() -> None:
    assert authorize_any().allows(BATCH)
    assert authorize_id(WEB).allows(WEB) and not authorize_id(WEB).allows(BATCH)
    assert authorize_id("spiffe://Example.ORG/web").allows(WEB)  # the trust domain is compared lower-cased
    assert not authorize_id(WEB).allows("spiffe://example.org/Web")  # the path is not
    one_of = authorize_one_of(WEB, "spiffe://example.org/api")
    assert one_of.allows("spiffe://example.org/api") and not one_of.allows(BATCH)
    assert authorize_one_of([WEB, BATCH]).allows(BATCH)
    member = authorize_member_of("example.org")
    assert member.allows(BATCH) and not member.allows("spiffe://other.org/web")
    assert authorize_member_of("spiffe://example.org").allows(WEB)
    matcher = adapt_matcher(lambda spiffe_id: spiffe_id.endswith("/web"))
    assert matcher.allows(WEB) and not matcher.allows(BATCH)

    def broken(spiffe_id: str) -> bool:
        raise RuntimeError("policy store down")

    assert not adapt_matcher(broken).allows(WEB)  # a matcher that fails refuses


def test_the_peer_s_spiffe_id_is_its_one_spiffe_uri() -> None:
    assert spiffe_id_of(peer(WEB, dns="web.example.org")) == WEB
    assert spiffe_id_of(peer("https://example.org/web")) is None
    assert spiffe_id_of(peer(WEB, BATCH)) is None  # an SVID has exactly one
    assert spiffe_id_of(peer()) is None
    assert spiffe_id_of({}) is None and spiffe_id_of(None) is None  # no certificate (or not verified)
    authorizer = authorize_id(WEB)
    assert authorizer.refusal(peer(WEB)) is None
    assert "spiffe://example.org/batch is not authorized (accepted: spiffe://example.org/web)" in str(
        authorizer.refusal(peer(BATCH))
    )
    assert "no certificate with one SPIFFE ID" in str(authorizer.refusal({}))


def test_the_option_syntax_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_authorizer("any").allows(BATCH)
    both = parse_authorizer(f" {WEB} , spiffe://partner.org ")
    assert both.allows(WEB) and both.allows("spiffe://partner.org/x") and not both.allows(BATCH)
    assert parse_authorizer("spiffe://example.org/").allows(BATCH)  # a trust domain, trailing slash or not
    assert parse_authorizer("spiffe_matcher:allows").description == "spiffe_matcher:allows"
    for bad, says in [
        ("", "no SPIFFE ID"),
        ("example.org/web", "is not a SPIFFE ID or trust domain"),
        ("spiffe://exa mple.org/web", "is not a SPIFFE trust domain"),
        ("spiffe://example.org//web", "is not a SPIFFE ID of a workload"),
        ("no_such_module_here:allows", "cannot import the SPIFFE ID matcher"),
        ("os:sep", "is not callable"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_authorizer(bad)
    monkeypatch.delenv(AUTHORIZE_ENV, raising=False)
    assert resolve_authorizer(None) is None
    monkeypatch.setenv(AUTHORIZE_ENV, "bogus")
    with pytest.raises(ValueError, match=f"\\${AUTHORIZE_ENV}: 'bogus' is not"):
        resolve_authorizer(None)
    given = authorize_id(WEB)
    assert resolve_authorizer(given) is given  # given wins over the environment
    assert isinstance(resolve_authorizer(lambda spiffe_id: True), Authorizer)


# --- servers --------------------------------------------------------------------------------------


def svid_client(server_ca: trustme.CA, svid_ca: trustme.CA, path: str) -> ssl.SSLContext:
    """A TLS 1.3 client presenting an SVID for ``spiffe://example.org/<path>``, trusting ``server_ca``."""
    return client_context(server_ca, pair_of(mint_svid(svid_ca, path)))


@pytest.fixture(params=list(server_kinds.KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_server_refuses_clients_its_authorizer_does_not_accept_fresh_and_resumed(
    kind: str, ca: trustme.CA, tmp_path: Path
) -> None:
    """Every server kind, authorized by ``$TLSRELOAD_SPIFFE_AUTHORIZE`` (a matcher over a set the test changes):
    the web SVID gets in and resumes, the batch SVID is refused; once web leaves the set, its fresh handshakes and
    its resumed sessions are refused too, in every worker. Twisted (pyOpenSSL) refuses to start, saying why."""
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    svid_ca = trustme.CA()
    bundle = tmp_path / "clients" / "ca.crt"
    bundle.parent.mkdir()
    bundle.write_bytes(svid_ca.cert_pem.bytes())
    allowed = tmp_path / "allowed"
    allowed.write_text(f"{WEB}\n")
    port = free_port()
    command = server_kinds.args(kind, port, layout, client_ca=bundle)
    env = {**server_env(), AUTHORIZE_ENV: "spiffe_matcher:allows", ALLOWED_ENV: str(allowed)}
    with run_server(command, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        if kind == "daphne":
            wait_until(lambda: server.proc.poll() is not None, DEADLINE, what="Twisted to refuse to start")
            assert "Twisted makes its handshakes with pyOpenSSL" in server.output()
            assert AUTHORIZE_ENV in server.output()
            return
        web = svid_client(ca, svid_ca, "web")
        sessions = sessions_from_every_worker(port, web, server_kinds.workers(kind))
        assert not ask(port, svid_client(ca, svid_ca, "batch")).ok
        wait_until(lambda: refused_peers(port, web) >= 1, DEADLINE, what="a worker counting the refusal")
        assert resumes(port, web, sessions), "resumption works at all"
        replace_file(allowed, b"")  # every worker's next handshake reads it (spiffe_matcher)
        assert not ask(port, web).ok
        answers = [ask(port, web, session) for session in sessions.values() for _ in range(8)]
        assert not any(answer.ok for answer in answers), "a session resumed after its peer left the accepted set"
        output = server.output()
    assert f"refused a TLS handshake: {BATCH} is not authorized (accepted: spiffe_matcher:allows)" in output
    assert output.count(f"refused a TLS handshake: {BATCH} is not authorized") <= server_kinds.workers(kind)


def refused_peers(port: int, ctx: ssl.SSLContext) -> float:
    """``tlsreload_unauthorized_peers_total{side="server"}`` in the /metrics of the worker that answers."""
    body = request(port, ctx, "/metrics")
    found = re.search(rb'(?m)^tlsreload_unauthorized_peers_total\{side="server"\} ([0-9.]+)$', body)
    return float(found.group(1)) if found else 0.0


def test_grpc_server_credentials_refuse_an_authorizer_they_cannot_apply(
    ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tlsreload_plugins.grpc import server_credentials

    place_good(tmp_path / "tls.crt", tmp_path / "tls.key", ca)
    monkeypatch.setenv(AUTHORIZE_ENV, "any")
    with pytest.raises(ValueError, match="gRPC's server makes its handshakes in its own TLS stack"):
        server_credentials(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))


# --- the function-style glues' own Python entry points ----------------------------------------------


Check = Callable[[ssl.SSLContext], None]


def via_aiohttp(cert: str, key: str, bundle: str, check: Check) -> None:
    from aiohttp import web

    from tlsreload_plugins.aiohttp import reloading

    app = web.Application()
    context = reloading(app, cert, key, ca_certs=bundle, authorize=WEB)

    async def run() -> None:
        runner = web.AppRunner(app)
        await runner.setup()  # enters the app's cleanup_ctx, whose first entry stops the checks on cleanup
        try:
            await asyncio.to_thread(check, context)
        finally:
            await runner.cleanup()

    asyncio.run(run())


def via_websockets(cert: str, key: str, bundle: str, check: Check) -> None:
    from tlsreload_plugins.websockets import reloading

    async def run() -> None:
        async with reloading(cert, key, ca_certs=bundle, authorize=WEB) as context:
            await asyncio.to_thread(check, context)

    asyncio.run(run())


def via_uvicorn(cert: str, key: str, bundle: str, check: Check) -> None:
    import uvicorn

    from tlsreload_plugins.uvicorn import reloading_certificates, reloading_ssl_context

    async def app(scope: object, receive: object, send: object) -> None:
        pass

    factory = functools.partial(reloading_ssl_context, authorize=WEB)
    config = uvicorn.Config(app, ssl_certfile=cert, ssl_keyfile=key, ssl_ca_certs=bundle, ssl_context_factory=factory)
    config.load()  # uvicorn calls the factory: no CERT_REQUIRED given, the authorizer requires client certificates
    context = config.ssl
    assert context is not None

    async def run() -> None:
        async with reloading_certificates():  # as the app's lifespan would: checks, then stops and unregisters
            await asyncio.to_thread(check, context)

    asyncio.run(run())


def via_tornado(cert: str, key: str, bundle: str, check: Check) -> None:
    from tlsreload_plugins.tornado import reloading

    tls = reloading({"certfile": cert, "keyfile": key, "ca_certs": bundle}, authorize=WEB)  # no cert_reqs
    try:
        check(tls.context())
    finally:
        tls.close()


def via_cheroot(cert: str, key: str, bundle: str, check: Check) -> None:
    from tlsreload_plugins.cheroot import ReloadingSSLAdapter, reloaders

    adapter = ReloadingSSLAdapter(cert, key, bundle, authorize=WEB)  # no verify mode set on its context
    try:
        assert adapter.reloader in reloaders() and adapter.context is adapter.reloader.context
        check(adapter.context)
    finally:
        adapter.close()


def via_sanic(cert: str, key: str, bundle: str, check: Check) -> None:
    from sanic import Sanic

    from tlsreload_plugins.sanic import ReloadingCertLoader, reloaders, reloading
    from tlsreload_plugins.serving import lifespan

    app: Sanic[Any, Any] = Sanic(f"tlsreload_authorize_{secrets.token_hex(4)}")
    try:
        reloading(app, authorize=WEB)
        before = set(reloaders())
        context = ReloadingCertLoader({"cert": cert, "key": key, "ca_certs": bundle}).load(app)  # as a worker does
        (reloader,) = set(reloaders()) - before
        try:
            assert context is not None and context is reloader.context
            check(context)
        finally:
            driver = lifespan.unregister(reloader)  # the worker's checking thread: the worker's exit would end it
            assert isinstance(driver, ThreadDriver)
            driver.stop()
    finally:
        Sanic.unregister_app(app)


GLUES: dict[str, Callable[[str, str, str, Check], None]] = {
    "aiohttp reloading": via_aiohttp,
    "websockets reloading": via_websockets,
    "uvicorn reloading_ssl_context": via_uvicorn,
    "tornado reloading": via_tornado,
    "cheroot ReloadingSSLAdapter": via_cheroot,
    "sanic reloading": via_sanic,
}


def echo_once(context: ssl.SSLContext, client: ssl.SSLContext) -> tuple[bytes | None, BaseException | None]:
    """One connection from ``client`` to a plain socket server in a thread serving ``context`` (accept,
    ``wrap_socket(server_side=True)``, read, echo): what the client read back (``None``: its handshake or read
    failed), and what the server's side raised."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(DEADLINE)
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError as e:
            raised.append(e)
            return
        conn.settimeout(DEADLINE)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(tls.recv(64))
        except OSError as e:  # ssl.SSLError, Unauthorized among them
            raised.append(e)
        finally:
            conn.close()

    thread = threading.Thread(target=serve, name="authorize-echo", daemon=True)
    thread.start()
    got: bytes | None
    try:
        with handshake(listener.getsockname()[1], client) as tls:
            tls.sendall(b"ping")
            got = tls.recv(64)
    except OSError:
        got = None
    finally:
        thread.join(DEADLINE)
        listener.close()
    assert not thread.is_alive()
    return got, raised[0] if raised else None


@pytest.mark.parametrize("glue", list(GLUES))
def test_function_style_glues_take_authorize_from_python(
    glue: str, ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each glue's own entry point with ``authorize=``, on files (and a client-CA bundle, no verify mode asked
    for): the context it hands its server has the authorizer and requires client certificates; a server on it
    lets in the web SVID and refuses the batch one in the handshake."""
    monkeypatch.delenv(AUTHORIZE_ENV, raising=False)  # the keyword alone
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    place_good(cert, key, ca)
    svid_ca = trustme.CA()
    bundle = tmp_path / "clients.pem"
    bundle.write_bytes(svid_ca.cert_pem.bytes())
    web, batch = svid_client(ca, svid_ca, "web"), svid_client(ca, svid_ca, "batch")
    checked: list[ssl.SSLContext] = []

    def check(context: ssl.SSLContext) -> None:
        authorizer = authorizer_of(context)
        assert authorizer is not None and authorizer.description == WEB, glue
        assert context.verify_mode == ssl.CERT_REQUIRED, glue
        assert echo_once(context, web) == (b"ping", None), glue
        got, refused = echo_once(context, batch)
        assert got != b"ping" and isinstance(refused, Unauthorized), (glue, got, refused)
        assert f"{BATCH} is not authorized (accepted: {WEB})" in str(refused), refused
        checked.append(context)

    GLUES[glue](str(cert), str(key), str(bundle), check)
    assert len(checked) == 1, "the glue never handed its context over"


# --- clients --------------------------------------------------------------------------------------


def write_pair(directory: Path, name: str, pair: Pair) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    return cert, key


@pytest.fixture
def svid_server(tmp_path: Path) -> tuple[tuple[Path, Path], trustme.CA, Path]:
    """The files of a server with the SVID ``spiffe://example.org/api`` (no DNS name), asking clients for SVIDs of
    the same trust domain: ((certificate, key), the trust domain's CA, the bundle file)."""
    svid_ca = trustme.CA()
    pair = write_pair(tmp_path / "server", "api", pair_of(mint_svid(svid_ca, "api")))
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(svid_ca.cert_pem.bytes())
    return pair, svid_ca, bundle


def client_identity(tmp_path: Path, svid_ca: trustme.CA, bundle: Path, authorize: str | None) -> ClientIdentity:
    cert, key = write_pair(tmp_path / "client", "web", pair_of(mint_svid(svid_ca, "web")))
    return ClientIdentity(str(cert), str(key), cafile=str(bundle), watch=False, authorize=authorize, metrics=True)


def test_clients_check_the_server_s_spiffe_id_instead_of_its_host_name(
    svid_server: tuple[tuple[Path, Path], trustme.CA, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx, requests and aiohttp on a ClientIdentity with an authorizer reach a server whose SVID has no DNS name
    when its ID is accepted (no ``check_hostname = False`` written), and are refused in the handshake when it is not;
    without an authorizer, the host name is checked as always (and fails: the SVID names no host)."""
    import aiohttp
    import httpx
    import requests

    from tlsreload_plugins.client.aiohttp import ReloadingConnector
    from tlsreload_plugins.client.httpx import reloading_client
    from tlsreload_plugins.client.requests import ReloadingAdapter

    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    (cert, key), svid_ca, bundle = svid_server
    port = free_port()
    args = [str(TESTS / "mtls_servers.py"), "http", "--cert", str(cert), "--key", str(key)]
    args += ["--client-ca", str(bundle), "--port", str(port)]
    url = f"https://localhost:{port}/"
    with run_server([sys.executable, *args], tmp_path / "server.log", port) as running:
        wait_until(lambda: "ready" in running.output(), DEADLINE, what="the mTLS server to listen")

        def via_httpx(identity: ClientIdentity) -> int:
            with reloading_client(identity) as client:
                return client.get(url).status_code

        def via_requests(identity: ClientIdentity) -> int:
            with requests.Session() as session:
                session.mount("https://", ReloadingAdapter(identity))
                return session.get(url, timeout=10).status_code

        def via_aiohttp(identity: ClientIdentity) -> int:
            async def get() -> int:
                async with (
                    aiohttp.ClientSession(connector=ReloadingConnector(identity)) as session,
                    session.get(url) as response,
                ):
                    return response.status

            return asyncio.run(get())

        for name, via, refused in [
            ("httpx", via_httpx, httpx.ConnectError),
            ("requests", via_requests, requests.exceptions.SSLError),
            ("aiohttp", via_aiohttp, aiohttp.ClientConnectorError),
        ]:
            before = REGISTRY.get_sample_value("tlsreload_unauthorized_peers_total", {"side": "client"}) or 0.0
            accepted = client_identity(tmp_path / name, svid_ca, bundle, "spiffe://example.org/api")
            assert via(accepted) == 200, name
            for authorize in ("spiffe://example.org/other", None):
                identity = client_identity(tmp_path / name, svid_ca, bundle, authorize)
                with pytest.raises(refused) as raised:
                    via(identity)
                identity.close()
                expected = Unauthorized if authorize else ssl.SSLCertVerificationError
                assert any(isinstance(e, expected) for e in chain_of(raised.value)), (name, authorize, raised.value)
            counted = REGISTRY.get_sample_value("tlsreload_unauthorized_peers_total", {"side": "client"})
            assert counted == before + 1, (name, counted, before)  # the refused server, counted once
            assert accepted.authorizer is not None
            refusals = accepted.authorizer.refused
            accepted.close()
            assert refusals == 0
    said = [r.getMessage() for r in caplog.records if "refused a TLS handshake" in r.getMessage()]
    other = "the client refused a TLS handshake: spiffe://example.org/api is not authorized"
    assert said == [f"{other} (accepted: spiffe://example.org/other) (said once per peer ID; counted)"] * 3


def test_grpc_channels_refuse_an_identity_with_an_authorizer(
    svid_server: tuple[tuple[Path, Path], trustme.CA, Path], tmp_path: Path
) -> None:
    """gRPC's channels make their handshakes in gRPC's TLS stack: an authorizer there would be silently ignored."""
    from tlsreload_plugins.client.grpc import AsyncReloadingChannel, ReloadingChannel

    _, svid_ca, bundle = svid_server
    identity = client_identity(tmp_path, svid_ca, bundle, "spiffe://example.org/api")
    for channel in (ReloadingChannel, AsyncReloadingChannel):
        with pytest.raises(ValueError, match=re.escape("cannot apply an authorizer (spiffe://example.org/api)")):
            channel(identity, "localhost:1")
    identity.close()


def chain_of(error: BaseException) -> list[BaseException]:
    """``error`` and what caused it, as far as the chain goes (libraries wrap the ssl error)."""
    found: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in found:
        found.append(seen)
        wrapped = seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None
        seen = seen.__cause__ or seen.__context__ or wrapped
    return found


# --- the drop-ins ----------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_in", ["tlsreload-uvicorn", "gunicorn"])
def test_drop_ins_serve_the_svid_asked_for_and_authorize_clients_by_spiffe_id(
    drop_in: str, tmp_path: Path, ca: trustme.CA
) -> None:
    """The drop-ins on the Workload API, two workers: ``--tls-spiffe-id`` (gunicorn: ``tls_spiffe_id``) picks the
    second SVID of the answer, ``--tls-spiffe-authorize`` (``tls_spiffe_authorize``) lets in the web client and
    refuses the batch one in every worker, with no ``--ssl-cert-reqs``: an authorizer requires client certificates."""
    api = WorkloadAPI(tmp_path)
    first, chosen = mint_svid(ca, "default", "localhost"), mint_svid(ca, "api", "localhost")
    api.send([first, chosen])
    port = free_port()
    if drop_in == "gunicorn":
        (tmp_path / "gunicorn.conf.py").write_text(
            "from tlsreload_plugins.gunicorn import reloading\n\n"
            f"tls_spiffe = {api.endpoint!r}\n"
            f"tls_spiffe_id = {chosen.spiffe_id!r}\n"
            f"tls_spiffe_authorize = {WEB!r}\n\n"
            "reloading(globals())\n"
        )
        args = ["-m", "gunicorn", "-c", str(tmp_path / "gunicorn.conf.py"), "--bind", f"127.0.0.1:{port}"]
        args += ["--no-control-socket", "--graceful-timeout", "5", "--workers", "2", "gunicorn_apps:wsgi"]
    else:
        args = ["-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS), "--port", str(port)]
        args += ["--host", "127.0.0.1", "--workers", "2", f"--tls-spiffe={api.endpoint}"]
        args += ["--tls-spiffe-id", chosen.spiffe_id, "--tls-spiffe-authorize", WEB]
    env = {**server_env(), AUTHORIZE_ENV: ""}
    web, batch = svid_client(ca, ca, "web"), svid_client(ca, ca, "batch")
    with api, run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        wait_until(lambda: ask(port, web).ok, DEADLINE, what="serving")
        with handshake(port, web) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None and serial_of(der) == serial_of(chosen.chain)
        sessions_from_every_worker(port, web, 2)
        assert not any(ask(port, batch).ok for _ in range(6))
        output = server.output()
    assert f"refused a TLS handshake: {BATCH} is not authorized (accepted: {WEB})" in output, output


@pytest.mark.parametrize("kind", ["tlsreload-uvicorn", "tlsreload-hypercorn"])
def test_drop_ins_take_the_authorizer_as_an_option_on_files(kind: str, ca: trustme.CA, tmp_path: Path) -> None:
    """``--tls-spiffe-authorize`` on files (an SVID issued by cert-manager's csi-driver-spiffe, say), two workers:
    the option reaches every worker (hypercorn's spawned ones through its configuration)."""
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    bundle = tmp_path / "ca.crt"
    bundle.write_bytes(ca.cert_pem.bytes())
    port = free_port()
    command = server_kinds.args(kind, port, layout, "--tls-spiffe-authorize", WEB, client_ca=bundle)
    web, batch = svid_client(ca, ca, "web"), svid_client(ca, ca, "batch")
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        sessions_from_every_worker(port, web, server_kinds.workers(kind))
        assert not any(ask(port, batch).ok for _ in range(6))
        output = server.output()
    assert f"refused a TLS handshake: {BATCH} is not authorized (accepted: {WEB})" in output, output


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--tls-spiffe-authorize", "web"], "argument --tls-spiffe-authorize: 'web' is not a SPIFFE ID"),
        (["--tls-spiffe=unix:///nowhere", "--tls-spiffe-id", "web"], "argument --tls-spiffe-id: 'web' is not"),
        (["--tls-spiffe-federation=a b"], "argument --tls-spiffe-federation: 'a b' is not a SPIFFE trust domain"),
        (["--tls-spiffe-id", WEB], "--tls-spiffe-id chooses what comes from SPIFFE's Workload API: it needs"),
    ],
)
def test_tlsreload_uvicorn_s_bad_spiffe_options_are_usage_errors_naming_them(
    options: list[str], says: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS)]
    result = subprocess.run([*command, *options], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("tls_spiffe_authorize = 'web'", "tls_spiffe_authorize: 'web' is not a SPIFFE ID"),
        ("tls_spiffe_id = 'spiffe://example.org/a'", "tls_spiffe_id chooses what comes from SPIFFE's Workload API"),
        ("tls_spiffe_federation = ['a b']", "tls_spiffe_federation: 'a b' is not a SPIFFE trust domain"),
    ],
)
def test_gunicorn_s_bad_spiffe_settings_halt_naming_them(
    setting: str, says: str, tmp_path: Path, ca: trustme.CA
) -> None:
    place_good(tmp_path / "tls.crt", tmp_path / "tls.key", ca)
    (tmp_path / "gunicorn.conf.py").write_text(
        f"from tlsreload_plugins.gunicorn import reloading\n\n{setting}\n\nreloading(globals())\n"
    )
    args = ["-m", "gunicorn", "-c", "gunicorn.conf.py", "--certfile", "tls.crt", "--keyfile", "tls.key"]
    args += ["--bind", f"127.0.0.1:{free_port()}", "gunicorn_apps:wsgi"]
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, **server_env()},
    )
    assert result.returncode == 1, result.stderr
    assert says in result.stderr, result.stderr
