"""The one decision every identity makes ("changed? valid? swap?"), called directly: no files, no thread, no server.
What the server's Reloader, a client's ClientIdentity and each SNI identity do on top of it is tested with real
servers and clients elsewhere (test_reloader, test_client_identity, test_sni)."""

from __future__ import annotations

import logging
import ssl

import pytest
import trustme

from tlsreload_plugins.decision import Decision, servable
from tlsreload_plugins.errors import InvalidIdentity, NotServable
from tlsreload_plugins.examine import Examined, judge
from tlsreload_plugins.files import Snapshot, TLSFiles, fingerprint
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome, Record

FILES = TLSFiles("tls.crt", "tls.key")
log = logging.getLogger("tlsreload_plugins.test_decision")


def identity(ca: trustme.CA) -> tuple[Snapshot, Leaf]:
    cert = ca.issue_cert("example.test")
    chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
    snapshot = Snapshot(FILES, chain, cert.private_key_pem.bytes(), None)
    return snapshot, judge(snapshot, None)


def new(snapshot: Snapshot, leaf: Leaf) -> Examined:
    """What a look finds when the files hold ``snapshot``, valid and built."""
    return Examined(fingerprint(snapshot), snapshot, leaf=leaf, context=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))


def refused(snapshot: Snapshot, error: Exception) -> Examined:
    return Examined(fingerprint(snapshot), error=error)  # type: ignore[arg-type]


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def decision(ca: trustme.CA) -> Decision:
    snapshot, leaf = identity(ca)
    return Decision(FILES, Record(log, "certificate", "serving", 0.0), snapshot, leaf)


def test_the_content_served_is_unchanged_and_counted(decision: Decision) -> None:
    examined = Examined(decision.fingerprint, unchanged=True)

    assert decision.conclude(examined, 1.0, settle=True) is Outcome.UNCHANGED
    assert decision.record.checks == 1 and decision.record.last_success == 1.0 and decision.record.failures == 0


def test_new_valid_content_is_reloaded_only_once_accepted(decision: Decision, ca: trustme.CA) -> None:
    before = (decision.served, decision.fingerprint, decision.leaf)
    snapshot, leaf = identity(ca)
    examined = new(snapshot, leaf)

    assert servable(examined)
    assert decision.conclude(examined, 1.0, settle=True) is Outcome.RELOADED
    # Deciding changed nothing served: the caller puts the context in place, then accepts.
    assert (decision.served, decision.fingerprint, decision.leaf) == before and decision.record.reloads == 0

    old = decision.accept(examined, 2.0)

    assert old == before[2]
    assert (decision.served, decision.fingerprint, decision.leaf) == (snapshot, fingerprint(snapshot), leaf)
    assert decision.record.reloads == 1 and decision.record.last_reload == 2.0
    assert decision.conclude(Examined(decision.fingerprint, unchanged=True), 3.0, True) is Outcome.UNCHANGED


def test_a_refusal_settles_before_it_is_reported_and_is_reported_once(
    decision: Decision, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot, _ = identity(ca)
    examined = refused(snapshot, InvalidIdentity("the key does not match the certificate (tls.key)"))
    caplog.set_level(logging.DEBUG, logger=log.name)

    outcomes = [decision.conclude(examined, float(n), settle=True) for n in range(4)]

    assert outcomes == [Outcome.PENDING, Outcome.FAILED, Outcome.FAILED, Outcome.FAILED]
    assert decision.record.failures == 1 and decision.record.checks == 4
    assert decision.known_bad is examined  # not parsed again while the files hold it
    failed = [r for r in caplog.records if "reload failed" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.WARNING] and "tls.key" in failed[0].getMessage()


def test_without_settling_a_refusal_is_reported_at_once(decision: Decision, ca: trustme.CA) -> None:
    snapshot, _ = identity(ca)

    outcome = decision.conclude(refused(snapshot, InvalidIdentity("expired (tls.crt)")), 1.0, settle=False)

    assert outcome is Outcome.FAILED and decision.record.last_error == "expired (tls.crt)"


@pytest.mark.parametrize(
    ("error", "quiet", "level"),
    [
        (InvalidIdentity("no certificate in tls.crt"), False, logging.WARNING),
        (NotServable("the recipe returned a context already in use"), False, logging.ERROR),
        (InvalidIdentity("the client-CA bundle ca.crt holds no certificate"), True, logging.DEBUG),
    ],
)
def test_a_refusal_is_said_at_the_level_of_who_says_it(
    decision: Decision, ca: trustme.CA, caplog: pytest.LogCaptureFixture, error: Exception, quiet: bool, level: int
) -> None:
    snapshot, _ = identity(ca)
    caplog.set_level(logging.DEBUG, logger=log.name)

    assert decision.conclude(refused(snapshot, error), 1.0, settle=False, quiet=quiet) is Outcome.FAILED

    assert [r.levelno for r in caplog.records if "reload failed" in r.getMessage()] == [level]


def test_usable_content_after_a_refusal_ends_it_and_forgets_the_bad_content(
    decision: Decision, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    bad, _ = identity(ca)
    decision.conclude(refused(bad, InvalidIdentity("expired (tls.crt)")), 1.0, settle=False)
    snapshot, leaf = identity(ca)
    examined = new(snapshot, leaf)
    caplog.set_level(logging.INFO, logger=log.name)

    assert decision.conclude(examined, 2.0, settle=True) is Outcome.RELOADED
    decision.accept(examined, 2.0)

    assert decision.known_bad is None and decision.record.last_error is None
    assert any("usable again" in r.getMessage() for r in caplog.records)


def test_content_that_changed_while_it_was_read_is_looked_at_again(decision: Decision, ca: trustme.CA) -> None:
    snapshot, leaf = identity(ca)
    examined = new(snapshot, leaf)._replace(changed_while_building=True)

    assert not servable(examined)
    assert decision.conclude(examined, 1.0, settle=True) is Outcome.PENDING
    assert decision.record.failures == 0
    with pytest.raises(ValueError, match="only new, valid content"):
        decision.accept(examined, 1.0)
