"""Validate the files that make up a server's TLS identity: parse them, check that they make a usable
identity, and describe the leaf certificate.

Nothing here knows about a server. Every function is plain code over bytes so that the
decision "is what is on disk now usable?" can be tested without a socket. Reading and
fingerprinting the files are in :mod:`tlsreload_plugins.files`, the exceptions in
:mod:`tlsreload_plugins.errors`.

``cryptography`` is imported by the functions that parse, when first called: reading and
fingerprinting need none of it. A serving process does not call them itself: the reloader validates
through :mod:`tlsreload_plugins.validation.apart`, which runs :func:`validate` in a short-lived child
process, so that the server never loads ``cryptography``. A direct call of :func:`validate` runs in
the calling process.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, password_bytes
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.revocation import Revocation, judge_crl_dates, judge_crls

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

MAX_CERT_LIST_BYTES = 100 * 1024
"""The largest certificate list a client accepts: OpenSSL's default ``max_cert_list``
(``SSL_MAX_CERT_LIST_DEFAULT``). A longer chain loads, then fails every handshake with
``EXCESSIVE_MESSAGE_SIZE``, so it is refused."""

_KEY_BEGIN = re.compile(rb"-----BEGIN ((?:RSA |EC |DSA |ENCRYPTED )?)PRIVATE KEY-----")
"""The PEM private-key kinds cryptography loads. A closed set keeps the scan linear: at most one
failed search for an END line per kind, however many BEGIN lines a file holds."""
_CERT_BEGIN = b"-----BEGIN CERTIFICATE-----"
_CERT_END = b"-----END CERTIFICATE-----"


class Leaf(FrozenRecord):
    """What an operator wants to know about the certificate being served."""

    _fields = ("subject", "serial", "sans", "not_before", "not_after", "sha256", "revocation", "purposes")
    __slots__ = _fields
    subject: str
    serial: str
    sans: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    sha256: str
    revocation: Revocation | None
    """What the CRLs served with it say (``None``: no CRL is configured)."""
    purposes: tuple[str, ...] | None
    """The dotted OIDs of the certificate's extended key usage (``1.3.6.1.5.5.7.3.2``: client authentication),
    ``None`` when it has none (any purpose)."""

    def __init__(
        self,
        subject: str,
        serial: str,
        sans: tuple[str, ...],
        not_before: datetime,
        not_after: datetime,
        sha256: str,
        revocation: Revocation | None = None,
        purposes: tuple[str, ...] | None = None,
    ) -> None:
        self._set(subject, serial, sans, not_before, not_after, sha256, revocation, purposes)

    def describe(self) -> str:
        """One line for logs: serial, subject, names and expiry (and the CRLs, when there are)."""
        sans = ",".join(self.sans) or "-"
        crl = f" crl: {self.revocation.describe()}" if self.revocation is not None else ""
        return (
            f"serial={self.serial} subject={self.subject or '-'} sans={sans} not_after={self.not_after.isoformat()}"
            + crl
        )

    def fields(self) -> list[object]:
        """The leaf as plain values (strings, numbers, lists): how it travels as JSON (:meth:`from_fields`)."""
        revocation = self.revocation
        crl = (
            None
            if revocation is None
            else [
                revocation.last_update.isoformat(),
                None if revocation.next_update is None else revocation.next_update.isoformat(),
                revocation.revoked,
                list(revocation.uncovered),
            ]
        )
        when = (self.not_before.isoformat(), self.not_after.isoformat())
        purposes = None if self.purposes is None else list(self.purposes)
        return [self.subject, self.serial, list(self.sans), *when, self.sha256, crl, purposes]

    @classmethod
    def from_fields(cls, fields: list[Any]) -> Leaf:
        """The leaf :meth:`fields` described.

        Raises:
            TypeError, ValueError: ``fields`` is not what :meth:`fields` returns.
        """
        subject, serial, sans, not_before, not_after, sha256, crl, purposes = fields
        when = datetime.fromisoformat
        revocation = None
        if crl is not None:
            last, next_update, revoked, uncovered = crl
            revocation = Revocation(
                when(str(last)),
                None if next_update is None else when(str(next_update)),
                int(revoked),
                tuple(str(name) for name in uncovered),
            )
        return cls(
            str(subject),
            str(serial),
            tuple(str(san) for san in sans),
            when(str(not_before)),
            when(str(not_after)),
            str(sha256),
            revocation,
            None if purposes is None else tuple(str(oid) for oid in purposes),
        )


@contextlib.contextmanager
def _unexpected(path: str, what: str) -> Iterator[None]:
    """Turn anything a parser raises that was not foreseen into a reason naming the file.

    cryptography parses some parts lazily (a malformed extension raises ``ValueError`` only when
    touched) and raises ``UnsupportedAlgorithm``, ``MemoryError`` and friends for odd input.
    """
    try:
        yield
    except InvalidIdentity:
        raise
    except Exception as e:
        raise InvalidIdentity(f"{what} in {path} cannot be used: {type(e).__name__}: {e}", path=path) from e


def _load_certificates(data: bytes, path: str, role: str) -> list[x509.Certificate]:
    if not data.strip():
        raise InvalidIdentity(f"{role} file {path} is empty", path=path)
    begins = data.count(_CERT_BEGIN)
    if begins == 0:
        if b"PRIVATE KEY-----" in data:
            raise InvalidIdentity(
                f"{role} file {path} holds a private key, not a certificate "
                "(are the certificate and key paths swapped?)",
                path=path,
            )
        raise InvalidIdentity(f"{role} file {path} holds no PEM certificate", path=path)
    ends = data.count(_CERT_END)
    if ends < begins:
        # Checked before parsing: the PEM reader then never searches for an end that is not there.
        raise InvalidIdentity(
            f"{role} file {path} is truncated: {begins} certificates begin but {ends} are complete", path=path
        )
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise InvalidIdentity(
            f"{role} file {path} holds a certificate that cannot be parsed (truncated or corrupt)", path=path
        ) from None
    if len(certs) != begins:
        raise InvalidIdentity(
            f"{role} file {path} is truncated: {begins} certificates begin but {len(certs)} are complete", path=path
        )
    return certs


def _key_block(data: bytes) -> bytes | None:
    """The first complete PEM private-key block, found in time linear in ``len(data)``.

    (A regular expression with a lazy ``.*?`` to the matching END line takes quadratic time on a
    file of many BEGIN lines with no END, with the GIL held.)
    """
    no_end: set[bytes] = set()
    for begin in _KEY_BEGIN.finditer(data):
        label = begin.group(1)
        if label in no_end:
            continue
        end_line = b"-----END " + label + b"PRIVATE KEY-----"
        end = data.find(end_line, begin.end())
        if end < 0:
            no_end.add(label)  # no later BEGIN of this kind can have an END either
            continue
        return data[begin.start() : end + len(end_line)]
    return None


def _is_encrypted(block: bytes) -> bool:
    return block.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") or b"Proc-Type: 4,ENCRYPTED" in block


def _load_key(data: bytes, path: str, password: Password) -> PrivateKeyTypes:
    block = _key_block(data)
    if block is None:
        if not data.strip():
            raise InvalidIdentity(f"key file {path} is empty", path=path)
        if b"PRIVATE KEY-----" in data:
            raise InvalidIdentity(f"key file {path} is truncated: the private key has no end marker", path=path)
        if _CERT_BEGIN in data:
            raise InvalidIdentity(
                f"key file {path} holds a certificate, not a private key (are the certificate and key paths swapped?)",
                path=path,
            )
        raise InvalidIdentity(f"key file {path} holds no PEM private key", path=path)
    from cryptography.hazmat.primitives import serialization

    secret = password_bytes(password)
    # cryptography's RSA consistency check holds the GIL for tens to hundreds of milliseconds, stalling
    # every handshake in the worker during a reload. Whether the key belongs to the certificate
    # is still checked below (public keys) and by OpenSSL when the context is built.
    load = functools.partial(serialization.load_pem_private_key, unsafe_skip_rsa_key_validation=True)
    try:
        return load(block, password=secret)
    except TypeError:
        if secret is None:
            raise InvalidIdentity(f"key file {path} is encrypted and no password is configured", path=path) from None
        if _is_encrypted(block):  # cryptography takes an empty password for none at all
            raise InvalidIdentity(
                f"wrong password for key file {path} (the password given is empty)", path=path
            ) from None
        # A password given for an unencrypted key is fine for ssl; accept it here too.
        try:
            return load(block, password=None)
        except (TypeError, ValueError):
            raise InvalidIdentity(f"key file {path} holds a private key that cannot be parsed", path=path) from None
    except ValueError as e:
        # A wrong password sometimes decrypts to bytes with valid padding (11 in 3,000 here): cryptography
        # then reports "Could not deserialize", not "Incorrect password". An encrypted key that a given
        # password cannot open is reported the way openssl does: a wrong password.
        encrypted = _is_encrypted(block)
        if secret is not None and (encrypted or "decrypt" in str(e).lower() or "password" in str(e).lower()):
            raise InvalidIdentity(f"wrong password for key file {path}", path=path) from None
        raise InvalidIdentity(
            f"key file {path} holds a private key that cannot be parsed (truncated or corrupt)", path=path
        ) from None
    except Exception as e:  # cryptography raises UnsupportedAlgorithm and friends for odd keys
        raise InvalidIdentity(
            f"key file {path} holds a private key of an unsupported kind ({type(e).__name__}: {e})", path=path
        ) from e


def _spki(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    public_bytes = getattr(key, "public_bytes")  # noqa: B009 - every public key type has it
    result: bytes = public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return result


def serial_hex(serial: int) -> str:
    """A serial number as ``openssl x509 -serial`` prints it: upper-case hex, whole bytes (``0F18...``)."""
    digits = format(serial, "X")
    return digits.zfill(len(digits) + len(digits) % 2)


def leaf_info(cert: x509.Certificate) -> Leaf:
    """Summarise a certificate for logs and status.

    Raises:
        ValueError: an extension is malformed (cryptography parses extensions only when asked).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = tuple(str(getattr(name, "value", name)) for name in san)
    except x509.ExtensionNotFound:
        sans = ()
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        purposes: tuple[str, ...] | None = tuple(oid.dotted_string for oid in usage)
    except x509.ExtensionNotFound:
        purposes = None
    return Leaf(
        subject=cert.subject.rfc4514_string(),
        serial=serial_hex(cert.serial_number),
        sans=sans,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        sha256=cert.fingerprint(hashes.SHA256()).hex(),
        purposes=purposes,
    )


