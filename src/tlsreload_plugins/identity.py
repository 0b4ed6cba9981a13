"""Read, fingerprint and validate the files that make up a server's TLS identity.

Nothing here knows about a server. Every function is plain code over bytes so that the
decision "is what is on disk now usable?" can be tested without a socket.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

Password = str | bytes | Callable[[], str | bytes] | None
"""A key password as :meth:`ssl.SSLContext.load_cert_chain` accepts it."""

_KEY_BLOCK = re.compile(rb"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----", re.DOTALL)
_CERT_BEGIN = b"-----BEGIN CERTIFICATE-----"


class InvalidIdentity(Exception):
    """The files on disk do not make a usable TLS identity.

    ``str(error)`` names the file and says what is wrong with it, in words an operator can act on.
    """


@dataclass(frozen=True)
class TLSFiles:
    """The paths that make up one TLS identity.

    ``keyfile`` may be ``None`` when the key is in ``certfile`` (as :mod:`ssl` allows);
    ``ca_certs`` is the optional bundle of CAs that client certificates are verified against.
    """

    certfile: str
    keyfile: str | None = None
    ca_certs: str | None = None

    def describe(self) -> str:
        """One line naming the files, for logs."""
        parts = [f"cert={self.certfile}"]
        if self.keyfile:
            parts.append(f"key={self.keyfile}")
        if self.ca_certs:
            parts.append(f"ca={self.ca_certs}")
        return " ".join(parts)


@dataclass(frozen=True)
class Snapshot:
    """The bytes of each file as read in one check."""

    files: TLSFiles
    cert: bytes
    key: bytes | None
    ca: bytes | None


@dataclass(frozen=True)
class Leaf:
    """What an operator wants to know about the certificate being served."""

    subject: str
    serial: str
    sans: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    sha256: str

    def describe(self) -> str:
        """One line for logs: serial, subject, names and expiry."""
        sans = ",".join(self.sans) or "-"
        return f"serial={self.serial} subject={self.subject or '-'} sans={sans} not_after={self.not_after.isoformat()}"


def _read(path: str, role: str) -> bytes:
    # Opening the path on every check follows whatever symlinks point at now:
    # kubelet's ..data swap and certbot's relinking are seen without watching anything.
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise InvalidIdentity(f"{role} file {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidIdentity(f"{role} file {path} is a directory, not a file") from None
    except PermissionError:
        raise InvalidIdentity(f"{role} file {path} cannot be read: permission denied") from None
    except OSError as e:
        raise InvalidIdentity(f"{role} file {path} cannot be read: {e.strerror or e}") from None


def read_files(files: TLSFiles) -> Snapshot:
    """Read every file of ``files`` once. Raises :class:`InvalidIdentity` naming a file that cannot be read."""
    return Snapshot(
        files=files,
        cert=_read(files.certfile, "certificate"),
        key=_read(files.keyfile, "key") if files.keyfile else None,
        ca=_read(files.ca_certs, "client CA") if files.ca_certs else None,
    )


def fingerprint(snapshot: Snapshot) -> str:
    """A digest of the content of every file: equal when, and only when, no byte changed.

    Metadata (mtime, mode, owner, inode) is deliberately not part of it: chmod storms and
    touch cause nothing.
    """
    digest = hashlib.sha256()
    for part in (snapshot.cert, snapshot.key, snapshot.ca):
        if part is None:
            digest.update(b"-")
        else:
            digest.update(b"%d:" % len(part))
            digest.update(part)
    return digest.hexdigest()


def _load_certificates(data: bytes, path: str, role: str) -> list[x509.Certificate]:
    if not data.strip():
        raise InvalidIdentity(f"{role} file {path} is empty")
    begins = data.count(_CERT_BEGIN)
    if begins == 0:
        if _KEY_BLOCK.search(data) or b"PRIVATE KEY-----" in data:
            raise InvalidIdentity(
                f"{role} file {path} holds a private key, not a certificate "
                "(are the certificate and key paths swapped?)"
            )
        raise InvalidIdentity(f"{role} file {path} holds no PEM certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise InvalidIdentity(
            f"{role} file {path} holds a certificate that cannot be parsed (truncated or corrupt)"
        ) from None
    if len(certs) != begins:
        raise InvalidIdentity(
            f"{role} file {path} is truncated: {begins} certificates begin but {len(certs)} are complete"
        )
    return certs


def _password_bytes(password: Password) -> bytes | None:
    if callable(password):
        password = password()
    if isinstance(password, str):
        return password.encode()
    return password


def _load_key(data: bytes, path: str, password: Password) -> PrivateKeyTypes:
    match = _KEY_BLOCK.search(data)
    if match is None:
        if not data.strip():
            raise InvalidIdentity(f"key file {path} is empty")
        if b"PRIVATE KEY-----" in data:
            raise InvalidIdentity(f"key file {path} is truncated: the private key has no end marker")
        if _CERT_BEGIN in data:
            raise InvalidIdentity(
                f"key file {path} holds a certificate, not a private key (are the certificate and key paths swapped?)"
            )
        raise InvalidIdentity(f"key file {path} holds no PEM private key")
    block = match.group(0)
    secret = _password_bytes(password)
    # cryptography's RSA consistency check holds the GIL for ~30 ms (RSA 2048) to ~210 ms (RSA 4096),
    # stalling every handshake in the worker during a reload. Whether the key belongs to the certificate
    # is still checked below (public keys) and by OpenSSL when the context is built.
    load = functools.partial(serialization.load_pem_private_key, unsafe_skip_rsa_key_validation=True)
    try:
        return load(block, password=secret)
    except TypeError:
        if secret is None:
            raise InvalidIdentity(f"key file {path} is encrypted and no password is configured") from None
        # A password given for an unencrypted key is fine for ssl; accept it here too.
        try:
            return load(block, password=None)
        except (TypeError, ValueError):
            raise InvalidIdentity(f"key file {path} holds a private key that cannot be parsed") from None
    except ValueError as e:
        # A wrong password sometimes decrypts to bytes with valid padding (11 in 3,000 here): cryptography
        # then reports "Could not deserialize", not "Incorrect password". An encrypted key that a given
        # password cannot open is reported the way openssl does: a wrong password.
        encrypted = block.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") or b"Proc-Type: 4,ENCRYPTED" in block
        if secret is not None and (encrypted or "decrypt" in str(e).lower() or "password" in str(e).lower()):
            raise InvalidIdentity(f"wrong password for key file {path}") from None
        raise InvalidIdentity(
            f"key file {path} holds a private key that cannot be parsed (truncated or corrupt)"
        ) from None
    except Exception:  # cryptography raises UnsupportedAlgorithm and friends for odd keys
        raise InvalidIdentity(f"key file {path} holds a private key of an unsupported kind") from None


def _spki(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes")  # noqa: B009 - every public key type has it
    result: bytes = public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return result


def leaf_info(cert: x509.Certificate) -> Leaf:
    """Summarise a certificate for logs and status."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = tuple(str(getattr(name, "value", name)) for name in san)
    except x509.ExtensionNotFound:
        sans = ()
    return Leaf(
        subject=cert.subject.rfc4514_string(),
        serial=format(cert.serial_number, "X"),
        sans=sans,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def validate(snapshot: Snapshot, password: Password = None) -> Leaf:
    """Check that ``snapshot`` is a usable identity and describe its leaf certificate.

    The chain must parse completely, the key must parse (with ``password`` when it is
    encrypted) and must be the key of the first (leaf) certificate, and the client-CA
    bundle, when configured, must parse. Raises :class:`InvalidIdentity` otherwise.
    """
    files = snapshot.files
    certs = _load_certificates(snapshot.cert, files.certfile, "certificate")
    key_path = files.keyfile or files.certfile
    key_data = snapshot.key if snapshot.key is not None else snapshot.cert
    if snapshot.key is None and b"PRIVATE KEY-----" not in key_data:
        raise InvalidIdentity(f"certificate file {files.certfile} holds no private key, and no key file is configured")
    key = _load_key(key_data, key_path, password)
    leaf = certs[0]
    if _spki(key.public_key()) != _spki(leaf.public_key()):
        info = leaf_info(leaf)
        raise InvalidIdentity(
            f"key file {key_path} does not match the certificate in {files.certfile} "
            f"(serial {info.serial}): the two were not issued together"
        )
    if snapshot.ca is not None and files.ca_certs:
        _load_certificates(snapshot.ca, files.ca_certs, "client CA")
    return leaf_info(leaf)
