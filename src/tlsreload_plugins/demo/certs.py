"""The certificates of ``tlsreload demo``, and the kubelet Secret volume they are written to.

:func:`mint_ca` makes a throwaway CA, :func:`mint_leaf` a server certificate for localhost and ``HOST``
signed by it, and :func:`write_secret_volume` lays files out and rotates them exactly as kubelet's atomic
writer updates a mounted Secret. Only ``cryptography`` is used: the demo must run from a plain install.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tlsreload_plugins.identity import serial_hex

HOST = "127.0.0.1"
"""The address the demo's server listens on, named in its certificate."""


# --- certificates (cryptography only: the demo must run from a plain install) ---------------


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pair:
    chain: bytes
    key: bytes
    serial: str


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tlsreload demo"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def mint_ca() -> Authority:
    """A throwaway CA valid for a year."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tlsreload demo CA"))
        .issuer_name(_name("tlsreload demo CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def mint_leaf(ca: Authority, days: float = 90.0, *, client: bool = False) -> Pair:
    """A fresh key and a server certificate for localhost and 127.0.0.1, signed by ``ca`` (``client``: good for
    client authentication too)."""
    purposes = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(purposes), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Pair(
        chain=cert.public_bytes(serialization.Encoding.PEM) + ca.pem,
        key=key_pem,
        serial=serial_hex(cert.serial_number),
    )


# --- the kubelet Secret volume layout --------------------------------------------------------


def write_secret_volume(root: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``root`` the way kubelet's atomic writer updates a Secret volume.

    ``root/NAME -> ..data/NAME`` and ``..data -> ..TIMESTAMP``: each update writes a new
    timestamped directory, renames a temporary symlink over ``..data`` (all files change in
    one step) and then deletes the previous directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y_%m_%d_%H_%M_%S")
    version = Path(tempfile.mkdtemp(prefix=f"..{stamp}.", dir=root))
    for name, data in files.items():
        (version / name).write_bytes(data)
        os.chmod(version / name, 0o600 if name.endswith(".key") else 0o644)
    os.chmod(version, 0o755)
    data_link = root / "..data"
    previous = os.readlink(data_link) if data_link.is_symlink() else None
    tmp_link = root / "..data_tmp"
    os.symlink(version.name, tmp_link)
    os.rename(tmp_link, data_link)
    for name in files:
        if not (root / name).is_symlink():
            os.symlink(f"..data/{name}", root / name)
    if previous:
        shutil.rmtree(root / previous)
