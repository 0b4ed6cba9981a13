"""Certificate revocation lists in every server of the shared matrix: each kind of :mod:`server_kinds` runs with a
client-CA bundle and its CRL file, given in the server's own convention (``crl=`` of :func:`server_kinds.args`).

For every kind, while the holder of a client certificate keeps connecting:

1. the holder gets in from every worker and keeps a session from each: refusing it is possible at all;
2. the CRL is replaced by one revoking the holder: every worker refuses its new handshakes, and no session kept in
   1 gets back in, while another client of the same CA gets in from every worker;
3. the CRL is replaced by one revoking nobody: the holder gets in again.

On :data:`HOSTILE_KINDS`, each hostile CRL file (garbage, another CA's CRL, a forged one, an expired one, an empty
file, a FIFO) is reported by every worker naming the file, the last good CRL holds (the holder stays out) and nobody
else is refused; then a CA and its CRL rotated together take effect as one change. The core's cases in detail:
tests/test_crl.py.
"""

from __future__ import annotations

import datetime
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme

import server_kinds
from hostile import place_good
from test_hostile import TESTS, server_env
from test_trust import ask, client, sessions_from_every_worker
from test_uvicorn import drop_in as uvicorn_drop_in
from tlsreload_plugins.settings import CRL_ENV
from tlstest import (
    Pair,
    RenameEachLayout,
    Server,
    crl_pem,
    free_port,
    issue,
    replace_file,
    run_server,
    wait_until,
    worker_status,
)

DEADLINE = 30.0
"""Seconds for a server to start, or for every worker to take a new CRL (the interval is 0.3 s)."""
REFUSALS = 8
"""Consecutive new connections that must all be refused before the holder counts as refused by every worker."""
HOSTILE_KINDS = ("sync", "tlsreload-uvicorn")
"""Kinds that meet every hostile CRL file (the others: revoke and un-revoke only, to keep the suite's time)."""
DAY = datetime.timedelta(days=1)


class Trust:
    """A client-CA bundle and its CRL file on disk, and two clients of that CA."""

    def __init__(self, root: Path, server_ca: trustme.CA) -> None:
        self.server_ca = server_ca
        self.ca = trustme.CA()
        root.mkdir()
        self.bundle, self.crl = root / "ca.crt", root / "clients.crl"
        replace_file(self.bundle, self.ca.cert_pem.bytes())
        replace_file(self.crl, crl_pem(self.ca))
        self.holder = issue(self.ca, "holder.example")
        self.other = issue(self.ca, "other.example")

    def client(self, pair: Pair) -> ssl.SSLContext:
        return client(self.server_ca, pair, ssl.TLSVersion.TLSv1_3, False)


def refused_by_every_worker(port: int, ctx: ssl.SSLContext) -> float:
    """Seconds until :data:`REFUSALS` new connections of ``ctx`` in a row are refused."""
    start = time.monotonic()
    wait_until(
        lambda: not any(ask(port, ctx).ok for _ in range(REFUSALS)), DEADLINE, interval=0.05, what="every refusal"
    )
    return time.monotonic() - start


def statuses(port: int, ctx: ssl.SSLContext, workers: int) -> dict[int, dict[str, object]]:
    """The first reloader's ``status()`` of each of ``workers`` processes (``/status``)."""
    found: dict[int, dict[str, object]] = {}

    def every_worker() -> bool:
        pid, status = worker_status(port, ctx)
        found[pid] = status
        return len(found) >= workers

    wait_until(every_worker, DEADLINE, interval=0.01, what="the status of every worker")
    return found


def reloaded_in_every_worker(port: int, ctx: ssl.SSLContext, before: dict[int, dict[str, object]]) -> None:
    """Wait until each worker of ``before`` (its first reloader's status, by pid) has reloaded since."""
    pending = set(before)

    def every_worker() -> bool:
        pid, status = worker_status(port, ctx)
        if pid in pending and int(str(status["reloads"])) > int(str(before[pid]["reloads"])):
            pending.discard(pid)
        return not pending

    wait_until(every_worker, DEADLINE, interval=0.01, what="a reload in every worker")


