"""Identities that do not come from files: the push API (:mod:`tlsreload_plugins.sources.pushed`) and SPIFFE's
Workload API (:mod:`tlsreload_plugins.sources.spiffe`), against a Workload API server that speaks SPIFFE's protocol
over a Unix socket (tests/workload_api_server.py: no SPIRE can be built here, there is no Go toolchain), driven
through SVID rotations, a bundle change, a stream that drops and comes back, and a malformed SVID.

Servers and clients run as subprocesses, hammered by real TLS clients meanwhile: no failed handshake, no failed
request.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from tlsreload_plugins.settings import resolve_spiffe
from tlsreload_plugins.sources.spiffe import NoSVID, SpiffeSource
from tlsreload_plugins.sources.workload_api import (
    MalformedResponse,
    channel_target,
    choose,
    decode_response,
    der_certificates,
)
from tlstest import (
    HOST,
    Hammer,
    Pair,
    child_running,
    client_context,
    free_port,
    get,
    handshake,
    run_server,
    serial_of,
    wait_until,
)
from workload_api_server import Svid, WorkloadAPI, encode_response, gunicorn_on, mint_svid

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"
INTERVAL = "0.3"
DEADLINE = 20.0


def pair_of(svid: Svid) -> Pair:
    """An SVID as PEM, for a test's own TLS client."""
    key = serialization.load_der_private_key(svid.key, None)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Pair(ssl.DER_cert_to_PEM_cert(svid.chain).encode(), key_pem, serial_of(svid.chain))


def served(port: int, ctx: ssl.SSLContext) -> str:
    with handshake(port, ctx) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)


def with_key_of(svid: Svid, other: Svid) -> Svid:
    """``svid`` with ``other``'s key: a malformed SVID (its key does not match its certificate)."""
    return Svid(svid.spiffe_id, svid.chain, other.key, svid.bundle)


def with_bundle(svid: Svid, *cas: trustme.CA) -> Svid:
    bundle = b"".join(ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode()) for ca in cas)
    return Svid(svid.spiffe_id, svid.chain, svid.key, bundle)


# --- the Workload API, decoded by hand ----------------------------------------------------------------


