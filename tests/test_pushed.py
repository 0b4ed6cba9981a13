"""The push API (:mod:`tlsreload_plugins.sources.pushed`): an identity handed over as bytes, written as one atomic
swap of private files that every server and client takes as it takes files; the example that keeps a server and a
client fresh from a dict standing in for a secret manager; every server of the shared matrix following pushes (the
clients' matrix: tests/test_clients.py, its "pushed" layout)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

import server_kinds
from test_gunicorn import DEADLINE, FAILED, fetch, wait_every_worker
from test_hostile import server_env
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.sources import PushedIdentity
from tlstest import Hammer, client_context, free_port, issue, run_server, wait_until

EXAMPLES = Path(__file__).parent.parent / "examples"


# --- the push API ---------------------------------------------------------------------------------


def test_a_push_swaps_every_file_at_once_private_and_removed_at_close(ca: trustme.CA) -> None:
    first, second = ca.issue_cert("localhost"), ca.issue_cert("localhost")
    with PushedIdentity() as pushed:
        with pytest.raises(RuntimeError, match="nothing was pushed"):
            pushed.files  # noqa: B018
        assert pushed.push(first.cert_chain_pems[0].bytes(), first.private_key_pem.bytes(), ca.cert_pem.bytes())
        files = pushed.files
        assert files.ca_certs is not None and files.keyfile is not None
        assert stat.S_IMODE(os.stat(pushed.directory).st_mode) == 0o700
        for path in (files.certfile, files.keyfile, files.ca_certs):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert Path(files.keyfile).read_bytes() == first.private_key_pem.bytes()

        # A reader that opens the files through the "..data" link always finds one push's files, never a mix.
        torn: list[str] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                try:
                    version = os.readlink(os.path.join(pushed.directory, "..data"))
                    base = Path(pushed.directory) / version
                    cert, key = (base / "tls.crt").read_bytes(), (base / "tls.key").read_bytes()
                except FileNotFoundError:
                    continue  # an old version removed after the swap: read the new one
                if (cert, key) not in pairs:
                    torn.append(version)

        pairs = {(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes()) for leaf in (first, second)}
        reader = threading.Thread(target=read)
        reader.start()
        try:
            for n in range(200):
                leaf = (first, second)[n % 2]
                pushed.push(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes(), ca.cert_pem.bytes())
        finally:
            stop.set()
            reader.join()
        assert not torn
        names = ["..data", "..200", "tls.crt", "tls.key", "ca.crt"]  # the first of the 200 pushed the same bytes again
        assert sorted(os.listdir(pushed.directory)) == sorted(names)
        assert pushed.files == files  # stable paths across pushes

        # The same bytes again write nothing; a change of shape is the pusher's error, at once.
        leaf = second if Path(files.certfile).read_bytes() == second.cert_chain_pems[0].bytes() else first
        assert not pushed.push(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes(), ca.cert_pem.bytes())
        with pytest.raises(ValueError, match="had a CA bundle"):
            pushed.push(first.cert_chain_pems[0].bytes(), first.private_key_pem.bytes())
        with pytest.raises(TypeError):
            pushed.push("not bytes", b"")  # type: ignore[arg-type]
    assert not os.path.exists(pushed.directory)
    with pytest.raises(RuntimeError, match="closed"):
        pushed.push(b"", b"", b"")


def test_hostile_bytes_pushed_are_refused_by_the_reader_and_the_last_good_keeps_serving(ca: trustme.CA) -> None:
    good, other = ca.issue_cert("client.test"), ca.issue_cert("client.test")
    with PushedIdentity() as pushed:
        pushed.push(good.cert_chain_pems[0].bytes(), good.private_key_pem.bytes(), ca.cert_pem.bytes())
        with ClientIdentity.from_files(pushed.files, watch=False) as identity:
            serial = identity.presented.leaf.serial
            for cert, key in (
                (good.cert_chain_pems[0].bytes(), other.private_key_pem.bytes()),  # a mismatched pair
                (b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n", good.private_key_pem.bytes()),
                (b"\x00" * 2_000_000, b""),  # larger than any certificate file may be
            ):
                pushed.push(cert, key, ca.cert_pem.bytes())
                identity.check(settle=False)
                status = identity.status()
                assert status.leaf.serial == serial and status.last_error is not None
                assert pushed.directory in status.last_error
            failures = identity.status().failures
            assert failures == 3
            pushed.push(other.cert_chain_pems[0].bytes(), other.private_key_pem.bytes(), ca.cert_pem.bytes())
            identity.check(settle=False)
            assert identity.status().leaf.serial != serial and identity.status().last_error is None


def test_the_secret_manager_example_keeps_a_server_and_a_client_on_what_is_pushed(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "push_from_secret_manager.py"), "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    requests = [line for line in lines if "ok" in line]
    rotations = [line["rotated"] for line in lines if "rotated" in line]
    assert len(rotations) == 2 and all(line["ok"] for line in requests), lines
    # After each rotation, the next request met the new server certificate and presented the new client one.
    for rotation in rotations:
        after = lines[lines.index({"rotated": rotation}) + 1]
        assert (after["server_serial"], after["client_serial"]) == (rotation["server"], rotation["client"])
    assert "certificate reload failed" not in run.stderr and "Traceback" not in run.stderr


# --- every server of the shared matrix on pushed identities ----------------------------------------------


@dataclass(frozen=True)
class PushedLayout:
    """Where a server of the matrix is told its files are: a :class:`PushedIdentity`'s."""

    cert_path: Path
    key_path: Path


@pytest.mark.parametrize("kind", list(server_kinds.KINDS))
def test_every_server_follows_pushes_and_keeps_serving_through_a_hostile_one(
    kind: str, ca: trustme.CA, tmp_path: Path
) -> None:
    first, second, third = issue(ca), issue(ca), issue(ca)
    ctx = client_context(ca)
    port = free_port()
    workers = server_kinds.workers(kind)
    with PushedIdentity(str(tmp_path)) as pushed:
        pushed.push(first.chain, first.key)
        files = pushed.files
        assert files.keyfile is not None
        command = server_kinds.args(kind, port, PushedLayout(Path(files.certfile), Path(files.keyfile)))
        with run_server(command, tmp_path / "server.log", port, env=server_env(), cwd=tmp_path) as server:
            wait_every_worker(port, ctx, first.serial, workers)
            with Hammer(port, ctx, threads=2) as hammer:
                pushed.push(second.chain, second.key)
                wait_every_worker(port, ctx, second.serial, workers)
                pushed.push(second.chain, third.key)  # a mismatched pair: refused, the last good serving
                wait_until(lambda: server.output().count(FAILED) >= workers, DEADLINE, what="every worker's report")
                assert all(fetch(port, ctx)[0] == second.serial for _ in range(4))
                pushed.push(third.chain, third.key)
                wait_every_worker(port, ctx, third.serial, workers)
    assert hammer.successes > 0 and not hammer.failures, hammer.failures[:5]
    assert hammer.serials <= {first.serial, second.serial, third.serial}, hammer.serials
    assert server.output().count(FAILED) == workers, server.output()
