"""Certificate revocation lists (CRLs) served beside the client-CA bundle: what a CRL file must be to be served
(:func:`judge_crls`, :func:`judge_crl_dates`), what it says (:func:`describe_crls`, for ``tlsreload check``) and
how a context checks client certificates against it (:func:`check_revocation`).

A CRL file is one or more PEM ``X509 CRL`` blocks. OpenSSL refuses a client certificate whose issuer has no CRL,
and every client certificate once a CRL's ``nextUpdate`` has passed: a careless CRL is an outage, so a CRL file
is judged as strictly as a certificate before it replaces the one served. ``cryptography`` is imported by the
functions that parse, when first called (they run in the validating child, see
:mod:`tlsreload_plugins.validation.apart`); :func:`check_revocation` needs only :mod:`ssl`.
"""

from __future__ import annotations

import ssl
from datetime import datetime
from typing import TYPE_CHECKING

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.frozen import FrozenRecord

if TYPE_CHECKING:
    from cryptography import x509

_CRL_BEGIN = b"-----BEGIN X509 CRL-----"
_CRL_END = b"-----END X509 CRL-----"

WARNING_SHARE = 0.25
"""Warn when less than this share of the served CRL's validity (``thisUpdate`` to ``nextUpdate``) remains: a CRL
that its issuer replaces halfway through, as usual, never gets near it."""


class Revocation(FrozenRecord):
    """What the CRLs served beside a client-CA bundle say, as a server needs to know it.

    Attributes:
        last_update: ``thisUpdate`` of the CRL that needs replacing first.
        next_update: the earliest ``nextUpdate`` of the CRLs (``None``: none of them has one): once it has
            passed, OpenSSL refuses every client certificate.
        revoked: how many certificates the CRLs revoke, together.
        uncovered: the subjects of the bundle's CAs that no CRL covers: OpenSSL refuses every client
            certificate they issued.
    """

    _fields = ("last_update", "next_update", "revoked", "uncovered")
    __slots__ = _fields
    last_update: datetime
    next_update: datetime | None
    revoked: int
    uncovered: tuple[str, ...]

    def __init__(
        self, last_update: datetime, next_update: datetime | None, revoked: int, uncovered: tuple[str, ...] = ()
    ) -> None:
        self._set(last_update, next_update, revoked, uncovered)

    def describe(self) -> str:
        """One line for logs: how many revoked, and when the CRLs need replacing."""
        when = self.next_update.isoformat() if self.next_update is not None else "never"
        return f"{self.revoked} revoked, next_update={when}"

    def warn_at(self) -> float | None:
        """The ``time.time()`` from which a warning that the CRL needs replacing is due (:data:`WARNING_SHARE`)."""
        if self.next_update is None:
            return None
        end = self.next_update.timestamp()
        return end - max(0.0, end - self.last_update.timestamp()) * WARNING_SHARE


def crl_blocks(data: bytes, path: str) -> list[bytes]:
    """The PEM ``X509 CRL`` blocks of ``data`` (the CRL file ``path``), each whole.

    Raises:
        InvalidIdentity: the file is empty (an empty file is not "no revocations": a CRL says that), holds no
            CRL, or a CRL begins without ending.
    """
    if not data.strip():
        raise InvalidIdentity(f"CRL file {path} is empty (a CRL revoking nothing is still a signed CRL)", path=path)
    blocks = []
    at = data.find(_CRL_BEGIN)
    if at < 0:
        raise InvalidIdentity(f"CRL file {path} holds no PEM CRL (-----BEGIN X509 CRL-----)", path=path)
    while at >= 0:
        end = data.find(_CRL_END, at)
        following = data.find(_CRL_BEGIN, at + len(_CRL_BEGIN))
        if end < 0 or (0 <= following < end):
            raise InvalidIdentity(f"CRL file {path} is truncated: a CRL has no end marker", path=path)
        blocks.append(data[at : end + len(_CRL_END)])
        at = following
    return blocks


def load_crls(data: bytes, path: str) -> list[x509.CertificateRevocationList]:
    """Every CRL of the file ``path`` holding ``data``, parsed.

    Raises:
        InvalidIdentity: as :func:`crl_blocks`, or a CRL cannot be parsed.
    """
    from cryptography import x509

    crls = []
    for number, block in enumerate(crl_blocks(data, path), 1):
        try:
            crls.append(x509.load_pem_x509_crl(block))
        except ValueError:
            raise InvalidIdentity(
                f"CRL file {path} holds a CRL (number {number}) that cannot be parsed", path=path
            ) from None
    return crls


def _updates(crl: x509.CertificateRevocationList) -> tuple[datetime, datetime | None]:
    """``thisUpdate`` and ``nextUpdate`` of ``crl``, aware of their time zone (UTC)."""
    last = crl.last_update_utc
    return last, crl.next_update_utc


