"""SNI identities in the core: a real threaded TLS server (tests/tls_server.py, in-process) whose default
reloader routes handshakes by server name, and real clients sending different names."""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import ssl
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

import tlsreload_plugins.files
import tlsreload_plugins.reloader
from tls_server import make_recipe, serving
from tlsreload_plugins import Outcome, Reloader, SNIIdentities, ThreadDriver, TLSFiles, metrics
from tlsreload_plugins.sni.discovery import SNI_ENV, resolve_directories
from tlsreload_plugins.sni.identities import for_reloader
from tlsreload_plugins.sni.table import host_names
from tlstest import HOST, CertbotLayout, KubeletLayout, Pair, client_context, issue, serial_of, wait_until

INTERVAL = 0.2
DEADLINE = 20.0


# --- helpers shared with test_sni_servers.py ---------------------------------------------------------


def sni_serial(port: int, ctx: ssl.SSLContext, name: str | None, timeout: float = 10.0) -> str:
    """Serial of the leaf a new connection sending server name ``name`` (``None``: no SNI) gets."""
    with (
        socket.create_connection((HOST, port), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)


def verifying(ca: trustme.CA) -> ssl.SSLContext:
    """A client that verifies the chain and the name it sends."""
    return client_context(ca)


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    """A client that verifies the chain but not the name (to see which leaf an unknown name gets)."""
    return client_context(ca, check_hostname=False)


@dataclass
class NameHammer:
    """Client threads handshaking in a loop, each sending one of ``names``, counting every failure
    and the serials each name got."""

    port: int
    ctx: ssl.SSLContext
    names: list[str]
    successes: int = 0
    failures: list[str] = field(default_factory=list)
    serials: dict[str, set[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _loop(self, name: str) -> None:
        while not self._stop.is_set():
            try:
                serial = sni_serial(self.port, self.ctx, name)
            except Exception as e:
                with self._lock:
                    self.failures.append(f"{name}: {e!r}")
            else:
                with self._lock:
                    self.successes += 1
                    self.serials.setdefault(name, set()).add(serial)

    def __enter__(self) -> NameHammer:
        for name in self.names:
            thread = threading.Thread(target=self._loop, args=(name,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def install(layout: KubeletLayout | CertbotLayout, pair: Pair) -> Pair:
    layout.install(pair)
    return pair


# --- an in-process server with SNI identities -------------------------------------------------------


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile)()


@dataclass
class Setup:
    default: Pair
    default_reloader: Reloader
    identities: SNIIdentities
    port: int


@contextmanager
def sni_server(
    tmp_path: Path,
    ca: trustme.CA,
    directories: list[str] | str | None,
    *,
    with_metrics: bool = False,
) -> Iterator[Setup]:
    """A server with its default identity in ``tmp_path/default`` (kept as it is when it exists already,
    as a restarted process finds it) and the SNI identities in ``directories``."""
    default_layout = KubeletLayout(tmp_path / "default")
    if default_layout.cert_path.exists():
        default = Pair(default_layout.cert_path.read_bytes(), default_layout.key_path.read_bytes(), "")
    else:
        default = install(default_layout, issue(ca, "default.test"))
    files = TLSFiles(str(default_layout.cert_path), str(default_layout.key_path))
    reloader = Reloader(files.certfile, files.keyfile, recipe=lambda: recipe_for(files), interval=INTERVAL)
    if with_metrics:
        assert metrics.observe(reloader)
    identities = SNIIdentities.attach(reloader, directories, recipe_for=recipe_for)
    with serving(reloader.context) as port, ThreadDriver(reloader):
        yield Setup(default, reloader, identities, port)


def checks_made(reloader: Reloader, more: int = 2) -> None:
    """Wait until ``more`` further checks (scans) have run."""
    target = reloader.status().checks + more
    wait_until(lambda: reloader.status().checks >= target, DEADLINE, interval=0.1, what=f"{more} more checks")


# --- tests ------------------------------------------------------------------------------------------


def test_each_name_gets_its_own_leaf_and_others_the_default(tmp_path: Path, ca: trustme.CA) -> None:
    secrets = tmp_path / "secrets"
    a = install(KubeletLayout(secrets / "a"), issue(ca, "a.test"))
    b = install(KubeletLayout(secrets / "b"), issue(ca, "b.test", "alias.test"))
    certbot = CertbotLayout(tmp_path / "letsencrypt", "c.test")
    c = install(certbot, issue(ca, "c.test"))
    (tmp_path / "letsencrypt" / "live" / "README").write_text("certbot's own file: not an identity\n")
    directories = [str(secrets), str(tmp_path / "letsencrypt" / "live")]
    with sni_server(tmp_path, ca, directories) as s:
        ctx = verifying(ca)
        assert sni_serial(s.port, ctx, "a.test") == a.serial
        assert sni_serial(s.port, ctx, "b.test") == b.serial
        assert sni_serial(s.port, ctx, "alias.test") == b.serial
        assert sni_serial(s.port, ctx, "c.test") == c.serial
        assert sni_serial(s.port, ctx, "A.TEST") == a.serial  # names are not case-sensitive
        assert sni_serial(s.port, ctx, "default.test") == s.default.serial
        assert sni_serial(s.port, trusting(ca), "unknown.test") == s.default.serial
        assert sni_serial(s.port, trusting(ca), None) == s.default.serial
        assert set(s.identities.status()) == {"a", "b", "c.test"}
        assert s.identities.names() == {"a.test": "a", "b.test": "b", "alias.test": "b", "c.test": "c.test"}


def test_an_exact_name_beats_a_wildcard_one_label_deep(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    wild = install(KubeletLayout(sni / "wild"), issue(ca, "*.example.test"))
    www = install(KubeletLayout(sni / "www"), issue(ca, "www.example.test"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        ctx, any_name = verifying(ca), trusting(ca)
        assert sni_serial(s.port, ctx, "www.example.test") == www.serial
        assert sni_serial(s.port, ctx, "api.example.test") == wild.serial
        assert sni_serial(s.port, any_name, "example.test") == s.default.serial
        assert sni_serial(s.port, any_name, "a.b.example.test") == s.default.serial


def test_an_exact_identity_removed_hands_its_names_to_the_wildcard_without_a_failed_handshake(
    tmp_path: Path, ca: trustme.CA
) -> None:
    sni = tmp_path / "sni"
    wild = install(KubeletLayout(sni / "wild"), issue(ca, "*.example.test"))
    install(KubeletLayout(sni / "www"), issue(ca, "www.example.test"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        ctx = verifying(ca)
        # A handshake that looked the name up just before the identity went still gets that identity's certificate.
        looked_up = s.identities.reloader_for("www.example.test")
        assert looked_up is not None
        with NameHammer(s.port, ctx, ["www.example.test", "www.example.test"]) as hammer:
            wait_until(lambda: hammer.successes > 10, DEADLINE, what="handshakes before the removal")
            _remove_tree(sni / "www")
            wait_until(lambda: sni_serial(s.port, ctx, "www.example.test") == wild.serial, DEADLINE, what="www gone")
            seen = hammer.successes
            wait_until(lambda: hammer.successes > seen + 10, DEADLINE, what="handshakes after the removal")
        assert hammer.failures == []
        assert looked_up.newest_context is not None
        # Nothing else keeps the removed identity, nor its context.
        gone = weakref.ref(looked_up)
        del looked_up
        gc.collect()
        assert gone() is None


def test_internationalized_names_match_in_a_label_form(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    idn = install(KubeletLayout(sni / "idn"), issue(ca, "bücher.example"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        assert sni_serial(s.port, verifying(ca), "bücher.example") == idn.serial  # the client sends xn--bcher-kva
        assert s.identities.context_for("xn--bcher-kva.example") is not None
    assert host_names(["Bücher.Example", "*.W.test", "10.0.0.1", "https://x.test/", "f*.x.test", "*.*.x.test"]) == [
        "xn--bcher-kva.example",
        "*.w.test",
    ]


def test_rotating_one_identity_changes_only_its_leaf_without_a_failed_handshake(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    layout_a = KubeletLayout(sni / "a")
    a1 = install(layout_a, issue(ca, "a.test"))
    b = install(KubeletLayout(sni / "b"), issue(ca, "b.test"))
    with sni_server(tmp_path, ca, str(sni)) as s, NameHammer(s.port, verifying(ca), ["a.test", "b.test"]) as hammer:
        wait_until(lambda: hammer.successes > 20, DEADLINE, what="handshakes before the rotation")
        a2 = install(layout_a, issue(ca, "a.test"))
        wait_until(lambda: sni_serial(s.port, verifying(ca), "a.test") == a2.serial, DEADLINE, what="a's new leaf")
        seen = hammer.successes
        wait_until(lambda: hammer.successes > seen + 20, DEADLINE, what="handshakes after the rotation")
    assert hammer.failures == []
    assert hammer.serials["b.test"] == {b.serial}
    assert hammer.serials["a.test"] <= {a1.serial, a2.serial}
    status = s.identities.status()
    assert (status["a"].reloads, status["b"].reloads) == (1, 0)
    assert s.default_reloader.status().reloads == 0
    assert s.default_reloader.status().failures == 0
    assert status["a"].failures == status["b"].failures == 0  # no "hook replaced" from a routed identity


def test_changes_counts_what_is_served_changing_and_nothing_else(tmp_path: Path, ca: trustme.CA) -> None:
    """What the reader compares before it copies the identities into its publication (instead of looking at every
    identity every interval): ticks with nothing new leave the count alone; a rotation, an identity added, one
    removed each move it."""
    sni = tmp_path / "sni"
    layout_a = KubeletLayout(sni / "a")
    install(layout_a, issue(ca, "a.test"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        at_start = s.identities.changes
        assert at_start >= 1  # the identities found at start
        checks_made(s.default_reloader, 3)
        assert s.identities.changes == at_start
        a2 = install(layout_a, issue(ca, "a.test"))
        wait_until(lambda: sni_serial(s.port, verifying(ca), "a.test") == a2.serial, DEADLINE, what="a's new leaf")
        rotated = s.identities.changes
        assert rotated > at_start
        c = install(KubeletLayout(sni / "c"), issue(ca, "c.test"))
        wait_until(lambda: sni_serial(s.port, verifying(ca), "c.test") == c.serial, DEADLINE, what="c added")
        added = s.identities.changes
        assert added > rotated
        _remove_tree(sni / "c")
        wait_until(lambda: "c" not in s.identities.reloaders(), DEADLINE, what="c removed")
        assert s.identities.changes > added
        settled = s.identities.changes
        checks_made(s.default_reloader, 3)
        assert s.identities.changes == settled


def test_a_bad_pair_for_one_identity_keeps_it_and_the_others_serving(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sni = tmp_path / "sni"
    layout_a = KubeletLayout(sni / "a")
    a = install(layout_a, issue(ca, "a.test"))
    b = install(KubeletLayout(sni / "b"), issue(ca, "b.test"))
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(sni)) as s, NameHammer(s.port, verifying(ca), ["a.test", "b.test"]) as hammer:
        other = issue(ca, "a.test")
        layout_a.write_raw(a.chain, other.key)  # a certificate with someone else's key
        wait_until(lambda: s.identities.status()["a"].failures == 1, DEADLINE, what="a's failure reported")
        assert sni_serial(s.port, verifying(ca), "a.test") == a.serial
        assert sni_serial(s.port, verifying(ca), "b.test") == b.serial
        fixed = install(layout_a, issue(ca, "a.test"))
        wait_until(lambda: sni_serial(s.port, verifying(ca), "a.test") == fixed.serial, DEADLINE, what="a fixed")
    assert hammer.failures == []
    assert s.identities.status()["b"].failures == 0
    assert s.identities.status()["a"].last_error is None
    failed = [r.getMessage() for r in caplog.records if "certificate reload failed" in r.getMessage()]
    assert len(failed) == 1
    assert str(layout_a.cert_path) in failed[0] or str(layout_a.key_path) in failed[0]


def test_identities_added_and_removed_while_running(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sni = tmp_path / "sni"
    a = install(KubeletLayout(sni / "a"), issue(ca, "a.test"))
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(sni)) as s:
        any_name = trusting(ca)
        assert sni_serial(s.port, any_name, "new.test") == s.default.serial
        # Written the way kubelet writes, into a new directory: picked up within a few checks.
        new = install(KubeletLayout(sni / "new"), issue(ca, "new.test"))
        wait_until(lambda: sni_serial(s.port, any_name, "new.test") == new.serial, DEADLINE, what="new identity")
        assert sni_serial(s.port, verifying(ca), "new.test") == new.serial
        # An identity whose files are never valid is reported once and not served.
        broken = sni / "broken"
        broken.mkdir()
        (broken / "tls.crt").write_bytes(b"not a certificate\n")
        (broken / "tls.key").write_bytes(a.key)
        wait_until(lambda: "broken" in s.identities.unserved(), DEADLINE, what="the broken identity reported")
        # Removed: its names fall back to the default identity.
        _remove_tree(sni / "a")
        wait_until(lambda: sni_serial(s.port, any_name, "a.test") == s.default.serial, DEADLINE, what="a removed")
        assert set(s.identities.status()) == {"new"}
        assert sni_serial(s.port, verifying(ca), "new.test") == new.serial
    messages = [r.getMessage() for r in caplog.records]
    assert sum("SNI identity broken not served" in m for m in messages) == 1
    assert any("SNI identity a removed" in m for m in messages)


def test_certbot_renewal_relinking_never_drops_the_identity(tmp_path: Path, ca: trustme.CA) -> None:
    certbot = CertbotLayout(tmp_path / "le", "r.test")
    install(certbot, issue(ca, "r.test"))
    live = str(tmp_path / "le" / "live")
    with sni_server(tmp_path, ca, live) as s, NameHammer(s.port, verifying(ca), ["r.test", "r.test"]) as hammer:
        for _ in range(15):
            latest = install(certbot, issue(ca, "r.test"))
            checks_made(s.default_reloader, 1)
        wait_until(lambda: sni_serial(s.port, verifying(ca), "r.test") == latest.serial, DEADLINE, what="renewal")
    assert hammer.failures == []
    assert s.identities.status()["r.test"].reloads >= 1


def test_a_directory_that_is_an_identity_and_the_environment(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = install(KubeletLayout(tmp_path / "mounted" / "one"), issue(ca, "one.test"))
    two = install(KubeletLayout(tmp_path / "two"), issue(ca, "two.test"))
    monkeypatch.setenv(SNI_ENV, os.pathsep.join([str(tmp_path / "mounted" / "one"), str(tmp_path / "two"), ""]))
    assert resolve_directories() == [str(tmp_path / "mounted" / "one"), str(tmp_path / "two")]
    with sni_server(tmp_path, ca, None) as s:
        assert sni_serial(s.port, verifying(ca), "one.test") == one.serial
        assert sni_serial(s.port, verifying(ca), "two.test") == two.serial
        assert for_reloader(s.default_reloader) is s.identities
    with pytest.raises(ValueError, match="does not exist"):
        resolve_directories([str(tmp_path / "nowhere")])


def test_the_first_identity_claiming_a_name_wins(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sni = tmp_path / "sni"
    first = install(KubeletLayout(sni / "a-first"), issue(ca, "same.test"))
    install(KubeletLayout(sni / "b-second"), issue(ca, "same.test", "own.test"))
    caplog.set_level(logging.WARNING, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(sni)) as s:
        assert sni_serial(s.port, verifying(ca), "same.test") == first.serial
        checks_made(s.default_reloader, 3)
    claims = [r.getMessage() for r in caplog.records if "is claimed by" in r.getMessage()]
    assert claims == ["SNI name same.test is claimed by identities a-first and b-second: a-first serves it"]


def test_context_for_is_the_public_way_to_the_newest_context(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    layout = KubeletLayout(sni / "a")
    install(layout, issue(ca, "a.test", "*.a.test"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        before = s.identities.context_for("a.test")
        assert before is not None and s.identities.context_for("x.a.test") is before
        assert s.identities.context_for("other.test") is None and s.identities.context_for(None) is None
        install(layout, issue(ca, "a.test", "*.a.test"))
        wait_until(lambda: s.identities.context_for("a.test") is not before, DEADLINE, what="a new context")
        reloader = s.identities.reloader_for("X.A.TEST")
        assert reloader is s.identities.reloaders()["a"]
        assert s.identities.context_for("a.test") is reloader._serving[0]


def test_hostile_files_in_one_identity_are_contained(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sni = tmp_path / "sni"
    a = install(KubeletLayout(sni / "a"), issue(ca, "a.test"))
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(sni)) as s:
        fifo = sni / "fifo"
        fifo.mkdir()
        os.mkfifo(fifo / "tls.crt")  # opening it for reading would wait for a writer forever
        (fifo / "tls.key").write_bytes(a.key)
        (sni / "loop").symlink_to(sni / "loop")  # not a directory: skipped
        (sni / "plain-file").write_text("not an identity\n")
        wait_until(lambda: "fifo" in s.identities.unserved(), DEADLINE, what="the FIFO identity refused")
        assert "FIFO" in s.identities.unserved()["fifo"]
        checks_made(s.default_reloader, 2)  # checks go on: nothing hangs
        assert sni_serial(s.port, verifying(ca), "a.test") == a.serial
        assert set(s.identities.status()) == {"a"}


def test_the_expiry_warning_is_given_per_identity(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sni = tmp_path / "sni"
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3)
    expiring = install(KubeletLayout(sni / "expiring"), issue(ca, "expiring.test", not_after=soon))
    install(KubeletLayout(sni / "fresh"), issue(ca, "fresh.test"))
    caplog.set_level(logging.WARNING, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(sni)) as s:
        checks_made(s.default_reloader, 2)
    warnings = [r.getMessage() for r in caplog.records if "expires in" in r.getMessage()]
    assert len(warnings) == 1 and expiring.serial in warnings[0] and "expiring.test" in warnings[0]


def test_identities_verify_client_certificates_with_the_server_ca_bundle(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    a = install(KubeletLayout(sni / "a"), issue(ca, "a.test"))
    client_ca = trustme.CA()
    bundle = tmp_path / "clients.pem"
    bundle.write_bytes(client_ca.cert_pem.bytes())
    default_layout = KubeletLayout(tmp_path / "default")
    install(default_layout, issue(ca, "default.test"))
    files = TLSFiles(str(default_layout.cert_path), str(default_layout.key_path), str(bundle))

    def mtls_recipe_for(f: TLSFiles) -> ssl.SSLContext:
        return make_recipe(f.certfile, f.keyfile, f.ca_certs)()

    reloader = Reloader(files.certfile, files.keyfile, recipe=lambda: mtls_recipe_for(files), ca_certs=files.ca_certs)
    identities = SNIIdentities.attach(reloader, str(sni), recipe_for=mtls_recipe_for)
    assert identities.reloaders()["a"].files.ca_certs == str(bundle)
    good_client = issue(client_ca, "client.test")
    stranger = issue(trustme.CA(), "client.test")
    with serving(reloader.context) as port:
        assert sni_serial(port, client_context(ca, good_client), "a.test") == a.serial

        def refused() -> bool:
            with socket.create_connection((HOST, port), timeout=10) as raw:
                tls = client_context(ca, stranger).wrap_socket(raw, server_hostname="a.test")
                try:
                    tls.sendall(b"x")
                    return tls.recv(16) == b""  # TLS 1.3: the refusal arrives after the handshake
                except (ssl.SSLError, OSError):
                    return True
                finally:
                    tls.close()

        assert refused()


def test_an_identity_name_found_twice_serves_the_first(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    first = install(KubeletLayout(tmp_path / "one" / "shop"), issue(ca, "shop.test"))
    install(KubeletLayout(tmp_path / "two" / "shop"), issue(ca, "shop.test", "other.test"))
    caplog.set_level(logging.WARNING, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, [str(tmp_path / "one"), str(tmp_path / "two")]) as s:
        assert sni_serial(s.port, verifying(ca), "shop.test") == first.serial
        assert sni_serial(s.port, trusting(ca), "other.test") == s.default.serial
        checks_made(s.default_reloader, 3)
    shadowed = [r.getMessage() for r in caplog.records if "of the same name was found first" in r.getMessage()]
    assert shadowed == [
        f"SNI identity {tmp_path / 'two' / 'shop'} is not served: an identity of the same name was found first"
    ]


def test_metrics_per_identity(tmp_path: Path, ca: trustme.CA) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    sni = tmp_path / "sni"
    layout = KubeletLayout(sni / "a")
    install(layout, issue(ca, "a.test"))
    with sni_server(tmp_path, ca, str(sni), with_metrics=True) as s:
        labels = {"certfile": str(layout.cert_path), "identity": "a"}
        default_labels = {"certfile": str(tmp_path / "default" / "tls.crt"), "identity": "default"}
        registry = prometheus_client.REGISTRY
        not_after = registry.get_sample_value("tlsreload_certificate_not_after_timestamp_seconds", labels)
        assert not_after == s.identities.status()["a"].leaf.not_after.timestamp()
        install(layout, issue(ca, "a.test"))
        wait_until(
            lambda: registry.get_sample_value("tlsreload_reload_successes_total", labels) == 1.0,
            DEADLINE,
            what="the reload counted for a",
        )
        assert registry.get_sample_value("tlsreload_checks_total", labels) >= 1
        assert registry.get_sample_value("tlsreload_reload_successes_total", default_labels) == 0.0


def test_without_metrics_on_the_default_no_identity_exports_any(tmp_path: Path, ca: trustme.CA) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    sni = tmp_path / "sni"
    layout = KubeletLayout(sni / "quiet")
    install(layout, issue(ca, "quiet.test"))
    with sni_server(tmp_path, ca, str(sni)) as s:
        assert set(s.identities.status()) == {"quiet"}
        labels = {"certfile": str(layout.cert_path), "identity": "quiet"}
        assert prometheus_client.REGISTRY.get_sample_value("tlsreload_checks_total", labels) is None


def _remove_tree(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        if path.is_dir() and not path.is_symlink():
            for inner in path.iterdir():
                inner.unlink()
            path.rmdir()
        else:
            path.unlink()
    directory.rmdir()


def test_identities_found_at_start_are_vouched_for_by_the_stamp_taken_before_their_one_read(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 100,000 identities the sweep looks at 1,667 a second: an identity read at start (in one pass, for its
    reloader) is not read again by its first sweep, which compares the stamp taken just before that read."""
    monkeypatch.setattr(tlsreload_plugins.files, "RACY_NS", 0)  # files written just now vouch for themselves
    sni = tmp_path / "sni"
    layouts = {name: KubeletLayout(sni / name) for name in ("a", "b", "c")}
    for name, layout in layouts.items():
        install(layout, issue(ca, f"{name}.test"))
    identities = SNIIdentities(str(sni), recipe_for=recipe_for, interval=60)
    reads: list[object] = []
    real_read = tlsreload_plugins.reloader.read_files

    def counted(files: TLSFiles) -> object:
        reads.append(files)
        return real_read(files)

    monkeypatch.setattr(tlsreload_plugins.reloader, "read_files", counted)
    served = identities.reloaders()
    assert sorted(served) == ["a", "b", "c"]
    assert all(reloader.sweep() is Outcome.UNCHANGED for reloader in served.values())
    assert reads == []
    install(layouts["b"], issue(ca, "b.test"))  # kubelet's swap: a new inode behind the link
    assert served["b"].sweep() is Outcome.RELOADED
    assert len(reads) >= 1
