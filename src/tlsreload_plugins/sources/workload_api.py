"""SPIFFE's Workload API as bytes: where it listens, and what its X.509 answer holds, decoded by hand.

The Workload API (``SpiffeWorkloadAPI/FetchX509SVID``, SPIFFE's ``workload.proto``) streams
``X509SVIDResponse`` messages: field 1, repeated ``X509SVID`` {1 ``spiffe_id`` string, 2 ``x509_svid`` (the DER
certificate chain, leaf first, concatenated), 3 ``x509_svid_key`` (PKCS#8 DER), 4 ``bundle`` (the trust
domain's CA certificates, DER, concatenated)}; field 3, ``map<string, bytes> federated_bundles`` (each entry a
message {1 key: the foreign trust domain's SPIFFE ID, ``spiffe://other.org``; 2 value: its CA certificates, DER,
concatenated}). This module reads those few fields with a bounded protobuf reader and turns them into the PEM a
:class:`~tlsreload_plugins.sources.pushed.PushedIdentity` writes; it parses no certificate beyond the leaf's
``notAfter`` (for the metrics; the readers of the files judge the certificates, in a child process). Plain
functions: the tests call them directly, :mod:`tlsreload_plugins.sources.spiffe` drives them.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from tlsreload_plugins.authorization import trust_domain_of

__all__ = [
    "ENDPOINT_ENV",
    "FETCH_X509_SVID",
    "MAX_MESSAGE_BYTES",
    "METADATA",
    "MalformedResponse",
    "Federation",
    "PemIdentity",
    "Response",
    "Svid",
    "channel_target",
    "choose",
    "decode_response",
    "der_certificates",
    "federation_of",
    "not_after",
    "pem",
    "read_response",
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

SPIFFE_SCHEME = "spiffe://"

Federation = bool | frozenset[str]
"""Which federated bundles join the CA bundle: none (``False``), all the Workload API sends (``True``), or those of
these trust domains (names, ``other.org``): what :func:`federation_of` makes of a user's setting."""

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class MalformedResponse(ValueError):
    """The bytes are not a well-formed ``X509SVIDResponse`` (or hold no SVID to serve)."""


@dataclass(frozen=True, slots=True)
class Svid:
    """One ``X509SVID`` of a response, as sent: DER bytes."""

    spiffe_id: str
    chain: bytes
    key: bytes
    bundle: bytes


@dataclass(frozen=True, slots=True)
class Response:
    """One ``X509SVIDResponse``, as sent: its SVIDs in order, and the federated bundles (DER) by the key sent (the
    foreign trust domain's SPIFFE ID, ``spiffe://other.org``)."""

    svids: tuple[Svid, ...]
    federated_bundles: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PemIdentity:
    """What a :class:`~tlsreload_plugins.sources.pushed.PushedIdentity` is pushed: the SVID's chain, its key and
    the CA bundle (the trust domain's, then the federated ones asked for), PEM; and what went into it."""

    spiffe_id: str
    cert: bytes
    key: bytes
    bundle: bytes
    federated: tuple[str, ...] = ()
    """The trust domains (names, sorted) whose federated bundles follow the SVID's own in :attr:`bundle`."""
    missing: tuple[str, ...] = ()
    """The trust domains asked for (sorted) that the response carries no bundle of."""
    not_after: float | None = None
    """When the SVID (its leaf) expires, Unix time; ``None`` where its DER does not say (the readers refuse it)."""


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


def federation_of(setting: bool | str | Collection[str]) -> Federation:
    """Which federated bundles a setting asks for: ``False``/``True`` as given; trust domains (names or SPIFFE
    IDs, one string or a collection) as a set of names, lower-cased as the authorizers and the drop-ins' options
    take them (:func:`~tlsreload_plugins.authorization.trust_domain_of`). An empty collection is ``False``.

    Raises:
        ValueError: a name that is not a trust domain's.
        TypeError: neither a bool nor strings.

    Example: ``federation_of(["spiffe://other.org", "third.org"]) == frozenset({"other.org", "third.org"})``.
    """
    if isinstance(setting, bool):
        return setting
    names = [setting] if isinstance(setting, str) else list(setting)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"federation takes True, False or trust domain names, not {type(name).__name__}")
    return frozenset(trust_domain_of(name) for name in names) or False


