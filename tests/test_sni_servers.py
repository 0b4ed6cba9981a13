"""SNI identities end to end: real servers (gunicorn gthread, asgi, sync, gevent and tornado,
UvicornWorker, tlsreload-uvicorn, tlsreload-hypercorn; 2 workers each) as subprocesses, real clients
sending different server names. Each server is configured the way its users would: gunicorn through
``tls_sni`` in ./gunicorn.conf.py read by the drop-in, ``tls_sni`` before ``reloading(globals())``
in an own configuration, or ``$TLSRELOAD_SNI``; uvicorn and hypercorn through ``--tls-sni DIR``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from revocation_steps import Mtls, admitted, revocation_holds
from test_sni import NameHammer, install, sni_serial, trusting, verifying
from tlstest import HOST, KubeletLayout, Pair, free_port, issue, run_server, serial_of, wait_until, worker_status

TESTS = Path(__file__).parent
INTERVAL = "0.3"
DEADLINE = 40.0
BATCH = 6  # consecutive connections that must all agree: with 2 workers, each may land on either
SERVERS = ["gthread", "asgi", "UvicornWorker", "tlsreload-uvicorn", "hypercorn", "sync", "gevent", "tornado"]
GUNICORN = {"gthread", "asgi", "UvicornWorker", "sync", "gevent", "tornado"}


@dataclass
class Sites:
    sni: Path
    default: Pair
    a: Pair
    b: Pair
    wild: Pair
    exact: Pair
    layouts: dict[str, KubeletLayout]


def make_sites(tmp_path: Path, ca: trustme.CA) -> Sites:
    sni = tmp_path / "sni"
    layouts = {name: KubeletLayout(sni / name) for name in ("a", "b", "wild", "exact")}
    layouts["default"] = KubeletLayout(tmp_path / "default")
    return Sites(
        sni=sni,
        default=install(layouts["default"], issue(ca, "default.test")),
        a=install(layouts["a"], issue(ca, "a.test")),
        b=install(layouts["b"], issue(ca, "b.test")),
        wild=install(layouts["wild"], issue(ca, "*.w.test")),
        exact=install(layouts["exact"], issue(ca, "x.w.test")),
        layouts=layouts,
    )


def command(server: str, port: int, sites: Sites, tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The command line, environment and working directory that start ``server`` with ``sites``."""
    default = sites.layouts["default"]
    cert, key, sni = str(default.cert_path), str(default.key_path), str(sites.sni)
    # PYTHONPATH from the environment is kept, so the test can run against another copy of the package.
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env["TLSRELOAD_INTERVAL"] = INTERVAL
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    if server in GUNICORN:
        worker = "uvicorn_worker.UvicornWorker" if server == "UvicornWorker" else server
        app = "gunicorn_apps:asgi" if server in ("asgi", "UvicornWorker") else "gunicorn_apps:wsgi"
        args = ["-m", "gunicorn", "--certfile", cert, "--keyfile", key, "--bind", f"{HOST}:{port}"]
        args += ["--no-control-socket", "--graceful-timeout", "5", "--worker-class", worker, "--workers", "2"]
        if server in ("gthread", "gevent"):  # the drop-in reads ./gunicorn.conf.py, tls_sni included
            (cwd / "gunicorn.conf.py").write_text(f"tls_sni = [{sni!r}]\n")
            args += ["-c", "python:tlsreload_plugins.gunicorn_conf"]
        elif server == "asgi":  # an own configuration
            config = cwd / "conf.py"
            config.write_text(
                f"from tlsreload_plugins.gunicorn import reloading\ntls_sni = [{sni!r}]\nreloading(globals())\n"
            )
            args += ["-c", str(config)]
        else:
            env["TLSRELOAD_SNI"] = sni
            args += ["-c", "python:tlsreload_plugins.gunicorn_conf"]
        return [*args, app], env, cwd
    if server == "tlsreload-uvicorn":
        args = ["-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS)]
        args += ["--host", HOST, "--port", str(port), "--workers", "2", "--ssl-certfile", cert, "--ssl-keyfile", key]
        return [*args, "--tls-sni", sni, "--tls-reload-interval", INTERVAL], env, cwd
    app = f"{TESTS / 'gunicorn_apps.py'}:asgi"
    args = ["-m", "tlsreload_plugins.hypercorn", app, "--bind", f"{HOST}:{port}", "--workers", "2"]
    return [*args, "--certfile", cert, "--keyfile", key, "--tls-sni", sni], env, cwd


def every_connection(port: int, ctx: ssl.SSLContext, name: str | None, serial: str) -> bool:
    return all(sni_serial(port, ctx, name) == serial for _ in range(BATCH))


def wait_served(port: int, ctx: ssl.SSLContext, name: str | None, serial: str, what: str) -> None:
    wait_until(lambda: every_connection(port, ctx, name, serial), DEADLINE, interval=0.25, what=what)


@pytest.mark.parametrize("server", SERVERS)
def test_sni_identities_in_a_real_server(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    sites = make_sites(tmp_path, ca)
    port = free_port()
    args, env, cwd = command(server, port, sites, tmp_path)
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=cwd) as running:
        ctx, any_name = verifying(ca), trusting(ca)
        wait_served(port, ctx, "a.test", sites.a.serial, "the server up, serving a.test")
        # Each name its own leaf; an exact name beats the wildcard; the rest gets the default.
        assert every_connection(port, ctx, "b.test", sites.b.serial)
        assert every_connection(port, ctx, "x.w.test", sites.exact.serial)
        assert every_connection(port, ctx, "y.w.test", sites.wild.serial)
        assert every_connection(port, any_name, "w.test", sites.default.serial)
        assert every_connection(port, any_name, "unknown.test", sites.default.serial)
        assert every_connection(port, any_name, None, sites.default.serial)

        # Rotating one identity changes only its leaf, with no failed handshake.
        with NameHammer(port, ctx, ["a.test", "b.test", "y.w.test"]) as hammer:
            wait_until(lambda: hammer.successes > 10, DEADLINE, what="handshakes before the rotation")
            a2 = install(sites.layouts["a"], issue(ca, "a.test"))
            wait_served(port, ctx, "a.test", a2.serial, "a.test rotated in every worker")
            seen = hammer.successes
            wait_until(lambda: hammer.successes > seen + 10, DEADLINE, what="handshakes after the rotation")
        assert hammer.failures == [], running.output()
        assert hammer.serials["b.test"] == {sites.b.serial}
        assert hammer.serials["y.w.test"] == {sites.wild.serial}
        assert every_connection(port, any_name, None, sites.default.serial)

        # A bad pair for one identity: it keeps its last good leaf, the others serve on.
        sites.layouts["b"].write_raw(sites.b.chain, issue(ca, "b.test").key)
        wait_until(
            lambda: str(sites.layouts["b"].cert_path) in running.output() and "reload failed" in running.output(),
            DEADLINE,
            interval=0.25,
            what="the bad pair for b reported",
        )
        assert every_connection(port, ctx, "b.test", sites.b.serial)
        assert every_connection(port, ctx, "a.test", a2.serial)

        # An identity added while running, another removed (its name then falls to the wildcard).
        new = install(KubeletLayout(sites.sni / "new"), issue(ca, "new.test"))
        wait_served(port, any_name, "new.test", new.serial, "the new identity served")
        shutil.rmtree(sites.sni / "exact")
        wait_served(port, ctx, "x.w.test", sites.wild.serial, "x.w.test served by the wildcard once exact is gone")
        code = running.stop()
        out = running.output()
    assert code in (0, -15), out
    assert "Traceback" not in out, out
    assert "SNI identity exact removed" in out, out


def test_a_missing_sni_directory_stops_the_start_with_one_line(tmp_path: Path, ca: trustme.CA) -> None:
    sites = make_sites(tmp_path, ca)
    nowhere = str(tmp_path / "nowhere")
    for server in ("tlsreload-uvicorn", "hypercorn", "gthread"):
        port = free_port()
        args, env, cwd = command(server, port, sites, _fresh(tmp_path, server))
        env["TLSRELOAD_SNI"] = nowhere
        if "--tls-sni" in args:
            args[args.index("--tls-sni") + 1] = nowhere
        if server == "gthread":
            (cwd / "gunicorn.conf.py").write_text(f"tls_sni = [{nowhere!r}]\n")
        with run_server(args, tmp_path / f"{server}.log", port, env=env, cwd=cwd) as running:
            wait_until(lambda: running.proc.poll() is not None, DEADLINE, what=f"{server} to stop")
            out = running.output()
        assert running.proc.returncode != 0, out
        assert f"SNI directory {nowhere} does not exist" in out, out
        assert "Traceback" not in out, out


def pid_and_serial(port: int, ctx: ssl.SSLContext, name: str) -> tuple[int, str]:
    """Which worker answered a new connection sending server name ``name``, and the serial of the leaf it got."""
    with (
        socket.create_connection((HOST, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(4096):
            data += chunk
    assert der is not None
    return int(data.split(b"pid=", 1)[1].split()[0]), serial_of(der)


def answers(port: int, ctx: ssl.SSLContext, name: str, pids: set[int], tries: int = 200) -> dict[int, str]:
    """The serial each of the workers ``pids`` serves to ``name`` (new connections until each has answered)."""
    seen: dict[int, str] = {}
    for _ in range(tries):
        pid, serial = pid_and_serial(port, ctx, name)
        seen[pid] = serial
        if pids <= seen.keys():
            break
    return seen


def test_every_worker_serves_what_the_reader_published_never_the_files(tmp_path: Path, ca: trustme.CA) -> None:
    """tlsreload-uvicorn with two workers, SNI identities and an interval of an hour (no check runs during the
    test): a.test rotated on disk and a worker replaced, the new worker serves a.test as the server's reader
    published it, as its sibling does; no worker reads the files (only the reader does, at its interval), and
    the handshake builds the identity's context from the published bytes, in the ClientHello."""
    sites = make_sites(tmp_path, ca)
    port = free_port()
    args, env, cwd = command("tlsreload-uvicorn", port, sites, tmp_path)
    args[args.index("--tls-reload-interval") + 1] = "3600"
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=cwd) as running:
        ctx = verifying(ca)
        wait_served(port, ctx, "b.test", sites.b.serial, "the server up")
        seen: set[int] = set()
        wait_until(lambda: len(seen.update(answers(port, ctx, "b.test", set(), 20)) or seen) == 2, DEADLINE)
        install(sites.layouts["a"], issue(ca, "a.test"))
        stale, replaced = sorted(seen)
        os.kill(replaced, signal.SIGKILL)
        seen.discard(replaced)
        wait_until(lambda: len(seen.update(answers(port, ctx, "b.test", set(), 20)) or seen) == 2, DEADLINE)
        pids = set(seen)
        assert stale in pids, pids
        served = answers(port, ctx, "a.test", pids)
        assert served == dict.fromkeys(pids, sites.a.serial), (served, running.output())
        code = running.stop()
        out = running.output()
    assert code in (0, -15), out
    assert "Traceback" not in out, out


def _fresh(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def test_sni_identities_share_the_default_identity_s_crl_reported_once(tmp_path: Path, ca: trustme.CA) -> None:
    """tlsreload-uvicorn with a client-CA bundle, its CRL and an SNI identity: a revocation reaches handshakes naming
    the identity as it reaches the default identity; what concerns the shared bundle and CRL (a CA without a CRL, a
    revocation, a CRL refused, usable again) is said once, not once per identity."""
    mtls = Mtls(tmp_path, ca)
    mtls.bundle.write_bytes(mtls.client_ca.cert_pem.bytes() + trustme.CA().cert_pem.bytes())  # one CA uncovered
    a = install(KubeletLayout(tmp_path / "sni" / "a"), issue(ca, "a.test"))
    port = free_port()
    args = ["-m", "tlsreload_plugins.uvicorn", "hostile_apps:asgi", "--app-dir", str(TESTS), "--host", HOST]
    args += ["--port", str(port), "--ssl-certfile", str(mtls.cert), "--ssl-keyfile", str(mtls.key)]
    args += ["--ssl-ca-certs", str(mtls.bundle), "--ssl-cert-reqs", "2", "--tls-crl", str(mtls.crl)]
    args += ["--tls-sni", str(tmp_path / "sni"), "--tls-reload-interval", INTERVAL]
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        holder, other = mtls.client(mtls.holder), mtls.client(mtls.other)
        wait_until(lambda: admitted(port, other, "a.test"), DEADLINE, what="the server up")
        assert sni_serial(port, other, "a.test") == a.serial
        revocation_holds(port, mtls, server_name="a.test")
        assert not admitted(port, holder), "the default identity let the revoked holder in"

        mtls.crl.write_bytes(b"-----BEGIN X509 CRL-----\nbm90IGEgQ1JM\n-----END X509 CRL-----\n")
        wait_until(lambda: "reload failed" in running.output(), DEADLINE, what="the refused CRL reported")
        checks = worker_status(port, other)[1]["checks"]
        wait_until(lambda: worker_status(port, other)[1]["checks"] >= checks + 3, DEADLINE, what="three more checks")
        assert not admitted(port, holder, "a.test"), "the identity dropped the last good CRL"
        assert admitted(port, other, "a.test")

        mtls.revoke(mtls.holder)
        wait_until(lambda: "usable again" in running.output(), DEADLINE, what="the new CRL served")
        checks = worker_status(port, other)[1]["checks"]
        wait_until(lambda: worker_status(port, other)[1]["checks"] >= checks + 3, DEADLINE, what="three more checks")
        code = running.stop()
        out = running.output()
    assert code in (0, -15), out
    assert len([line for line in out.splitlines() if "holds no CRL for 1 CA" in line]) == 1, out
    assert len([line for line in out.splitlines() if "reloaded TLS certificate" in line]) == 2, out
    failed = [line for line in out.splitlines() if "reload failed" in line]
    assert len(failed) == 1 and str(mtls.crl) in failed[0], out
    assert len([line for line in out.splitlines() if "usable again" in line]) == 1, out
