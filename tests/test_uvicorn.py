"""End-to-end tests of the uvicorn adapter: real uvicorn processes, real TLS clients, real rotations.

The drop-in runs as ``python -m tlsreload_plugins.uvicorn`` (the console script is the same function);
the programmatic ways run ``examples/programmatic_uvicorn.py`` (``uvicorn.Config`` + ``uvicorn.Server``)
and ``tests/uvicorn_apps.py`` as a script (``uvicorn.run``). Every response body names the serving pid.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import ssl
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from uvicorn.config import create_ssl_context

from revocation_steps import Mtls, revocation_holds
from tlstest import (
    HOST,
    CertbotLayout,
    Hammer,
    KubeletLayout,
    Layout,
    Pair,
    Server,
    client_context,
    free_port,
    handshake,
    issue,
    run_server,
    serial_of,
    served_serial,
    wait_for_serial,
    wait_until,
)

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"
DROP_IN = ["-m", "tlsreload_plugins.uvicorn"]
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "tlsreload-uvicorn")
INTERVAL = "0.3"
DEADLINE = 30.0
STARTUP_FAILURE = 3
RELOADED = "tlsreload: reloaded TLS certificate"
FAILED = "tlsreload: certificate reload failed"
# What an unclean exit leaves in the output: a traceback, asyncio's complaints, any Python warning.
UNCLEAN = re.compile(r"Traceback|Task was destroyed|was never awaited|Exception ignored|\w+Warning\b|^ERROR", re.M)


# --- helpers ----------------------------------------------------------------------------------


def drop_in(
    port: int, layout: Layout, *extra: str, app: str = "uvicorn_apps:plain", app_dir: Path = TESTS
) -> list[str]:
    args = [*DROP_IN, app, "--app-dir", str(app_dir), "--host", HOST, "--port", str(port)]
    args += ["--ssl-certfile", str(layout.cert_path), "--ssl-keyfile", str(layout.key_path)]
    return [*args, "--tls-reload-interval", INTERVAL, *extra]


def script(path: Path, *args: str) -> list[str]:
    return [sys.executable, str(path), *args]


def start(args: list[str], tmp_path: Path, port: int) -> AbstractContextManager[Server]:
    return run_server(args, tmp_path / "server.log", port, env={"TLSRELOAD_INTERVAL": INTERVAL}, cwd=tmp_path)


def get(port: int, ctx: ssl.SSLContext) -> tuple[str, str]:
    """One HTTPS GET with httpx on a new connection: (serial of the leaf served, response body)."""
    with httpx.Client(verify=ctx, timeout=10) as client:
        response = client.get(f"https://{HOST}:{port}/")
        response.raise_for_status()
        der = response.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(True)
        return serial_of(der), response.text


def rejected(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        get(port, ctx)
    except httpx.TransportError:
        return True
    return False


def stop_cleanly(server: Server, sig: int, *expected_warnings: str) -> str:
    """Stop with ``sig``; assert uvicorn exited as it does (0, or killed by the SIGTERM it re-raises) and cleanly,
    with no warning logged but those expected."""
    code = server.stop(sig)
    out = server.output()
    assert code in (0, -signal.SIGTERM), out
    assert "Finished server process" in out, out
    assert not UNCLEAN.search(out), out
    for warning in lines_with(out, "WARNING"):
        assert any(text in warning for text in expected_warnings), out
    return out


def lines_with(out: str, text: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


def encrypted(pair: Pair, password: bytes) -> bytes:
    key = serialization.load_pem_private_key(pair.key, password=None)
    encryption = serialization.BestAvailableEncryption(password)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


# --- the command line is uvicorn's ------------------------------------------------------------


def run(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def test_help_is_uvicorns_plus_ours() -> None:
    stock = run([sys.executable, "-m", "uvicorn", "--help"])
    assert stock.returncode == 0
    for command in ([CONSOLE_SCRIPT], [sys.executable, *DROP_IN]):
        ours = run([*command, "--help"])
        assert ours.returncode == 0, ours.stderr
        assert all(option in ours.stdout for option in ("--tls-reload-interval", "--tls-sni", "--tls-metrics"))
        # Word for word uvicorn's help (same options, help texts and defaults), plus our options.
        without_ours = re.sub(
            r"\n  --tls-(reload-interval|sni|metrics|crl|spiffe).*?(?=\n  --)", "", ours.stdout, flags=re.S
        )
        assert without_ours.splitlines()[1:] == stock.stdout.splitlines()[1:]
        assert ours.stdout.splitlines()[0].endswith("[OPTIONS] APP")


@pytest.mark.parametrize(
    "args",
    [["app:app", "--no-such-option"], [], ["app:app", "--port", "eighty"], ["app:app", "--lifespan", "sometimes"]],
    ids=["unknown-option", "no-app", "bad-port", "bad-choice"],
)
def test_usage_errors_exit_as_uvicorn_does(args: list[str]) -> None:
    stock = run([sys.executable, "-m", "uvicorn", *args])
    ours = run([sys.executable, *DROP_IN, *args])
    assert stock.returncode == 2
    assert ours.returncode == stock.returncode, ours.stderr
    assert ours.stderr.splitlines()[-1] == stock.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--tls-reload-interval", "0"], {}, "--tls-reload-interval"),
        (["--tls-reload-interval", "soon"], {}, "--tls-reload-interval"),
        ([], {"TLSRELOAD_INTERVAL": "-1"}, "TLSRELOAD_INTERVAL"),
        ([], {"TLSRELOAD_EXPIRY_WARNING_DAYS": "soon"}, "TLSRELOAD_EXPIRY_WARNING_DAYS"),
    ],
)
def test_bad_tlsreload_settings_are_usage_errors(args: list[str], env: dict[str, str], named: str) -> None:
    result = run([sys.executable, *DROP_IN, "app:app", *args], env={**os.environ, **env})
    assert result.returncode == 2 and named in result.stderr.splitlines()[-1], result.stderr


@pytest.mark.parametrize("way", ["drop-in", "drop-in --workers 2", "uvicorn.run"])
def test_unusable_files_at_startup_fail_with_one_clear_line(ca: trustme.CA, tmp_path: Path, way: str) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    layout.write_raw(issue(ca).chain, issue(ca).key)  # a key that is not the certificate's
    port = free_port()
    if way == "uvicorn.run":
        args = script(TESTS / "uvicorn_apps.py", "plain", str(port), str(layout.cert_path), str(layout.key_path))
    else:
        args = [sys.executable, *drop_in(port, layout, *way.split()[1:])]
    result = run(args, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == STARTUP_FAILURE, out
    errors = lines_with(out, "ERROR")
    assert len(errors) == 1 and "does not match the certificate" in errors[0], out
    assert "Traceback" not in out


# --- the drop-in ------------------------------------------------------------------------------


def test_drop_in_reloads_without_failed_handshakes_and_keeps_the_last_good(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    with start(drop_in(port, layout), tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        assert get(port, ctx) == (first.serial, f"pid={server.proc.pid}")

        with Hammer(port, ctx, threads=4) as hammer:
            for _ in range(2):
                latest = issue(ca)
                layout.install(latest)
                wait_for_serial(port, ctx, latest.serial, DEADLINE)
            wait_until(lambda: latest.serial in hammer.serials, DEADLINE, what="the hammer on the new leaf")
        assert hammer.failures == [] and hammer.successes > 0

        bad = issue(ca)
        layout.write_raw(bad.chain, first.key)
        wait_until(lambda: FAILED in server.output(), DEADLINE, what="the failure to be logged")
        assert served_serial(port, ctx) == latest.serial
        assert get(port, ctx)[0] == latest.serial

        fixed = issue(ca)
        layout.install(fixed)
        wait_for_serial(port, ctx, fixed.serial, DEADLINE)
        assert get(port, ctx) == (fixed.serial, f"pid={server.proc.pid}")
        out = stop_cleanly(server, signal.SIGTERM, FAILED)

    # Through uvicorn's handlers and format, each line once.
    assert len(lines_with(out, "tlsreload: watching")) == 1
    assert len(lines_with(out, RELOADED)) == 3
    assert all(line.startswith("INFO:     ") for line in lines_with(out, RELOADED))
    (failure,) = lines_with(out, FAILED)
    assert failure.startswith("WARNING:  ") and "does not match" in failure


def test_drop_in_reloads_every_worker(ca: trustme.CA, tmp_path: Path) -> None:
    layout = CertbotLayout(tmp_path / "letsencrypt")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = drop_in(port, layout, "--workers", "2", app="fastapi_app:app", app_dir=EXAMPLES)
    with start(args, tmp_path, port) as server:
        pids: set[int] = set()

        def both_workers_answer() -> bool:
            serial, body = get(port, ctx)
            assert serial == first.serial
            pids.add(httpx.Response(200, content=body).json()["pid"])
            return len(pids) == 2

        wait_until(both_workers_answer, DEADLINE, what="both workers")

        second = issue(ca)
        renewed: set[int] = set()

        def every_worker_renewed() -> bool:
            serial, body = get(port, ctx)
            if serial == second.serial:
                renewed.add(httpx.Response(200, content=body).json()["pid"])
            return renewed == pids

        with Hammer(port, ctx, threads=4) as hammer:
            layout.install(second)
            wait_until(every_worker_renewed, DEADLINE, what="every worker serving the new leaf")
            wait_for_serial(port, ctx, second.serial, DEADLINE, attempts=6)
            wait_until(lambda: second.serial in hammer.serials, DEADLINE, what="the hammer on the new leaf")
        assert hammer.failures == [] and hammer.successes > 0

        with httpx.Client(verify=ctx, timeout=10) as client:  # the example's status endpoint
            status = client.get(f"https://{HOST}:{port}/tls").json()
        assert status[0]["serial"] == second.serial and status[0]["last_error"] is None
        out = stop_cleanly(server, signal.SIGTERM)

    assert len(lines_with(out, "tlsreload: watching")) == 2
    assert len(lines_with(out, RELOADED)) == 2
    assert out.count("example app: startup") == 2 and out.count("example app: shutdown") == 2


def test_mtls_client_ca_bundle_reloads_too(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    old_clients, new_clients = trustme.CA(), trustme.CA()
    first, second = issue(ca), issue(ca)
    files = {"tls.crt": first.chain, "tls.key": first.key, "ca.crt": old_clients.cert_pem.bytes()}
    layout.write_files(files)
    port = free_port()
    old_client = client_context(ca, issue(old_clients, "client.test"))
    new_client = client_context(ca, issue(new_clients, "client.test"))
    anonymous = client_context(ca)
    args = drop_in(port, layout, "--ssl-ca-certs", str(layout.ca_path), "--ssl-cert-reqs", "2")
    with start(args, tmp_path, port) as server:
        wait_until(lambda: get(port, old_client)[0] == first.serial, DEADLINE, what="server up")
        assert rejected(port, new_client) and rejected(port, anonymous)

        layout.write_files({"tls.crt": second.chain, "tls.key": second.key, "ca.crt": new_clients.cert_pem.bytes()})
        wait_until(lambda: get(port, new_client)[0] == second.serial, DEADLINE, what="the new client CA")
        assert rejected(port, old_client)
        assert rejected(port, anonymous)  # CERT_REQUIRED survives the reload
        stop_cleanly(server, signal.SIGTERM)


def test_encrypted_key_with_password_reloads(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second, third = issue(ca), issue(ca), issue(ca)
    layout.write_raw(first.chain, encrypted(first, b"s3cret"))
    port = free_port()
    ctx = client_context(ca)
    with start(drop_in(port, layout, "--ssl-keyfile-password", "s3cret"), tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        layout.write_raw(second.chain, encrypted(second, b"s3cret"))
        wait_for_serial(port, ctx, second.serial, DEADLINE)

        layout.write_raw(third.chain, encrypted(third, b"other"))
        wait_until(lambda: FAILED in server.output(), DEADLINE, what="the failure to be logged")
        assert get(port, ctx)[0] == second.serial
        out = stop_cleanly(server, signal.SIGINT, FAILED)
    assert "wrong password" in lines_with(out, FAILED)[0]
    assert "s3cret" not in out


def test_an_sni_identity_negotiates_the_alpn_of_uvicorns_own_context(ca: trustme.CA, tmp_path: Path) -> None:
    """uvicorn's default factory sets the ALPN protocols of its HTTP protocol class; the context built for an
    SNI identity (and for the last good identity) is built the same way, with them."""
    layout, named = KubeletLayout(tmp_path / "tls"), KubeletLayout(tmp_path / "sni" / "other")
    first, other = issue(ca), issue(ca, "other.test")
    layout.install(first)
    named.install(other)
    port = free_port()
    ctx = client_context(ca)
    ctx.set_alpn_protocols(["h2", "http/1.1"])

    def negotiated(server_name: str) -> tuple[str, str | None]:
        with handshake(port, ctx, server_name=server_name) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return serial_of(der), tls.selected_alpn_protocol()

    args = drop_in(port, layout, "--http", "uvicorn_apps:H11WithALPN", "--tls-sni", str(tmp_path / "sni"))
    with start(args, tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        default_serial, default_alpn = negotiated("localhost")
        sni_serial, sni_alpn = negotiated("other.test")
        stop_cleanly(server, signal.SIGTERM)
    assert (default_serial, sni_serial) == (first.serial, other.serial)
    if "alpn_protocols" in inspect.signature(create_ssl_context).parameters:  # uvicorn sets ALPN since 0.5x
        assert default_alpn == "http/1.1"  # uvicorn's own context: the protocol class's
    assert sni_alpn == default_alpn


# --- no lifespan to follow --------------------------------------------------------------------


RUN_LIFESPAN_OFF = """
import sys
import uvicorn
from tlsreload_plugins.uvicorn import reloading_ssl_context
port, cert, key = sys.argv[1:]
uvicorn.run("uvicorn_apps:plain", host="127.0.0.1", port=int(port), ssl_certfile=cert, ssl_keyfile=key,
            ssl_context_factory=reloading_ssl_context, lifespan="off")