def _key_domain(key: str) -> str:
    """The trust domain a federated bundle's key names (``spiffe://other.org`` -> ``other.org``), compared
    leniently: the key less its scheme and a trailing slash, lower-cased (what is left is written as sent)."""
    bare = key[len(SPIFFE_SCHEME) :] if key.lower().startswith(SPIFFE_SCHEME) else key
    return bare.rstrip("/").lower()


def _id_domain(spiffe_id: str) -> str:
    """The trust domain of an SVID's SPIFFE ID (``spiffe://example.org/web`` -> ``example.org``)."""
    bare = spiffe_id[len(SPIFFE_SCHEME) :] if spiffe_id.lower().startswith(SPIFFE_SCHEME) else spiffe_id
    return bare.split("/", 1)[0].lower()


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


def _parts(message: bytes, numbers: tuple[int, ...]) -> dict[int, bytes]:
    """The length-delimited fields ``numbers`` of one message (the last of each, as protobuf readers keep)."""
    return {number: data for number, data in _fields(message) if number in numbers and data is not None}


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedResponse(f"{what} is not UTF-8") from None


def read_response(message: bytes) -> Response:
    """One ``X509SVIDResponse``: its SVIDs in the order sent and its federated bundles (its CRLs are not read).

    Raises:
        MalformedResponse: not a well-formed message, or larger than :data:`MAX_MESSAGE_BYTES`.

    Example: ``response = read_response(message)``; ``response.federated_bundles.get("spiffe://other.org")``.
    """
    if len(message) > MAX_MESSAGE_BYTES:
        raise MalformedResponse(f"a response of {len(message)} bytes, more than {MAX_MESSAGE_BYTES}")
    svids = []
    federated: dict[str, bytes] = {}
    for number, value in _fields(message):
        if value is None:
            continue
        if number == 1:
            parts = _parts(value, (1, 2, 3, 4))
            spiffe_id = _text(parts.get(1, b""), "an SVID's SPIFFE ID")
            svids.append(Svid(spiffe_id, parts.get(2, b""), parts.get(3, b""), parts.get(4, b"")))
        elif number == 3:  # a map entry: {1 key, 2 value}; a later entry of the same key wins, as in protobuf
            entry = _parts(value, (1, 2))
            federated[_text(entry.get(1, b""), "a federated bundle's trust domain")] = entry.get(2, b"")
    return Response(tuple(svids), federated)


def decode_response(message: bytes) -> list[Svid]:
    """The SVIDs of one ``X509SVIDResponse``, in the order sent (:func:`read_response` has the rest).

    Raises:
        MalformedResponse: not a well-formed message, or larger than :data:`MAX_MESSAGE_BYTES`.

    Example: ``svids = decode_response(message)``; ``svids[0].spiffe_id``.
    """
    return list(read_response(message).svids)


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


def _tlv(der: bytes, at: int, end: int) -> tuple[int, int, int]:
    """The DER element at ``at`` (before ``end``): its tag, where its content starts and where it ends."""
    if at + 2 > end:
        raise MalformedResponse("a truncated DER element")
    tag, first = der[at], der[at + 1]
    start = at + 2
    if first < 0x80:
        length = first
    elif 0x81 <= first <= 0x84:
        start += first & 0x7F
        if start > end:
            raise MalformedResponse("a truncated DER length")
        length = int.from_bytes(der[at + 2 : start], "big")
    else:
        raise MalformedResponse("a DER element with no definite length")
    if start + length > end:
        raise MalformedResponse("a DER element that runs past its container")
    return tag, start, start + length