def _cert_list_bytes(certs: list[x509.Certificate]) -> int:
    # TLS 1.3 Certificate message: 4-byte header, context, 3-byte list length, then per certificate a
    # 3-byte length, the DER and 2 bytes of (empty) extensions.
    from cryptography.hazmat.primitives import serialization

    return 8 + sum(5 + len(cert.public_bytes(serialization.Encoding.DER)) for cert in certs)


def validate(snapshot: Snapshot, password: Password = None) -> Leaf:
    """Check that ``snapshot`` is a usable identity and describe its leaf certificate.

    The chain must parse completely and fit in what a client accepts (:data:`MAX_CERT_LIST_BYTES`),
    every extension of the leaf must parse, the key must parse (with ``password`` when it is
    encrypted) and must be the key of the first (leaf) certificate, the client-CA bundle, when
    configured, must parse, and its CRLs, when configured, must parse and be signed by a CA of the bundle
    (:func:`~tlsreload_plugins.revocation.judge_crls`). The validity period is not judged here: see
    :func:`judge_period`.

    Raises:
        InvalidIdentity: for any of the above, and for anything a parser raises; nothing else escapes.
    """
    files = snapshot.files
    key_path = files.keyfile or files.certfile
    with _unexpected(files.certfile, "the certificate"):
        certs = _load_certificates(snapshot.cert, files.certfile, "certificate")
        size = _cert_list_bytes(certs)
        if size > MAX_CERT_LIST_BYTES:
            raise InvalidIdentity(
                f"certificate file {files.certfile} holds {len(certs)} certificates ({size} bytes on the wire), "
                f"more than the {MAX_CERT_LIST_BYTES} bytes a TLS client accepts (OpenSSL's max_cert_list): "
                "every handshake would fail; is a whole CA bundle appended to the chain?",
                path=files.certfile,
            )
        leaf = certs[0]
        info = leaf_info(leaf)
        leaf_spki = _spki(leaf.public_key())
    key_data = snapshot.key if snapshot.key is not None else snapshot.cert
    if snapshot.key is None and b"PRIVATE KEY-----" not in key_data:
        raise InvalidIdentity(
            f"certificate file {files.certfile} holds no private key, and no key file is configured",
            path=files.certfile,
        )
    with _unexpected(key_path, "the private key"):
        key = _load_key(key_data, key_path, password)
        key_spki = _spki(key.public_key())
    if key_spki != leaf_spki:
        raise InvalidIdentity(
            f"key file {key_path} does not match the certificate in {files.certfile} "
            f"(serial {info.serial}): the two were not issued together",
            path=key_path,
        )
    cas = []
    if snapshot.ca is not None and files.ca_certs:
        with _unexpected(files.ca_certs, "the client CA bundle"):
            cas = _load_certificates(snapshot.ca, files.ca_certs, "client CA")
    if snapshot.crl is not None and files.crl:
        if not cas:
            raise InvalidIdentity(
                f"CRL file {files.crl} is configured without a client-CA bundle: there is nothing for it to revoke",
                path=files.crl,
            )
        with _unexpected(files.crl, "the CRL"):
            return info._replace(revocation=judge_crls(snapshot.crl, files.crl, cas))
    return info


def judge_period(leaf: Leaf, files: TLSFiles, now: datetime) -> None:
    """Refuse a certificate no client accepts at ``now``: expired, or not valid yet; and CRLs with which no
    client certificate is accepted at ``now`` (:func:`~tlsreload_plugins.revocation.judge_crl_dates`).

    Raises:
        InvalidIdentity: naming the certificate (or CRL) file and the date.
    """
    if leaf.revocation is not None and files.crl:
        judge_crl_dates(leaf.revocation, files.crl, now)
    if now >= leaf.not_after:
        raise InvalidIdentity(
            f"certificate file {files.certfile} holds a certificate that expired at {leaf.not_after.isoformat()} "
            f"(serial {leaf.serial})",
            path=files.certfile,
        )
    if now < leaf.not_before:
        raise InvalidIdentity(
            f"certificate file {files.certfile} holds a certificate not valid before "
            f"{leaf.not_before.isoformat()} (serial {leaf.serial}); is a clock wrong?",
            path=files.certfile,
        )