"""


@pytest.mark.parametrize(
    ("way", "message"),
    [
        ("drop-in --lifespan off", None),
        ("drop-in, app refusing lifespan", None),
        ("uvicorn.run lifespan off", "WARNING:  tlsreload: lifespan is off"),
        ("factory without extension", "WARNING:  tlsreload: no TLSReloadLifespan or reloading_certificates()"),
    ],
)
def test_without_a_lifespan_it_still_reloads(ca: trustme.CA, tmp_path: Path, way: str, message: str | None) -> None:
    """The drop-in checks from the event loop and needs no lifespan; a factory used without the extension
    says once how its checks run."""
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    cert, key = str(layout.cert_path), str(layout.key_path)
    if way == "drop-in --lifespan off":
        args = drop_in(port, layout, "--lifespan", "off")
    elif way == "drop-in, app refusing lifespan":
        args = drop_in(port, layout, app="uvicorn_apps:no_lifespan")
    elif way == "uvicorn.run lifespan off":
        args = [sys.executable, "-c", RUN_LIFESPAN_OFF, str(port), cert, key]
    else:
        args = script(TESTS / "uvicorn_apps.py", "unwrapped_app", str(port), cert, key, "--lifespan-grace", "1")
    env = {"TLSRELOAD_INTERVAL": INTERVAL, "PYTHONPATH": str(TESTS)}
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        if message is not None:
            wait_until(lambda: message in server.output(), DEADLINE, what=message)
        layout.install(second)
        wait_for_serial(port, ctx, second.serial, DEADLINE)
        expected = () if message is None else (message,)
        out = stop_cleanly(server, signal.SIGINT, *expected)  # SIGINT: the loop is torn down, the ticker cancelled
    if message is not None:
        assert len(lines_with(out, message)) == 1
    assert len(lines_with(out, "tlsreload: watching")) == 1
    assert len(lines_with(out, RELOADED)) == 1


def test_extension_without_the_factory_says_there_is_nothing_to_reload(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = ["-m", "uvicorn", "uvicorn_apps:starlette_app", "--app-dir", str(TESTS), "--port", str(port)]
    args += ["--ssl-certfile", str(layout.cert_path), "--ssl-keyfile", str(layout.key_path)]  # stock uvicorn
    message = "WARNING:  tlsreload: no reloading TLS context in this process, nothing to reload"
    with start(args, tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        assert get(port, ctx)[0] == first.serial
        out = stop_cleanly(server, signal.SIGTERM, message)
    assert len(lines_with(out, message)) == 1


# --- programmatic -----------------------------------------------------------------------------


def test_programmatic_config_and_server_example(ca: trustme.CA, tmp_path: Path) -> None:
    layout = CertbotLayout(tmp_path / "letsencrypt")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = ["--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path), "--port", str(port)]
    with start(script(EXAMPLES / "programmatic_uvicorn.py", *args, "--interval", INTERVAL), tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        layout.install(second)
        wait_for_serial(port, ctx, second.serial, DEADLINE)
        serial, body = get(port, ctx)
        assert serial == second.serial and httpx.Response(200, content=body).json() == {"pid": server.proc.pid}
        out = stop_cleanly(server, signal.SIGINT)
    assert "every 0.3s" in lines_with(out, "tlsreload: watching")[0]
    assert "example app: startup" in out and "example app: shutdown" in out


def test_programmatic_run_with_a_crl_refuses_a_client_once_revoked(ca: trustme.CA, tmp_path: Path) -> None:
    """``uvicorn.run(app, ssl_ca_certs=..., ssl_cert_reqs=ssl.CERT_REQUIRED,
    ssl_context_factory=functools.partial(reloading_ssl_context, crl=CRL))``: the CRL reloads with the bundle."""
    mtls = Mtls(tmp_path, ca)
    port = free_port()
    args = script(TESTS / "uvicorn_apps.py", "fastapi_app", str(port), str(mtls.cert), str(mtls.key))
    args += ["--ca-certs", str(mtls.bundle), "--crl", str(mtls.crl)]
    with start(args, tmp_path, port) as server:
        revocation_holds(port, mtls)
        out = stop_cleanly(server, signal.SIGINT)
    assert len(lines_with(out, "tlsreload: watching")) == 1


@pytest.mark.parametrize(("app", "sig"), [("starlette_app", signal.SIGINT), ("fastapi_app", signal.SIGTERM)])
def test_extension_composes_with_the_apps_own_lifespan(ca: trustme.CA, tmp_path: Path, app: str, sig: int) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    cert, key = str(layout.cert_path), str(layout.key_path)
    args = script(TESTS / "uvicorn_apps.py", app, str(port), cert, key, "--log-level", "debug")
    with start(args, tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        layout.install(second)
        wait_for_serial(port, ctx, second.serial, DEADLINE)
        assert get(port, ctx)[0] == second.serial
        out = stop_cleanly(server, sig)
    # The extension is outermost: checks run through the app's own start-up and shutdown, then stop
    # before uvicorn hears that the application shut down.
    order = [
        "own startup (tlsreload checking: True)",
        "Application startup complete",
        RELOADED,
        "own shutdown (tlsreload checking: True)",
        "tlsreload: stopped checking",
        "Application shutdown complete",
    ]
    positions = [out.find(text) for text in order]
    assert -1 not in positions and positions == sorted(positions), out
    assert "every 0.3s" in lines_with(out, "tlsreload: watching")[0]  # from $TLSRELOAD_INTERVAL