def test_an_x509_svid_response_is_decoded_as_spiffes_workload_proto_lays_it_out(ca: trustme.CA) -> None:
    one, two = mint_svid(ca, "one", "localhost"), mint_svid(ca, "two")
    two = with_bundle(two, ca, trustme.CA())
    svids = decode_response(encode_response([one, two], crl=b"\x30\x00"))
    assert [svid.spiffe_id for svid in svids] == ["spiffe://example.org/one", "spiffe://example.org/two"]
    assert svids[0].chain == one.chain and svids[0].key == one.key
    assert len(der_certificates(svids[1].bundle)) == 2
    chosen = choose(encode_response([one, two]))
    assert chosen.spiffe_id.endswith("/one") and chosen.cert == ssl.DER_cert_to_PEM_cert(one.chain).encode()
    assert chosen.key.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert choose(encode_response([one, two]), "spiffe://example.org/two").spiffe_id.endswith("/two")
    with pytest.raises(MalformedResponse, match=re.escape("no SVID for spiffe://example.org/three")):
        choose(encode_response([one]), "spiffe://example.org/three")
    for hostile in (b"", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a", b"\x0f", b"\x80" * 11):
        with pytest.raises(MalformedResponse):
            choose(hostile)
    for bad_der in (b"\x31\x00", b"\x30\x85\x00\x00\x00\x00\x00", b"\x30\x05\x00", b"\x30\x82\x01"):
        with pytest.raises(MalformedResponse):
            der_certificates(bad_der)
    # A chain that does not split into certificates is still written, for the readers to refuse.
    assert choose(encode_response([Svid("spiffe://example.org/x", b"\x01\x02", b"k", b"")])).cert.startswith(
        b"-----BEGIN CERTIFICATE-----"
    )


def test_workload_api_addresses_and_the_spiffe_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert channel_target("unix:///run/spire/agent.sock") == "unix:/run/spire/agent.sock"
    assert channel_target("unix:/run/agent.sock") == "unix:/run/agent.sock"
    assert channel_target("/run/agent.sock") == "unix:/run/agent.sock"
    assert channel_target("tcp://127.0.0.1:8081") == "127.0.0.1:8081"
    for bad in ("agent.sock", "http://x", "tcp://"):
        with pytest.raises(ValueError):
            channel_target(bad)
    monkeypatch.delenv("TLSRELOAD_SPIFFE", raising=False)
    assert resolve_spiffe(None) is None and resolve_spiffe(True) == "" and resolve_spiffe("/s") == "/s"
    monkeypatch.setenv("TLSRELOAD_SPIFFE", "1")
    assert resolve_spiffe(None) == ""
    monkeypatch.setenv("TLSRELOAD_SPIFFE", "unix:///a.sock")
    assert resolve_spiffe(None) == "unix:///a.sock" and resolve_spiffe(False) is None


# --- the source, against a Workload API server -------------------------------------------------------


def test_a_source_follows_rotations_a_bundle_change_a_dropped_stream_and_refuses_garbage(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    api = WorkloadAPI(tmp_path)
    first = mint_svid(ca, "web", "localhost")
    api.send([first])
    with api, SpiffeSource(api.endpoint, timeout=DEADLINE) as source:
        files = source.files
        assert files.ca_certs is not None and files.keyfile is not None
        assert Path(files.certfile).read_bytes() == ssl.DER_cert_to_PEM_cert(first.chain).encode()
        assert source.status().spiffe_id == "spiffe://example.org/web" and source.status().connected

        def holds(svid: Svid) -> bool:
            return Path(files.certfile).read_bytes() == ssl.DER_cert_to_PEM_cert(svid.chain).encode()

        rotated = mint_svid(ca, "web", "localhost")
        api.send([rotated])
        wait_until(lambda: holds(rotated), DEADLINE, what="the rotated SVID written")
        other_ca = trustme.CA()
        api.send([with_bundle(rotated, ca, other_ca)])
        wait_until(lambda: other_ca.cert_pem.bytes() in Path(files.ca_certs).read_bytes(), DEADLINE, what="bundle")

        api.stop()  # the agent goes away: the files keep the last identity
        wait_until(lambda: not source.status().connected, DEADLINE, what="the drop seen")
        assert holds(rotated) and source.status().drops == 1
        again = mint_svid(ca, "web", "localhost")
        api.send([again])
        api.start()
        wait_until(lambda: holds(again), DEADLINE, what="the SVID after the agent came back")
        assert source.status().connected

        api.send_raw(b"\x0a\xff\xff")  # garbage: not written
        wait_until(lambda: source.status().refused == 1, DEADLINE, what="the garbage refused")
        assert holds(again)

        # Files that cannot be written (a directory where the swap stages its link): counted, the stream followed on.
        blocker = Path(source.pushed.directory) / "..data_tmp"
        blocker.mkdir()
        api.send([mint_svid(ca, "web", "localhost")])
        wait_until(lambda: source.status().refused == 2, DEADLINE, what="the unwritable update refused")
        assert holds(again) and "..data_tmp" in (source.status().last_error or "")
        blocker.rmdir()
        last = mint_svid(ca, "web", "localhost")
        api.send([last])
        wait_until(lambda: holds(last), DEADLINE, what="the next update written")
    assert not os.path.exists(files.certfile)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("tlsreload_plugins.sources")]
    drops = [m for level, m in lines if level == "WARNING" and "went away" in m]
    assert len(drops) == 1 and str(api.socket) in drops[0]
    assert sum(1 for level, m in lines if level == "INFO" and "is back" in m) == 1
    assert sum(1 for level, m in lines if level == "WARNING" and "not written" in m) == 2


def test_a_source_with_no_svid_in_time_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", f"unix://{tmp_path}/absent.sock")
    with pytest.raises(NoSVID, match=re.escape(f"{tmp_path}/absent.sock within 0.5 s")):
        SpiffeSource(timeout=0.5)
    api = WorkloadAPI(tmp_path)  # a server that has nothing for this workload yet
    with api, pytest.raises(NoSVID, match=r"within 0\.5 s"):
        SpiffeSource(api.endpoint, timeout=0.5)
    monkeypatch.delenv("SPIFFE_ENDPOINT_SOCKET")
    with pytest.raises(ValueError, match="SPIFFE_ENDPOINT_SOCKET"):
        SpiffeSource()


# --- servers and a client on SVIDs ---------------------------------------------------------------------


def run_example(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )


def test_uvicorn_workers_and_an_httpx_client_on_svids_through_rotations_and_dropped_streams(
    tmp_path: Path, ca: trustme.CA
) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    server_api, client_api = WorkloadAPI(tmp_path / "server"), WorkloadAPI(tmp_path / "client")
    server_svid, client_svid = mint_svid(ca, "web", "localhost"), mint_svid(ca, "caller")
    server_api.send([server_svid])
    client_api.send([client_svid])
    hammer_ctx = client_context(ca, pair_of(mint_svid(ca, "hammer")))
    port = free_port()
    args = ["-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS), "--host", HOST]
    args += ["--port", str(port), "--workers", "2", "--ssl-cert-reqs", "2", "--tls-reload-interval", INTERVAL]
    args += [f"--tls-spiffe={server_api.endpoint}"]
    with server_api, client_api, run_server(args, tmp_path / "server.log", port) as server:
        wait_until(lambda: served(port, hammer_ctx) == serial_of(server_svid.chain), DEADLINE, what="serving")
        example = ["--url", f"https://localhost:{port}/", "--duration", "120", "--every", "50"]
        client = run_example(
            [str(EXAMPLES / "spiffe_httpx_client.py"), *example, "--interval", INTERVAL],
            tmp_path / "client.log",
            {"SPIFFE_ENDPOINT_SOCKET": client_api.endpoint},
        )
        try:
            watching = "watching client certificate"
            wait_until(lambda: watching in (tmp_path / "client.log").read_text(), DEADLINE, what="the client")
            with Hammer(port, hammer_ctx) as hammer:

                def all_serve(svid: Svid) -> None:
                    serial = serial_of(svid.chain)
                    wait_until(lambda: all(served(port, hammer_ctx) == serial for _ in range(6)), DEADLINE)

                def client_presents(svid: Svid, reloads: int) -> None:
                    wait_until(
                        lambda: (
                            (tmp_path / "client.log").read_text().count(serial_of(svid.chain)) >= 1
                            and (tmp_path / "client.log").read_text().count("reloaded client certificate") >= reloads
                        ),
                        DEADLINE,
                        what=f"the client presenting {serial_of(svid.chain)}",
                    )

                # A rotation on each side.
                server_svid, client_svid = mint_svid(ca, "web", "localhost"), mint_svid(ca, "caller")
                server_api.send([server_svid])
                client_api.send([client_svid])
                all_serve(server_svid)
                client_presents(client_svid, 1)

                # Both agents go away, rotate while away, come back: the last identities serve meanwhile.
                server_api.stop()
                client_api.stop()
                all_serve(server_svid)
                server_svid, client_svid = mint_svid(ca, "web", "localhost"), mint_svid(ca, "caller")
                server_api.send([server_svid])
                client_api.send([client_svid])
                server_api.start()
                client_api.start()
                all_serve(server_svid)
                client_presents(client_svid, 2)

                # A malformed SVID (its key not its certificate's): refused, the last good keeps serving.
                server_api.send([with_key_of(mint_svid(ca, "web", "localhost"), server_svid)])
                wait_until(lambda: server.output().count("certificate reload failed") >= 1, DEADLINE, what="refusal")
                all_serve(server_svid)
        finally:
            client.send_signal(signal.SIGTERM)
            out, _ = client.communicate(timeout=30)
        lines = [json.loads(line) for line in out.decode().splitlines()]
        assert lines and all(line["ok"] for line in lines), [line for line in lines if not line["ok"]][:3]
        assert hammer.successes > 0 and not hammer.failures, hammer.failures[:5]

        # A bundle change: a client of another CA is refused, then trusted once the bundle holds its CA. Not under
        # the hammer: a connection accepted before a client-CA change whose ClientHello comes after it is refused
        # (docs/internals.md, trust changes and session resumption).
        other_ca = trustme.CA()
        stranger = client_context(ca, pair_of(mint_svid(other_ca, "stranger")))
        with pytest.raises((ssl.SSLError, OSError)):
            get(port, stranger)  # TLS 1.3: the refusal comes after the handshake, on the first read
        server_api.send([with_bundle(server_svid, ca, other_ca)])
        wait_until(lambda: all(get(port, stranger) for _ in range(6)), DEADLINE, what="the new bundle")
    assert "the Workload API at" in server.output() and "is back" in server.output()
    assert "is back" in (tmp_path / "client.log").read_text()


@pytest.mark.parametrize("configured", ["drop-in", "own-config"])
def test_gunicorn_workers_on_svids_through_a_rotation_a_dropped_stream_and_a_hup(
    tmp_path: Path, ca: trustme.CA, configured: str
) -> None:
    """``drop-in``: the drop-in configuration with ``$TLSRELOAD_SPIFFE=1`` and ``$SPIFFE_ENDPOINT_SOCKET``;
    ``own-config``: the user's own ``gunicorn.conf.py`` naming the socket in ``tls_spiffe``, then ``reloading``."""
    api = WorkloadAPI(tmp_path)
    svid = mint_svid(ca, "web", "localhost")
    api.send([svid])
    ctx = client_context(ca)
    port = free_port()
    args, env = gunicorn_on(api, port, INTERVAL)
    if configured == "own-config":  # its configuration names the socket: nothing from the environment
        (tmp_path / "gunicorn.conf.py").write_text(
            "from tlsreload_plugins.gunicorn import reloading\n\n"
            f"tls_spiffe = {api.endpoint!r}\n\n"
            "reloading(globals())\n"
        )
        args[args.index("-c") + 1] = str(tmp_path / "gunicorn.conf.py")
        del env["TLSRELOAD_SPIFFE"], env["SPIFFE_ENDPOINT_SOCKET"]
    with api, run_server(args, tmp_path / "gunicorn.log", port, env=env) as server:
        wait_until(lambda: served(port, ctx) == serial_of(svid.chain), DEADLINE, what="serving")
        with Hammer(port, ctx) as hammer:

            def all_serve(svid: Svid) -> None:
                serial = serial_of(svid.chain)
                wait_until(lambda: all(served(port, ctx) == serial for _ in range(6)), DEADLINE, what=serial)

            svid = mint_svid(ca, "web", "localhost")
            api.send([svid])
            all_serve(svid)
            api.stop()
            all_serve(svid)
            svid = mint_svid(ca, "web", "localhost")
            api.send([svid])
            api.start()
            all_serve(svid)
            # A HUP reads the configuration again and starts new workers: they get the SVID's files too.
            server.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: server.output().count("Booting worker") >= 4, DEADLINE, what="new workers")
            svid = mint_svid(ca, "web", "localhost")
            api.send([svid])
            all_serve(svid)
        output = server.output()
    assert hammer.successes > 0 and not hammer.failures, hammer.failures[:5]
    assert output.count("went away") == 1 and output.count("is back") == 1, output


def test_tlsreload_uvicorn_refuses_spiffe_with_files_and_without_a_socket(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS)]
    env = {k: v for k, v in os.environ.items() if k not in ("SPIFFE_ENDPOINT_SOCKET", "TLSRELOAD_SPIFFE")}
    both = subprocess.run(
        [*command, "--ssl-certfile", "tls.crt", "--tls-spiffe"], capture_output=True, text=True, timeout=60, env=env
    )
    assert both.returncode == 2 and "drop --ssl-certfile" in both.stderr, both.stderr
    nowhere = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**env, "TLSRELOAD_SPIFFE": "1"}, cwd=tmp_path
    )
    assert nowhere.returncode == 3, nowhere.stderr
    assert "cannot serve TLS from SPIFFE: no Workload API socket" in nowhere.stderr, nowhere.stderr


