"""A reloader's settings: the check interval, the expiry warning, the key password and the CRL file, and a server's
metrics and SNI directories, each given as an argument, else read from its environment variable, else its default.

:class:`~tlsreload_plugins.reloader.Reloader` resolves its settings here, and so do the adapters,
so that every server reads the same variables the same way. Reading a setting imports nothing it turns on: a
worker learns here that it has no SNI identities and exports no metrics without importing either machinery.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tlsreload_plugins.files import Password, password_file

DEFAULT_INTERVAL = 1.0
"""Seconds between checks. An unchanged check reads two small files and hashes them (its cost is in
docs/benchmarks.md), so checking every second costs next to nothing and a rotation is served within
about a second."""

DEFAULT_EXPIRY_WARNING_DAYS = 14.0
"""The longest expiry warning window when none is set: the window is the last sixth of a certificate's lifetime
(:func:`tlsreload_plugins.expiry.warning_seconds`), at most this many days. cert-manager renews at two thirds of the
lifetime and certbot 30 days ahead: a certificate this close to expiry means renewal is not reaching the server."""

MIN_INTERVAL = 0.1
"""The shortest check interval accepted: below it a worker would spend its time reading files."""

INTERVAL_ENV = "TLSRELOAD_INTERVAL"
EXPIRY_WARNING_ENV = "TLSRELOAD_EXPIRY_WARNING_DAYS"
PASSWORD_FILE_ENV = "TLSRELOAD_KEY_PASSWORD_FILE"
CRL_ENV = "TLSRELOAD_CRL"
METRICS_ENV = "TLSRELOAD_METRICS"
"""``1`` (or ``true``, ``yes``, ``on``) for the adapters to export metrics; unset or ``0`` for none;
``per-identity`` for metrics with every SNI identity's own series, however many there are."""
SNI_ENV = "TLSRELOAD_SNI"
"""Directories of SNI identities, separated by ``os.pathsep`` (``:`` on Unix)."""

PER_IDENTITY = "per-identity"
"""``TLSRELOAD_METRICS=per-identity``: metrics on, with every SNI identity's own series however many there are."""

_TRUE = frozenset({"1", "true", "yes", "on", PER_IDENTITY})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _number(value: str | float, name: str, unit: str, *, minimum: float = 0.0) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of {unit}, got {value!r}") from None
    if not number >= minimum or number == float("inf"):  # NaN fails the comparison
        raise ValueError(f"{name} must be a number of {unit} >= {minimum:g}, got {value!r}")
    return number


def resolve_interval(interval: float | None = None) -> float:
    """The check interval: ``interval`` if given, else ``$TLSRELOAD_INTERVAL``, else 1 second.

    Raises:
        ValueError: the interval is not a number of seconds >= :data:`MIN_INTERVAL`.
    """
    if interval is not None:
        return _number(interval, "interval", "seconds", minimum=MIN_INTERVAL)
    env = os.environ.get(INTERVAL_ENV)
    if env:
        return _number(env, INTERVAL_ENV, "seconds", minimum=MIN_INTERVAL)
    return DEFAULT_INTERVAL


def resolve_password(password: Password = None) -> Password:
    """The key password: ``password`` if given, else the first line of ``$TLSRELOAD_KEY_PASSWORD_FILE``
    (read again on every reload, as nginx's ``ssl_password_file``), else ``None``."""
    if password is not None:
        return password
    path = os.environ.get(PASSWORD_FILE_ENV)
    return password_file(path) if path else None


def resolve_expiry_warning_days(days: float | None = None) -> float | None:
    """Days before expiry to warn: ``days`` if given, else ``$TLSRELOAD_EXPIRY_WARNING_DAYS``, else ``None``: the
    last sixth of each certificate's lifetime, at most :data:`DEFAULT_EXPIRY_WARNING_DAYS`
    (:func:`tlsreload_plugins.expiry.warning_seconds`)."""
    if days is not None:
        return _number(days, "expiry_warning_days", "days")
    env = os.environ.get(EXPIRY_WARNING_ENV)
    if env:
        return _number(env, EXPIRY_WARNING_ENV, "days")
    return None


def resolve_crl(crl: str | None = None) -> str | None:
    """The CRL file (PEM, one or more CRLs for the CAs of the client-CA bundle): ``crl`` if given, else
    ``$TLSRELOAD_CRL``, else ``None`` (no revocation checked)."""
    return crl or os.environ.get(CRL_ENV) or None


SPIFFE_ENV = "TLSRELOAD_SPIFFE"

_OFF = ("", "0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def resolve_spiffe(spiffe: str | bool | None = None) -> str | None:
    """Whether a server's identity comes from SPIFFE's Workload API, and from where: ``spiffe`` if given (``True``
    or ``""``: ``$SPIFFE_ENDPOINT_SOCKET``'s agent; a string: the agent's address; ``False``: not), else
    ``$TLSRELOAD_SPIFFE`` (``1``, or the address), else not.

    Returns:
        ``None``: files, not SPIFFE; ``""``: the address in ``$SPIFFE_ENDPOINT_SOCKET``; else the address.

    Example: ``resolve_spiffe(None)`` is ``""`` when ``TLSRELOAD_SPIFFE=1``.
    """
    if spiffe is True:
        return ""
    if spiffe is False:
        return None
    if spiffe is not None:
        return spiffe
    value = os.environ.get(SPIFFE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    return "" if value.lower() in _ON else value


def resolve_metrics(setting: bool | None = None) -> bool:
    """Whether a server exports metrics: ``setting`` if given, else ``$TLSRELOAD_METRICS``, else not.

    Raises:
        ValueError: ``$TLSRELOAD_METRICS`` is neither true-like nor false-like.

    Example: ``if resolve_metrics(settings.metrics): metrics.observe(reloader)``.
    """
    if setting is not None:
        return bool(setting)
    value = os.environ.get(METRICS_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{METRICS_ENV} must be 1 or 0 (true/false, yes/no, on/off), or {PER_IDENTITY}, got {value!r}")


def resolve_sni_directories(directories: Iterable[str] | str | None = None) -> list[str]:
    """The SNI directories: ``directories`` if given (a sequence, or one ``os.pathsep``-separated
    string), else ``$TLSRELOAD_SNI``, else none. Empty entries are dropped.

    Raises:
        ValueError: a directory does not exist or is not a directory.

    Example: ``resolve_sni_directories("/etc/tls/a:/etc/tls/b")`` is ``["/etc/tls/a", "/etc/tls/b"]``.
    """
    if directories is None:
        directories = os.environ.get(SNI_ENV, "")
    if isinstance(directories, str):
        directories = directories.split(os.pathsep)
    found = [str(d) for d in directories if str(d)]
    for directory in found:
        if not os.path.isdir(directory):
            raise ValueError(f"SNI directory {directory} does not exist or is not a directory")
    return found
