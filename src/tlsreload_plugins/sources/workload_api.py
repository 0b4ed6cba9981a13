"""SPIFFE's Workload API as bytes: where it listens, and what its X.509 answer holds, decoded by hand.

The Workload API (``SpiffeWorkloadAPI/FetchX509SVID``, SPIFFE's ``workload.proto``) streams
``X509SVIDResponse`` messages: field 1, repeated ``X509SVID`` {1 ``spiffe_id`` string, 2 ``x509_svid`` (the DER
certificate chain, leaf first, concatenated), 3 ``x509_svid_key`` (PKCS#8 DER), 4 ``bundle`` (the trust
domain's CA certificates, DER, concatenated)}. This module reads those few fields with a bounded protobuf reader
and turns them into the PEM a :class:`~tlsreload_plugins.sources.pushed.PushedIdentity` writes; it parses no
certificate (the readers of the files judge them, in a child process). Plain functions: the tests call them
directly, :mod:`tlsreload_plugins.sources.spiffe` drives them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ENDPOINT_ENV",
    "FETCH_X509_SVID",
    "MAX_MESSAGE_BYTES",
    "METADATA",
    "MalformedResponse",
    "PemIdentity",
    "Svid",
    "channel_target",
    "choose",
    "decode_response",
    "der_certificates",
    "pem",
    "to_pem",
]

ENDPOINT_ENV = "SPIFFE_ENDPOINT_SOCKET"
"""The variable naming the Workload API's address (SPIFFE's convention): ``unix:///path`` or ``tcp://ip:port``."""

FETCH_X509_SVID = "/SpiffeWorkloadAPI/FetchX509SVID"
"""The server-streaming method that sends the workload's X.509 SVIDs, and again on every change."""

METADATA = (("workload.spiffe.io", "true"),)
"""The header every Workload API call carries (servers refuse a call without it)."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message read (gRPC's default receive limit): more is refused unread."""

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class MalformedResponse(ValueError):
    """The bytes are not a well-formed ``X509SVIDResponse`` (or hold no SVID to serve)."""


@dataclass(frozen=True)
class Svid:
    """One ``X509SVID`` of a response, as sent: DER bytes."""

    spiffe_id: str
    chain: bytes
    key: bytes
    bundle: bytes


@dataclass(frozen=True)
class PemIdentity:
    """What a :class:`~tlsreload_plugins.sources.pushed.PushedIdentity` is pushed: the SVID's chain, its key and
    the trust domain's bundle, PEM."""

    spiffe_id: str
    cert: bytes
    key: bytes
    bundle: bytes


