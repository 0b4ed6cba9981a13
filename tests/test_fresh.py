"""fresh_context: the one line for any server that takes an ``ssl.SSLContext``.

Servers run as subprocesses (examples/aiohttp_app.py, tests/fresh_server.py) and are driven by real TLS
clients (httpx, ``ssl``) while their files rotate the way kubelet writes them. close(), status() and the
recipe are tested in-process, each with real handshakes over a socket pair."""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tlsreload_plugins import FreshContext, InvalidIdentity, TLSFiles, fresh_context
from tlstest import (
    HOST,
    KubeletLayout,
    Pair,
    Server,
    client_context,
    free_port,
    get,
    handshake,
    issue,
    run_server,
    serial_of,
    wait_for_serial,
    wait_until,
    with_password,
)

ROOT = Path(__file__).resolve().parent.parent
FRESH_SERVER = Path(__file__).resolve().with_name("fresh_server.py")
DEADLINE = 20.0


# --- helpers ------------------------------------------------------------------------------------


@contextmanager
def fresh_server(tmp_path: Path, layout: KubeletLayout, *options: str) -> Iterator[Server]:
    """tests/fresh_server.py on ``layout``'s files, checking every 0.2 s."""
    port = free_port()
    args = [sys.executable, str(FRESH_SERVER), "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    args += ["--port", str(port), "--interval", "0.2", *options]
    with run_server(args, tmp_path / "server.log", port) as server:
        yield server


def https_get(port: int, ctx: ssl.SSLContext, path: str = "/") -> tuple[str, dict[str, Any]]:
    """One GET with httpx on a new connection: (serial served, the JSON answer)."""
    with httpx.Client(verify=ctx, timeout=10) as client:
        response = client.get(f"https://{HOST}:{port}{path}")
        response.raise_for_status()
        der = response.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(True)
        return serial_of(der), json.loads(response.text)


def status(port: int, ctx: ssl.SSLContext) -> dict[str, Any]:
    return https_get(port, ctx, "/status")[1]


def wait_for_more_checks(port: int, ctx: ssl.SSLContext, after: int, more: int = 3) -> None:
    wait_until(lambda: status(port, ctx)["checks"] >= after + more, DEADLINE, what=f"{more} more checks")


def served_by(context: ssl.SSLContext, ca: trustme.CA, server_name: str = "localhost") -> str:
    """The serial ``context`` presents to a new connection: a real handshake over a socket pair."""
    client_end, server_end = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with context.wrap_socket(server_end, server_side=True):
                pass
        except OSError as e:
            errors.append(e)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        with client_context(ca).wrap_socket(client_end, server_hostname=server_name) as tls:
            der = tls.getpeercert(binary_form=True)
    finally:
        server.join(10)
        client_end.close()
        server_end.close()
    assert der is not None, errors
    return serial_of(der)


def checking_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "tlsreload" and t.is_alive()}


@pytest.fixture
def first_layout(tmp_path: Path, ca: trustme.CA) -> tuple[KubeletLayout, Pair]:
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    return layout, first


# --- servers as subprocesses --------------------------------------------------------------------


def test_a_kubelet_rotation_reaches_a_new_connection_in_aiohttp(
    tmp_path: Path, ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]
) -> None:
    layout, first = first_layout
    second = issue(ca)
    ctx = client_context(ca)
    port = free_port()
    args = [sys.executable, str(ROOT / "examples" / "aiohttp_app.py"), "--certfile", str(layout.cert_path)]
    args += ["--keyfile", str(layout.key_path), "--host", HOST, "--port", str(port), "--interval", "0.2"]
    with run_server(args, tmp_path / "server.log", port) as server:
        wait_until(lambda: https_get(port, ctx)[0] == first.serial, 30, 0.25, what="aiohttp to serve")
        with httpx.Client(verify=ctx, timeout=10) as kept:  # an established connection keeps its certificate
            assert kept.get(f"https://{HOST}:{port}/").status_code == 200
            layout.install(second)  # one rename of ..data swaps both files
            wait_until(lambda: https_get(port, ctx)[0] == second.serial, DEADLINE, what="the new serial")
            response = kept.get(f"https://{HOST}:{port}/")
            der = response.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(True)
            assert serial_of(der) == first.serial
        assert server.proc.poll() is None, server.output()
    assert "Traceback" not in server.output(), server.output()


