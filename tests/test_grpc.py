"""gRPC servers (``grpc.server`` and ``grpc.aio.server``) on :func:`tlsreload_plugins.grpc.server_credentials`.

Servers run as subprocesses (tests/grpc_apps.py, examples/grpc_app.py). Clients are real: gRPC calls of
the standard health service, each on a fresh channel with its own subchannel pool (so each call is a new
connection and a new handshake), and plain TLS handshakes offering ``h2``, which read the served leaf.
Rotations are written the way kubelet and certbot write them, under continuous traffic; every hostile
case of tests/hostile.py (and the matrix's torn certificate and missing key) is put under one server,
which must keep serving its last good pair and take the next good one. gRPC is not HTTP, so it does not
join tests/test_hostile.py's matrix: the hostile cases are here.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health")

import trustme  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from hostile import FILE_OF_CASE, HOSTILE, place_good, replace_bytes  # noqa: E402
from tlsreload_plugins import InvalidIdentity  # noqa: E402
from tlsreload_plugins.grpc import reloaders, server_credentials  # noqa: E402
from tlstest import (  # noqa: E402
    HOST,
    PASSWORD,
    CertbotLayout,
    Hammer,
    KubeletLayout,
    Pair,
    RenameEachLayout,
    Server,
    client_context,
    free_port,
    handshake,
    issue,
    run_server,
    serial_of,
    wait_until,
    with_password,
)

TESTS = Path(__file__).resolve().parent
APP = TESTS / "grpc_apps.py"
EXAMPLE = TESTS.parent / "examples" / "grpc_app.py"
INTERVAL = "0.2"
DEADLINE = 20.0
STARTUP = 30.0
FAILED = "certificate reload failed"
SERVING = health_pb2.HealthCheckResponse.SERVING


# --- clients ------------------------------------------------------------------------------------


def trusting(ca: trustme.CA, client: Pair | None = None) -> Any:
    """gRPC channel credentials trusting ``ca``, presenting ``client`` (mutual TLS) when given."""
    if client is None:
        return grpc.ssl_channel_credentials(ca.cert_pem.bytes())
    return grpc.ssl_channel_credentials(ca.cert_pem.bytes(), client.key, client.chain)


@contextmanager
def fresh_channel(port: int, credentials: Any, server_name: str = "localhost") -> Iterator[Any]:
    """A channel of its own: a new connection, a new handshake, the server's name checked against ``server_name``."""
    options = [("grpc.ssl_target_name_override", server_name), ("grpc.use_local_subchannel_pool", 1)]
    with grpc.secure_channel(f"{HOST}:{port}", credentials, options=options) as channel:
        yield channel


def check_health(port: int, credentials: Any, server_name: str = "localhost") -> int:
    """One ``grpc.health.v1.Health/Check`` on a fresh channel; the status it answers."""
    with fresh_channel(port, credentials, server_name) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return int(response.status)


def app_status(port: int, credentials: Any) -> dict[str, Any]:
    """tests/grpc_apps.py's counters, over gRPC (raw bytes, no protobuf)."""
    with fresh_channel(port, credentials) as channel:
        answer: dict[str, Any] = json.loads(channel.unary_unary("/tlsreload.test.Status/Get")(b"", timeout=10))
        return answer


def tls_context(ca: trustme.CA, client: Pair | None = None) -> ssl.SSLContext:
    ctx = client_context(ca, client)
    ctx.set_alpn_protocols(["h2"])  # what a gRPC client offers
    return ctx


def served(port: int, ctx: ssl.SSLContext, server_name: str = "localhost") -> str:
    """The serial a plain TLS handshake sending ``server_name`` gets."""
    with handshake(port, ctx, server_name=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)


