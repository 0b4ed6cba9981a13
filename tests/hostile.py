"""Hostile files: content that must never stop, stall or silently freeze a server (issue 9).

Plain functions, no pytest, so that benchmarks can import them too. :data:`HOSTILE` maps a case name to
``place(cert_path, key_path, ca)``, which puts that case on disk at the configured paths. Every case
replaces one file in a single atomic step (``os.replace`` of a file, symlink or FIFO made at a temporary
name beside it), so a reloader sees the hostile content at once and never a half-written mix. Cases that
need a certificate matching the key reuse the key already on disk (written by :func:`place_good`), so the
key file is not touched; they mint a new key and write it too only when none can be loaded.

Only ``trustme`` and ``cryptography`` are needed: this module does not import the test kit.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HUGE_SIZE = 200 * 1024 * 1024
UNTERMINATED_LINES = 4_000  # 28 bytes each: about 112 KB
MANY_CERTS = 5_000
# A SubjectAlternativeName value whose DER is cut short: a SEQUENCE of 3 bytes holding a dNSName
# of length 1 with no byte. The certificate's outer DER is fine; cryptography raises ValueError only
# when ``.extensions`` is read.
MALFORMED_SAN = b"\x30\x03\x82\x01"

Place = Callable[[Path, Path, trustme.CA], None]

_counter = 0


# --- atomic writes ---------------------------------------------------------------------------


def _temp_beside(path: Path) -> Path:
    global _counter
    _counter += 1
    return path.with_name(f".{path.name}.hostile-{os.getpid()}-{_counter}")


def replace_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` at a temporary name beside ``path``, then rename it over ``path``."""
    tmp = _temp_beside(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def replace_symlink(path: Path, target: str) -> None:
    """Make ``path`` a symlink to ``target`` in one rename."""
    tmp = _temp_beside(path)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def replace_fifo(path: Path) -> None:
    """Make ``path`` a FIFO (a named pipe nobody writes to: opening it for reading blocks)."""
    tmp = _temp_beside(path)
    os.mkfifo(tmp)
    os.replace(tmp, path)


def write_pair(cert_path: Path, key_path: Path, cert: bytes, key: bytes) -> None:
    """Write a certificate and key, each atomically: cert first, then key (the pair itself is not atomic)."""
    replace_bytes(cert_path, cert)
    replace_bytes(key_path, key)


def place_good(cert_path: Path, key_path: Path, ca: trustme.CA) -> str:
    """Issue a fresh good pair for localhost and 127.0.0.1 from ``ca`` and write it; returns its serial (hex)."""
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    write_pair(cert_path, key_path, chain, leaf.private_key_pem.bytes())
    return serial_of_pem(chain)


def serial_of_pem(pem: bytes) -> str:
    """Serial of the first certificate in ``pem`` as the reloader logs it: upper-case hex, whole bytes."""
    digits = format(x509.load_pem_x509_certificate(pem).serial_number, "X")
    return digits.zfill(len(digits) + len(digits) % 2)


# --- certificates built by hand ------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_key_on_disk(key_path: Path) -> PrivateKeyTypes | None:
    """The unencrypted private key at ``key_path``, or None when there is none usable (no blocking reads)."""
    try:
        if not key_path.is_file() or key_path.stat().st_size > 1024 * 1024:
            return None
        return serialization.load_pem_private_key(key_path.read_bytes(), None)
    except (OSError, ValueError, TypeError):
        return None


def key_for(key_path: Path) -> tuple[PrivateKeyTypes, bool]:
    """The key on disk if usable, else a new EC key; the flag says whether the key is new (must be written)."""
    key = load_key_on_disk(key_path)
    if key is not None:
        return key, False
    return ec.generate_private_key(ec.SECP256R1()), True


def leaf_for_key(
    ca: trustme.CA,
    key: PrivateKeyTypes,
    *,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    san: x509.ExtensionType | None = None,
) -> bytes:
    """PEM of a leaf for ``key`` signed by ``ca``, like trustme's, with the given validity and SAN extension."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    now = _now()
    public = key.public_key()
    if san is None:
        san = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hostile test leaf")]))
        .issuer_name(ca_cert.subject)
        .public_key(public)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(hours=1))
        .not_valid_after(not_after or now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)  # type: ignore[arg-type]
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(san, critical=False)
    )
    return _pem(builder.sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]


def _place_leaf(cert_path: Path, key_path: Path, ca: trustme.CA, extra: bytes = b"", **kwargs: object) -> None:
    """Replace the certificate with a leaf for the key on disk (plus ``extra`` PEM after it)."""
    key, new = key_for(key_path)
    cert = leaf_for_key(ca, key, **kwargs) + extra  # type: ignore[arg-type]
    if new:
        write_pair(cert_path, key_path, cert, _key_pem(key))
    else:
        replace_bytes(cert_path, cert)


def self_signed_pem(name: str) -> bytes:
    """A self-signed EC CA certificate (fast to mint)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert)


