"""End to end, aiohttp, websockets and Tornado (issue 26): each example run as its users would run it, with
real TLS clients. One body per behaviour, parametrized over the three servers.

``examples/<server>_app.py --certfile C --keyfile K --host H --port P``: kubelet and certbot rotations reach
new connections with no failed handshake under continuous traffic, a mismatched pair is refused once per
process, client-CA rotation (mutual TLS), a clean exit on SIGTERM and SIGINT, one line and status 1 for
unusable files at start. Tornado runs under ``fork_processes`` (2 processes) where that matters: a process
restarted while the files are broken serves the last good certificate. websockets: an open websocket keeps
its session across a rotation. The hostile-files matrix runs them too (``tests/kinds_<server>.py``).
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from tlstest import (
    HOST,
    LAYOUTS,
    Hammer,
    KubeletLayout,
    Pair,
    Server,
    client_context,
    free_port,
    get,
    issue,
    run_server,
    serial_of,
    wait_for_serial,
    wait_until,
)

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"
SERVERS = ["aiohttp", "websockets", "tornado"]
FORKED = {"tornado": 2}
"""Servers run with several processes: every one must reload."""
INTERVAL = "0.3"
DEADLINE = 30.0
FAILED = "certificate reload failed"
LAST_GOOD = "serving the last good certificate this server served"
UNCLEAN = re.compile(r"Traceback|Task was destroyed|was never awaited|Exception ignored|\w+Warning\b|\[ERROR\]", re.M)


def example(server: str, port: int, cert: Path, key: Path, *extra: str, processes: int = 1) -> list[str]:
    args = [sys.executable, str(EXAMPLES / f"{server}_app.py"), "--certfile", str(cert), "--keyfile", str(key)]
    args += ["--host", HOST, "--port", str(port), "--interval", INTERVAL, *extra]
    return [*args, "--processes", str(processes)] if processes > 1 else args


def fetch(port: int, ctx: ssl.SSLContext) -> tuple[str, int]:
    """``GET /`` on a new connection: (serial served, pid that answered, from ``pid=N`` or ``{"pid": N}``)."""
    serial, response = get(port, ctx)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), response[:300]
    match = re.search(rb'pid"?[=:] ?(\d+)', body)
    assert match, response
    return serial, int(match.group(1))


def wait_every_process(port: int, ctx: ssl.SSLContext, serial: str, processes: int) -> set[int]:
    """Wait until a batch of connections all get ``serial`` and ``processes`` distinct pids have served it."""
    pids: set[int] = set()

    def all_new() -> bool:
        batch = [fetch(port, ctx) for _ in range(6)]
        pids.update(pid for s, pid in batch if s == serial)
        return all(s == serial for s, _ in batch) and len(pids) >= processes

    wait_until(all_new, DEADLINE, what=f"{processes} processes serving {serial}")
    return pids


def refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        fetch(port, ctx)
    except (OSError, AssertionError):  # ssl.SSLError is an OSError; AssertionError: no response
        return True
    return False


def stop_cleanly(server: Server, sig: int = signal.SIGTERM) -> str:
    """Stop with ``sig``: status 0, no traceback, error or Python warning in the output."""
    code = server.stop(sig)
    out = server.output()
    assert code == 0, out
    assert not UNCLEAN.search(out), out
    return out


# --- rotations under load ----------------------------------------------------------------------


@pytest.mark.parametrize("layout_name", ["kubelet", "certbot"])
@pytest.mark.parametrize("server", SERVERS)
def test_rotations_reach_new_connections_under_load(
    tmp_path: Path, ca: trustme.CA, server: str, layout_name: str
) -> None:
    layout = LAYOUTS[layout_name](tmp_path / "tls")
    first, second, third = issue(ca), issue(ca), issue(ca)
    layout.install(first)
    port, ctx = free_port(), client_context(ca)
    processes = FORKED.get(server, 1)
    args = example(server, port, layout.cert_path, layout.key_path, processes=processes)
    with run_server(args, tmp_path / "server.log", port) as running:
        wait_every_process(port, ctx, first.serial, processes)
        with Hammer(port, ctx, threads=3) as hammer:
            layout.install(second)
            wait_every_process(port, ctx, second.serial, processes)
            layout.write_raw(third.chain, first.key)  # a mismatched pair: refused, second keeps serving
            wait_until(lambda: running.output().count(FAILED) >= processes, DEADLINE, what="every refusal")
            assert all(fetch(port, ctx)[0] == second.serial for _ in range(6))
            layout.install(third)
            wait_every_process(port, ctx, third.serial, processes)
        out = stop_cleanly(running)
    assert hammer.successes > 0
    assert hammer.failures == [], hammer.failures[:5]
    assert hammer.serials <= {first.serial, second.serial, third.serial}
    refusals = [line for line in out.splitlines() if FAILED in line]
    assert len(refusals) == processes and all("[WARNING]" in line for line in refusals), refusals


# --- what is particular to each server ---------------------------------------------------------


def test_an_open_websocket_keeps_its_session_across_a_rotation(tmp_path: Path, ca: trustme.CA) -> None:
    from websockets.sync.client import connect

    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port, ctx = free_port(), client_context(ca)
    with run_server(example("websockets", port, layout.cert_path, layout.key_path), tmp_path / "ws.log", port) as ws:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        with connect(f"wss://localhost:{port}/", ssl=ctx, open_timeout=DEADLINE) as websocket:
            websocket.send("before")
            assert websocket.recv(timeout=10) == "before"
            layout.install(second)
            wait_for_serial(port, ctx, second.serial, DEADLINE)
            with connect(f"wss://localhost:{port}/", ssl=ctx, open_timeout=DEADLINE) as newer:
                newer.send("new")
                assert newer.recv(timeout=10) == "new"
                assert serial_of(newer.socket.getpeercert(binary_form=True)) == second.serial
            for message in ("after", "still"):
                websocket.send(message)
                assert websocket.recv(timeout=10) == message
            assert serial_of(websocket.socket.getpeercert(binary_form=True)) == first.serial
        stop_cleanly(ws)


@pytest.mark.parametrize("server", SERVERS)
def test_mtls_client_ca_rotation(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    old_clients, new_clients = trustme.CA(), trustme.CA()
    old_client = client_context(ca, issue(old_clients, "old-client"))
    new_client = client_context(ca, issue(new_clients, "new-client"))
    anonymous = client_context(ca)
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca) for _ in range(2)]

    def install(pair: Pair, client_ca: trustme.CA) -> None:
        layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": client_ca.cert_pem.bytes()})

    install(pairs[0], old_clients)
    port = free_port()
    args = example(server, port, layout.cert_path, layout.key_path, "--ca-certs", str(layout.ca_path))
    with run_server(args, tmp_path / "server.log", port) as running:
        wait_every_process(port, old_client, pairs[0].serial, 1)
        assert all(refused(port, anonymous) for _ in range(3))
        assert all(refused(port, new_client) for _ in range(3))

        install(pairs[1], new_clients)
        wait_every_process(port, new_client, pairs[1].serial, 1)
        assert all(refused(port, old_client) for _ in range(3))
        assert all(refused(port, anonymous) for _ in range(3))  # still CERT_REQUIRED after the swap
        stop_cleanly(running, signal.SIGINT)


def test_a_tornado_process_restarted_on_broken_files_serves_the_last_good(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second, third = issue(ca), issue(ca), issue(ca)
    layout.install(first)
    port, ctx = free_port(), client_context(ca)
    args = example("tornado", port, layout.cert_path, layout.key_path, processes=2)
    with run_server(args, tmp_path / "server.log", port) as running:
        wait_every_process(port, ctx, first.serial, 2)
        layout.install(second)
        before = wait_every_process(port, ctx, second.serial, 2)
        layout.write_raw(third.chain, first.key)  # broken: a mismatched pair
        wait_until(lambda: running.output().count(FAILED) >= 2, DEADLINE, what="both processes' refusal")

        victim = next(iter(before))
        os.kill(victim, signal.SIGKILL)  # fork_processes restarts a child killed by a signal
        wait_until(lambda: f"(pid {victim}) killed by signal 9, restarting" in running.output(), DEADLINE)
        restarted = wait_until(lambda: {pid for _, pid in (fetch(port, ctx) for _ in range(6))} - before, DEADLINE)
        assert all(fetch(port, ctx)[0] == second.serial for _ in range(10))
        assert [line for line in running.output().splitlines() if LAST_GOOD in line and f"[{restarted.pop()}]" in line]

        layout.install(third)
        wait_every_process(port, ctx, third.serial, 2)
        code = running.stop()
        out = running.output()
    assert code == 0, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("server", SERVERS)
def test_unusable_files_at_start_stop_with_one_line(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    pair = issue(ca)
    layout.write_raw(b"not a certificate\n", pair.key)
    args = example(server, free_port(), layout.cert_path, layout.key_path, processes=FORKED.get(server, 1))
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out, out
    naming = [line for line in out.splitlines() if str(layout.cert_path) in line]
    assert len(naming) == 1 and "cannot serve TLS" in naming[0], out


def test_gunicorn_drop_in_refuses_an_aiohttp_worker_class_without_its_context_builder(
    tmp_path: Path, ca: trustme.CA
) -> None:
    """The guard on aiohttp's private builder: a worker class without it stops the server at start, one line."""
    layout = KubeletLayout(tmp_path / "tls")
    layout.install(issue(ca))
    args = [sys.executable, "-m", "gunicorn", "-c", "python:tlsreload_plugins.gunicorn_conf"]
    args += ["-k", "aiohttp_workers.WithoutContextBuilder"]
    args += ["--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path)]
    args += ["--bind", f"{HOST}:{free_port()}", "--no-control-socket", "asyncio_server_apps:aiohttp_app"]
    # PYTHONPATH from the environment is kept, so the test can run against another copy of the package.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out and "Booting worker" not in out, out
    reasons = [line for line in out.splitlines() if "WithoutContextBuilder" in line]
    assert len(reasons) == 1 and "[ERROR]" in reasons[0] and "could not be reloaded" in reasons[0], out