def _issuer_of(crl: x509.CertificateRevocationList, cas: list[x509.Certificate]) -> x509.Certificate | None:
    """The CA of ``cas`` that signed ``crl``: its subject is the CRL's issuer and its key verifies the signature."""
    for ca in cas:
        if ca.subject != crl.issuer:
            continue
        try:
            if crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
                return ca
        except (TypeError, ValueError):  # a key kind that cannot sign a CRL
            continue
    return None


def judge_crls(data: bytes, path: str, cas: list[x509.Certificate]) -> Revocation:
    """Check that the CRL file ``path`` (holding ``data``) can be served beside the client-CA bundle ``cas``, and
    say what it holds. Its dates are not judged here: see :func:`judge_crl_dates`.

    Every CRL must parse and be signed by a CA of the bundle (a CRL naming a CA of the bundle as its issuer but
    signed by another key, a forgery, is refused).

    Raises:
        InvalidIdentity: naming the file and the CRL at fault.
    """
    crls = load_crls(data, path)
    covered: set[bytes] = set()
    revoked = 0
    soonest: tuple[datetime, datetime | None] | None = None
    for number, crl in enumerate(crls, 1):
        issuer = crl.issuer.rfc4514_string() or "-"
        ca = _issuer_of(crl, cas)
        if ca is None:
            named = any(ca.subject == crl.issuer for ca in cas)
            why = "is not signed by the key of that CA (forged?)" if named else "is not a CA of the client-CA bundle"
            raise InvalidIdentity(
                f"CRL file {path} holds a CRL (number {number}) issued by {issuer}, which {why}", path=path
            )
        covered.add(ca.subject.public_bytes())
        revoked += len(crl)
        updates = _updates(crl)
        if soonest is None or (updates[1] is not None and (soonest[1] is None or updates[1] < soonest[1])):
            soonest = updates
    assert soonest is not None  # crl_blocks found one at least
    uncovered = tuple(ca.subject.rfc4514_string() for ca in cas if ca.subject.public_bytes() not in covered)
    return Revocation(last_update=soonest[0], next_update=soonest[1], revoked=revoked, uncovered=uncovered)


def judge_crl_dates(revocation: Revocation, path: str, now: datetime) -> None:
    """Refuse CRLs with which OpenSSL refuses every client at ``now``: past their ``nextUpdate``, or not issued yet.

    Raises:
        InvalidIdentity: naming the CRL file and the date.
    """
    if revocation.next_update is not None and now >= revocation.next_update:
        raise InvalidIdentity(
            f"CRL file {path} holds a CRL whose nextUpdate passed at {revocation.next_update.isoformat()}: "
            "with it, every client certificate would be refused",
            path=path,
        )
    if now < revocation.last_update:
        raise InvalidIdentity(
            f"CRL file {path} holds a CRL issued in the future ({revocation.last_update.isoformat()}); "
            "is a clock wrong?",
            path=path,
        )


def describe_crls(
    data: bytes, path: str, cas: list[x509.Certificate], clients: list[x509.Certificate]
) -> list[tuple[str, list[x509.Certificate]]]:
    """Each CRL of the file ``path`` described in a line (its issuer, ``thisUpdate``, ``nextUpdate``, how many it
    revokes, whether a CA of ``cas`` signed it), with those of the client certificates ``clients`` it revokes.
    For ``tlsreload check``.

    Raises:
        InvalidIdentity: as :func:`load_crls`.
    """
    described = []
    for crl in load_crls(data, path):
        last, next_update = _updates(crl)
        signed = "signed by a CA of the bundle" if _issuer_of(crl, cas) is not None else "NOT signed by the bundle"
        when = next_update.isoformat() if next_update is not None else "none"
        line = (
            f"issuer={crl.issuer.rfc4514_string() or '-'} this_update={last.isoformat()} next_update={when} "
            f"revoked={len(crl)} ({signed})"
        )
        revoked = [
            client
            for client in clients
            if client.issuer == crl.issuer and crl.get_revoked_certificate_by_serial_number(client.serial_number)
        ]
        described.append((line, revoked))
    return described


def check_revocation(context: ssl.SSLContext, path: str) -> None:
    """Have ``context`` refuse client certificates that the CRLs in the PEM file ``path`` revoke, and (as
    OpenSSL does) every client certificate whose issuer has no CRL there or once a CRL's ``nextUpdate`` has
    passed.

    (:meth:`ssl.SSLContext.load_verify_locations` reads CRLs from a file only: its ``cadata`` takes certificates
    and skips CRLs.)

    Example: ``check_revocation(context, "/etc/tls/clients.crl")``.
    """
    context.load_verify_locations(cafile=path)
    context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