def _time(tag: int, text: bytes) -> float:
    """An ASN.1 UTCTime (``YYMMDDHHMMSSZ``, 1950-2049) or GeneralizedTime (``YYYYMMDDHHMMSSZ``), as Unix time."""
    if tag == 0x17 and len(text) == 13 and text.endswith(b"Z"):
        year = int(text[:2])
        text = (b"19" if year >= 50 else b"20") + text
    elif not (tag == 0x18 and len(text) == 15 and text.endswith(b"Z")):
        raise MalformedResponse("a certificate time that is neither UTCTime nor GeneralizedTime in UTC")
    if not text[:14].isdigit():
        raise MalformedResponse("a certificate time that is not digits")
    when = datetime.datetime.strptime(text[:14].decode(), "%Y%m%d%H%M%S").replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def not_after(chain: bytes) -> float | None:
    """When the first certificate of ``chain`` (DER, leaf first) expires, Unix time: its ``notAfter``, read by hand
    from the DER (tbsCertificate: [0] version, serial, signature algorithm, issuer, then the validity); ``None``
    when the bytes do not say (the readers of the files refuse such a certificate).

    Example: ``not_after(svid.chain)`` -> ``1767225600.0``.
    """
    try:
        _, certificate, certificate_end = _tlv(chain, 0, len(chain))
        _, at, tbs_end = _tlv(chain, certificate, certificate_end)
        tag, _, end = _tlv(chain, at, tbs_end)
        if tag == 0xA0:  # the explicit version (absent: a v1 certificate)
            at = end
        for _ in range(3):  # serialNumber, signature, issuer
            _, _, at = _tlv(chain, at, tbs_end)
        tag, validity, validity_end = _tlv(chain, at, tbs_end)
        if tag != 0x30:
            raise MalformedResponse("no validity where a certificate has it")
        _, _, at = _tlv(chain, validity, validity_end)  # notBefore
        tag, start, end = _tlv(chain, at, validity_end)
        return _time(tag, chain[start:end])
    except (MalformedResponse, ValueError):
        return None


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


def to_pem(
    svid: Svid, federated_bundles: Mapping[str, bytes] | None = None, federation: Federation = False
) -> PemIdentity:
    """``svid`` in PEM: the chain, the PKCS#8 key, the bundle (not judged here: the readers judge the files).

    Args:
        svid: the SVID to serve.
        federated_bundles: the response's federated bundles (DER), keyed as sent (``spiffe://other.org``).
        federation: which of them follow the SVID's own bundle in :attr:`PemIdentity.bundle`, in the order of
            their trust domains' names (an order of the map's entries that changes is no change of the file);
            a bundle sent for the SVID's own trust domain is left out (its own bundle is the one to trust).

    Example: ``to_pem(svid, response.federated_bundles, frozenset({"other.org"})).bundle``.
    """
    own = _id_domain(svid.spiffe_id)
    offered = {_key_domain(key): der for key, der in (federated_bundles or {}).items()}
    offered.pop(own, None)
    missing: list[str] = []
    if isinstance(federation, bool):
        chosen = sorted(offered) if federation else []
    else:
        chosen = sorted(domain for domain in offered if domain in federation)
        missing = sorted(domain for domain in federation if domain not in offered and domain != own)
    bundle = _certificates_pem(svid.bundle) + b"".join(_certificates_pem(offered[domain]) for domain in chosen)
    return PemIdentity(
        svid.spiffe_id,
        _certificates_pem(svid.chain),
        pem("PRIVATE KEY", svid.key),
        bundle,
        tuple(chosen),
        tuple(missing),
        not_after(svid.chain),
    )


def choose(message: bytes, spiffe_id: str | None = None, federation: Federation = False) -> PemIdentity:
    """The identity to serve from one ``X509SVIDResponse``: its first SVID (the Workload API's default one), or
    the one whose SPIFFE ID is ``spiffe_id``; its CA bundle with the federated bundles ``federation`` asks for.

    Args:
        message: the response's bytes.
        spiffe_id: the SPIFFE ID of the SVID to serve (default: the first sent).
        federation: which federated bundles join the CA bundle (:func:`federation_of`; :func:`to_pem`).

    Raises:
        MalformedResponse: the message is malformed, holds no SVID, or none with ``spiffe_id`` (named).

    Example: ``identity = choose(message)``; ``pushed.push(identity.cert, identity.key, identity.bundle)``.
    """
    response = read_response(message)
    if not response.svids:
        raise MalformedResponse("a response with no SVID")
    if spiffe_id is None:
        return to_pem(response.svids[0], response.federated_bundles, federation)
    for svid in response.svids:
        if svid.spiffe_id == spiffe_id:
            return to_pem(svid, response.federated_bundles, federation)
    sent = ", ".join(svid.spiffe_id for svid in response.svids)
    raise MalformedResponse(f"no SVID for {spiffe_id} in a response holding {sent}")