@dataclass
class Calls:
    """Client threads each making gRPC health checks on fresh channels in a loop, counting every failure."""

    port: int
    credentials: Any
    threads: int = 2
    successes: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                assert check_health(self.port, self.credentials) == SERVING
                self.successes += 1
            except Exception as e:
                self.failures.append(repr(e))

    def __enter__(self) -> Calls:
        for i in range(self.threads):
            thread = threading.Thread(target=self._loop, name=f"grpc-calls-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join(30)


# --- servers ------------------------------------------------------------------------------------


@contextmanager
def grpc_server(root: Path, cert: Path, key: Path | None, *options: str) -> Iterator[Server]:
    """tests/grpc_apps.py on ``cert`` and ``key``, checking every 0.2 s; asserts a clean exit at the end."""
    port = free_port()
    args = [sys.executable, str(APP), "--certfile", str(cert), "--port", str(port), "--interval", INTERVAL]
    args += ["--keyfile", str(key)] if key is not None else []
    with run_server([*args, *options], root / f"server-{port}.log", port, env={"PYTHONPATH": str(TESTS)}) as server:
        yield server
        assert server.stop() == 0, server.output()
    assert "stopped; checks running: False" in server.output(), server.output()
    assert "Traceback" not in server.output(), server.output()


def rotate_under_traffic(
    port: int, install: Callable[[Pair], None], new_pairs: list[Pair], ca: trustme.CA, client: Pair | None = None
) -> tuple[Calls, Hammer]:
    """Install each pair in turn while gRPC calls and TLS handshakes run; each must reach new connections."""
    ctx = tls_context(ca, client)
    with Calls(port, trusting(ca, client)) as calls, Hammer(port, ctx, threads=1) as hammer:
        for pair in new_pairs:
            install(pair)
            wait_until(lambda s=pair.serial: served(port, ctx) == s, DEADLINE, what=f"serial {pair.serial}")
            seen = calls.successes
            wait_until(lambda seen=seen: calls.successes > seen + 10, DEADLINE, what="calls on the new pair")
    return calls, hammer


# --- rotations under traffic --------------------------------------------------------------------


def test_kubelet_rotations_fail_no_call_and_mtls_client_ca_rotation_refuses_the_removed_ca(
    tmp_path: Path, ca: trustme.CA
) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old_client, new_client = issue(old_ca, "client.example.test"), issue(new_ca, "client.example.test")
    pairs = [issue(ca) for _ in range(4)]
    bundle = old_ca.cert_pem.bytes()

    def install(pair: Pair) -> None:
        layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": bundle})

    install(pairs[0])
    with grpc_server(tmp_path, layout.cert_path, layout.key_path, "--ca-certs", str(layout.ca_path)) as server:
        port = server.port
        wait_until(lambda: check_health(port, trusting(ca, old_client)) == SERVING, STARTUP, 0.25, what="the server")
        calls, hammer = rotate_under_traffic(port, install, pairs[1:3], ca, old_client)
        assert calls.failures == [] and hammer.failures == [], (calls.failures[:3], hammer.failures[:3])
        assert calls.successes > 0 and pairs[2].serial in hammer.serials
        print(f"\ngrpc.server, kubelet: {calls.successes} calls on fresh channels, {hammer.successes} handshakes")

        def refused(client: Pair) -> bool:
            try:
                check_health(port, trusting(ca, client))
            except grpc.RpcError as e:
                return bool(e.code() == grpc.StatusCode.UNAVAILABLE)
            return False

        assert refused(new_client)
        bundle = old_ca.cert_pem.bytes() + new_ca.cert_pem.bytes()  # the new CA added: both accepted
        install(pairs[3])
        wait_until(lambda: check_health(port, trusting(ca, new_client)) == SERVING, DEADLINE, what="the new CA")
        assert check_health(port, trusting(ca, old_client)) == SERVING
        bundle = new_ca.cert_pem.bytes()  # then the old CA removed, with the same pair
        install(pairs[3])
        wait_until(lambda: refused(old_client), DEADLINE, what="a client of the removed CA refused")
        assert check_health(port, trusting(ca, new_client)) == SERVING
        status = app_status(port, trusting(ca, new_client))
        assert status["failures"] == 0 and status["reloads"] == 4 and status["handed"] >= 1, status
        with pytest.raises(grpc.RpcError):  # no client certificate at all
            check_health(port, trusting(ca))


@pytest.mark.parametrize("server_kind", ["grpc.aio.server", "grpc.server"])
def test_certbot_rotations_fail_no_call(tmp_path: Path, ca: trustme.CA, server_kind: str) -> None:
    layout = CertbotLayout(tmp_path / "letsencrypt")
    pairs = [issue(ca) for _ in range(3)]
    layout.install(pairs[0])
    aio = ["--aio"] if server_kind == "grpc.aio.server" else []
    with grpc_server(tmp_path, layout.cert_path, layout.key_path, *aio) as server:
        port = server.port
        wait_until(lambda: check_health(port, trusting(ca)) == SERVING, STARTUP, 0.25, what="the server")
        calls, hammer = rotate_under_traffic(port, layout.install, pairs[1:], ca)
        assert calls.failures == [] and hammer.failures == [], (calls.failures[:3], hammer.failures[:3])
        status = app_status(port, trusting(ca))
        assert status["serial"] == pairs[2].serial and status["failures"] == 0, status
    print(f"\n{server_kind}, certbot: {calls.successes} calls on fresh channels, {hammer.successes} handshakes")
    assert server.output().count(FAILED) == 0, server.output()  # certbot relinks one file at a time: not a failure


# --- hostile files: one server for every case ---------------------------------------------------


def place_truncated(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    chain = issue(ca).chain
    replace_bytes(cert_path, chain[: len(chain) // 2])


def place_missing_key(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    key_path.unlink()


CASES: dict[str, Callable[[Path, Path, trustme.CA], None]] = {
    **HOSTILE,
    "truncated": place_truncated,
    "missing_key": place_missing_key,
}
KEY_CASES = {*(case for case, which in FILE_OF_CASE.items() if which == "key"), "missing_key"}


@dataclass
class Running:
    server: Server
    layout: RenameEachLayout
    ca: trustme.CA
    serial: str


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("grpc-hostile")
    ca = trustme.CA()
    layout = RenameEachLayout(root / "tls")
    serial = place_good(layout.cert_path, layout.key_path, ca)
    with grpc_server(root, layout.cert_path, layout.key_path) as server:
        wait_until(lambda: check_health(server.port, trusting(ca)) == SERVING, STARTUP, 0.25, what="the server")
        yield Running(server, layout, ca, serial)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_file_keeps_the_last_good_serving_and_good_files_are_taken(
    hostile_server: Running, case: str
) -> None:
    run, port = hostile_server, hostile_server.server.port
    named = run.layout.key_path if case in KEY_CASES else run.layout.cert_path
    ctx, credentials = tls_context(run.ca), trusting(run.ca)
    before = app_status(port, credentials)
    assert before["serial"] == run.serial, before
    with Calls(port, credentials, threads=1) as calls, Hammer(port, ctx, threads=1) as hammer:
        CASES[case](run.layout.cert_path, run.layout.key_path, run.ca)

        def reported() -> bool:
            now = app_status(port, credentials)
            return now["failures"] > before["failures"] and str(named) in (now["last_error"] or "")

        wait_until(reported, DEADLINE, what=f"the failure reported, naming {named}")
        checks = app_status(port, credentials)["checks"]
        wait_until(lambda: app_status(port, credentials)["checks"] > checks + 3, DEADLINE, what="more checks")
        during = app_status(port, credentials)
        assert all(served(port, ctx) == run.serial for _ in range(3))
        served_while_hostile = set(hammer.serials)
        new = place_good(run.layout.cert_path, run.layout.key_path, run.ca)
        wait_until(lambda: served(port, ctx) == new, DEADLINE, what="the next good pair")
        assert check_health(port, credentials) == SERVING
    assert calls.failures == [] and hammer.failures == [], (calls.failures[:3], hammer.failures[:3])
    assert calls.successes > 0 and served_while_hostile == {run.serial}, served_while_hostile
    assert during["failures"] == before["failures"] + 1, during  # reported once, however many checks
    assert during["configurations"] == before["configurations"], during  # nothing new reached gRPC
    after = app_status(port, credentials)
    assert after["serial"] == new and after["configurations"] == before["configurations"] + 1, after
    assert run.server.proc.poll() is None and "Traceback" not in run.server.output()
    run.serial = new


# --- SNI, start-up, the example -----------------------------------------------------------------


def test_sni_identities_are_chosen_by_grpc_and_rotate(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    sites = tmp_path / "sites"
    site_a, site_b = KubeletLayout(sites / "a"), KubeletLayout(sites / "b")
    default, a, b, a_again = (
        issue(ca),
        issue(ca, "a.example.test"),
        issue(ca, "*.b.example.test"),
        issue(ca, "a.example.test"),
    )
    layout.install(default)
    site_a.install(a)
    site_b.install(b)
    ctx, credentials = tls_context(ca), trusting(ca)
    with grpc_server(tmp_path, layout.cert_path, layout.key_path, "--sni", str(sites)) as server:
        port = server.port
        wait_until(lambda: check_health(port, credentials) == SERVING, STARTUP, 0.25, what="the server")
        assert served(port, ctx) == default.serial
        assert served(port, ctx, "a.example.test") == a.serial
        assert served(port, ctx, "www.b.example.test") == b.serial
        # gRPC clients check the name: each call succeeds only with the identity that names it.
        assert check_health(port, credentials, "a.example.test") == SERVING
        assert check_health(port, credentials, "www.b.example.test") == SERVING
        site_a.install(a_again)
        wait_until(lambda: served(port, ctx, "a.example.test") == a_again.serial, DEADLINE, what="a's rotation")
        assert served(port, ctx) == default.serial and served(port, ctx, "www.b.example.test") == b.serial
        status = app_status(port, credentials)
        assert status["sni"] == {"a": a_again.serial, "b": b.serial}, status


def test_unusable_files_at_start_up_are_one_error_line_and_exit_1(tmp_path: Path, ca: trustme.CA) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    layout.write_raw(issue(ca).chain, issue(ca).key)
    args = [str(EXAMPLE), "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    result = subprocess.run(
        [sys.executable, *args, "--port", str(free_port())], capture_output=True, text=True, timeout=60
    )
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert result.returncode == 1, result.stderr
    assert len(errors) == 1 and f"key file {layout.key_path} does not match" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_example_serves_health_follows_a_rotation_and_exits_cleanly(
    tmp_path: Path, ca: trustme.CA, sig: signal.Signals
) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    args = [sys.executable, str(EXAMPLE), "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    args += ["--host", HOST, "--port", str(port)]
    ctx, credentials = tls_context(ca), trusting(ca)
    with run_server(args, tmp_path / "example.log", port, env={"TLSRELOAD_INTERVAL": INTERVAL}) as server:
        wait_until(lambda: check_health(port, credentials) == SERVING, STARTUP, 0.25, what="the example")
        assert served(port, ctx) == first.serial
        layout.install(second)
        wait_until(lambda: served(port, ctx) == second.serial, DEADLINE, what="the new serial")
        assert check_health(port, credentials) == SERVING
        assert server.stop(sig) == 0, server.output()
    output = server.output()
    assert "tlsreload_plugins.reloader: reloaded TLS certificate" in output, output
    assert "grpc_app: stopped" in output and "Traceback" not in output, output


# --- in-process: the fetcher, close(), keys, refusals -------------------------------------------


def test_the_fetcher_hands_each_validated_configuration_once_and_close_stops_checking(
    tmp_path: Path, ca: trustme.CA
) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    with server_credentials(str(layout.cert_path), str(layout.key_path), interval=0.1) as credentials:
        assert credentials.running and credentials.reloader in reloaders()
        assert credentials.fetch_configuration() is None  # gRPC took the initial one itself
        layout.install(second)
        wait_until(lambda: credentials.configurations == 2, DEADLINE, what="the new configuration")
        assert isinstance(credentials.fetch_configuration(), grpc.ServerCertificateConfiguration)
        assert credentials.fetch_configuration() is None and credentials.handed == 1
    assert not credentials.running and credentials.reloader not in reloaders()
    checks = credentials.status().checks
    layout.install(issue(ca))
    assert credentials.status().checks == checks and credentials.fetch_configuration() is None


@pytest.mark.parametrize("where", ["an encrypted key with a password file", "the key in the certificate file"])
def test_a_real_server_in_process_takes_keys_the_way_ssl_does(tmp_path: Path, ca: trustme.CA, where: str) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    password_file = tmp_path / "password"
    password_file.write_text(f"{PASSWORD}\n")
    if where.startswith("an encrypted"):
        options: dict[str, Any] = {"keyfile": str(layout.key_path), "password_file": str(password_file)}
        install: Callable[[Pair], None] = lambda pair: layout.install(with_password(pair, PASSWORD))  # noqa: E731
    else:
        options = {}
        install = lambda pair: layout.write_files({"tls.crt": pair.key + pair.chain})  # noqa: E731
    install(first)
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    with server_credentials(str(layout.cert_path), interval=0.1, **options) as credentials:
        port = server.add_secure_port(f"{HOST}:0", credentials)
        server.start()
        try:
            ctx = tls_context(ca)
            assert check_health(port, trusting(ca)) == SERVING and served(port, ctx) == first.serial
            install(second)
            wait_until(lambda: served(port, ctx) == second.serial, DEADLINE, what="the new serial")
            assert check_health(port, trusting(ca)) == SERVING and credentials.status().failures == 0
            if options:  # the matrix's wrong key password: refused, the last good kept
                layout.install(with_password(issue(ca), "not the password"))
                wait_until(lambda: credentials.status().failures == 1, DEADLINE, what="the wrong password reported")
                assert "wrong password" in (credentials.status().last_error or "")
                assert served(port, ctx) == second.serial and credentials.configurations == 2
        finally:
            server.stop(None)


def test_unusable_files_and_bad_settings_are_refused_at_once(tmp_path: Path, ca: trustme.CA) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    first = issue(ca)
    layout.write_raw(first.chain, issue(ca).key)
    with pytest.raises(InvalidIdentity, match=f"key file {layout.key_path} does not match"):
        server_credentials(str(layout.cert_path), str(layout.key_path))
    layout.install(first)
    with pytest.raises(ValueError, match="require_client_auth needs ca_certs"):
        server_credentials(str(layout.cert_path), str(layout.key_path), require_client_auth=True)
    with pytest.raises(ValueError, match="interval"):
        server_credentials(str(layout.cert_path), str(layout.key_path), interval=0)
    with pytest.raises(ValueError, match="SNI directory"):
        server_credentials(str(layout.cert_path), str(layout.key_path), sni=[str(tmp_path / "missing")])
    # Taken as every glue takes them, and refused with the reason: gRPC's TLS stack is out of Python's reach.
    crl = tmp_path / "crl.pem"
    crl.write_bytes(b"")
    with pytest.raises(ValueError, match=r"take no certificate revocation list from Python, so crl \("):
        server_credentials(str(layout.cert_path), str(layout.key_path), ca_certs=str(layout.cert_path), crl=str(crl))
    with pytest.raises(ValueError, match="in its own TLS stack, out of Python's reach, so authorize cannot refuse"):
        server_credentials(str(layout.cert_path), str(layout.key_path), authorize="any")
    assert reloaders() == []