def test_a_broken_pair_keeps_the_last_good_and_is_reported_once(
    tmp_path: Path, ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]
) -> None:
    layout, first = first_layout
    second, third = issue(ca), issue(ca)
    ctx = client_context(ca)
    with fresh_server(tmp_path, layout) as server:
        port = server.port
        wait_until(lambda: https_get(port, ctx)[0] == first.serial, 30, 0.25, what="the server")
        layout.write_raw(second.chain, first.key)  # mismatched
        wait_until(lambda: status(port, ctx)["failures"] == 1, DEADLINE, what="the mismatch reported")
        wait_for_more_checks(port, ctx, status(port, ctx)["checks"])
        assert status(port, ctx)["failures"] == 1
        assert https_get(port, ctx)[0] == first.serial
        layout.write_raw(third.chain[: len(third.chain) // 2], third.key)  # torn
        wait_until(lambda: status(port, ctx)["failures"] == 2, DEADLINE, what="the torn file reported")
        wait_for_more_checks(port, ctx, status(port, ctx)["checks"])
        assert status(port, ctx)["failures"] == 2
        assert https_get(port, ctx)[0] == first.serial
        layout.install(third)
        wait_until(lambda: https_get(port, ctx)[0] == third.serial, DEADLINE, what="the next good pair")
    reports = [line for line in server.output().splitlines() if "certificate reload failed" in line]
    assert len(reports) == 2, server.output()
    assert f"key file {layout.key_path} does not match" in reports[0]
    assert f"certificate file {layout.cert_path} is truncated" in reports[1]


def test_mtls_refuses_a_client_without_a_certificate(
    tmp_path: Path, ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]
) -> None:
    layout, first = first_layout
    ca_path = tmp_path / "client-ca.crt"
    ca.cert_pem.write_to_path(str(ca_path))
    with_certificate = client_context(ca, client=issue(ca, "client.example.test"))
    without = client_context(ca)
    with fresh_server(tmp_path, layout, "--ca-certs", str(ca_path)) as server:
        wait_until(lambda: get(server.port, with_certificate)[0] == first.serial, 30, 0.25, what="the server")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(server.port, without)
        wait_until(lambda: "did not return a certificate" in server.output(), DEADLINE, what="the refusal logged")
        assert get(server.port, with_certificate)[0] == first.serial


def test_a_password_file_is_read_again_on_each_reload(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    password = tmp_path / "password"
    first, second = issue(ca), issue(ca)
    password.write_text("one\n")
    layout.install(with_password(first, "one"))
    ctx = client_context(ca)
    with fresh_server(tmp_path, layout, "--password-file", str(password)) as server:
        wait_until(lambda: https_get(server.port, ctx)[0] == first.serial, 30, 0.25, what="the server")
        (tmp_path / "password.new").write_text("two\n")
        os.replace(tmp_path / "password.new", password)
        layout.install(with_password(second, "two"))
        wait_for_serial(server.port, ctx, second.serial, DEADLINE)
        assert status(server.port, ctx)["failures"] == 0, server.output()


def test_an_sni_directory_picks_a_leaf_by_name(
    tmp_path: Path, ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]
) -> None:
    layout, default = first_layout
    sites = tmp_path / "sites"
    site_a, site_b = KubeletLayout(sites / "a"), KubeletLayout(sites / "b")
    a, b, a_again = issue(ca, "a.example.test"), issue(ca, "*.b.example.test"), issue(ca, "a.example.test")
    site_a.install(a)
    site_b.install(b)
    ctx = client_context(ca)

    def serial_for(name: str) -> str:
        with handshake(port, ctx, server_name=name) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return serial_of(der)

    with fresh_server(tmp_path, layout, "--sni", str(sites)) as server:
        port = server.port
        wait_until(lambda: serial_for("localhost") == default.serial, 30, 0.25, what="the server")
        assert serial_for("a.example.test") == a.serial
        assert serial_for("www.b.example.test") == b.serial
        site_a.install(a_again)
        wait_until(lambda: serial_for("a.example.test") == a_again.serial, DEADLINE, what="a's rotation")
        assert serial_for("localhost") == default.serial


# --- in-process: close(), status(), the recipe, refusals -----------------------------------------


def test_close_stops_checking(ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]) -> None:
    layout, first = first_layout
    second = issue(ca)
    closed = fresh_context(str(layout.cert_path), str(layout.key_path), interval=0.1)
    witness = fresh_context(str(layout.cert_path), str(layout.key_path), interval=0.1)
    try:
        assert closed.running
        assert served_by(closed.context, ca) == first.serial
        closed.close()
        assert not closed.running
        checks = closed.status().checks
        layout.install(second)
        # Still checking, the witness shows that the rotation was there to be picked up.
        wait_until(lambda: served_by(witness.context, ca) == second.serial, DEADLINE, what="the witness")
        assert served_by(closed.context, ca) == first.serial
        assert closed.status().checks == checks
        assert closed.status().leaf.serial == first.serial
        closed.close()  # idempotent
        assert witness.status().reloads == 1
        assert witness.status().leaf.serial == second.serial
    finally:
        witness.close()
        closed.close()
    assert not witness.running


def test_as_a_context_manager_it_gives_the_context_and_closes(
    ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]
) -> None:
    layout, first = first_layout
    before = checking_threads()
    with fresh_context(str(layout.cert_path), str(layout.key_path)) as context:
        assert isinstance(context, ssl.SSLContext)
        started = checking_threads() - before
        assert len(started) == 1
        assert served_by(context, ca) == first.serial
    assert not any(t.is_alive() for t in started)


def test_the_recipe_builds_every_context(ca: trustme.CA, first_layout: tuple[KubeletLayout, Pair]) -> None:
    layout, first = first_layout
    second = issue(ca)
    built: list[TLSFiles] = []

    def recipe(files: TLSFiles) -> ssl.SSLContext:
        built.append(files)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(files.certfile, files.keyfile)
        return context

    fresh: FreshContext = fresh_context(str(layout.cert_path), str(layout.key_path), interval=0.1, recipe=recipe)
    with fresh as context:
        assert context.minimum_version is ssl.TLSVersion.TLSv1_3
        assert served_by(context, ca) == first.serial
        layout.install(second)
        wait_until(lambda: served_by(context, ca) == second.serial, DEADLINE, what="the rotation")
    assert built[0] == TLSFiles(str(layout.cert_path), str(layout.key_path))
    assert len(built) >= 2


def test_unusable_files_and_bad_settings_are_refused_at_once(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    before = checking_threads()
    layout.write_raw(first.chain, issue(ca).key)
    with pytest.raises(InvalidIdentity, match=f"key file {layout.key_path} does not match"):
        fresh_context(str(layout.cert_path), str(layout.key_path))
    layout.install(first)
    with pytest.raises(ValueError, match="interval"):
        fresh_context(str(layout.cert_path), str(layout.key_path), interval=0)
    with pytest.raises(ValueError, match="SNI directory"):
        fresh_context(str(layout.cert_path), str(layout.key_path), sni=[str(tmp_path / "missing")])
    assert checking_threads() == before
