"""Who may be on the other end of a connection, by SPIFFE ID: the authorizers of go-spiffe's ``tlsconfig``.

An SVID carries no host name that means anything; SPIFFE's mTLS is "a peer of my trust domain, with an ID I
accept". An :class:`Authorizer` says which IDs are accepted, built the way go-spiffe builds them
(:func:`authorize_any`, :func:`authorize_id`, :func:`authorize_one_of`, :func:`authorize_member_of`,
:func:`adapt_matcher`) or from one string a command line or configuration file can hold (:func:`parse_authorizer`).
Deciding is plain code, with no ``ssl``: :meth:`Authorizer.refusal` answers for a peer's certificate as
:meth:`ssl.SSLSocket.getpeercert` gives it (which needs no ``cryptography``). Where the decision is applied, in the
handshake of every connection of a context, is :mod:`tlsreload_plugins.resumption`'s
(:func:`~tlsreload_plugins.resumption.authorize_peers`).

Refusals are counted (:attr:`Authorizer.refused`) and said once per peer ID at INFO; past :data:`SAID_UP_TO`
distinct IDs, once more in a line saying the rest are counted only.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "AUTHORIZE_ENV",
    "SAID_UP_TO",
    "Authorizer",
    "adapt_matcher",
    "authorize_any",
    "authorize_id",
    "authorize_member_of",
    "authorize_one_of",
    "parse_authorizer",
    "parse_spiffe_id",
    "resolve_authorizer",
    "spiffe_id_of",
    "trust_domain_of",
]

log: logging.Logger = logging.getLogger("tlsreload_plugins.authorization")

AUTHORIZE_ENV = "TLSRELOAD_SPIFFE_AUTHORIZE"
"""Who may be on the other end when no setting says it (the syntax of :func:`parse_authorizer`)."""

SAID_UP_TO = 1000
"""Distinct refused peer IDs said in a line each; beyond, one line says the rest are counted only."""

SCHEME = "spiffe://"


def trust_domain_of(value: str) -> str:
    """The trust domain of a SPIFFE ID or trust domain name, lower-cased: ``spiffe://Example.org/web`` and
    ``example.org`` both give ``example.org``.

    Raises:
        ValueError: not a trust domain: empty, or characters SPIFFE does not allow (``a-z 0-9 . - _``).

    Example: ``trust_domain_of("spiffe://example.org/web") == "example.org"``.
    """
    rest = value[len(SCHEME) :] if value.lower().startswith(SCHEME) else value
    domain = rest.split("/", 1)[0].lower()
    if not domain or any(not (c.isascii() and (c.isalnum() or c in ".-_")) for c in domain):
        raise ValueError(f"{value!r} is not a SPIFFE trust domain (letters, digits, '.', '-', '_')")
    return domain


def parse_spiffe_id(value: str) -> str:
    """``value`` as a workload's SPIFFE ID: a path after the trust domain; scheme and trust domain lower-cased, as
    SPIFFE compares them.

    Raises:
        ValueError: not a workload's SPIFFE ID.

    Example: ``parse_spiffe_id("spiffe://Example.org/web") == "spiffe://example.org/web"``.
    """
    if not value.lower().startswith(SCHEME):
        raise ValueError(f"{value!r} is not a SPIFFE ID (spiffe://trust-domain/path)")
    domain = trust_domain_of(value)
    path = value[len(SCHEME) + len(domain) :]
    if not path.startswith("/") or path == "/" or "//" in path or path.endswith("/"):
        raise ValueError(f"{value!r} is not a SPIFFE ID of a workload (spiffe://trust-domain/path)")
    return f"{SCHEME}{domain}{path}"


def spiffe_id_of(peer: Mapping[str, Any] | None) -> str | None:
    """The SPIFFE ID of a peer's certificate as :meth:`ssl.SSLSocket.getpeercert` decodes it: its one URI
    subject alternative name with the ``spiffe`` scheme. ``None``: no certificate, none such, or more than one (an
    X.509 SVID has exactly one).

    Example: ``spiffe_id_of(conn.getpeercert())``.
    """
    if not peer:
        return None
    names = [
        value
        for kind, value in peer.get("subjectAltName", ())
        if kind == "URI" and isinstance(value, str) and value.lower().startswith(SCHEME)
    ]
    if len(names) != 1:
        return None
    try:
        return parse_spiffe_id(names[0])
    except ValueError:
        return None


class Authorizer:
    """Which peers' SPIFFE IDs are accepted, and the count of those refused (one per process, shared by every
    context it is applied to). Build one with the functions of this module.

    Attributes:
        description: what it accepts, in the words of the log lines (``spiffe://example.org/web or members of
            other.org``).
        refused: handshakes refused so far in this process.

    Example::

        authorizer = authorize_member_of("example.org")
        authorizer.allows("spiffe://example.org/web")    # True
    """

    def __init__(self, allows: Callable[[str], bool], description: str) -> None:
        self._allows = allows
        self.description = description
        self.refused: int = 0
        self._said: set[str] = set()
        self._lock = threading.Lock()  # the count and the IDs said: a few assignments, never across I/O
        self._on_refused: list[Callable[[], object]] = []

    def allows(self, spiffe_id: str) -> bool:
        """Whether a peer with ``spiffe_id`` may be on the other end (a matcher that raises refuses)."""
        try:
            return bool(self._allows(spiffe_id))
        except Exception as e:
            log.error("the SPIFFE authorizer %s failed on %s (refused): %r", self.description, spiffe_id, e)
            return False

    def refusal(self, peer: Mapping[str, Any] | None) -> str | None:
        """Why the peer whose certificate is ``peer`` (``getpeercert()``'s dictionary) is refused, else ``None``."""
        spiffe_id = spiffe_id_of(peer)
        if spiffe_id is None:
            return "the peer presented no certificate with one SPIFFE ID"
        if not self.allows(spiffe_id):
            return f"{spiffe_id} is not authorized (accepted: {self.description})"
        return None

    def on_refused(self, callback: Callable[[], object]) -> None:
        """Have ``callback`` called (in the handshake's thread, quickly) at each refusal: metrics count them so."""
        self._on_refused.append(callback)

    def count_refusal(self, peer: Mapping[str, Any] | None, reason: str, where: str) -> None:
        """Count a refused handshake and say it once per peer ID (``where``: which side refused, for the line)."""
        spiffe_id = spiffe_id_of(peer) or "(no SPIFFE ID)"
        with self._lock:  # what to say is decided here, with the IDs said: two handshakes never both say one
            self.refused += 1
            first = spiffe_id not in self._said and len(self._said) <= SAID_UP_TO
            if first:
                self._said.add(spiffe_id)
            past_the_bound = first and len(self._said) > SAID_UP_TO
        if past_the_bound:
            log.info("%s refused more peers than the %d named so far: they are counted only", where, SAID_UP_TO)
        elif first:
            log.info("%s refused a TLS handshake: %s (said once per peer ID; counted)", where, reason)
        for callback in self._on_refused:
            try:
                callback()
            except Exception:
                log.exception("a callback on a refused peer failed")

    def __repr__(self) -> str:
        return f"Authorizer({self.description})"


def authorize_any() -> Authorizer:
    """Any peer with a SPIFFE ID whose certificate verified against the trust bundle (go-spiffe's ``AuthorizeAny``).

    Example: ``authorize_any().allows("spiffe://example.org/anything")`` is ``True``.
    """
    return Authorizer(lambda spiffe_id: True, "any SPIFFE ID")


def authorize_id(spiffe_id: str) -> Authorizer:
    """Exactly one peer ID (``AuthorizeID``).

    Raises:
        ValueError: ``spiffe_id`` is not a workload's SPIFFE ID.

    Example: ``authorize_id("spiffe://example.org/web")``.
    """
    return authorize_one_of(spiffe_id)


def authorize_one_of(*spiffe_ids: str | Iterable[str]) -> Authorizer:
    """Any of these peer IDs (``AuthorizeOneOf``): given one by one, or as one iterable.

    Raises:
        ValueError: none given, or one is not a workload's SPIFFE ID.

    Example: ``authorize_one_of("spiffe://example.org/web", "spiffe://example.org/batch")``.
    """
    flat = [one for given in spiffe_ids for one in ([given] if isinstance(given, str) else given)]
    if not flat:
        raise ValueError("authorize_one_of needs at least one SPIFFE ID")
    accepted = frozenset(parse_spiffe_id(one) for one in flat)
    return Authorizer(accepted.__contains__, " or ".join(sorted(accepted)))


def authorize_member_of(trust_domain: str) -> Authorizer:
    """Any peer of one trust domain (``AuthorizeMemberOf``): ``example.org`` or ``spiffe://example.org``.

    Raises:
        ValueError: not a trust domain.

    Example: ``authorize_member_of("example.org").allows("spiffe://example.org/web")`` is ``True``.
    """
    domain = trust_domain_of(trust_domain)
    return Authorizer(lambda spiffe_id: trust_domain_of(spiffe_id) == domain, f"members of {domain}")


def adapt_matcher(matcher: Callable[[str], bool], description: str | None = None) -> Authorizer:
    """A peer ID accepted when ``matcher(spiffe_id)`` is true (``AdaptMatcher``); it runs in every handshake, in the
    thread making it (an event loop's included): keep it quick, with no I/O. An exception from it refuses the peer.

    Example: ``adapt_matcher(lambda spiffe_id: spiffe_id.startswith("spiffe://example.org/ns/prod/"))``.
    """
    return Authorizer(matcher, description or str(getattr(matcher, "__qualname__", "a matcher")))


def _union(authorizers: list[Authorizer]) -> Authorizer:
    if len(authorizers) == 1:
        return authorizers[0]
    return Authorizer(
        lambda spiffe_id: any(one.allows(spiffe_id) for one in authorizers),
        " or ".join(one.description for one in authorizers),
    )


def parse_authorizer(value: str) -> Authorizer:
    """The authorizer a command-line option, configuration key or ``$TLSRELOAD_SPIFFE_AUTHORIZE`` names.

    ``any``; a SPIFFE ID (``spiffe://example.org/web``); a trust domain, all its members
    (``spiffe://example.org``); several of these separated by commas (any of them); or ``module:function``, a
    matcher imported as gunicorn imports an application (``function(spiffe_id) -> bool``).

    Raises:
        ValueError: none of these, naming the part that is not (a matcher that cannot be imported included).

    Example: ``parse_authorizer("spiffe://example.org/web,spiffe://partner.org")``.
    """
    text = value.strip()
    if text.lower() == "any":
        return authorize_any()
    if ":" in text and SCHEME not in text.lower():
        return adapt_matcher(_imported(text), text)
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError("no SPIFFE ID, trust domain, 'any' or module:function given")
    ids: list[str] = []
    made: list[Authorizer] = []
    for part in parts:
        if not part.lower().startswith(SCHEME):
            raise ValueError(
                f"{part!r} is not a SPIFFE ID or trust domain (spiffe://example.org[/path]), 'any' or module:function"
            )
        if "/" not in part[len(SCHEME) :].rstrip("/"):  # spiffe://example.org: the trust domain's members
            made.append(authorize_member_of(part.rstrip("/")))
        else:
            ids.append(part)
    if ids:
        made.insert(0, authorize_one_of(ids))
    return _union(made)


def _imported(reference: str) -> Callable[[str], bool]:
    module_name, _, name = reference.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in name.split("."):
            found = getattr(found, part)
    except Exception as e:
        raise ValueError(f"cannot import the SPIFFE ID matcher {reference!r}: {e}") from None
    if not callable(found):
        raise ValueError(f"the SPIFFE ID matcher {reference!r} is not callable")
    return found  # type: ignore[no-any-return]


def resolve_authorizer(authorize: Authorizer | Callable[[str], bool] | str | None) -> Authorizer | None:
    """Who may be on the other end: ``authorize`` if given (an :class:`Authorizer`, a matcher, or the syntax of
    :func:`parse_authorizer`), else ``$TLSRELOAD_SPIFFE_AUTHORIZE``, else nobody is checked (``None``).

    Raises:
        ValueError: a string (or the variable) that :func:`parse_authorizer` does not take; the variable is named.

    Example: ``resolve_authorizer("spiffe://example.org")`` accepts the members of example.org.
    """
    if isinstance(authorize, Authorizer):
        return authorize
    if callable(authorize):
        return adapt_matcher(authorize)
    if authorize is not None and authorize.strip():
        return parse_authorizer(authorize)
    value = os.environ.get(AUTHORIZE_ENV, "").strip()
    if not value:
        return None
    try:
        return parse_authorizer(value)
    except ValueError as e:
        raise ValueError(f"${AUTHORIZE_ENV}: {e}") from None
