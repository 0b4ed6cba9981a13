"""End-to-end tests of the cheroot and CherryPy glue: ``examples/cheroot_app.py`` as a real process (cheroot's
``wsgi.Server`` with :class:`ReloadingSSLAdapter`, and CherryPy with ``server.ssl_module 'tlsreload'``), real
TLS clients, rotations written as kubelet and certbot write them.

The bodies that every server of issue 26 goes through the same way (rotations under continuous handshakes,
bad inputs that keep the last good certificate, a client-CA rotation, a clean stop) are the functions below;
test_sanic.py runs them against Sanic. Every response names the serving pid (``pid=N``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from revocation_steps import Mtls, revocation_holds
from test_gunicorn import fetch, wait_every_worker
from tlsreload_plugins.settings import CRL_ENV
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
    get,
    issue,
    run_server,
    served_serial,
    wait_until,
    with_password,
)

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "cheroot_app.py"
INTERVAL = "0.3"
DEADLINE = 30.0
ROTATIONS = 3
FAILED = "certificate reload failed"
RELOADED = "reloaded TLS certificate"
WATCHING = "watching "
# What an unclean run or exit leaves in the output: a traceback, an unraisable exception, a Python warning, an error.
UNCLEAN = re.compile(r"Traceback|Exception ignored|\w+Warning\b|\[ERROR\]|ERROR:")


# --- shared with test_sanic.py --------------------------------------------------------------------


def example(script: Path, port: int, layout: Layout, *extra: str) -> list[str]:
    """``python examples/<server>_app.py`` on ``layout``'s files, as the issue runs every example."""
    args = [sys.executable, str(script), "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    return [*args, "--host", HOST, "--port", str(port), "--interval", INTERVAL, *extra]


@contextlib.contextmanager
def start(args: list[str], tmp_path: Path, port: int, env: dict[str, str] | None = None) -> Iterator[Server]:
    """``args`` with tests/ importable (and ``$PYTHONPATH`` kept: the suite may run against another copy of the
    package), ``$TLSRELOAD_INTERVAL`` and ``env``; SIGINT as a server started at a terminal gets it."""
    paths = [str(ROOT / "tests"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    full = {"TLSRELOAD_INTERVAL": INTERVAL, "PYTHONPATH": os.pathsep.join(paths), **(env or {})}
    with contextlib.ExitStack() as stack:
        with sigint_as_from_a_terminal():
            server = stack.enter_context(run_server(args, tmp_path / "server.log", port, env=full, cwd=tmp_path))
        yield server


@contextlib.contextmanager
def sigint_as_from_a_terminal() -> Iterator[None]:
    """Processes started in the block get SIGINT at its default (Python makes it KeyboardInterrupt), however pytest
    was started. A process inherits an ignored or blocked SIGINT (pytest run in the background by a non-interactive
    shell, under nohup, by some CI runners), and Python leaves an ignored SIGINT ignored: CherryPy, which stops on
    KeyboardInterrupt in ``engine.block()``, would never see the tests' SIGINT, stock CherryPy as with the plugin
    (issue 46: "did not stop within 20 s of SIGINT", no "Bus STOPPING"; ``benchmarks/stop_under_load.py --sigint
    ignored``)."""
    if threading.current_thread() is not threading.main_thread():  # signal dispositions are set there only
        yield
        return
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if ignored:  # a handled signal is back at its default in the new program; an ignored one would stay ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        yield
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def lines_with(out: str, text: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


def more_handshakes(hammer: Hammer, count: int = 20) -> None:
    target = hammer.successes + count
    wait_until(lambda: hammer.successes >= target, DEADLINE, what=f"{count} more handshakes")


def rotate_under_load(port: int, layout: Layout, ca: trustme.CA, first: Pair, workers: int) -> Pair:
    """Rotations written by ``layout`` while four clients handshake without pause: every worker serves each
    new leaf and no handshake fails. Returns the leaf served last."""
    ctx = client_context(ca)
    wait_every_worker(port, ctx, first.serial, workers)
    latest = first
    with Hammer(port, ctx, threads=4) as hammer:
        for _ in range(ROTATIONS):
            more_handshakes(hammer)
            latest = issue(ca)
            layout.install(latest)
            wait_every_worker(port, ctx, latest.serial, workers)
        wait_until(lambda: latest.serial in hammer.serials, DEADLINE, what="the hammer on the new leaf")
    assert hammer.failures == [], hammer.failures[:5]
    assert hammer.successes > 20 * ROTATIONS
    return latest


def keep_last_good(server: Server, port: int, layout: Layout, ca: trustme.CA, latest: Pair, workers: int) -> Pair:
    """A key that is not the certificate's, then a missing key: each reported once per worker with the file
    named, the last good leaf served throughout; good files afterwards are served. Returns them."""
    ctx = client_context(ca)
    offset = len(server.output())

    def failures() -> list[str]:
        return lines_with(server.output()[offset:], FAILED)

    layout.write_raw(issue(ca).chain, latest.key)
    wait_until(lambda: len(failures()) >= workers, DEADLINE, what="the mismatch reported")
    assert all(served_serial(port, ctx) == latest.serial for _ in range(6))
    os.unlink(layout.key_path)
    wait_until(lambda: len(failures()) >= 2 * workers, DEADLINE, what="the missing key reported")
    assert all(served_serial(port, ctx) == latest.serial for _ in range(6))

    fixed = issue(ca)
    layout.install(fixed)
    wait_every_worker(port, ctx, fixed.serial, workers)
    reports = failures()
    assert sum("does not match" in line for line in reports) == workers, reports
    assert sum(f"{layout.key_path} does not exist" in line for line in reports) == workers, reports
    return fixed


def rotate_client_cas(port: int, layout: KubeletLayout, ca: trustme.CA, old: trustme.CA, new: trustme.CA) -> None:
    """The server trusts clients of ``old`` (``layout``'s ca.crt); a kubelet swap brings a new pair and ``new``:
    clients of ``new`` get in, those of ``old`` and clients without a certificate are refused."""
    old_client = client_context(ca, issue(old, "client.test"))
    new_client = client_context(ca, issue(new, "client.test"))
    anonymous = client_context(ca)
    first = served_serial(port, old_client)
    assert refused(port, new_client) and refused(port, anonymous)
    second = issue(ca)
    layout.write_files({"tls.crt": second.chain, "tls.key": second.key, "ca.crt": new.cert_pem.bytes()})

    def every_worker_rotated() -> bool:  # six in a row: each connection may land on another worker
        return all(get(port, new_client)[0] == second.serial and refused(port, old_client) for _ in range(6))

    wait_until(every_worker_rotated, DEADLINE, what="the new client CA on every worker")
    assert first != second.serial
    assert refused(port, anonymous)  # client certificates still required after the reload


def refused(port: int, ctx: ssl.SSLContext) -> bool:
    """The server refuses this client: the handshake or the request fails (TLS 1.3 reports a refused client
    certificate after the handshake)."""
    try:
        get(port, ctx, timeout=5)
    except (OSError, AssertionError):
        return True
    return False


def stop_cleanly(
    server: Server, sig: int = signal.SIGTERM, stock: str = "", forgiven: Callable[[str], str] = str
) -> str:
    """Stop with ``sig``: exit status 0, no traceback, error or warning but the reports of bad files and the lines
    the stock server prints in the same case (those containing ``stock``, and what ``forgiven`` removes)."""
    code = server.stop(sig)
    out = server.output()
    assert code == 0, out
    rest = forgiven(out).splitlines()
    assert not UNCLEAN.search("\n".join(line for line in rest if not stock or stock not in line)), out
    return out


def mtls_layout(tmp_path: Path, ca: trustme.CA, clients: trustme.CA) -> KubeletLayout:
    layout = KubeletLayout(tmp_path / "tls")
    pair = issue(ca)
    layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": clients.cert_pem.bytes()})
    return layout


# --- cheroot and CherryPy ---------------------------------------------------------------------------


WAYS = {"cheroot": (), "cherrypy": ("--cherrypy",)}


def engine_started(server: Server) -> None:
    """Wait until CherryPy's engine says it has started. Its HTTP server serves from its own thread before that,
    while the main thread is still in ``engine.start()``; a SIGINT then raises KeyboardInterrupt out of it, past
    ``engine.block()``, which alone stops the engine on it, and the process waits forever for the HTTP server's
    thread (stock CherryPy 18.10 as with the plugin: ``benchmarks/stop_under_load.py --moments served``)."""
    wait_until(lambda: "Bus STARTED" in server.output(), DEADLINE, what="CherryPy's engine started")


@pytest.mark.parametrize(
    ("way", "layout_class", "sig"),
    [("cheroot", KubeletLayout, signal.SIGTERM), ("cherrypy", CertbotLayout, signal.SIGINT)],
    ids=["cheroot-kubelet-sigterm", "cherrypy-certbot-sigint"],
)
def test_rotations_reach_new_connections_and_bad_files_keep_the_last_good(
    ca: trustme.CA, tmp_path: Path, way: str, layout_class: Callable[[Path], Layout], sig: int
) -> None:
    layout = layout_class(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    with start(example(EXAMPLE, port, layout, *WAYS[way]), tmp_path, port) as server:
        latest = rotate_under_load(port, layout, ca, first, workers=1)
        serial, response = get(port, client_context(ca))
        assert f"serial={serial}".encode() in response  # cheroot's SSL_SERVER_* environ follows the reload
        fixed = keep_last_good(server, port, layout, ca, latest, workers=1)
        assert f"serial={fixed.serial}".encode() in get(port, client_context(ca))[1]
        if way == "cherrypy":
            engine_started(server)
        out = stop_cleanly(server, sig)
    assert len(lines_with(out, WATCHING)) == 1 and "every 0.3s" in lines_with(out, WATCHING)[0]
    assert len(lines_with(out, RELOADED)) == ROTATIONS + 1


@pytest.mark.parametrize("side", ["stock", "plugin"])
def test_sigint_stops_cherrypy_however_pytest_was_started(ca: trustme.CA, tmp_path: Path, side: str) -> None:
    """pytest itself ignoring SIGINT (started in the background by a non-interactive shell): CherryPy, stock and with
    the plugin alike, still stops on the test's SIGINT, through KeyboardInterrupt in ``engine.block()``, as when
    stopped with Ctrl-C at a terminal. Both kept serving, with no "Bus STOPPING", before :func:`start` gave the
    servers SIGINT at its default. Sent once the engine has started (:func:`engine_started`)."""
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    if side == "plugin":
        args = example(EXAMPLE, port, layout, "--cherrypy")
    else:
        args = ["-m", "cheroot_apps", "--stock-cherrypy", "--certfile", str(layout.cert_path)]
        args += ["--keyfile", str(layout.key_path), "--port", str(port)]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with start(args, tmp_path, port) as server:
            wait_until(lambda: served_serial(port, client_context(ca)) == first.serial, DEADLINE, what="serving")
            engine_started(server)
            out = stop_cleanly(server, signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "Keyboard Interrupt: shutting down bus" in out and "Bus STOPPING" in out, out


@pytest.mark.parametrize("way", list(WAYS))
def test_mtls_client_ca_rotation(ca: trustme.CA, tmp_path: Path, way: str) -> None:
    old, new = trustme.CA(), trustme.CA()
    layout = mtls_layout(tmp_path, ca, old)
    port = free_port()
    args = example(EXAMPLE, port, layout, "--ca-certs", str(layout.ca_path), *WAYS[way])
    with start(args, tmp_path, port) as server:
        wait_until(lambda: fetch(port, client_context(ca, issue(old, "c.test"))), DEADLINE, what="server up")
        rotate_client_cas(port, layout, ca, old, new)
        stop_cleanly(server)


def test_cherrypy_ssl_module_takes_its_crl_from_the_environment(ca: trustme.CA, tmp_path: Path) -> None:
    """CherryPy builds the adapter from ``server.ssl_*`` (the example registers the subclass requiring client
    certificates as ``server.ssl_module = "tlsreload-mtls"``): the CRL comes from ``$TLSRELOAD_CRL``."""
    mtls = Mtls(tmp_path, ca)
    port = free_port()
    args = [sys.executable, str(EXAMPLE), "--cherrypy", "--certfile", str(mtls.cert), "--keyfile", str(mtls.key)]
    args += ["--ca-certs", str(mtls.bundle), "--host", HOST, "--port", str(port), "--interval", INTERVAL]
    with start(args, tmp_path, port, env={CRL_ENV: str(mtls.crl)}) as server:
        revocation_holds(port, mtls)
        stop_cleanly(server)


def test_encrypted_key_reloads_with_the_password_file(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = (with_password(issue(ca), "s3cret") for _ in range(2))
    layout.install(first)
    (tmp_path / "password").write_text("s3cret\n")
    port = free_port()
    args = example(EXAMPLE, port, layout)
    env = {"TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_KEY_PASSWORD_FILE": str(tmp_path / "password")}
    ctx = client_context(ca)
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        wait_until(lambda: served_serial(port, ctx) == first.serial, DEADLINE, what="the first leaf")
        layout.install(with_password(issue(ca), "other"))
        wait_until(lambda: FAILED in server.output(), DEADLINE, what="the wrong password reported")
        layout.install(second)
        wait_until(lambda: served_serial(port, ctx) == second.serial, DEADLINE, what="the second leaf")
        out = stop_cleanly(server)
    assert "wrong password" in lines_with(out, FAILED)[0] and "s3cret" not in out


@pytest.mark.parametrize("way", list(WAYS))
def test_unusable_files_at_start_stop_the_example_with_one_error(ca: trustme.CA, tmp_path: Path, way: str) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    layout.write_raw(issue(ca).chain, issue(ca).key)  # a key that is not the certificate's
    port = free_port()
    with start(example(EXAMPLE, port, layout, *WAYS[way]), tmp_path, port) as server:
        wait_until(lambda: server.proc.poll() is not None, DEADLINE, what="the example to stop")
    out = server.output()
    if way == "cheroot":
        assert server.proc.returncode == 1 and "Traceback" not in out, out
        errors = lines_with(out, "[ERROR]")
    else:  # CherryPy reports any failed start listener with its traceback, and exits with 70 (EX_SOFTWARE)
        assert server.proc.returncode == 70, out
        errors = lines_with(out, "tlsreload: cannot serve TLS")
    assert len(errors) == 1 and "does not match" in errors[0] and str(layout.cert_path) in errors[0], out
