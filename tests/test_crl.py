"""Certificate revocation lists in the core: what a CRL file must be to be served, and a reloader serving one to real
TLS clients (revoke, un-revoke, hostile files, a CA and its CRL rotated together, the last good identity, the
warnings, the metric and ``tlsreload check``). Every server's glue: tests/test_revocation.py."""

from __future__ import annotations

import datetime
import logging
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from revocation_steps import Mtls
from test_trust import VERSIONS, InMemory, refused_as_resumed, straddle
from tls_server import make_recipe, serving
from tlsreload_plugins import InvalidIdentity, Outcome, Reloader
from tlsreload_plugins.files import Snapshot, read_files
from tlsreload_plugins.identity import Leaf, judge_period, validate
from tlsreload_plugins.revocation import Revocation, crl_blocks
from tlsreload_plugins.settings import CRL_ENV
from tlstest import HOST, crl_pem, issue, replace_file

DAY = datetime.timedelta(days=1)


def gets_in(
    port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None
) -> tuple[bool, ssl.SSLSession | None]:
    """Whether a client of ``ctx`` (offering ``session``) gets the server's answer; and the session it has then."""
    try:
        with (
            socket.create_connection((HOST, port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
        ):
            return tls.recv(3) == b"ok\n", tls.session
    except (OSError, ssl.SSLError):
        return False, None


@pytest.fixture
def mtls(ca: trustme.CA, tmp_path: Path) -> Mtls:
    return Mtls(tmp_path, ca)


# --- what a CRL file must be ------------------------------------------------------------------------------------


def snapshot_with(mtls: Mtls, crl: bytes) -> Snapshot:
    mtls.crl.write_bytes(crl)
    return read_files(mtls.files)


def test_a_valid_crl_is_described(mtls: Mtls) -> None:
    leaf = validate(snapshot_with(mtls, crl_pem(mtls.client_ca, mtls.holder, mtls.other)))
    assert leaf.revocation is not None
    assert leaf.revocation.revoked == 2
    assert leaf.revocation.uncovered == ()
    assert leaf.revocation.next_update is not None
    judge_period(leaf, mtls.files, datetime.datetime.now(datetime.timezone.utc))


def hostile_crls(mtls: Mtls) -> dict[str, bytes]:
    good = crl_pem(mtls.client_ca, mtls.holder)
    return {
        "empty": b"",
        "garbage": b"-----BEGIN X509 CRL-----\nbm90IGEgQ1JM\n-----END X509 CRL-----\n",
        "no CRL": b"hello\n",
        "truncated": good[: len(good) // 2],
        "another CA's": crl_pem(trustme.CA()),
        "forged": crl_pem(mtls.client_ca, signer=trustme.CA()),
        "a second one forged": good + crl_pem(mtls.client_ca, signer=trustme.CA()),
        "a private key": mtls.key.read_bytes(),
    }


@pytest.mark.parametrize(
    "case",
    ["empty", "garbage", "no CRL", "truncated", "another CA's", "forged", "a second one forged", "a private key"],
)
def test_a_hostile_crl_is_refused_naming_the_file(mtls: Mtls, case: str) -> None:
    with pytest.raises(InvalidIdentity) as refused:
        validate(snapshot_with(mtls, hostile_crls(mtls)[case]))
    assert str(mtls.crl) in str(refused.value)
    assert refused.value.path == str(mtls.crl)


@pytest.mark.parametrize(
    ("last", "next_", "why"), [(-2 * DAY, -DAY, "nextUpdate passed"), (DAY, 2 * DAY, "issued in the future")]
)
def test_a_crl_no_client_passes_with_is_refused_for_its_dates(
    mtls: Mtls, last: datetime.timedelta, next_: datetime.timedelta, why: str
) -> None:
    leaf = validate(snapshot_with(mtls, crl_pem(mtls.client_ca, last_update=last, next_update=next_)))
    with pytest.raises(InvalidIdentity, match=why):
        judge_period(leaf, mtls.files, datetime.datetime.now(datetime.timezone.utc))


def test_a_ca_without_a_crl_is_named(mtls: Mtls) -> None:
    second = trustme.CA()
    mtls.bundle.write_bytes(mtls.client_ca.cert_pem.bytes() + second.cert_pem.bytes())
    leaf = validate(snapshot_with(mtls, crl_pem(mtls.client_ca)))
    assert leaf.revocation is not None
    assert len(leaf.revocation.uncovered) == 1
    assert "Testing CA" in leaf.revocation.uncovered[0] or leaf.revocation.uncovered[0]


def test_crl_blocks_split_a_file_of_several() -> None:
    ca = trustme.CA()
    two = crl_pem(ca) + b"\n" + crl_pem(trustme.CA())
    assert len(crl_blocks(two, "x")) == 2


def test_a_leaf_with_its_crls_travels_as_json(mtls: Mtls) -> None:
    snapshot = snapshot_with(mtls, crl_pem(mtls.client_ca, mtls.holder))
    leaf = validate(snapshot)
    assert Leaf.from_fields(leaf.fields()) == leaf


# --- a reloader serving a CRL to real clients -------------------------------------------------------------------


def test_revoke_and_unrevoke_reach_new_handshakes_and_no_old_session_resumes(
    mtls: Mtls, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    reloader = mtls.reloader()
    holder, other = mtls.client(mtls.holder), mtls.client(mtls.other)
    with serving(reloader.context) as port:
        ok, session = gets_in(port, holder)
        assert ok and session is not None  # revoking nobody, the holder gets in: refusing it is possible at all

        replace_file(mtls.crl, crl_pem(mtls.client_ca, mtls.holder))
        assert reloader.check() is Outcome.RELOADED
        assert reloader.status().leaf.revocation is not None
        serial = reloader.status().leaf.serial  # the line says the certificate stayed, not "serial X -> X"
        assert f"serial {serial} unchanged (a new key file, client-CA bundle or CRL)" in caplog.text, caplog.text
        assert f"-> {serial}" not in caplog.text, caplog.text
        assert not gets_in(port, holder)[0], "a revoked client got in with a new handshake"
        assert not gets_in(port, holder, session)[0], "a session made before the revocation resumed"
        assert gets_in(port, other)[0], "a client nobody revoked was refused"

        replace_file(mtls.crl, crl_pem(mtls.client_ca))
        assert reloader.check() is Outcome.RELOADED
        assert gets_in(port, holder)[0], "un-revoked, the holder is still refused"


@pytest.mark.parametrize("case", ["empty", "garbage", "another CA's", "forged", "expired", "fifo"])
def test_a_hostile_crl_file_keeps_the_last_good_crl(mtls: Mtls, case: str, caplog: pytest.LogCaptureFixture) -> None:
    import os

    replace_file(mtls.crl, crl_pem(mtls.client_ca, mtls.holder))
    reloader = mtls.reloader()
    holder, other = mtls.client(mtls.holder), mtls.client(mtls.other)
    if case == "fifo":
        mtls.crl.unlink()
        os.mkfifo(mtls.crl)
    elif case == "expired":
        replace_file(mtls.crl, crl_pem(mtls.client_ca, last_update=-2 * DAY, next_update=-DAY))
    else:
        replace_file(mtls.crl, hostile_crls(mtls)[case])
    with caplog.at_level(logging.WARNING, logger="tlsreload_plugins"):
        assert reloader.check(settle=False) is Outcome.FAILED
        assert reloader.check(settle=False) is Outcome.FAILED  # reported once
    reported = [r for r in caplog.records if "reload failed" in r.getMessage()]
    assert len(reported) == 1 and str(mtls.crl) in reported[0].getMessage()
    status = reloader.status()
    assert status.failures == 1 and status.last_error is not None and str(mtls.crl) in status.last_error
    with serving(reloader.context) as port:
        assert not gets_in(port, holder)[0], "the last good CRL no longer holds"
        assert gets_in(port, other)[0], "a client nobody revoked was refused"


def test_a_ca_and_its_crl_rotated_together_take_effect_as_one_change(mtls: Mtls) -> None:
    reloader = mtls.reloader()
    successor = trustme.CA()
    newcomer, revoked = issue(successor, "new.example"), issue(successor, "revoked.example")
    with serving(reloader.context) as port:
        assert gets_in(port, mtls.client(mtls.holder))[0]
        replace_file(mtls.bundle, successor.cert_pem.bytes())  # the bundle first, its CRL a moment later
        assert reloader.check() is Outcome.PENDING  # never the CA without its CRL
        assert gets_in(port, mtls.client(mtls.holder))[0]
        replace_file(mtls.crl, crl_pem(successor, revoked))
        assert reloader.check() is Outcome.RELOADED
        assert gets_in(port, mtls.client(newcomer))[0]
        assert not gets_in(port, mtls.client(revoked))[0]
        assert not gets_in(port, mtls.client(mtls.holder))[0]


@pytest.mark.parametrize("name", list(VERSIONS))
def test_a_connection_accepted_before_a_revocation_handshakes_with_the_new_crl(mtls: Mtls, name: str) -> None:
    """A straddler (accepted before the revocation, its ClientHello after it): a full handshake is verified against
    the new CRL, a resumed session is refused once its handshake completed."""
    reloader = mtls.reloader()
    straddled = straddle(name, reloader, mtls.ca, [mtls.holder, mtls.other])
    early = [InMemory(reloader.context) for _ in range(3)]
    replace_file(mtls.crl, crl_pem(mtls.client_ca, mtls.holder))
    assert reloader.check() is Outcome.RELOADED
    assert early[0].answer(straddled.client(mtls.other)).ok, "a client nobody revoked was refused on a straddler"
    assert not early[1].answer(straddled.client(mtls.holder)).ok, "a revoked client got in on a straddler"
    refused_as_resumed(early[2], straddled, mtls.holder)


def test_a_crl_needs_a_client_ca_bundle(mtls: Mtls) -> None:
    with pytest.raises(ValueError, match="client-CA bundle"):
        Reloader(str(mtls.cert), str(mtls.key), crl=str(mtls.crl), recipe=make_recipe(str(mtls.cert), str(mtls.key)))


def test_the_crl_comes_from_the_environment_too(mtls: Mtls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRL_ENV, str(mtls.crl))
    recipe = make_recipe(str(mtls.cert), str(mtls.key), str(mtls.bundle))
    reloader = Reloader(str(mtls.cert), str(mtls.key), ca_certs=str(mtls.bundle), recipe=recipe)
    assert reloader.files.crl == str(mtls.crl)
    assert reloader.leaf.revocation is not None


# --- warnings, metrics, tlsreload check -------------------------------------------------------------------------


def test_warnings_name_an_uncovered_ca_and_come_ahead_of_and_past_next_update(
    mtls: Mtls, caplog: pytest.LogCaptureFixture
) -> None:
    mtls.bundle.write_bytes(mtls.client_ca.cert_pem.bytes() + trustme.CA().cert_pem.bytes())
    replace_file(mtls.crl, crl_pem(mtls.client_ca, last_update=-3 * DAY, next_update=DAY / 2))
    now = [datetime.datetime.now(datetime.timezone.utc).timestamp()]
    with caplog.at_level(logging.WARNING, logger="tlsreload_plugins"):
        reloader = mtls.reloader(clock=lambda: now[0])
        messages = [r.getMessage() for r in caplog.records]
        assert any("holds no CRL for 1 CA" in m for m in messages), messages
        assert any("needs renewing" in m for m in messages), messages
        caplog.clear()
        reloader.check()
        assert not [r for r in caplog.records if "CRL" in r.getMessage()], "a CRL warning was repeated"
        now[0] += DAY.total_seconds()
        reloader.check()
        passed = [r for r in caplog.records if "every client certificate is refused" in r.getMessage()]
        assert len(passed) == 1 and passed[0].levelno == logging.ERROR


def test_the_crl_next_update_is_a_metric(mtls: Mtls) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from tlsreload_plugins import metrics

    registry = prometheus_client.CollectorRegistry()
    reloader = mtls.reloader()
    assert metrics.observe(reloader, registry)
    reloader.check()
    value = registry.get_sample_value(
        "tlsreload_crl_next_update_timestamp_seconds", {"certfile": str(mtls.cert), "identity": "default"}
    )
    revocation = reloader.leaf.revocation
    assert isinstance(revocation, Revocation) and revocation.next_update is not None
    assert value == revocation.next_update.timestamp()


def test_check_reports_the_crls_and_which_clients_they_revoke(mtls: Mtls, tmp_path: Path) -> None:
    replace_file(mtls.crl, crl_pem(mtls.client_ca, mtls.holder))
    holder_pem, other_pem = tmp_path / "holder.pem", tmp_path / "other.pem"
    holder_pem.write_bytes(mtls.holder.leaf)
    other_pem.write_bytes(mtls.other.leaf)
    command = [sys.executable, "-m", "tlsreload_plugins", "check", "--cert", str(mtls.cert), "--key", str(mtls.key)]
    command += ["--ca", str(mtls.bundle), "--crl", str(mtls.crl)]
    command += ["--client-cert", str(holder_pem), "--client-cert", str(other_pem)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "revoked=1" in result.stdout and "next_update=" in result.stdout
    assert f"serial {mtls.holder.serial}" in result.stdout
    assert f"serial {mtls.other.serial}" not in result.stdout
    replace_file(mtls.crl, crl_pem(trustme.CA()))
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not a CA of the client-CA bundle" in refused.stderr