@functools.lru_cache(maxsize=1)
def ca_bundle() -> bytes:
    """About 144 CA certificates, more than 100 KiB: the system bundle if present, else 150 minted ones."""
    if SYSTEM_BUNDLE.is_file():
        data = SYSTEM_BUNDLE.read_bytes()
        if data.count(b"-----BEGIN CERTIFICATE-----") >= 100 and len(data) > 100 * 1024:
            return data
    return b"".join(self_signed_pem(f"hostile bundle CA {i}") for i in range(150))


@functools.lru_cache(maxsize=1)
def many_certs_pem(count: int = MANY_CERTS) -> bytes:
    """``count`` certificates: a handful minted, repeated."""
    handful = [self_signed_pem(f"hostile repeated CA {i}") for i in range(5)]
    return b"".join(handful[i % len(handful)] for i in range(count))


# --- the cases -----------------------------------------------------------------------------


def place_fifo(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    replace_fifo(cert_path)


def place_dev_zero(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    replace_symlink(cert_path, "/dev/zero")


def place_dev_urandom(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    replace_symlink(cert_path, "/dev/urandom")


def place_huge(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    """200 MB of garbage: a sparse file with garbage at both ends."""
    tmp = _temp_beside(cert_path)
    with open(tmp, "wb") as f:
        f.write(b"-----BEGIN CERTIFICATE-----\n" + os.urandom(64 * 1024))
        f.truncate(HUGE_SIZE - 4096)
        f.seek(0, os.SEEK_END)
        f.write(os.urandom(4096))
    os.replace(tmp, cert_path)


def unterminated_key_pem(lines: int = UNTERMINATED_LINES) -> bytes:
    return b"-----BEGIN PRIVATE KEY-----\n" * lines


def place_unterminated_keys(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    """The key file becomes thousands of BEGIN lines with no END (the certificate is left as it is)."""
    replace_bytes(key_path, unterminated_key_pem())


def bad_san_pem(ca: trustme.CA, key: PrivateKeyTypes) -> bytes:
    """A leaf for ``key`` whose SubjectAlternativeName value is malformed DER."""
    san = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, MALFORMED_SAN)
    return leaf_for_key(ca, key, san=san)


def place_bad_san(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    san = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, MALFORMED_SAN)
    _place_leaf(cert_path, key_path, ca, san=san)


def place_system_bundle(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    """A good leaf followed by the CA bundle: a chain over OpenSSL's 100 KiB default limit."""
    _place_leaf(cert_path, key_path, ca, extra=ca_bundle())


def place_many_certs(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    """A good leaf followed by 5,000 certificates (about 3 MB)."""
    _place_leaf(cert_path, key_path, ca, extra=many_certs_pem())


def place_expired(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    now = _now()
    _place_leaf(
        cert_path,
        key_path,
        ca,
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


def place_not_yet_valid(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    now = _now()
    _place_leaf(
        cert_path,
        key_path,
        ca,
        not_before=now + datetime.timedelta(days=1),
        not_after=now + datetime.timedelta(days=30),
    )


def place_mismatched(cert_path: Path, key_path: Path, ca: trustme.CA) -> None:
    """A good certificate for another key; the key file is left as it is."""
    other = ec.generate_private_key(ec.SECP256R1())
    replace_bytes(cert_path, leaf_for_key(ca, other))


HOSTILE: dict[str, Place] = {
    "fifo": place_fifo,
    "dev_zero": place_dev_zero,
    "dev_urandom": place_dev_urandom,
    "huge": place_huge,
    "unterminated_keys": place_unterminated_keys,
    "bad_san": place_bad_san,
    "system_bundle": place_system_bundle,
    "many_certs": place_many_certs,
    "expired": place_expired,
    "not_yet_valid": place_not_yet_valid,
    "mismatched": place_mismatched,
}

BLOCKING = ("fifo", "dev_zero", "dev_urandom", "huge", "unterminated_keys", "bad_san")
"""Cases that can block, stall or crash a naive reader (the rest are ordinary refusals)."""

FILE_OF_CASE = {"unterminated_keys": "key"}
"""Which configured file each case makes unusable (``cert`` unless listed); the failure names that file."""