def test_gunicorn_s_arbiter_runs_no_thread_and_a_source_process_that_goes_away_is_said_and_brought_back(
    tmp_path: Path, ca: trustme.CA
) -> None:
    """The stream is followed by a child process of the arbiter, which keeps one thread (it forks the workers);
    that process killed with SIGKILL is said by each worker at its next check, the last SVID serving on; a HUP starts
    another (sweeping the directory the killed one left) and the workers serve what it writes."""
    api = WorkloadAPI(tmp_path)
    svid = mint_svid(ca, "web", "localhost")
    api.send([svid])
    ctx = client_context(ca)
    port = free_port()
    args, env = gunicorn_on(api, port, INTERVAL)
    with api, run_server(args, tmp_path / "gunicorn.log", port, env=env) as server:
        wait_until(lambda: served(port, ctx) == serial_of(svid.chain), DEADLINE, what="serving")
        arbiter = server.proc.pid
        assert os.listdir(f"/proc/{arbiter}/task") == [str(arbiter)], "the arbiter runs one thread"
        source = child_running(arbiter, "sources.source_process")
        os.kill(source, signal.SIGKILL)
        gone = f"the SPIFFE source (process {source}, following the Workload API at {api.endpoint}) has gone"
        wait_until(lambda: server.output().count(gone) == 2, DEADLINE, what="each worker saying the source is gone")
        assert served(port, ctx) == serial_of(svid.chain)  # the last SVID serves on
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "has gone: starting another" in server.output(), DEADLINE, what="a new source process")
        svid = mint_svid(ca, "web", "localhost")
        api.send([svid])
        wait_until(lambda: all(served(port, ctx) == serial_of(svid.chain) for _ in range(6)), DEADLINE, what="new")
        assert os.listdir(f"/proc/{arbiter}/task") == [str(arbiter)]
        output = server.output()
    assert output.count(gone) == 2, output  # once per worker, not at every check
    assert "skipping fork() handlers" not in output, output  # no gRPC thread in the process that forks
