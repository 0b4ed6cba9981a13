"""End-to-end tests of the gunicorn adapter: real gunicorn processes, real TLS clients, real rotations.

Each test starts gunicorn with 2 workers and checks with several consecutive connections (the
response body names the worker's pid) that every worker serves the newest certificate.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
import trustme

from tlsreload_plugins.gunicorn import reloading
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
    serial_of,
    wait_until,
)

TESTS = Path(__file__).parent
EXAMPLE_CONFIG = TESTS.parent / "examples" / "gunicorn.conf.py"
DROP_IN = "python:tlsreload_plugins.gunicorn_conf"
INTERVAL = "0.3"
DEADLINE = 30.0
UVICORN = "uvicorn_worker.UvicornWorker"
ASGI_WORKERS = {"asgi", UVICORN}
H2_WORKERS = {"gthread", "gevent", "asgi"}  # gunicorn 27 serves h2 with these; sync and tornado warn and fall back
WORKER_CLASSES = ["sync", "gthread", "gevent", "tornado", "asgi", UVICORN]
RELOADED = "reloaded TLS certificate"
FAILED = "certificate reload failed"
WAITING = "cannot load the TLS files and waits for usable ones"
LAST_GOOD = "serving the last good certificate this server served"


def gunicorn(port: int, cert: Path, key: Path, *extra: str, worker_class: str | None = "sync") -> list[str]:
    args = ["-m", "gunicorn", "--certfile", str(cert), "--keyfile", str(key), "--bind", f"{HOST}:{port}"]
    # Each arbiter must have its own control socket (the default path is shared machine-wide): none here.
    args += ["--no-control-socket", "--graceful-timeout", "5", *extra]
    if worker_class is not None:
        args += ["--worker-class", worker_class, "--workers", "2"]
    return [*args, "gunicorn_apps:asgi" if worker_class in ASGI_WORKERS else "gunicorn_apps:wsgi"]


def start(args: list[str], tmp_path: Path) -> AbstractContextManager[Server]:
    # PYTHONPATH from the environment is kept, so the suite can run against another copy of the package.
    paths = [str(TESTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"PYTHONPATH": os.pathsep.join(paths), "TLSRELOAD_INTERVAL": INTERVAL}
    port = int(args[args.index("--bind") + 1].rsplit(":", 1)[1])
    return run_server(args, tmp_path / "gunicorn.log", port, env=env)


def fetch(port: int, ctx: ssl.SSLContext, timeout: float = 10.0, server_name: str = "localhost") -> tuple[str, int]:
    """One HTTPS request on a new connection: (serial of the leaf served, pid of the worker)."""
    serial, response = get(port, ctx, timeout, server_name)
    match = re.search(rb"pid=(\d+)", response)
    assert match, response
    return serial, int(match.group(1))


def wait_every_worker(port: int, ctx: ssl.SSLContext, serial: str, workers: int = 2) -> set[int]:
    """Wait until a batch of connections all get ``serial`` and ``workers`` distinct pids have served it."""
    pids: set[int] = set()

    def all_new() -> bool:
        batch = [fetch(port, ctx) for _ in range(6)]
        pids.update(pid for s, pid in batch if s == serial)
        return all(s == serial for s, _ in batch) and len(pids) >= workers

    wait_until(all_new, DEADLINE, what=f"every worker serving {serial}")
    return pids


def assert_clean_exit(server: Server) -> str:
    code = server.stop()
    output = server.output()
    assert code == 0, output
    assert "Traceback" not in output, output
    return output


def h2_request(port: int, ctx: ssl.SSLContext) -> str:
    """One HTTP/2 request (ALPN h2, then a real exchange); returns the serial of the leaf served."""
    with httpx.Client(http2=True, verify=ctx) as client, client.stream("GET", f"https://{HOST}:{port}/") as response:
        body = response.read()
        tls = response.extensions["network_stream"].get_extra_info("ssl_object")
        assert response.http_version == "HTTP/2" and tls.selected_alpn_protocol() == "h2", response
        assert body.startswith(b"pid="), body
        return serial_of(tls.getpeercert(True))  # the low-level _ssl object: positional only


def refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        fetch(port, ctx)
    except (OSError, AssertionError):  # ssl.SSLError is an OSError; AssertionError: no response
        return True
    return False


@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_drop_in_reloads_every_worker_of_every_class(tmp_path: Path, ca: trustme.CA, worker_class: str) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca) for _ in range(4)]
    layout.install(pairs[0])
    port = free_port()
    h2 = worker_class in H2_WORKERS
    extra = ["-c", DROP_IN, *(["--http-protocols", "h2,h1"] if h2 else [])]
    ctx = client_context(ca)
    args = gunicorn(port, layout.cert_path, layout.key_path, *extra, worker_class=worker_class)
    with start(args, tmp_path) as server:
        first_pids = wait_every_worker(port, ctx, pairs[0].serial)
        with Hammer(port, ctx, threads=3) as hammer:
            for pair in pairs[1:3]:
                layout.install(pair)
                assert wait_every_worker(port, ctx, pair.serial) == first_pids  # swapped, not restarted
            # A key that does not match the certificate: every worker keeps its last good leaf.
            layout.write_raw(pairs[3].chain, pairs[2].key)
            wait_until(lambda: server.output().count(FAILED) >= 2, DEADLINE, what="both workers report the failure")
            assert {fetch(port, ctx)[0] for _ in range(10)} == {pairs[2].serial}
        assert hammer.failures == [], hammer.failures[:5]
        assert hammer.successes > 0
        assert pairs[2].serial in hammer.serials <= {pairs[0].serial, pairs[1].serial, pairs[2].serial}
        if h2:
            assert h2_request(port, ctx) == pairs[2].serial
        output = assert_clean_exit(server)
    # The package's lines are in gunicorn's error log, once each: one start line and two reloads per worker.
    assert output.count("watching cert=") == 2, output
    assert output.count(RELOADED) == 4, output
    assert output.count(FAILED) == 2, output


@pytest.mark.parametrize("worker_class", ["gthread", UVICORN])
def test_composed_user_config_keeps_its_hooks_and_tls13(tmp_path: Path, ca: trustme.CA, worker_class: str) -> None:
    layout = CertbotLayout(tmp_path / "letsencrypt")
    pairs = [issue(ca) for _ in range(3)]
    layout.install(pairs[0])
    port = free_port()
    args = gunicorn(port, layout.cert_path, layout.key_path, "-c", str(EXAMPLE_CONFIG), worker_class=None)
    if worker_class == UVICORN:
        args[-1:] = ["--worker-class", UVICORN, "gunicorn_apps:asgi"]
    tls13 = client_context(ca, minimum_version=ssl.TLSVersion.TLSv1_3)
    tls12 = client_context(ca, maximum_version=ssl.TLSVersion.TLSv1_2)
    with start(args, tmp_path) as server:
        wait_every_worker(port, tls13, pairs[0].serial)
        with Hammer(port, tls13, threads=3) as hammer:
            for pair in pairs[1:]:
                layout.install(pair)
                wait_every_worker(port, tls13, pair.serial)
        assert hammer.failures == [], hammer.failures[:5]
        assert pairs[2].serial in hammer.serials
        # The user's hook (TLS 1.3 only) applies to the reloaded context of every worker.
        assert all(refused(port, tls12) for _ in range(6))
        output = assert_clean_exit(server)
    assert output.count(RELOADED) == 4, output
    for hook in ("post_fork", "post_worker_init"):
        assert output.count(f"app hook: {hook} in worker") == 2, output
    if worker_class != UVICORN:  # uvicorn's worker dies of the SIGTERM it re-raises: no worker_exit, as without us
        assert output.count("app hook: worker_exit in worker") == 2, output


def test_mtls_client_ca_bundle_is_reloaded(tmp_path: Path, ca: trustme.CA) -> None:
    old_clients, new_clients = trustme.CA(), trustme.CA()
    old_client, new_client = issue(old_clients, "old-client"), issue(new_clients, "new-client")
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca) for _ in range(2)]

    def install(pair: Pair, client_ca: trustme.CA) -> None:
        layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": client_ca.cert_pem.bytes()})

    install(pairs[0], old_clients)
    port = free_port()
    mtls = ["-c", DROP_IN, "--ca-certs", str(layout.ca_path), "--cert-reqs", "2"]
    args = gunicorn(port, layout.cert_path, layout.key_path, *mtls, worker_class="gthread")
    with start(args, tmp_path) as server:
        wait_every_worker(port, client_context(ca, old_client), pairs[0].serial)
        assert all(refused(port, client_context(ca)) for _ in range(4))  # no client certificate
        assert all(refused(port, client_context(ca, new_client)) for _ in range(4))

        install(pairs[1], new_clients)
        wait_every_worker(port, client_context(ca, new_client), pairs[1].serial)
        assert all(refused(port, client_context(ca, old_client)) for _ in range(6))
        assert all(refused(port, client_context(ca)) for _ in range(6))  # still CERT_REQUIRED after the swap
        assert_clean_exit(server)


def test_preload_max_requests_hup_and_a_replacement_worker_with_broken_files(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca) for _ in range(5)]
    layout.install(pairs[0])
    port = free_port()
    ctx = client_context(ca)
    extra = ["-c", DROP_IN, "--preload", "--max-requests", "40"]
    with start(gunicorn(port, layout.cert_path, layout.key_path, *extra), tmp_path) as server:
        booted = wait_every_worker(port, ctx, pairs[0].serial)
        layout.install(pairs[1])
        wait_every_worker(port, ctx, pairs[1].serial)

        # max_requests: a replacement worker starts on the current leaf, then follows rotations.
        wait_until(lambda: {fetch(port, ctx)[1] for _ in range(10)} - booted, DEADLINE, what="a worker restart")
        layout.install(pairs[2])
        wait_every_worker(port, ctx, pairs[2].serial)
        reloaded_in = {int(pid) for pid in re.findall(rf"\[(\d+)\] \[INFO\] {RELOADED}", server.output())}
        assert reloaded_in - booted, "no replacement worker reloaded"

        # HUP: gunicorn starts new workers and stops the old ones, whose tickers end with them.
        before = {int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", server.output())}
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: not ({fetch(port, ctx)[1] for _ in range(10)} & before), DEADLINE, what="new workers")
        layout.install(pairs[3])
        wait_every_worker(port, ctx, pairs[3].serial)

        # Broken files on disk: a worker that max_requests replaces just then serves the last good
        # leaf instead of waiting or exiting, the others keep serving it, and all serve the next good
        # files. Each worker reports the problem: a serving one as a failed reload, a replacement one
        # as serving the last good certificate.
        def reports() -> int:
            output = server.output()
            return output.count(FAILED) + output.count(LAST_GOOD)

        reports_before = reports()
        layout.write_raw(pairs[4].chain, pairs[3].key)
        wait_until(lambda: reports() >= reports_before + 2, DEADLINE, what="failure reports")
        served: set[str] = set()

        def replacement_serves_last_good() -> bool:
            served.update(fetch(port, ctx)[0] for _ in range(10))
            return LAST_GOOD in server.output()

        wait_until(replacement_serves_last_good, DEADLINE, what="a replacement worker on the last good leaf")
        assert served == {pairs[3].serial}
        layout.install(pairs[4])
        wait_every_worker(port, ctx, pairs[4].serial)
        output = assert_clean_exit(server)
    assert "Handling signal: hup" in output
    assert "Worker failed to boot" not in output and "exited with code" not in output
    # Every worker that reported the broken files and then reloaded the good ones says the files are usable
    # again. Not every worker reports them: max_requests may replace a worker first, and a replacement that
    # serves the last good at once (content not judged yet) and sees the good files at its first check has
    # seen nothing broken. One at least did: the failure reports above.
    troubled = pids_saying(output, FAILED) | pids_saying(output, "the TLS files cannot be used")
    recovered = pids_saying(output, f"-> {pairs[4].serial}")
    assert troubled, output
    assert troubled & recovered <= pids_saying(output, "are usable again"), output


def pids_saying(output: str, words: str) -> set[int]:
    """The workers whose log lines (gunicorn's ``[pid] [LEVEL] message``) say ``words``."""
    return {int(pid) for pid in re.findall(rf"\[(\d+)\] \[[A-Z]+\] [^\n]*{re.escape(words)}", output)}


def test_unusable_files_at_start_stop_gunicorn_with_one_clear_error(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    good, other = issue(ca), issue(ca)
    layout.write_raw(good.chain, other.key)
    port = free_port()
    with start(gunicorn(port, layout.cert_path, layout.key_path, "-c", DROP_IN), tmp_path) as server:
        wait_until(lambda: server.proc.poll() is not None, DEADLINE, what="gunicorn to stop")
    output = server.output()
    assert server.proc.returncode == 1, output
    assert "Traceback" not in output, output
    assert "Booting worker" not in output and "Listening at" not in output, output
    errors = [line for line in output.splitlines() if "[ERROR]" in line and "TLS" in line]
    assert len(errors) == 2, output  # ours, then gunicorn's "Reason:"
    assert "cannot serve TLS: key file" in errors[0] and "does not match the certificate" in errors[0], errors


def test_add_reload_wraps_a_config_module_once() -> None:
    def ssl_context(conf: object, factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return factory()

    namespace: dict[str, object] = {"ssl_context": ssl_context, "workers": 2}
    reloading(namespace)
    wrapped = dict(namespace)
    assert {"ssl_context", "on_starting", "post_worker_init", "worker_exit"} <= wrapped.keys()
    assert "when_ready" not in wrapped  # the start-up check runs in on_starting, before the sockets are bound
    assert wrapped["ssl_context"] is not ssl_context and wrapped["workers"] == 2
    reloading(namespace)  # a config file executed twice, or a second call: no double wrapping
    assert namespace == wrapped


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
