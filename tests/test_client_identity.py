"""ClientIdentity and Pools called directly: what a check decides (a new context and generation, or the last good
one kept and the failure reported once), and which pools a client library's glue closes when. Real files, real
validation, real handshakes; no thread of its own (watch=False), checks made by the test."""

from __future__ import annotations

import datetime
import gc
import os
import socket
import ssl
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from hostile import leaf_for_key, load_key_on_disk
from tlsreload_plugins import InvalidIdentity, Outcome
from tlsreload_plugins.client import ClientIdentity
from tlsreload_plugins.client.pools import Closed, Pools
from tlstest import HOST, Pair, issue, serial_of, wait_until


def write(directory: Path, pair: Pair) -> tuple[Path, Path]:
    cert, key = directory / "client.crt", directory / "client.key"
    for path, data in ((key, pair.key), (cert, pair.chain)):
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
    return cert, key


@pytest.fixture
def server_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def mtls_port(ca: trustme.CA, server_ca: trustme.CA) -> Iterator[int]:
    """A server requiring a client certificate from ``ca``; each connection gets the serial it saw, then closes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ca.issue_cert("localhost").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2", "http/1.1"])  # a client offering h2 gets it, as from an HTTP/2 server
    listener = socket.create_server((HOST, 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(raw, server_side=True) as tls:
                    der = tls.getpeercert(binary_form=True) or b""

                    tls.sendall(serial_of(der).encode())
            except (ssl.SSLError, OSError):
                raw.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()
    thread.join(5)


def presented_serial(context: ssl.SSLContext, port: int) -> str:
    with (
        socket.create_connection((HOST, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.recv(100).decode()


def test_a_rotation_is_a_new_context_and_generation_and_the_old_one_is_untouched(
    tmp_path: Path, ca: trustme.CA, server_ca: trustme.CA, mtls_port: int
) -> None:
    first, second = issue(ca), issue(ca)
    cert, key = write(tmp_path, first)
    (tmp_path / "ca.crt").write_bytes(server_ca.cert_pem.bytes())
    identity = ClientIdentity(str(cert), str(key), cafile=str(tmp_path / "ca.crt"), watch=False, interval=0.1)
    seen = []
    identity.subscribe(seen.append)
    before = identity.presented
    assert before.generation == 0 and presented_serial(before.context, mtls_port) == first.serial
    assert identity.check() is Outcome.UNCHANGED
    write(tmp_path, second)
    assert identity.check() is Outcome.RELOADED
    after = identity.presented
    assert after.generation == 1 and after.context is not before.context and after.leaf.serial == second.serial
    assert seen == [after]
    assert presented_serial(after.context, mtls_port) == second.serial
    assert presented_serial(before.context, mtls_port) == first.serial  # replaced, never mutated
    assert identity.status().reloads == 1


def test_each_client_has_a_context_of_its_own_kept_as_fresh(
    tmp_path: Path, ca: trustme.CA, server_ca: trustme.CA, mtls_port: int
) -> None:
    """Two clients of one identity: what one sets on its context (httpcore's ALPN list) never reaches the other's,
    and at a change each is given its own context of the new generation before any subscriber hears of it."""
    first, second = issue(ca), issue(ca)
    cert, key = write(tmp_path, first)
    (tmp_path / "ca.crt").write_bytes(server_ca.cert_pem.bytes())
    identity = ClientIdentity(str(cert), str(key), cafile=str(tmp_path / "ca.crt"), watch=False)
    one, other = identity.own_context(), identity.own_context()
    contexts = {id(identity.context), id(one.context), id(other.context)}
    assert len(contexts) == 3 and one.generation == other.generation == 0
    one.context.set_alpn_protocols(["h2", "http/1.1"])  # what httpcore does to the context it is given

    def alpn(context: ssl.SSLContext) -> str | None:
        with (
            socket.create_connection((HOST, mtls_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.recv(100).decode() == first.serial
            return tls.selected_alpn_protocol()

    assert alpn(one.context) == "h2"  # possible at all: the server takes h2 from a client offering it
    assert alpn(other.context) is None and alpn(identity.context) is None  # set on one, offered by no other
    heard: list[tuple[int, int, int]] = []
    identity.subscribe(lambda presented: heard.append((presented.generation, one.generation, other.generation)))
    write(tmp_path, second)
    assert identity.check() is Outcome.RELOADED
    assert heard == [(1, 1, 1)]  # both were ready when the change was told
    assert presented_serial(one.context, mtls_port) == presented_serial(other.context, mtls_port) == second.serial
    assert one.context is not other.context is not identity.context
    assert one.presented.snapshot is identity.presented.snapshot  # the same validated bytes, built again
    gone = weakref.ref(identity.own_context())
    gc.collect()
    assert gone() is None  # the identity holds its clients' contexts weakly: a client nobody holds is collected
    assert identity.check() is Outcome.UNCHANGED


def test_a_client_that_sees_the_new_generation_finds_its_own_context_of_it(tmp_path: Path, ca: trustme.CA) -> None:
    """The identity's generation and every client's own context change together: a thread that sees the identity's
    new generation (as a client choosing its pool does) never finds its own context still on the old one (the copies
    are built before the change is made, not after: a request between the two presented the old certificate)."""
    cert, key = write(tmp_path, issue(ca))
    identity = ClientIdentity(str(cert), str(key), watch=False)
    owns = [identity.own_context() for _ in range(3)]
    seen: list[tuple[int, list[int]]] = []
    stop = threading.Event()

    def watch() -> None:
        last = identity.generation
        while not stop.is_set():
            now = identity.generation
            if now != last:
                seen.append((now, [own.generation for own in owns]))
                last = now

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for generation in range(1, 6):
            write(tmp_path, issue(ca))
            assert identity.check(settle=False) is Outcome.RELOADED
            wait_until(lambda g=generation: seen and seen[-1][0] == g, 10, what=f"generation {generation} seen")
    finally:
        stop.set()
        watcher.join(10)
    assert all(all(own >= generation for own in owns_seen) for generation, owns_seen in seen), seen


def place_no_client_auth(ca: trustme.CA, cert: Path, key: Path) -> None:
    private = load_key_on_disk(key)
    assert private is not None
    cert.write_bytes(leaf_for_key(ca, private))  # extended key usage: serverAuth only


@pytest.mark.parametrize(
    "case",
    ["mismatched pair", "no clientAuth", "empty key", "expired"],
)
def test_unusable_files_keep_the_last_good_and_are_reported_once(
    tmp_path: Path, ca: trustme.CA, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = issue(ca)
    cert, key = write(tmp_path, good)
    identity = ClientIdentity(str(cert), str(key), watch=False, interval=0.1)
    if case == "mismatched pair":
        key.write_bytes(issue(ca).key)
    elif case == "no clientAuth":
        place_no_client_auth(ca, cert, key)
    elif case == "empty key":
        key.write_bytes(b"")
    else:
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
        expired = ca.issue_cert("expired.test", not_before=past - datetime.timedelta(days=9), not_after=past)
        write(tmp_path, Pair(expired.cert_chain_pems[0].bytes(), expired.private_key_pem.bytes(), ""))
    outcomes = [identity.check() for _ in range(4)]
    assert outcomes == [Outcome.PENDING, Outcome.FAILED, Outcome.FAILED, Outcome.FAILED]
    status = identity.status()
    assert status.failures == 1 and status.last_error is not None
    assert str(tmp_path) in status.last_error
    assert identity.presented.generation == 0 and identity.presented.leaf.serial == good.serial
    failures = [r for r in caplog.records if "client certificate reload failed" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    write(tmp_path, issue(ca))
    assert identity.check() is Outcome.RELOADED and identity.status().last_error is None


def test_a_certificate_without_client_auth_is_refused_at_start(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = write(tmp_path, issue(ca))
    place_no_client_auth(ca, cert, key)
    with pytest.raises(InvalidIdentity, match="clientAuth"):
        ClientIdentity(str(cert), str(key), watch=False)


def test_pools_close_a_replaced_pool_once_idle_and_cut_it_once_overdue() -> None:
    now = [0.0]
    made: list[str] = []

    def make(generation: int) -> str:
        made.append(f"pool{generation}")
        return made[-1]

    pools: Pools[str] = Pools(make, retire_after=10.0, clock=lambda: now[0])
    pool, close = pools.acquire(0)
    assert (pool, close) == ("pool0", [])
    assert pools.release(pool) == []  # the current pool stays open when idle
    busy, _ = pools.acquire(0)
    assert pools.renew(1) == []  # replaced with a request in flight: kept
    assert pools.retired == 1
    fresh, close = pools.acquire(1)
    assert (fresh, close) == ("pool1", [])
    assert pools.release(busy) == ["pool0"]  # its last request done: closed
    assert pools.release(fresh) == []
    held, _ = pools.acquire(1)
    assert pools.renew(2) == []
    now[0] = 9.9
    assert pools.overdue() == []
    now[0] = 10.0
    assert pools.overdue() == ["pool1"]  # overdue: its connections to cut, once
    assert pools.overdue() == []
    assert pools.retired == 1  # cut, not closed: closed once its request lets go of it
    assert pools.release(held) == ["pool1"]
    assert pools.release(held) == []  # closed once only
    assert pools.acquire(2)[0] == "pool2"
    assert sorted(pools.close()) == ["pool2"]
    with pytest.raises(Closed):
        pools.acquire(2)


def test_pools_never_cut_by_default_and_go_on_after_clear() -> None:
    now = [0.0]
    pools: Pools[str] = Pools(lambda generation: f"pool{generation}", clock=lambda: now[0])
    stream, _ = pools.acquire(0)
    assert pools.renew(1) == []
    now[0] = 86400.0  # a day later, the stream still open: never due
    assert pools.overdue() == []
    assert pools.retired == 1
    assert sorted(pools.clear()) == ["pool0"]
    assert pools.acquire(1)[0] == "pool1"  # a cleared client goes on (requests after Session.close())
    assert pools.release(stream) == []


def test_pools_idle_replaced_pool_is_closed_at_renew() -> None:
    pools: Pools[str] = Pools(lambda generation: f"pool{generation}")
    pool, _ = pools.acquire(0)
    pools.release(pool)
    assert pools.renew(1) == ["pool0"]
    assert pools.renew(1) == []
