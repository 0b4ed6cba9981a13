"""The client side of mTLS, end to end: each client library's example (tests/client_kinds.py) runs as a user runs
it, one long-lived client making a request every EVERY ms, against an mTLS server that re-reads its own files per
connection and answers with the client certificate it saw. The client's files rotate the way kubelet and certbot
write them; hostile content is written where they are; the server's CA and the client CA change under it.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from client_kinds import CLIENTS, STOCK, ClientRun, World, kinds, replace, serve, start
from hostile import leaf_for_key, load_key_on_disk
from tlsreload_plugins.sources import PushedIdentity
from tlstest import CertbotLayout, KubeletLayout, Pair, issue, wait_until

INTERVAL = 0.2
EVERY = 100
EVERY_REQUEST_WITHIN = INTERVAL + 10.0
"""The issue's bound for every request to present a rotated certificate (benchmarks/client_rotation.py measures
how soon it does); the tests wait that long and more before failing."""


class ClientFiles:
    """The client's certificate, key and CA bundle, written as kubelet does (one swap of all three), as certbot
    does (the pair relinked one file at a time; the CA bundle a file of its own, replaced), or pushed as bytes by the
    push API (:class:`~tlsreload_plugins.sources.PushedIdentity`: what a secret manager's client or the SPIFFE
    source does)."""

    def __init__(self, root: Path, layout: str, pair: Pair, trusted: bytes) -> None:
        self.layout = layout
        if layout == "pushed":
            self.pushed = PushedIdentity(str(root))
            self.pushed.push(pair.chain, pair.key, trusted)
            pushed = self.pushed.files
            assert pushed.keyfile is not None and pushed.ca_certs is not None
            self.cert, self.key, self.cacert = Path(pushed.certfile), Path(pushed.keyfile), Path(pushed.ca_certs)
        elif layout == "kubelet":
            self.kubelet = KubeletLayout(root / "client")
            self.cert, self.key, self.cacert = self.kubelet.cert_path, self.kubelet.key_path, self.kubelet.ca_path
        else:
            self.certbot = CertbotLayout(root / "letsencrypt")
            self.cert, self.key = self.certbot.cert_path, self.certbot.key_path
            self.cacert = root / "server-ca.pem"
        self.chain, self.private, self.trusted = pair.chain, pair.key, trusted
        self.write()

    def write(self) -> None:
        if self.layout == "pushed":
            self.pushed.push(self.chain, self.private, self.trusted)
        elif self.layout == "kubelet":
            self.kubelet.write_files({"tls.crt": self.chain, "tls.key": self.private, "ca.crt": self.trusted})
        else:
            replace(self.cacert, self.trusted)
            self.certbot.write_raw(self.chain, self.private)

    def install(self, pair: Pair) -> None:
        self.chain, self.private = pair.chain, pair.key
        self.write()

    def raw(self, cert: bytes, key: bytes) -> None:
        self.chain, self.private = cert, key
        self.write()

    def trust(self, bundle: bytes) -> None:
        self.trusted = bundle
        self.write()


@pytest.fixture
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    server_kind = CLIENTS.get(getattr(request, "param", "httpx"), STOCK)[1]
    with serve(tmp_path, server_kind) as here:
        yield here


def run_client(kind: str, world: World, files: ClientFiles, duration: float = 120.0) -> ClientRun:
    example, server = STOCK if kind == "stock" else CLIENTS[kind]
    run = start(
        example, server, world.port, files.cert, files.key, files.cacert, duration=duration, every=EVERY,
        interval=INTERVAL,
    )  # fmt: skip
    wait_until(lambda: run.all(), 30, what=f"{kind}'s first answer")
    return run


def presented(run: ClientRun, serial: str, since: float, timeout: float) -> float:
    """When the server first saw ``serial`` after ``since`` (waiting up to ``timeout``)."""
    answer = wait_until(
        lambda: next((a for a in run.since(since) if a["ok"] and a["peer"] == serial), None),
        timeout,
        what=f"the server to see client certificate {serial}",
    )
    return float(answer["t"])


def no_failure(run: ClientRun) -> None:
    failed = [answer for answer in run.all() if not answer["ok"]]
    assert not failed, f"{len(failed)} requests failed:\n{run.output()}"


def rotate(run: ClientRun, files: ClientFiles, pair: Pair) -> None:
    """Rotate to ``pair``: the server sees it, and once it has, every later request presents it (kept-alive
    connections made before are not used again). How soon is measured by benchmarks/client_rotation.py."""
    written = time.time()
    files.install(pair)
    first_new = presented(run, pair.serial, written, EVERY_REQUEST_WITHIN + 20)
    mark = time.time()
    wait_until(lambda: len(run.since(mark)) >= 5, 30, what="five requests after the rotation reached the server")
    later = [a for a in run.since(first_new) if a.get("peer") != pair.serial]
    assert not later, f"requests after the first with {pair.serial} presented another: {later[:3]}\n{run.output()}"


@pytest.mark.parametrize("world", kinds(), indirect=True)
@pytest.mark.parametrize("layout", ["kubelet", "certbot", "pushed"])
def test_rotations_reach_the_server(world: World, layout: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    kind = request.node.callspec.params["world"]
    first = issue(world.client_ca)
    files = ClientFiles(tmp_path, layout, first, world.server_ca.cert_pem.bytes())
    run = run_client(kind, world, files)
    assert presented(run, first.serial, 0, 30)
    for _ in range(2):
        rotate(run, files, issue(world.client_ca))
    no_failure(run)
    assert run.terminate() <= 5.0


def hostile_cases(client_ca: trustme.CA, good: Pair, files: ClientFiles) -> dict[str, tuple[bytes, bytes]]:
    """Content that must never be presented: (certificate, key) bytes for each case."""
    other = issue(client_ca)
    key = load_key_on_disk(files.key)
    assert key is not None
    expired = client_ca.issue_cert("expired.client.test", not_after=_past(1), not_before=_past(30))
    server_only = leaf_for_key(client_ca, key)  # extended key usage serverAuth only
    return {
        "mismatched pair": (good.chain, other.key),
        "garbage": (b"garbage\n", good.key),
        "empty key": (good.chain, b""),
        "expired certificate": (expired.cert_chain_pems[0].bytes(), expired.private_key_pem.bytes()),
        "no clientAuth": (server_only, good.key),
    }


def _past(days: int) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)


@pytest.mark.parametrize("world", kinds(), indirect=True)
def test_hostile_files_are_never_presented(world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    kind = request.node.callspec.params["world"]
    good = issue(world.client_ca)
    files = ClientFiles(tmp_path, "kubelet", good, world.server_ca.cert_pem.bytes())
    run = run_client(kind, world, files)
    presented(run, good.serial, 0, 30)
    for number, (case, (cert, key)) in enumerate(hostile_cases(world.client_ca, good, files).items(), 1):
        written = time.time()
        files.raw(cert, key)
        wait_until(
            lambda n=number: len(run.lines("client certificate reload failed")) >= n,
            INTERVAL * 4 + 30,
            what=f"{case}: the failure reported",
        )
        assert str(files.cert.parent) in run.lines("client certificate reload failed")[-1], run.output()
        answers = run.since(written)
        assert answers and all(a["ok"] and a["peer"] == good.serial for a in answers), f"{case}\n{run.output()}"
    rotate(run, files, issue(world.client_ca))
    no_failure(run)
    assert run.terminate() <= 5.0


@pytest.mark.parametrize("world", kinds(), indirect=True)
def test_trust_changes_fail_no_request(world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The server moves to another CA (the client's bundle S, then S+T, the server on T, then T alone), and the
    server's client CA changes (C, then C+D, the client on D, then D alone): no request fails."""
    kind = request.node.callspec.params["world"]
    good = issue(world.client_ca)
    files = ClientFiles(tmp_path, "kubelet", good, world.server_ca.cert_pem.bytes())
    run = run_client(kind, world, files)
    presented(run, good.serial, 0, 30)

    def reloads() -> int:
        return len(run.lines("reloaded client certificate"))

    def settle(count: int) -> None:
        wait_until(lambda: reloads() >= count, INTERVAL * 4 + 30, what="the client to reload")
        mark = time.time()
        wait_until(lambda: len(run.since(mark)) >= 3, 30, what="three requests after the change")

    new_server_ca = trustme.CA()
    files.trust(world.server_ca.cert_pem.bytes() + new_server_ca.cert_pem.bytes())
    settle(1)
    world.server_files(issue(new_server_ca), world.client_ca.cert_pem.bytes())
    mark = time.time()
    wait_until(lambda: len(run.since(mark)) >= 3, 30, what="requests to the server on T")
    files.trust(new_server_ca.cert_pem.bytes())
    settle(2)

    new_client_ca = trustme.CA()
    world.server_files(issue(new_server_ca), world.client_ca.cert_pem.bytes() + new_client_ca.cert_pem.bytes())
    rotate(run, files, issue(new_client_ca))
    world.server_files(issue(new_server_ca), new_client_ca.cert_pem.bytes())
    mark = time.time()
    wait_until(lambda: len(run.since(mark)) >= 5, 30, what="requests after the client CA change")
    no_failure(run)
    assert run.terminate() <= 5.0


@pytest.mark.parametrize("world", ["httpx"], indirect=True)
def test_a_stock_client_never_presents_the_new_certificate(world: World, tmp_path: Path) -> None:
    """Side by side, the same files: httpx as users run it without us keeps presenting the certificate it was made
    with; ours presents the new one."""
    first = issue(world.client_ca)
    files = ClientFiles(tmp_path, "kubelet", first, world.server_ca.cert_pem.bytes())
    ours = run_client("httpx", world, files)
    stock = run_client("stock", world, files)
    presented(stock, first.serial, 0, 30)
    pair = issue(world.client_ca)
    written = time.time()
    files.install(pair)
    ours_saw = presented(ours, pair.serial, written, EVERY_REQUEST_WITHIN + 20)
    wait_until(lambda: len(stock.since(ours_saw + 1)) >= 5, 30, what="stock's requests after ours presented it")
    assert {a["peer"] for a in stock.since(written)} == {first.serial}, stock.output()
    no_failure(ours)
    ours.terminate()
    stock.terminate()