def channel_target(endpoint: str) -> str:
    """gRPC's target for a Workload API address.

    Args:
        endpoint: ``unix:///path``, ``unix:/path``, a plain socket path, or ``tcp://ip:port`` (SPIFFE's
            ``SPIFFE_ENDPOINT_SOCKET`` forms).

    Returns:
        ``unix:/path`` (an absolute path) or ``ip:port``.

    Raises:
        ValueError: an address of another kind, or a relative socket path.

    Example: ``channel_target("unix:///run/spire/agent.sock") == "unix:/run/spire/agent.sock"``.
    """
    if endpoint.startswith("tcp://"):
        address = endpoint[len("tcp://") :].rstrip("/")
        if not address:
            raise ValueError(f"the Workload API address {endpoint!r} names no host and port")
        return address
    path = endpoint
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    elif "://" in endpoint:
        raise ValueError(f"the Workload API address {endpoint!r} is neither unix:///PATH nor tcp://IP:PORT")
    if not path.startswith("/"):
        raise ValueError(f"the Workload API socket {endpoint!r} is not an absolute path")
    return "unix:" + path


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise MalformedResponse("a truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """Each field of one protobuf message: its number, and its bytes for a length-delimited one (else ``None``:
    numbers, which none of the fields read here are). Unknown fields are skipped, as protobuf readers do."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, kind = tag >> 3, tag & 7
        if kind == _LENGTH:
            size, at = _varint(data, at)
            if size > len(data) - at:
                raise MalformedResponse(f"field {number} claims {size} bytes, past the end of the message")
            yield number, data[at : at + size]
            at += size
        elif kind == _VARINT:
            _, at = _varint(data, at)
            yield number, None
        elif kind in (_FIXED64, _FIXED32):
            at += 8 if kind == _FIXED64 else 4
            if at > len(data):
                raise MalformedResponse(f"field {number} runs past the end of the message")
            yield number, None
        else:
            raise MalformedResponse(f"field {number} has wire type {kind}, which no X509SVIDResponse holds")


def decode_response(message: bytes) -> list[Svid]:
    """The SVIDs of one ``X509SVIDResponse``, in the order sent (CRLs and federated bundles are not read).

    Raises:
        MalformedResponse: not a well-formed message, or larger than :data:`MAX_MESSAGE_BYTES`.

    Example: ``svids = decode_response(message)``; ``svids[0].spiffe_id``.
    """
    if len(message) > MAX_MESSAGE_BYTES:
        raise MalformedResponse(f"a response of {len(message)} bytes, more than {MAX_MESSAGE_BYTES}")
    svids = []
    for number, value in _fields(message):
        if number != 1 or value is None:
            continue
        parts: dict[int, bytes] = {}
        for inner, data in _fields(value):
            if inner in (1, 2, 3, 4) and data is not None:
                parts[inner] = data
        try:
            spiffe_id = parts.get(1, b"").decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedResponse("an SVID whose SPIFFE ID is not UTF-8") from None
        svids.append(Svid(spiffe_id, parts.get(2, b""), parts.get(3, b""), parts.get(4, b"")))
    return svids


def der_certificates(der: bytes) -> list[bytes]:
    """Split concatenated DER certificates by their ASN.1 lengths (each a SEQUENCE, definite length).

    Raises:
        MalformedResponse: empty, not a SEQUENCE, or a length that runs past the end.

    Example: ``leaf, *intermediates = der_certificates(svid.chain)``.
    """
    if not der:
        raise MalformedResponse("no certificate")
    certificates = []
    at = 0
    while at < len(der):
        if der[at] != 0x30 or at + 2 > len(der):
            raise MalformedResponse(f"the byte at {at} does not start a DER certificate (a SEQUENCE)")
        first = der[at + 1]
        header = 2
        if first < 0x80:
            length = first
        elif 0x81 <= first <= 0x84:
            count = first & 0x7F
            header += count
            if at + header > len(der):
                raise MalformedResponse(f"the certificate at byte {at} has a truncated length")
            length = int.from_bytes(der[at + 2 : at + header], "big")
        else:
            raise MalformedResponse(f"the certificate at byte {at} has no definite length")
        end = at + header + length
        if end > len(der):
            raise MalformedResponse(f"the certificate at byte {at} runs past the end ({end} > {len(der)} bytes)")
        certificates.append(der[at:end])
        at = end
    return certificates


def pem(label: str, der: bytes) -> bytes:
    """One PEM block: ``der`` in base64, 64 characters a line, between ``-----BEGIN label-----`` and its END."""
    body = base64.b64encode(der)
    lines = b"\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return b"-----BEGIN %s-----\n%s\n-----END %s-----\n" % (label.encode(), lines, label.encode())


def _certificates_pem(der: bytes) -> bytes:
    """The certificates of ``der`` in PEM; bytes that do not split into certificates are written as one block, for
    the readers to refuse as they refuse a bad certificate file (its name in the report, the last good serving)."""
    try:
        return b"".join(pem("CERTIFICATE", certificate) for certificate in der_certificates(der))
    except MalformedResponse:
        return pem("CERTIFICATE", der)


def to_pem(svid: Svid) -> PemIdentity:
    """``svid`` in PEM: the chain, the PKCS#8 key, the bundle (not judged here: the readers judge the files)."""
    return PemIdentity(
        svid.spiffe_id, _certificates_pem(svid.chain), pem("PRIVATE KEY", svid.key), _certificates_pem(svid.bundle)
    )


def choose(message: bytes, spiffe_id: str | None = None) -> PemIdentity:
    """The identity to serve from one ``X509SVIDResponse``: its first SVID (the Workload API's default one), or
    the one whose SPIFFE ID is ``spiffe_id``.

    Raises:
        MalformedResponse: the message is malformed, holds no SVID, or none with ``spiffe_id``.

    Example: ``identity = choose(message)``; ``pushed.push(identity.cert, identity.key, identity.bundle)``.
    """
    svids = decode_response(message)
    if not svids:
        raise MalformedResponse("a response with no SVID")
    if spiffe_id is None:
        return to_pem(svids[0])
    for svid in svids:
        if svid.spiffe_id == spiffe_id:
            return to_pem(svid)
    sent = ", ".join(svid.spiffe_id for svid in svids)
    raise MalformedResponse(f"no SVID for {spiffe_id} in a response holding {sent}")
