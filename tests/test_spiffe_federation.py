"""SPIFFE federation (issue 47, item 2): the bundles of other trust domains that the Workload API sends
(``X509SVIDResponse.federated_bundles``), decoded by hand and joined to the CA bundle when a source asks for them
(``SpiffeSource(federation=...)``), against the tests' Workload API server; then a real server on the source's files
and a real TLS client presenting an SVID of another trust domain: refused unless the server trusts that domain.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import sys
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from test_spiffe import pair_of
from tlsreload_plugins.sources.spiffe import SpiffeSource
from tlsreload_plugins.sources.workload_api import (
    MalformedResponse,
    choose,
    decode_response,
    federation_of,
    not_after,
    read_response,
)
from tlstest import client_context, free_port, get, run_server, serial_of, wait_until
from workload_api_server import Svid, WorkloadAPI, encode_response, mint_svid

TESTS = Path(__file__).parent
DEADLINE = 20.0
OTHER = "spiffe://other.org"
THIRD = "spiffe://third.org"
UTC = datetime.timezone.utc


def der_of(*cas: trustme.CA) -> bytes:
    """The CAs' certificates, DER, concatenated: a bundle as the Workload API sends it."""
    return b"".join(ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode()) for ca in cas)


def ders(pem: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, DER, in order."""
    end = "-----END CERTIFICATE-----"
    blocks = [block + end for block in pem.decode().split(end) if block.strip()]
    return [ssl.PEM_cert_to_DER_cert(block.strip()) for block in blocks]


def leaf_not_after(svid: Svid) -> float:
    return x509.load_der_x509_certificate(svid.chain).not_valid_after_utc.timestamp()


# --- the message, decoded by hand -----------------------------------------------------------------------


def test_federated_bundles_are_decoded_and_joined_to_the_bundle_as_asked(ca: trustme.CA) -> None:
    other_ca, third_ca = trustme.CA(), trustme.CA()
    svid = mint_svid(ca, "web", "localhost")
    federated = {THIRD: der_of(third_ca), OTHER: der_of(other_ca, third_ca)}
    message = encode_response([svid], federated=federated)
    assert read_response(message).federated_bundles == federated
    assert [s.spiffe_id for s in decode_response(message)] == [svid.spiffe_id]

    own, other, third = der_of(ca), der_of(other_ca), der_of(third_ca)
    assert ders(choose(message).bundle) == [own] and choose(message).federated == ()  # off by default
    everything = choose(message, federation=True)
    # The SVID's own bundle first, then each trust domain's by name: the map's order is no change of the file.
    assert ders(everything.bundle) == [own, other, third, third] and everything.federated == ("other.org", "third.org")
    reordered = encode_response([svid], federated=dict(reversed(federated.items())))
    assert choose(reordered, federation=True).bundle == everything.bundle
    only_other = choose(message, federation=federation_of(["spiffe://other.org"]))
    assert ders(only_other.bundle) == [own, other, third] and only_other.federated == ("other.org",)
    asked = choose(message, federation=federation_of(["third.org", "fourth.org"]))
    assert asked.federated == ("third.org",) and asked.missing == ("fourth.org",)
    assert ders(asked.bundle) == [own, third]
    # A bundle sent for the SVID's own trust domain is not another trust domain's: its own bundle stands.
    own_again = encode_response([svid], federated={"spiffe://example.org": other})
    assert ders(choose(own_again, federation=True).bundle) == [own]

    # Hostile map entries (field 3, wire type 2): a key claiming more bytes than its entry has, a key not UTF-8.
    for hostile in (b"\x1a\x04\x0a\x05ab", b"\x1a\x04\x0a\x02\xff\xfe"):
        with pytest.raises(MalformedResponse):
            read_response(encode_response([svid]) + hostile)


def test_federation_settings_name_trust_domains_as_the_authorizers_do() -> None:
    assert federation_of(True) is True and federation_of(False) is False and federation_of([]) is False
    assert federation_of("spiffe://other.org") == frozenset({"other.org"})  # one string: one trust domain
    assert federation_of(("Other.org", "spiffe://third.org/")) == frozenset({"other.org", "third.org"})
    for bad in ("", "spiffe://", "https://other.org", "other org", "other.org:443"):
        with pytest.raises(ValueError):
            federation_of([bad])
    with pytest.raises(TypeError):
        federation_of([1])  # type: ignore[list-item]


def test_the_svid_s_expiry_is_read_from_its_der(ca: trustme.CA) -> None:
    """UTCTime up to 2049, GeneralizedTime from 2050 (RFC 5280); bytes that are no certificate say nothing."""
    for end in (datetime.datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC), datetime.datetime(2051, 1, 2, tzinfo=UTC)):
        svid = mint_svid(ca, "web", not_after=end)
        assert not_after(svid.chain) == end.timestamp() == leaf_not_after(svid)
        assert choose(encode_response([svid])).not_after == end.timestamp()
    for garbage in (b"", b"\x30\x00", b"\x30\x03\x30\x01\x00", b"\x30\x82\xff\xff" + b"\x00" * 8):
        assert not_after(garbage) is None


# --- a source ------------------------------------------------------------------------------------------


def test_a_source_joins_the_federated_bundles_asked_for_and_says_which_are_missing(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    other_ca, third_ca = trustme.CA(), trustme.CA()
    api = WorkloadAPI(tmp_path)
    web = "spiffe://example.org/web"
    api.send([mint_svid(ca, "web", "localhost")], federated={OTHER: der_of(other_ca)})
    with api, SpiffeSource(api.endpoint, spiffe_id=web, federation=["other.org", THIRD], timeout=DEADLINE) as source:
        bundle = Path(source.files.ca_certs or "")

        def holds(*cas: trustme.CA) -> bool:
            return ders(bundle.read_bytes()) == [der_of(c) for c in (ca, *cas)]

        assert holds(other_ca) and source.status().federated == ("other.org",)
        api.send([mint_svid(ca, "web", "localhost")], federated={OTHER: der_of(other_ca), THIRD: der_of(third_ca)})
        wait_until(lambda: holds(other_ca, third_ca), DEADLINE, what="third.org's bundle joined")
        api.send([mint_svid(ca, "web", "localhost")], federated={OTHER: der_of(other_ca), THIRD: der_of(third_ca)})
        wait_until(lambda: source.status().updates == 3, DEADLINE, what="a rotation")  # nothing to say about it
        api.send([mint_svid(ca, "web", "localhost")], federated={THIRD: der_of(third_ca)})
        # The status follows the files' write (the source's thread sets it after the push): waited for too.
        wait_until(
            lambda: holds(third_ca) and source.status().federated == ("third.org",),
            DEADLINE,
            what="other.org's bundle gone",
        )

        # The SVID asked for missing from a message: refused, the ID named.
        api.send([mint_svid(ca, "api")], federated={THIRD: der_of(third_ca)})
        wait_until(lambda: source.status().refused == 1, DEADLINE, what="the message without the SVID refused")
        assert f"no SVID for {web}" in (source.status().last_error or "") and holds(third_ca)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("tlsreload_plugins.sources")]
    missing = [m for level, m in lines if level == "WARNING" and "sends no bundle" in m]
    assert len(missing) == 2, lines  # third.org at the start, other.org when it went
    assert "third.org: its peers are refused" in missing[0] and "other.org" in missing[1], missing
    came = [m for level, m in lines if level == "INFO" and "now sends the bundle" in m]
    assert len(came) == 1 and "third.org" in came[0], lines
    assert any(level == "WARNING" and f"no SVID for {web}" in m for level, m in lines), lines


# --- a server, and a peer of another trust domain -------------------------------------------------------


@pytest.mark.parametrize(
    ("federation", "trusted"),
    [
        pytest.param(False, False, id="off"),
        pytest.param(True, True, id="all"),
        pytest.param(["other.org"], True, id="other.org"),
        pytest.param(["spiffe://other.org"], True, id="spiffe://other.org"),
        pytest.param(["third.org"], False, id="third.org"),
    ],
)
def test_a_server_trusts_a_peer_of_a_federated_trust_domain_only_when_asked(
    tmp_path: Path, ca: trustme.CA, federation: bool | list[str], trusted: bool
) -> None:
    other_ca, third_ca = trustme.CA(), trustme.CA()
    api = WorkloadAPI(tmp_path)
    server_svid = mint_svid(ca, "web", "localhost")
    federated = {OTHER: der_of(other_ca), THIRD: der_of(third_ca)}
    api.send([server_svid], federated=federated)
    # The clients trust the server's trust domain; one presents an SVID of other.org, one of example.org.
    peer = client_context(ca, pair_of(mint_svid(other_ca, "caller", trust_domain=OTHER)))
    domestic = client_context(ca, pair_of(mint_svid(ca, "caller")))
    port = free_port()
    with api, SpiffeSource(api.endpoint, federation=federation, timeout=DEADLINE) as source:
        files = source.files
        assert files.keyfile is not None and files.ca_certs is not None
        command = [sys.executable, str(TESTS / "fresh_server.py"), "--certfile", files.certfile]
        command += ["--keyfile", files.keyfile, "--ca-certs", files.ca_certs, "--port", str(port), "--interval", "0.3"]
        with run_server(command, tmp_path / "server.log", port) as server:
            serial, _ = wait_until(lambda: get(port, domestic), DEADLINE, what="the server serving the SVID")
            assert serial == serial_of(server_svid.chain)

            def accepted() -> bool:
                try:
                    return bool(get(port, peer, server_name="localhost"))
                except (ssl.SSLError, OSError):  # TLS 1.3: the refusal comes after the handshake, on the first read
                    return False

            if trusted:
                assert accepted(), server.output()
                # other.org's bundle no longer sent: its peers are refused from the next reload on.
                api.send([server_svid], federated={THIRD: der_of(third_ca)})
                wait_until(lambda: not accepted(), DEADLINE, what="other.org's peer refused once its bundle went")
            else:
                assert not accepted(), server.output()
                wait_until(lambda: "certificate verify failed" in server.output(), DEADLINE, what="the refusal")
            assert get(port, domestic)[0] == serial_of(server_svid.chain)
