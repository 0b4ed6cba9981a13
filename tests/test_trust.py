"""A change of what a server trusts holds for resumed sessions as for new ones, in every server of the shared matrix.

A resumed TLS session skips certificate verification: the client certificate comes from the session. So when
the client-CA bundle stops trusting a CA, a client holding a session made before the change must not get back
in by offering it. Each server kind of :mod:`server_kinds` runs with a client-CA bundle; for TLS 1.3 (tickets),
TLS 1.2 with tickets and TLS 1.2 with session ids only (the client sets ``OP_NO_TICKET``), one after the other
on the same server:

1. a client (one :class:`ssl.SSLContext` for its identity: Python offers a session only through the context that
   made it) keeps a session from every worker, and at least one of them resumes: resumption works at all;
2. the bundle is replaced by another CA's (renamed into place), and every worker lets the other CA's client in;
3. every session kept in 1, offered again several times, gets no answer; a fresh handshake is refused too;
4. sessions made after the change resume as before.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme
from prometheus_client import CollectorRegistry

import server_kinds
from hostile import place_good
from test_hostile import TESTS, server_env
from tls_server import make_recipe
from tlsreload_plugins import Outcome, Reloader
from tlsreload_plugins.metrics import observe
from tlstest import (
    HOST,
    Pair,
    RenameEachLayout,
    Server,
    client_context,
    free_port,
    issue,
    replace_file,
    run_server,
    wait_until,
)

DEADLINE = 30.0
"""Seconds for a server to start, or for every worker to take the new bundle (the interval is 0.3 s)."""
OFFERS = 8
"""How often each session kept before the change is offered after it (either worker may answer)."""
ATTEMPTS = 40
"""Connections offering a session before resumption counts as not working (either worker may answer)."""

VERSIONS = {
    "TLS 1.3": (ssl.TLSVersion.TLSv1_3, False),
    "TLS 1.2 tickets": (ssl.TLSVersion.TLSv1_2, False),
    "TLS 1.2 session ids": (ssl.TLSVersion.TLSv1_2, True),
}
THREADED = ("sync", "gthread", "gevent", "cheroot", "tornado", "gunicorn tornado")
NEVER_RESUMED = {
    # These close a connection without a TLS shutdown, and OpenSSL drops the session of a connection that ends so
    # from its cache: with or without tlsreload, they resume TLS 1.2 sessions by ticket only, never by id.
    **{(kind, "TLS 1.2 session ids"): "sessions by id" for kind in THREADED},
    # Twisted's CertificateOptions turn the session cache and tickets off unless asked (enableSessions).
    **{("daphne", version): "sessions (Twisted's default)" for version in VERSIONS},
}
"""(kind, version) pairs where the server resumes no session, before or after any change: there the test checks
that nothing resumes, and still that no session made before a change gets back in."""
SOMETIMES_RESUMED = {("tlsreload-hypercorn trio", "TLS 1.2 session ids")}
"""(kind, version) pairs where the server's own close decides whether a session stays in its cache: trio sends its
close_notify or not depending on who closes first, and OpenSSL drops the session of a connection closed without it
(no resumption by id at all in 1 of 3 full runs). There the test does not ask for resumption, and still checks that
no session made before a change gets back in."""


def uvicorn_default_ciphers() -> str | None:
    import uvicorn

    default = inspect.signature(uvicorn.Config).parameters["ssl_ciphers"].default
    return default if isinstance(default, str) else None


NO_TLS12 = {("tlsreload-uvicorn", name) for name in VERSIONS if "1.2" in name and uvicorn_default_ciphers() == "TLSv1"}
"""Versions a server cannot speak with this client at all: older uvicorn's default ciphers (``TLSv1``) are CBC-SHA1
suites, which Python's clients refuse; there TLS 1.2 is left out."""


@dataclass
class Answer:
    """What one connection got: an HTTP 200 (with the worker's pid), the session, whether it was resumed."""

    ok: bool
    pid: int | None = None
    session: ssl.SSLSession | None = None
    resumed: bool = False


Ask = Callable[[int, ssl.SSLContext, "ssl.SSLSession | None"], Answer]