@pytest.fixture(params=list(server_kinds.KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start(kind: str, tmp_path: Path, ca: trustme.CA, trust: Trust) -> tuple[int, list[str]]:
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    port = free_port()
    return port, server_kinds.args(kind, port, layout, client_ca=trust.bundle, crl=trust.crl)


def test_a_revocation_reaches_every_worker_and_no_session_made_before_it(
    kind: str, ca: trustme.CA, tmp_path: Path
) -> None:
    trust = Trust(tmp_path / "clients", ca)
    port, command = start(kind, tmp_path, ca, trust)
    workers = server_kinds.workers(kind)
    holder, other = trust.client(trust.holder), trust.client(trust.other)
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        kept = in_from_every_worker(server, port, holder, workers, "before any revocation")
        before = statuses(port, other, workers)

        replace_file(trust.crl, crl_pem(trust.ca, trust.holder))
        refused_by_every_worker(port, holder)
        # REFUSALS in a row may all have met one worker: the sessions are offered once every worker took the CRL.
        reloaded_in_every_worker(port, other, before)
        answered = [ask(port, holder, session) for session in kept.values() for _ in range(4)]
        assert not any(answer.ok for answer in answered), f"{kind}: a session made before the revocation got in"
        in_from_every_worker(server, port, other, workers, "a client nobody revoked")

        replace_file(trust.crl, crl_pem(trust.ca))
        in_from_every_worker(server, port, holder, workers, "un-revoked")


def in_from_every_worker(
    server: Server, port: int, ctx: ssl.SSLContext, workers: int, when: str
) -> dict[int, ssl.SSLSession]:
    try:
        return sessions_from_every_worker(port, ctx, workers)
    except AssertionError:
        raise AssertionError(f"refused from some worker ({when})\n{server.output()}") from None


HOSTILE = ("garbage", "another CA's", "forged", "expired", "empty", "fifo")


def place_hostile(trust: Trust, case: str) -> None:
    if case == "fifo":
        staged = trust.crl.with_name(".fifo")
        os.mkfifo(staged)
        os.replace(staged, trust.crl)
        return
    data = {
        "garbage": b"-----BEGIN X509 CRL-----\nbm90IGEgQ1JM\n-----END X509 CRL-----\n",
        "another CA's": crl_pem(trustme.CA()),
        "forged": crl_pem(trust.ca, signer=trustme.CA()),
        "expired": crl_pem(trust.ca, last_update=-2 * DAY, next_update=-DAY),
        "empty": b"",
    }[case]
    replace_file(trust.crl, data)


@pytest.mark.parametrize("hostile_kind", HOSTILE_KINDS)
def test_hostile_crl_files_keep_the_last_good_one_and_a_ca_rotates_with_its_crl(
    hostile_kind: str, ca: trustme.CA, tmp_path: Path
) -> None:
    trust = Trust(tmp_path / "clients", ca)
    replace_file(trust.crl, crl_pem(trust.ca, trust.holder))
    port, command = start(hostile_kind, tmp_path, ca, trust)
    workers = server_kinds.workers(hostile_kind)
    holder, other = trust.client(trust.holder), trust.client(trust.other)
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        in_from_every_worker(server, port, other, workers, "at start")
        assert not ask(port, holder).ok
        for case in HOSTILE:
            place_hostile(trust, case)

            def reported(case: str = case) -> bool:
                found = statuses(port, other, workers)
                return all(str(trust.crl) in str(status["last_error"] or "") for status in found.values())

            wait_until(reported, DEADLINE, what=f"every worker reporting the {case} CRL")
            assert not any(ask(port, holder).ok for _ in range(REFUSALS)), f"{case}: the last good CRL no longer holds"
            in_from_every_worker(server, port, other, workers, f"{case} CRL on disk")
        # A CA and its CRL written together (the bundle a moment before its CRL): one change.
        successor = trustme.CA()
        newcomer, revoked = issue(successor, "new.example"), issue(successor, "revoked.example")
        replace_file(trust.bundle, successor.cert_pem.bytes())
        replace_file(trust.crl, crl_pem(successor, revoked))
        in_from_every_worker(server, port, trust.client(newcomer), workers, "the successor CA")
        refused_by_every_worker(port, trust.client(revoked))
        refused_by_every_worker(port, other)


def test_grpc_refuses_a_crl_at_start_with_one_line(ca: trustme.CA, tmp_path: Path) -> None:
    trust = Trust(tmp_path / "clients", ca)
    pair = issue(ca, "localhost")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    port = free_port()
    command = [sys.executable, str(TESTS / "grpc_apps.py"), "--certfile", str(cert), "--keyfile", str(key)]
    command += ["--port", str(port), "--ca-certs", str(trust.bundle)]
    env = {**os.environ, **server_env(), CRL_ENV: str(trust.crl)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert "take no certificate revocation list" in result.stdout + result.stderr


@pytest.mark.parametrize("way", ["reloading", "drop-in"])
def test_gunicorn_takes_tls_crl_from_its_own_configuration(ca: trustme.CA, tmp_path: Path, way: str) -> None:
    """A user's gunicorn configuration with ``tls_crl = ...`` and ``tls_reload_interval = ...`` (gunicorn's own
    convention for tlsreload's settings), read by ``reloading(globals())`` at its end, or by the drop-in
    (``-c python:tlsreload_plugins.gunicorn_conf``, which reads ``./gunicorn.conf.py``): the CRL reloads in every
    worker, which checks at that interval."""
    trust = Trust(tmp_path / "clients", ca)
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    settings = f"tls_crl = {str(trust.crl)!r}\ntls_reload_interval = 0.4\n"
    if way == "reloading":
        config = tmp_path / "gunicorn_conf.py"
        config.write_text(f"from tlsreload_plugins.gunicorn import reloading\n{settings}reloading(globals())\n")
        given = ("-c", str(config))
    else:
        (tmp_path / "gunicorn.conf.py").write_text(settings)
        given = ("-c", server_kinds.DROP_IN)
    port = free_port()
    command = server_kinds.gunicorn(
        port, layout.cert_path, layout.key_path, *given, "--ca-certs", str(trust.bundle), "--cert-reqs", "2"
    )
    command[-1] = "hostile_apps:wsgi"
    holder, other = trust.client(trust.holder), trust.client(trust.other)
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        in_from_every_worker(server, port, holder, 2, "before the revocation")
        assert worker_status(port, holder)[1]["interval"] == 0.4
        replace_file(trust.crl, crl_pem(trust.ca, trust.holder))
        refused_by_every_worker(port, holder)
        in_from_every_worker(server, port, other, 2, "another client of the CA, after the revocation")


def test_a_crl_no_client_is_asked_to_meet_is_named_once(ca: trustme.CA, tmp_path: Path) -> None:
    """tlsreload-uvicorn with a client-CA bundle and its CRL but uvicorn's default ``--ssl-cert-reqs 0``: the server
    asks no client for a certificate, so the CRL refuses nobody. One WARNING says so, naming the CRL file."""
    trust = Trust(tmp_path / "clients", ca)
    replace_file(trust.crl, crl_pem(trust.ca, trust.holder))
    layout = RenameEachLayout(tmp_path / "tls")
    place_good(layout.cert_path, layout.key_path, ca)
    port = free_port()
    command = uvicorn_drop_in(
        port, layout, "--ssl-ca-certs", str(trust.bundle), "--tls-crl", str(trust.crl), app="hostile_apps:asgi"
    )
    holder = trust.client(trust.holder)
    unasked = "refuses nobody"
    with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
        wait_until(lambda: ask(port, holder).ok, DEADLINE, what="the revoked holder in, asked for no certificate")
        wait_until(lambda: unasked in server.output(), DEADLINE, what="the CRL named as refusing nobody")
        seen = checks(port, holder)
        wait_until(lambda: checks(port, holder) >= seen + 3, DEADLINE, what="three more checks")
        out = server.output()
    warned = [line for line in out.splitlines() if unasked in line]
    assert len(warned) == 1 and "WARNING" in warned[0] and str(trust.crl) in warned[0], out


def checks(port: int, ctx: ssl.SSLContext) -> int:
    """How many checks the reloader of the process answering has made."""
    return int(worker_status(port, ctx)[1]["checks"])
