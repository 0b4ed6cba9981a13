"""Issue 27, end to end: the ``tlsreload:`` endpoint (``ssl:`` plus live reload) under real daphne and real
``twistd web``, with real TLS clients.

One daphne serves an ASGI app from a kubelet Secret volume through rotations and bad inputs under continuous
traffic, then exits on SIGTERM; one ``twistd web`` follows certbot renewals with their intermediate chain; one
daphne serves mutual TLS with an encrypted key and an SNI identity, each reloaded on its own. The parser test
compares, in this process, what ``tlsreload:`` builds with what ``ssl:`` builds from the same strings. The
hostile files of the shared matrix run against daphne through ``kinds_twisted.py``.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from hostile import HOSTILE, place_good
from revocation_steps import Mtls, revocation_holds
from tlstest import (
    HOST,
    CertbotLayout,
    Hammer,
    KubeletLayout,
    Pair,
    Server,
    client_context,
    free_port,
    get,
    issue,
    run_server,
    status_body,
    wait_for_serial,
    wait_until,
    with_password,
)

TESTS = Path(__file__).parent
TWISTD = str(Path(sys.executable).parent / "twistd")
INTERVAL = "0.3"
DEADLINE = 30.0
ROTATIONS = 3
FAILED = "certificate reload failed"
RELOADED = "reloaded TLS certificate"
WATCHING = "watching cert="
CANNOT_SERVE = "tlsreload: cannot serve TLS"
# What an unclean run leaves in daphne's or twistd's output: a traceback, an error line, a Python warning.
UNCLEAN = re.compile(r"Traceback|Unhandled Error|\bERROR\b|\bCRITICAL\b|#error\]|#critical\]|\w+Warning\b")
# RFC 7919's ffdhe2048 group: DH parameters for the dhParameters keyword, without minutes of generation.
FFDHE2048 = b"""-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
"""


# --- command lines ------------------------------------------------------------------------------


def quote(value: object) -> str:
    """An endpoint string argument with its backslashes and colons escaped (Twisted's quoteStringArgument)."""
    return str(value).replace("\\", "\\\\").replace(":", "\\:")


def tlsreload(port: int, cert: Path, key: Path, **keywords: object) -> str:
    """A ``tlsreload:`` endpoint string on 127.0.0.1:``port`` with ``keywords`` after the files."""
    fields = [f"tlsreload:{port}", f"interface={HOST}", f"privateKey={quote(key)}", f"certKey={quote(cert)}"]
    return ":".join(fields + [f"{name}={quote(value)}" for name, value in keywords.items()])


def daphne(description: str, app: str = "hostile_apps:asgi") -> list[str]:
    return ["-m", "daphne", "-e", description, app]


def twistd_web(description: str, root: Path) -> list[str]:
    return [TWISTD, "-n", "--pidfile=", "web", "--listen", description, "--path", str(root)]


def server_env() -> dict[str, str]:
    paths = [str(TESTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), "TLSRELOAD_INTERVAL": INTERVAL}


def start(args: list[str], log_dir: Path, port: int) -> AbstractContextManager[Server]:
    return run_server(args, log_dir / "server.log", port, env=server_env(), cwd=log_dir)


# --- clients and checks -------------------------------------------------------------------------


class Requests(Hammer):
    """Client threads doing whole HTTPS requests in a loop, a new connection each, counting every failure."""

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                serial, response = get(self.port, self.ctx)
                if not response.startswith(b"HTTP/1.1 200"):
                    raise AssertionError(response[:200])
            except Exception as e:
                with self._lock:
                    self.failures.append(repr(e))
            else:
                with self._lock:
                    self.successes += 1
                    self.serials.add(serial)


def status(port: int, ctx: ssl.SSLContext) -> dict[str, Any]:
    """The server's one reloader's ``status()``, from hostile_apps' ``/status``."""
    reloaders = status_body(port, ctx)["reloaders"]
    assert len(reloaders) == 1, reloaders
    found: dict[str, Any] = reloaders[0]
    return found


def rejected(port: int, ctx: ssl.SSLContext, server_name: str = "localhost") -> bool:
    try:
        get(port, ctx, server_name=server_name)
    except OSError:  # an alert from the server (ssl.SSLError), or the connection closed
        return True
    return False


def more(clients: Hammer, count: int = 10) -> None:
    target = clients.successes + count
    wait_until(lambda: clients.successes >= target, DEADLINE, what=f"{count} more successes")


def reach(clients: Hammer, serial: str) -> None:
    """Wait until ``clients`` have been served ``serial``."""
    wait_until(lambda: serial in clients.serials, DEADLINE, what=f"{type(clients).__name__} served {serial}")


def lines_with(out: str, text: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


def stop_cleanly(server: Server, *expected_warnings: str, status: int = 0) -> str:
    """SIGTERM: exit ``status``, no traceback, error or Python warning, no warning line but those expected."""
    code = server.stop(signal.SIGTERM)
    out = server.output()
    assert code == status, out
    assert not UNCLEAN.search(out), out
    for warning in lines_with(out, "WARNING") + lines_with(out, "#warn]"):
        assert any(text in warning for text in expected_warnings), out
    return out


# --- ssl: and tlsreload: parse the same strings -------------------------------------------------


def described(endpoint: Any) -> dict[str, Any]:
    """An ``SSL4ServerEndpoint``'s listening settings and every setting of the ``CertificateOptions`` its
    connections are made from, certificates and keys as DER, plus the built context's own settings."""
    from twisted.internet.ssl import CertificateOptions

    options = endpoint._sslContextFactory
    if not isinstance(options, CertificateOptions):
        options = options.options  # tlsreload's NewestContext: the options new connections get
    context = options.getContext()
    return {
        "type": type(endpoint).__name__,
        "listen": (endpoint._port, endpoint._backlog, endpoint._interface),
        "options": {name: comparable(value) for name, value in vars(options).items() if name != "_context"},
        "context": (context.get_verify_mode(), context.get_session_cache_mode(), context.get_verify_depth()),
    }


def comparable(value: Any) -> Any:
    from OpenSSL import crypto
    from twisted.internet.ssl import DiffieHellmanParameters

    if isinstance(value, list):
        return [comparable(item) for item in value]
    if isinstance(value, crypto.X509):
        return value.to_cryptography().public_bytes(serialization.Encoding.DER)
    if isinstance(value, crypto.PKey):
        key = value.to_cryptography_key()
        return key.private_bytes(  # type: ignore[union-attr]
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    if isinstance(value, DiffieHellmanParameters):
        return value._dhFile
    if inspect.ismethod(value):  # a bound method compares its object's identity: compare the function
        return value.__func__
    if type(value).__module__.startswith("twisted."):
        return type(value).__name__, comparable(sorted(vars(value).items()))
    if isinstance(value, tuple):
        return tuple(comparable(item) for item in value)
    return value


@pytest.fixture
def pem_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The files the ``ssl:`` parser tests use, escaped for endpoint strings; ``server.pem`` (the
    ``privateKey`` default: key and certificate in one file) in the working directory."""
    root_ca = trustme.CA()
    intermediate = root_ca.create_child_ca()
    pair = issue(intermediate)
    leaf = pair.leaf
    files = {
        "cert": leaf,
        "key": pair.key,
        "server.pem": pair.key + leaf,  # "{combined}" in the strings
        "chain": pair.chain[len(leaf) :] + root_ca.cert_pem.bytes(),
        "dh": FFDHE2048,
        "bare_cert": leaf.rstrip(b"\n"),
        "bare_key": pair.key.rstrip(b"\n"),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    escaped = {name: quote(tmp_path / name) for name in files}
    escaped["combined"] = escaped.pop("server.pem")
    return escaped


SSL_STRINGS = [
    "{prefix}:1234:backlog=12:privateKey={key}:certKey={cert}:sslmethod=TLSv1_2_METHOD:interface=10.0.0.1",
    "{prefix}:4321",
    "{prefix}:4321:{combined}",
    "{prefix}:4321:privateKey={combined}:interface=127.0.0.1",
    "{prefix}:1234:privateKey={key}:certKey={cert}:extraCertChain={chain}",
    "{prefix}:4321:privateKey={key}:certKey={cert}:dhParameters={dh}:sslmethod=TLS_METHOD",
    "{prefix}:1234:backlog=12:privateKey={bare_key}:certKey={bare_cert}",
]


@pytest.mark.parametrize("template", SSL_STRINGS)
def test_every_ssl_keyword_parses_as_ssl_parses_it(pem_files: dict[str, str], template: str) -> None:
    from twisted.internet.endpoints import serverFromString
    from twisted.internet.testing import MemoryReactor

    reactor = MemoryReactor()
    stock = serverFromString(reactor, template.replace("{prefix}", "ssl").format_map(pem_files))
    ours = serverFromString(reactor, template.replace("{prefix}", "tlsreload").format_map(pem_files))
    assert described(ours) == described(stock)
    # The checks start when the reactor runs and stop before it shuts down.
    assert [hook.__name__ for hook, _, _ in reactor.whenRunningHooks] == ["start"]
    assert [hook.__name__ for hook, _, _ in reactor.triggers["before"]["shutdown"]] == ["stop"]


def test_what_ssl_refuses_tlsreload_refuses(pem_files: dict[str, str]) -> None:
    from twisted.internet.endpoints import serverFromString
    from twisted.internet.testing import MemoryReactor

    reactor = MemoryReactor()
    for prefix in ("ssl", "tlsreload"):
        with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
            serverFromString(reactor, f"{prefix}:1234:privateKey={pem_files['key']}:colour=blue")
    with pytest.raises(FileNotFoundError):
        serverFromString(reactor, "ssl:1234:privateKey=missing.pem")
    with pytest.raises(SystemExit, match=r"^tlsreload: cannot serve TLS: certificate file missing.pem does not exist$"):
        serverFromString(reactor, "tlsreload:1234:privateKey=missing.pem")
    with pytest.raises(ValueError, match="interval must be a number of seconds, got 'soon'"):
        serverFromString(reactor, f"tlsreload:1234:privateKey={pem_files['combined']}:interval=soon")


# --- daphne: an ASGI app through kubelet rotations and bad inputs --------------------------------


@dataclass
class Running:
    server: Server
    port: int
    layout: KubeletLayout
    ca: trustme.CA
    ctx: ssl.SSLContext
    serial: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """daphne serving hostile_apps' ASGI app from a kubelet Secret volume (``$TLSRELOAD_INTERVAL``: 0.3 s)."""
    root = tmp_path_factory.mktemp("daphne")
    ca = trustme.CA()
    layout = KubeletLayout(root / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    with start(daphne(tlsreload(port, layout.cert_path, layout.key_path)), root, port) as server:
        ctx = client_context(ca)
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        yield Running(server, port, layout, ca, ctx, first.serial)


def test_daphne_serves_an_asgi_app_through_kubelet_rotations(served: Running) -> None:
    run = served
    rotated = []
    with Hammer(run.port, run.ctx, threads=2) as hammer, Requests(run.port, run.ctx, threads=2) as requests:
        for _ in range(ROTATIONS):
            more(hammer)
            more(requests)
            pair = issue(run.ca)
            run.layout.install(pair)
            rotated.append(pair.serial)
            reach(hammer, pair.serial)
            reach(requests, pair.serial)
    assert hammer.failures == [] and requests.failures == [], (hammer.failures[:3], requests.failures[:3])
    assert set(rotated) <= hammer.serials
    run.serial = rotated[-1]
    assert status(run.port, run.ctx)["last_error"] is None


BAD_INPUTS: dict[str, Callable[[bytes, Pair], dict[str, bytes]]] = {
    "torn write": lambda key, new: {"tls.crt": new.chain[: len(new.chain) // 2], "tls.key": key},
    "mismatched pair": lambda key, new: {"tls.crt": new.chain, "tls.key": key},
    "garbage": lambda key, new: {"tls.crt": os.urandom(1500), "tls.key": key},
    "encrypted key, no password": lambda key, new: {"tls.crt": new.chain, "tls.key": with_password(new, "x").key},
    "missing key": lambda key, new: {"tls.crt": new.chain},
}
"""Bad inputs as a kubelet Secret volume would hold them, each given the key served now and a new pair."""


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_keep_the_last_good_and_are_reported_once(served: Running, case: str) -> None:
    run = served
    before = status(run.port, run.ctx)
    offset = len(run.server.output())
    with Hammer(run.port, run.ctx, threads=2) as hammer:
        more(hammer)
        run.layout.write_files(BAD_INPUTS[case](run.layout.key_path.read_bytes(), issue(run.ca)))
        wait_until(lambda: lines_with(run.server.output()[offset:], FAILED), DEADLINE, what="the failure reported")
        checks = status(run.port, run.ctx)["checks"]
        wait_until(lambda: status(run.port, run.ctx)["checks"] >= checks + 4, DEADLINE, what="four more checks")
        after = status(run.port, run.ctx)
        reports = lines_with(run.server.output()[offset:], FAILED)
        served_while_bad = set(hammer.serials)
        fixed = issue(run.ca)
        run.layout.install(fixed)
        wait_until(lambda: fixed.serial in hammer.serials, DEADLINE, what="the hammer on the next good pair")
    assert hammer.failures == [], hammer.failures[:3]
    assert served_while_bad == {run.serial}, served_while_bad
    assert len(reports) == 1 and "WARNING" in reports[0], reports
    assert after["failures"] == before["failures"] + 1 and after["last_error"], after
    run.serial = fixed.serial


def test_daphne_exits_cleanly_on_sigterm(served: Running) -> None:
    reloads = status(served.port, served.ctx)["reloads"]
    out = stop_cleanly(served.server, FAILED)
    assert len(lines_with(out, WATCHING)) == 1 and "every 0.3s" in lines_with(out, WATCHING)[0], out
    assert len(lines_with(out, RELOADED)) == reloads, out


# --- twistd web: certbot renewals with their intermediate chain ---------------------------------


def test_twistd_web_follows_certbot_renewals_with_their_chain(tmp_path: Path) -> None:
    root_ca = trustme.CA()
    intermediate = root_ca.create_child_ca()  # the chain must be sent: clients trust the root only
    layout = CertbotLayout(tmp_path / "letsencrypt")
    first = issue(intermediate)
    layout.install(first)
    live = layout.live
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("hello\n")
    port = free_port()
    description = tlsreload(
        port, live / "cert.pem", live / "privkey.pem", extraCertChain=live / "chain.pem", interval=INTERVAL
    )
    ctx = client_context(root_ca)
    with start(twistd_web(description, tmp_path / "www"), tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        with Hammer(port, ctx, threads=2) as hammer, Requests(port, ctx, threads=1) as requests:
            for _ in range(ROTATIONS):
                more(hammer)
                pair = issue(intermediate)
                layout.install(pair)
                reach(hammer, pair.serial)
                reach(requests, pair.serial)
        # twistd ends by the signal it was stopped with, after a clean shutdown (stock twistd does the same).
        out = stop_cleanly(server, status=-signal.SIGTERM)
    assert "Server Shut Down." in out, out
    assert hammer.failures == [] and requests.failures == [], (hammer.failures[:3], requests.failures[:3])
    # Through twistd's own log.
    assert len(lines_with(out, "[tlsreload_plugins.reloader#info] tlsreload: " + RELOADED)) == ROTATIONS, out
    assert "every 0.3s" in lines_with(out, WATCHING)[0], out


def test_twistd_web_with_crl_file_refuses_a_client_once_revoked(tmp_path: Path, ca: trustme.CA) -> None:
    """``twistd web --listen tlsreload:...:caFile=CA:crlFile=CRL``: the CRL reloads with the client-CA bundle."""
    mtls = Mtls(tmp_path, ca)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("hello\n")
    port = free_port()
    description = tlsreload(port, mtls.cert, mtls.key, caFile=mtls.bundle, crlFile=mtls.crl, interval=INTERVAL)
    with start(twistd_web(description, tmp_path / "www"), tmp_path, port) as server:
        revocation_holds(port, mtls)
        out = stop_cleanly(server, status=-signal.SIGTERM)
    assert len(lines_with(out, WATCHING)) == 1 and f"crl={mtls.crl}" in lines_with(out, WATCHING)[0], out


# --- mutual TLS, an encrypted key and an SNI identity, each reloaded on its own -----------------


def test_client_ca_key_password_and_sni_identity_reload(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    old_clients, new_clients = trustme.CA(), trustme.CA()
    first = with_password(issue(ca), "s3cret")
    layout.write_files({"tls.crt": first.chain, "tls.key": first.key, "ca.crt": old_clients.cert_pem.bytes()})
    password = tmp_path / "key-password"
    password.write_text("s3cret\n")
    other = KubeletLayout(tmp_path / "sni" / "other")
    other_issuer = ca.create_child_ca()  # the identity's own chain must be sent: clients trust the root only
    other_first = issue(other_issuer, "other.test")
    other.install(other_first)
    port = free_port()
    description = tlsreload(
        port, layout.cert_path, layout.key_path, caFile=layout.ca_path, keyPasswordFile=password, sni=tmp_path / "sni"
    )
    old_client = client_context(ca, issue(old_clients, "client.test"))
    new_client = client_context(ca, issue(new_clients, "client.test"))
    anonymous = client_context(ca)
    with start(daphne(description, app="gunicorn_apps:asgi"), tmp_path, port) as server:
        wait_until(lambda: get(port, old_client)[0] == first.serial, DEADLINE, what="the server up")
        assert get(port, old_client, server_name="other.test")[0] == other_first.serial
        assert rejected(port, new_client) and rejected(port, anonymous)

        second = with_password(issue(ca), "s3cret")
        layout.write_files({"tls.crt": second.chain, "tls.key": second.key, "ca.crt": new_clients.cert_pem.bytes()})
        wait_until(lambda: get(port, new_client)[0] == second.serial, DEADLINE, what="the new pair and client CA")
        assert rejected(port, old_client) and rejected(port, anonymous)
        assert rejected(port, old_client, server_name="other.test")

        wrong = with_password(issue(ca), "wrong")
        layout.write_files({"tls.crt": wrong.chain, "tls.key": wrong.key, "ca.crt": new_clients.cert_pem.bytes()})
        wait_until(lambda: FAILED in server.output(), DEADLINE, what="the wrong password reported")
        assert all(get(port, new_client)[0] == second.serial for _ in range(4))

        third = with_password(issue(ca), "n3w")
        password.write_text("n3w\n")  # a new password with a new key: the file is read again
        layout.write_files({"tls.crt": third.chain, "tls.key": third.key, "ca.crt": new_clients.cert_pem.bytes()})
        wait_until(lambda: get(port, new_client)[0] == third.serial, DEADLINE, what="the new password's key")

        other_second = issue(other_issuer, "other.test")
        other.install(other_second)
        wait_until(
            lambda: get(port, new_client, server_name="other.test")[0] == other_second.serial,
            DEADLINE,
            what="the SNI identity's renewal",
        )
        assert get(port, new_client)[0] == third.serial
        out = stop_cleanly(server, FAILED)
    assert "wrong password" in lines_with(out, FAILED)[0], out
    assert "s3cret" not in out and "n3w" not in out


# --- start-up on unusable files -----------------------------------------------------------------


@pytest.mark.parametrize(("server", "case"), [("daphne", "fifo"), ("twistd", "missing key")])
def test_unusable_files_at_startup_stop_the_server_with_one_clear_line(
    tmp_path: Path, ca: trustme.CA, server: str, case: str
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    place_good(cert, key, ca)
    if case == "fifo":
        HOSTILE["fifo"](cert, key, ca)
    else:
        key.unlink()
    named = cert if case == "fifo" else key
    description = tlsreload(free_port(), cert, key)
    args = daphne(description) if server == "daphne" else twistd_web(description, tmp_path)
    command = [sys.executable, *args] if args[0] == "-m" else args
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, **server_env()}
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out, out
    refusals = lines_with(out, CANNOT_SERVE)
    assert len(refusals) == 1 and str(named) in refusals[0], out
