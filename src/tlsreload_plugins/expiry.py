"""When the served (or presented) identity's expiry is said, and in what words: :func:`expiry_notice` decides,
:func:`warn_expiry` says it.

Identities live months (files renewed by certbot), days (6-day public certificates) or an hour (SPIFFE SVIDs), so
the warning window is a share of the identity's own lifetime unless a number of days is set: the last sixth, half of
the last third in which cert-manager (at two thirds of the lifetime) and certbot (30 of 90 days) renew, at most
:data:`~tlsreload_plugins.settings.DEFAULT_EXPIRY_WARNING_DAYS`. "Expires in" is said once a day per certificate;
"EXPIRED" is said, at ERROR, at the first check after the end, whatever was said before, and again while it is still
served (an interval later, then at doubling gaps up to an hour): it is never silenced by an earlier warning. The
words use the scale of what is left (seconds, minutes, hours, days) and say where the next identity should come
from: the Workload API for an SVID, else the files' directory.
"""

from __future__ import annotations

import logging
import os

from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.settings import DEFAULT_EXPIRY_WARNING_DAYS

__all__ = ["EXPIRY_SHARE", "ExpiryNotice", "duration", "expiry_notice", "warn_expiry", "warning_seconds"]

EXPIRY_SHARE = 1 / 6
"""Unless a number of days is set, warn when less than this share of the identity's lifetime is left."""

REPEAT_EXPIRED_AT_MOST = 3600.0
"""The longest gap between two EXPIRED lines about an identity still served."""

WARN_AGAIN_AFTER = 86400.0
"""Seconds between two "expires in" lines about the same certificate."""

SPIFFE_DIRECTORY = "/tlsreload-spiffe-"
"""How the directory a SPIFFE source writes its SVIDs into begins (its private directory's kind,
:data:`~tlsreload_plugins.sources.spiffe.SPIFFE_KIND`)."""


class ExpiryNotice(FrozenRecord):
    """The last thing said about one certificate's expiry: when, about which serial, whether it had expired, and
    how long to wait before saying EXPIRED again."""

    _fields = ("serial", "said_at", "expired", "repeat_after")
    __slots__ = _fields
    serial: str
    said_at: float
    expired: bool
    repeat_after: float

    def __init__(self, serial: str, said_at: float, expired: bool, repeat_after: float) -> None:
        self._set(serial, said_at, expired, repeat_after)


def warning_seconds(leaf: Leaf, warning_days: float | None) -> float:
    """How long before ``leaf``'s end to warn: ``warning_days`` when set, else :data:`EXPIRY_SHARE` of its lifetime,
    at most :data:`~tlsreload_plugins.settings.DEFAULT_EXPIRY_WARNING_DAYS`.

    Example: an SVID of an hour, 600 seconds; a 90-day certificate, 14 days.
    """
    if warning_days is not None:
        return warning_days * 86400
    lifetime = max((leaf.not_after - leaf.not_before).total_seconds(), 0.0)
    return min(lifetime * EXPIRY_SHARE, DEFAULT_EXPIRY_WARNING_DAYS * 86400)


def duration(seconds: float) -> str:
    """``seconds`` in the unit of its scale: ``45 s``, ``9 min``, ``5.2 hours``, ``3.1 days``."""
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def expiry_notice(
    leaf: Leaf, now: float, warning_days: float | None, last: ExpiryNotice | None, interval: float
) -> tuple[ExpiryNotice | None, bool]:
    """Whether to say something about ``leaf``'s expiry at ``now``, given what was said last (plain decision).

    Args:
        leaf: the certificate served (presented).
        now: the wall clock.
        warning_days: the window set by the user, else ``None`` (:func:`warning_seconds`).
        last: what was said last (about any certificate: one about another serial counts for nothing).
        interval: seconds between checks: an expired certificate still served is said again after one.

    Returns:
        What is said by now, and whether it is to be said at this check.
    """
    last = last if last is not None and last.serial == leaf.serial else None
    left = leaf.not_after.timestamp() - now
    if left > 0:
        if left > warning_seconds(leaf, warning_days):
            return last, False
        if last is not None and now - last.said_at < WARN_AGAIN_AFTER:
            return last, False
        return ExpiryNotice(leaf.serial, now, False, 0.0), True
    if last is not None and last.expired:
        if now - last.said_at < last.repeat_after:
            return last, False
        return ExpiryNotice(leaf.serial, now, True, min(last.repeat_after * 2, REPEAT_EXPIRED_AT_MOST)), True
    return ExpiryNotice(leaf.serial, now, True, max(interval, 1e-3)), True


def _origin(files: TLSFiles) -> str:
    """Where the next identity should come from, in words."""
    if SPIFFE_DIRECTORY in files.certfile:
        return "no newer SVID has come from the Workload API"
    return f"no newer valid one is in {os.path.dirname(files.certfile) or '.'} yet"


def warn_expiry(
    log: logging.Logger,
    leaf: Leaf,
    files: TLSFiles,
    now: float,
    warning_days: float | None,
    last: ExpiryNotice | None,
    *,
    interval: float,
    what: str = "the served certificate",
) -> ExpiryNotice | None:
    """Say on ``log`` what :func:`expiry_notice` decides: that ``leaf`` expires soon (WARNING), or has expired
    (ERROR: handshakes with it fail).

    Args:
        log: the reloader's (or client identity's) logger.
        leaf: the certificate served or presented.
        files: where it comes from (named in the line).
        now, warning_days, last, interval: as :func:`expiry_notice` takes them.
        what: what ``leaf`` is, in words ("the served certificate", "the client certificate presented").

    Returns:
        What is said by now (to hand back as ``last`` next time).

    Example: ``self._expiry = warn_expiry(log, leaf, files, now, None, self._expiry, interval=1.0)``.
    """
    notice, say = expiry_notice(leaf, now, warning_days, last, interval)
    if not say or notice is None:
        return notice
    left = leaf.not_after.timestamp() - now
    if notice.expired:
        log.error(
            "%s EXPIRED %s ago (at %s) and %s: peers refuse it in every handshake: %s",
            what,
            duration(left),
            leaf.not_after.isoformat(),
            _origin(files),
            leaf.describe(),
        )
    else:
        log.warning(
            "%s expires in %s (at %s) and %s: %s",
            what,
            duration(left),
            leaf.not_after.isoformat(),
            _origin(files),
            leaf.describe(),
        )
    return notice