def client(
    server_ca: trustme.CA, holder: Pair, version: ssl.TLSVersion, no_ticket: bool, alpn: list[str] | None = None
) -> ssl.SSLContext:
    ctx = client_context(server_ca, holder, minimum_version=version, maximum_version=version)
    if no_ticket:
        ctx.options |= ssl.OP_NO_TICKET
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def ask(port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> Answer:
    """``GET /`` on a new connection offering ``session``; any refusal (handshake, reset, no 200) is not ok."""
    try:
        with (
            socket.create_connection((HOST, port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
        ):
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            response = b""
            while chunk := tls.recv(65536):  # reading to the end reads TLS 1.3's session tickets too
                response += chunk
            resumed, kept = tls.session_reused, tls.session
    except (OSError, ssl.SSLError):
        return Answer(ok=False)
    match = re.search(rb"(?im)^x-worker-pid: *(\d+)|pid=(\d+)", response)
    ok = response.startswith(b"HTTP/1.1 200")
    return Answer(ok=ok, pid=int(match.group(1) or match.group(2)) if match else None, session=kept, resumed=resumed)


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # then empty SETTINGS


def ask_h2(port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> Answer:
    """HTTP/2's connection preface on a new connection offering ``session``: ok when the server answers with a
    frame (gRPC's server settings), not with an alert or a close."""
    try:
        with (
            socket.create_connection((HOST, port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
        ):
            tls.sendall(H2_PREFACE)
            frame = tls.recv(9)
            return Answer(ok=len(frame) > 0, pid=0, session=tls.session, resumed=tls.session_reused)
    except (OSError, ssl.SSLError):
        return Answer(ok=False)


def sessions_from_every_worker(
    port: int, ctx: ssl.SSLContext, workers: int, ask: Ask = ask
) -> dict[int, ssl.SSLSession]:
    """A session from each of ``workers`` processes, made by fresh handshakes."""
    sessions: dict[int, ssl.SSLSession] = {}

    def every_worker() -> bool:
        answer = ask(port, ctx, None)
        if answer.ok and answer.pid is not None and answer.session is not None:
            sessions.setdefault(answer.pid, answer.session)
        return len(sessions) >= workers

    wait_until(every_worker, DEADLINE, interval=0.01, what=f"a session from each of {workers} workers")
    return sessions


def resumes(port: int, ctx: ssl.SSLContext, sessions: dict[int, ssl.SSLSession], ask: Ask = ask) -> bool:
    """Whether one of ``sessions``, offered again, resumes (each worker may answer any connection). Each session is
    offered on two connections in a row: two workers taking connections in turn would otherwise answer every offer
    of one worker's session with the other, in step with the sessions offered in turn (seen with Sanic)."""
    offered = list(sessions.values())
    return any(ask(port, ctx, offered[i // 2 % len(offered)]).resumed for i in range(ATTEMPTS))


def trust(path: Path, ca: trustme.CA) -> None:
    """Replace the client-CA bundle at ``path`` with ``ca``'s certificate, renamed into place."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(ca.cert_pem.bytes())
    os.replace(staged, path)


EXTRA_KINDS = {
    "gunicorn tornado": server_kinds.gunicorn_kind("tornado"),
    "tlsreload-hypercorn trio": lambda port, layout, client_ca: server_kinds.args(
        "tlsreload-hypercorn", port, layout, "--worker-class", "trio", client_ca=client_ca
    ),
    "sanic list": lambda port, layout, client_ca: sanic_list(port, layout, client_ca),
}
"""Worker classes this test meets beyond the matrix's kinds (the hostile cases do not)."""


def sanic_list(port: int, layout: RenameEachLayout, client_ca: Path) -> list[str]:
    """Sanic with a list of two certificates (its certificate selector), the layout's first: it answers
    ``localhost``."""
    other = issue(trustme.CA(), "other.example")
    other_cert, other_key = layout.cert_path.with_name("other.crt"), layout.key_path.with_name("other.key")
    other_cert.write_bytes(other.chain)
    other_key.write_bytes(other.key)
    command = server_kinds.args(
        "sanic", port, layout, "--cert", str(other_cert), "--key", str(other_key), client_ca=client_ca
    )
    return command


@pytest.fixture(params=[*server_kinds.KINDS, *EXTRA_KINDS])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_sessions_made_before_a_client_ca_change_never_resume(kind: str, ca: trustme.CA, tmp_path: Path) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    bundle = tmp_path / "clients" / "ca.crt"
    bundle.parent.mkdir()
    client_cas = [trustme.CA(), trustme.CA()]
    trust(bundle, client_cas[0])
    port = free_port()
    if kind in EXTRA_KINDS:
        command = EXTRA_KINDS[kind](port, layout, client_ca=bundle)
    else:
        command = server_kinds.args(kind, port, layout, client_ca=bundle)
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        changes_hold(kind, port, server, ca, bundle, client_cas, server_kinds.workers(kind))


def test_grpc_sessions_made_before_a_client_ca_change_never_resume(ca: trustme.CA, tmp_path: Path) -> None:
    """gRPC builds a new server context (new session cache and ticket keys) for each certificate configuration."""
    pair = issue(ca, "localhost")
    cert, key, bundle = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    client_cas = [trustme.CA(), trustme.CA()]
    trust(bundle, client_cas[0])
    port = free_port()
    command = [sys.executable, str(TESTS / "grpc_apps.py"), "--certfile", str(cert), "--keyfile", str(key)]
    command += ["--port", str(port), "--ca-certs", str(bundle)]
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        changes_hold("grpc", port, server, ca, bundle, client_cas, 1, ask_h2, alpn=["h2"])


def changes_hold(
    kind: str,
    port: int,
    server: Server,
    ca: trustme.CA,
    bundle: Path,
    client_cas: list[trustme.CA],
    workers: int,
    ask: Ask = ask,
    alpn: list[str] | None = None,
) -> None:
    """The module docstring's steps, for each TLS version, against ``server`` trusting ``client_cas[0]`` first."""
    holders = [issue(client_ca, "client.example") for client_ca in client_cas]
    trusted = 0
    for name, (version, no_ticket) in VERSIONS.items():
        if (kind, name) in NO_TLS12:
            continue
        before = client(ca, holders[trusted], version, no_ticket, alpn)
        try:
            kept = sessions_from_every_worker(port, before, workers, ask)
        except AssertionError:
            raise AssertionError(f"{kind}, {name}: no answer before the change\n{server.output()}") from None
        never = NEVER_RESUMED.get((kind, name))
        sometimes = (kind, name) in SOMETIMES_RESUMED
        assert sometimes or resumes(port, before, kept, ask) != bool(never), (
            f"{kind}, {name}: resumes {never} now: remove it from NEVER_RESUMED\n{server.output()}"
            if never
            else f"{kind}, {name}: no session resumes before the change at all\n{server.output()}"
        )

        trusted = 1 - trusted
        trust(bundle, client_cas[trusted])
        after = client(ca, holders[trusted], version, no_ticket, alpn)
        sessions_from_every_worker(port, after, workers, ask)  # every worker takes the new bundle

        answered = [ask(port, before, session) for session in kept.values() for _ in range(OFFERS)]
        assert not any(answer.ok for answer in answered), (
            f"{kind}, {name}: a session made before the client-CA change got back in "
            f"({sum(answer.resumed for answer in answered)} of {len(answered)} offers resumed)"
        )
        assert not ask(port, before, None).ok, f"{kind}, {name}: the removed CA's client got in with a new handshake"
        kept_after = sessions_from_every_worker(port, after, workers, ask)
        assert sometimes or resumes(port, after, kept_after, ask) != bool(never), (
            f"{kind}, {name}: sessions made after the change do not resume\n{server.output()}"
        )


class InMemory:
    """A server connection made by ``context.wrap_bio`` now (as asyncio does when it accepts one), handshaking
    later with a client through memory."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.client_resumed = False
        """Whether the client's last handshake resumed its session (the server took it): true even when the
        server refused the connection once its handshake completed."""

    def answer(self, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> Answer:
        """A client of ``ctx`` offering ``session`` handshakes and reads ``ok`` (and TLS 1.3's tickets)."""
        client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(client_in, client_out, server_hostname="localhost", session=session)
        try:
            for _ in range(10):
                for end in (tls, self.tls):
                    with contextlib.suppress(ssl.SSLWantReadError):
                        end.do_handshake()
                        self.client_resumed = self.client_resumed or (end is tls and tls.session_reused)
                self.incoming.write(client_out.read())
                client_in.write(self.outgoing.read())
            self.tls.write(b"ok")
            client_in.write(self.outgoing.read())
            received = tls.read(2)
        except ssl.SSLError:  # refused by either end, or no answer
            return Answer(ok=False)
        return Answer(ok=received == b"ok", session=tls.session, resumed=self.tls.session_reused)


@dataclass
class Straddle:
    """A reloader serving in-memory connections in one TLS version, and a session of each of ``holders`` made before
    any change."""

    reloader: Reloader
    version: ssl.TLSVersion
    no_ticket: bool
    server_ca: trustme.CA
    holders: list[Pair]
    kept: list[InMemory]
    """Kept open: OpenSSL drops the session of a connection freed unfinished."""
    clients: dict[int, ssl.SSLContext] = field(default_factory=dict)
    sessions: dict[int, ssl.SSLSession] = field(default_factory=dict)

    def client(self, holder: Pair) -> ssl.SSLContext:
        """One client context per holder: Python offers a session only through the context that made it."""
        if id(holder) not in self.clients:
            self.clients[id(holder)] = client(self.server_ca, holder, self.version, self.no_ticket)
        return self.clients[id(holder)]


def straddle(name: str, reloader: Reloader, server_ca: trustme.CA, holders: list[Pair]) -> Straddle:
    """Every one of ``holders`` gets in with a full handshake, and its session resumes: resumption works at all."""
    version, no_ticket = VERSIONS[name]
    made = Straddle(reloader, version, no_ticket, server_ca, holders, [])
    for holder in holders:
        made.kept.append(InMemory(reloader.context))
        answer = made.kept[-1].answer(made.client(holder))
        assert answer.ok and answer.session is not None and not answer.resumed, "a client is refused at all"
        made.sessions[id(holder)] = answer.session
        made.kept.append(InMemory(reloader.context))
        assert made.kept[-1].answer(made.client(holder), answer.session).resumed, "no session resumes at all"
    return made


def refused_as_resumed(early: InMemory, straddled: Straddle, holder: Pair) -> None:
    """``early`` (created before the change) resumes ``straddled``'s session and is refused once it did."""
    answer = early.answer(straddled.client(holder), straddled.sessions[id(holder)])
    assert early.client_resumed, "the straddler did not resume: its refusal shows nothing"
    assert not answer.ok, "a session made before the trust changed resumed on a connection accepted before it"


@pytest.mark.parametrize("name", list(VERSIONS))
def test_a_connection_accepted_before_a_client_ca_change_handshakes_with_the_new_trust(
    name: str, ca: trustme.CA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection the server accepted before the change, whose ClientHello comes after it (a straddler), makes a
    full handshake verified against the new bundle; it would resume from the session cache of the context it was
    created on, so a resumed session is refused once its handshake completed, counted in status() and metrics and
    said once. The next connection gets the new context, where sessions made after the change resume."""
    client_cas = [trustme.CA(), trustme.CA()]
    cert, key, bundle = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    pair = issue(ca, "localhost")
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    bundle.write_bytes(client_cas[0].cert_pem.bytes() + client_cas[1].cert_pem.bytes())
    recipe = make_recipe(str(cert), str(key), str(bundle))
    reloader = Reloader(str(cert), str(key), ca_certs=str(bundle), recipe=recipe)
    removed, kept = issue(client_cas[0], "removed.example"), issue(client_cas[1], "kept.example")
    straddled = straddle(name, reloader, ca, [removed, kept])
    early = [InMemory(reloader.context) for _ in range(4)]
    registry = CollectorRegistry()
    assert observe(reloader, registry)

    trust(bundle, client_cas[1])  # the first CA removed
    assert reloader.check() is Outcome.RELOADED
    assert early[0].answer(straddled.client(kept)).ok, "a still-trusted client's full handshake was refused"
    assert not early[1].answer(straddled.client(removed)).ok, "the removed CA's client got in on a straddler"
    assert reloader.status().refused_resumptions == 0  # full handshakes: nothing resumed
    with caplog.at_level(logging.INFO, logger="tlsreload_plugins"):
        refused_as_resumed(early[2], straddled, removed)
        refused_as_resumed(early[3], straddled, kept)  # its session too: it was made on the old context
    assert reloader.status().refused_resumptions == 2
    assert len([r for r in caplog.records if "refused a TLS session resumed" in r.getMessage()]) == 1
    assert reloader.check() is Outcome.UNCHANGED  # metrics take the count at a check
    assert (
        registry.get_sample_value("tlsreload_refused_resumptions_total", {"certfile": str(cert), "identity": "default"})
        == 2
    )
    assert not InMemory(reloader.context).answer(straddled.client(removed), straddled.sessions[id(removed)]).ok
    straddled.kept.append(InMemory(reloader.context))
    made_after = straddled.kept[-1].answer(straddled.client(kept))
    assert made_after.ok and not made_after.resumed
    straddled.kept.append(InMemory(reloader.context))
    assert straddled.kept[-1].answer(straddled.client(kept), made_after.session).resumed  # they resume after it


class Threaded:
    """A server connection made by ``context.wrap_socket`` on a real socket now (as a threaded server does when it
    accepts one), served by a thread that makes the handshake the way ``driven_by`` says, reads a request and
    answers ``ok``."""

    def __init__(self, context: ssl.SSLContext, driven_by: str) -> None:
        self.client_end, server_end = socket.socketpair()
        self.client_end.settimeout(10)
        server_end.settimeout(10)
        self.tls = context.wrap_socket(server_end, server_side=True, do_handshake_on_connect=False)
        self.received: bytes | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.serve, args=(driven_by,))
        self.thread.start()

    def serve(self, driven_by: str) -> None:
        try:
            if driven_by == "do_handshake":
                self.tls.do_handshake()
            self.received = self.tls.recv(100)  # "first read": the handshake happens inside this read
            self.tls.sendall(b"ok")
        except (OSError, ssl.SSLError) as e:
            self.error = e
        finally:
            self.tls.close()

    def answer(self, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> tuple[bool, bool]:
        """A client of ``ctx`` offering ``session``: whether it got ``ok``, and whether its handshake resumed."""
        resumed = False
        try:
            with ctx.wrap_socket(self.client_end, server_hostname="localhost", session=session) as tls:
                resumed = tls.session_reused
                tls.sendall(b"GET")
                ok = tls.recv(2) == b"ok"
        except (OSError, ssl.SSLError):
            ok = False
        self.thread.join(10)
        return ok, resumed


@pytest.mark.parametrize("driven_by", ["do_handshake", "first read"])
@pytest.mark.parametrize("name", list(VERSIONS))
def test_a_threaded_server_s_straddler_handshakes_with_the_new_trust(
    name: str, driven_by: str, ca: trustme.CA, tmp_path: Path
) -> None:
    """Threaded servers make the handshake in ``do_handshake`` (Tornado, gunicorn's gthread and gevent workers,
    ``wrap_socket`` itself for cheroot, through the same method) or let the first read make it (gunicorn's sync
    worker): either way a straddler's full handshake gets the new trust, and its resumed session is refused before a
    byte is read."""
    client_cas = [trustme.CA(), trustme.CA()]
    cert, key, bundle = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    pair = issue(ca, "localhost")
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    bundle.write_bytes(client_cas[0].cert_pem.bytes() + client_cas[1].cert_pem.bytes())
    reloader = Reloader(str(cert), str(key), ca_certs=str(bundle), recipe=make_recipe(str(cert), str(key), str(bundle)))
    removed, kept = issue(client_cas[0], "removed.example"), issue(client_cas[1], "kept.example")
    straddled = straddle(name, reloader, ca, [removed, kept])
    early = [Threaded(reloader.context, driven_by) for _ in range(3)]

    trust(bundle, client_cas[1])
    assert reloader.check() is Outcome.RELOADED
    assert early[0].answer(straddled.client(kept)) == (True, False), "a still-trusted client's handshake failed"
    assert not early[1].answer(straddled.client(removed))[0], "the removed CA's client got in on a straddler"
    ok, resumed = early[2].answer(straddled.client(removed), straddled.sessions[id(removed)])
    assert resumed, "the straddler did not resume: its refusal shows nothing"
    assert not ok and early[2].received is None, "a session made before the trust changed was read from"
    assert isinstance(early[2].error, ssl.SSLError)


ONE_WORKER = ("--workers", "1")
STRADDLE_KINDS = {
    "sync": (),
    "tlsreload-uvicorn": ONE_WORKER,
    "tlsreload-hypercorn": ONE_WORKER,
    "sanic": ONE_WORKER,
    "aiohttp": (),
    "websockets": (),
    "cheroot": (),
    "daphne": (),
}
"""Kinds a straddler is made on through real sockets (one threaded, one asyncio), with the extra arguments: with one
uvicorn worker every straddler meets the worker whose session it offers; gunicorn's sync workers, each blocked on
one straddler, take one each."""


def reloads(server: Server) -> int:
    """How many reloads the server's processes have logged."""
    return server.output().count("reloaded TLS certificate")


def straddlers_after(server: Server, workers: int, change: Callable[[], None], count: int) -> list[socket.socket]:
    """``count`` connections the server accepts now, whose ClientHello is still to come once ``change`` is done and
    every one of ``workers`` processes has reloaded."""
    raws = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(count)]
    before = reloads(server)
    change()
    wait_until(lambda: reloads(server) >= before + workers, DEADLINE, what=f"{workers} reloads\n{server.output()}")
    return raws


def hello_on(raw: socket.socket, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> tuple[bool, bool]:
    """The ClientHello on ``raw`` now, then ``GET /``: whether the answer was a 200, and whether the session resumed."""
    resumed = False
    try:
        with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
            resumed = tls.session_reused
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            response = b""
            while chunk := tls.recv(65536):
                response += chunk
    except (OSError, ssl.SSLError):
        return False, resumed
    return response.startswith(b"HTTP/1.1 200"), resumed


@pytest.mark.parametrize("kind", list(STRADDLE_KINDS))
def test_a_server_s_straddlers_handshake_with_the_new_trust(kind: str, ca: trustme.CA, tmp_path: Path) -> None:
    """Connections a real server accepted before a client-CA change, whose ClientHello comes after every worker
    reloaded: a full handshake gets the new trust (a still-trusted client in, the removed CA's out); a session
    resumed from before the change is refused before the request is answered (Twisted resumes none: there the
    straddler offering one makes a full handshake)."""
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    bundle = tmp_path / "clients" / "ca.crt"
    bundle.parent.mkdir()
    cas = [trustme.CA() for _ in range(3)]
    bundle.write_bytes(cas[0].cert_pem.bytes() + cas[1].cert_pem.bytes())
    removed, kept = (client(ca, issue(c, "client.example"), ssl.TLSVersion.TLSv1_3, False) for c in cas[:2])
    port = free_port()
    command = server_kinds.args(kind, port, layout, *STRADDLE_KINDS[kind], client_ca=bundle)
    workers = 1 if STRADDLE_KINDS[kind] else server_kinds.workers(kind)
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        sessions_from_every_worker(port, removed, workers)  # the first CA's client gets in before any change

        full = straddlers_after(server, workers, lambda: trust(bundle, cas[1]), 2)  # the first CA removed
        assert hello_on(full[0], kept) == (True, False), f"{kind}: a still-trusted client's straddler was refused"
        assert not hello_on(full[1], removed)[0], f"{kind}: the removed CA's client got in on a straddler"

        kept_sessions = sessions_from_every_worker(port, kept, workers)
        never = (kind, "TLS 1.3") in NEVER_RESUMED
        assert resumes(port, kept, kept_sessions) != never, f"{kind}: resumes {'now' if never else 'no session'}"
        offered = next(iter(kept_sessions.values()))
        two_cas = cas[1].cert_pem.bytes() + cas[2].cert_pem.bytes()
        resumed = straddlers_after(server, workers, lambda: replace_file(bundle, two_cas), workers)
        answers = [hello_on(raw, kept, offered) for raw in resumed]
        assert never or any(was_resumed for _, was_resumed in answers), f"{kind}: no straddler resumed"
        for ok, was_resumed in answers:
            assert ok != was_resumed, f"{kind}: a straddler {'resumed' if ok else 'made a full handshake'}: {answers}"
