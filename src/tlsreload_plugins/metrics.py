"""Prometheus metrics for a :class:`~tlsreload_plugins.reloader.Reloader` (the ``prometheus`` extra).

Off unless asked for: the adapters export metrics only with ``TLSRELOAD_METRICS=1`` (or their own
setting: ``tls_metrics = True`` in a gunicorn configuration, ``--tls-metrics`` on the drop-in
commands, ``metrics=True`` in the Python APIs), so that a server that scrapes nothing does not
import ``prometheus_client`` (about 13 MiB per worker process) at all.

:func:`observe` registers callbacks on a reloader that keep these up to date, each labelled with
``certfile`` (the certificate path as configured) and ``identity`` (``default`` for the configured
identity, an SNI identity's name for that identity, see :mod:`tlsreload_plugins.sni`):

* ``tlsreload_checks_total``: checks made;
* ``tlsreload_reload_attempts_total``: checks that found new content on disk and tried to use it
  (a rotation caught between writing the certificate and the key, or bad content confirmed on
  the next check, takes one attempt per check);
* ``tlsreload_reload_successes_total``: reloads, i.e. new certificates being served;
* ``tlsreload_reload_failures_total``: failures reported (one per distinct bad content);
* ``tlsreload_certificate_not_after_timestamp_seconds``: when the served certificate expires;
* ``tlsreload_last_success_timestamp_seconds``: when a check last found a usable identity on disk.

Under gunicorn (several worker processes) set ``PROMETHEUS_MULTIPROC_DIR`` as prometheus_client
documents: counters are then summed over all workers, dead ones included, and both gauges report
the minimum over live workers (``livemin``): the oldest certificate still served anywhere and the
worker that has gone longest without a good check, which is what an alert needs to see. A worker
that exits must be marked dead (``prometheus_client.multiprocess.mark_process_dead`` in gunicorn's
``child_exit`` hook), or its last gauge values linger.

Without ``prometheus_client`` installed, :func:`observe` does nothing and returns ``False``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .identity import Leaf, ReloadError
from .reloader import Outcome, Reloader, Status

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("tlsreload_plugins.metrics")

LABELS = ("certfile", "identity")
DEFAULT_IDENTITY = "default"
"""The ``identity`` label of the configured identity (SNI identities are labelled with their names)."""
GAUGE_MULTIPROCESS_MODE: Final = "livemin"

METRICS_ENV = "TLSRELOAD_METRICS"
"""``1`` (or ``true``, ``yes``, ``on``) for the adapters to export metrics; unset or ``0`` for none."""
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def wanted(setting: bool | None = None) -> bool:
    """Whether the adapters export metrics: ``setting`` if given, else ``$TLSRELOAD_METRICS``, else not.

    Raises:
        ValueError: ``$TLSRELOAD_METRICS`` is neither true-like nor false-like.
    """
    if setting is not None:
        return bool(setting)
    value = os.environ.get(METRICS_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{METRICS_ENV} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


@dataclass(frozen=True)
class _Families:
    checks: Counter
    attempts: Counter
    successes: Counter
    failures: Counter
    not_after: Gauge
    last_success: Gauge


_lock = threading.RLock()
_families: dict[int, tuple[object, _Families]] = {}
_observed: weakref.WeakSet[Reloader] = weakref.WeakSet()


def _create(registry: CollectorRegistry | None) -> _Families:
    from prometheus_client import REGISTRY, Counter, Gauge

    target = REGISTRY if registry is None else registry
    labels = LABELS
    return _Families(
        checks=Counter("tlsreload_checks", "Certificate checks made.", labels, registry=target),
        attempts=Counter(
            "tlsreload_reload_attempts",
            "Checks that found new certificate content on disk and tried to use it.",
            labels,
            registry=target,
        ),
        successes=Counter(
            "tlsreload_reload_successes", "Reloads: a new certificate is being served.", labels, registry=target
        ),
        failures=Counter(
            "tlsreload_reload_failures",
            "Reload failures reported (one per distinct unusable content); the last good certificate keeps serving.",
            labels,
            registry=target,
        ),
        not_after=Gauge(
            "tlsreload_certificate_not_after_timestamp_seconds",
            "Expiry (not-after) of the served certificate, as a Unix timestamp.",
            labels,
            registry=target,
            multiprocess_mode=GAUGE_MULTIPROCESS_MODE,
        ),
        last_success=Gauge(
            "tlsreload_last_success_timestamp_seconds",
            "Unix time of the last check that found a usable certificate and key on disk.",
            labels,
            registry=target,
            multiprocess_mode=GAUGE_MULTIPROCESS_MODE,
        ),
    )


def _families_for(registry: CollectorRegistry | None) -> _Families:
    # Metric families are created once per registry: prometheus_client refuses duplicates.
    with _lock:
        entry = _families.get(id(registry))
        if entry is None:
            entry = (registry, _create(registry))
            _families[id(registry)] = entry
        return entry[1]


def observing(reloader: Reloader) -> bool:
    """Whether :func:`observe` exports ``reloader``'s metrics."""
    with _lock:
        return reloader in _observed


def observe(reloader: Reloader, registry: CollectorRegistry | None = None, *, identity: str = DEFAULT_IDENTITY) -> bool:
    """Export ``reloader``'s activity as Prometheus metrics; ``False`` (and nothing done) without prometheus_client.

    ``registry`` defaults to prometheus_client's global ``REGISTRY`` (in multiprocess mode the
    values go to ``PROMETHEUS_MULTIPROC_DIR`` whatever the registry). Observing the same reloader
    again changes nothing. Metrics that cannot be set up (a ``PROMETHEUS_MULTIPROC_DIR`` that does
    not exist, say) are logged as one WARNING and give ``False``: they never stop the server.
    ``identity`` is the ``identity`` label (an SNI identity's name).
    """
    try:
        import prometheus_client  # noqa: F401 - only to learn whether it is installed
    except ImportError:
        log.debug("prometheus_client is not installed; no metrics for %s", reloader.files.certfile)
        return False
    with _lock:
        if reloader in _observed:
            return True
        _observed.add(reloader)
    certfile = reloader.files.certfile
    try:
        families = _families_for(registry)
        checks = families.checks.labels(certfile, identity)
        attempts = families.attempts.labels(certfile, identity)
        successes = families.successes.labels(certfile, identity)
        failures = families.failures.labels(certfile, identity)
        not_after = families.not_after.labels(certfile, identity)
        last_success = families.last_success.labels(certfile, identity)
        status = reloader.status()
        failures.inc(status.failures)  # reported before metrics were set up (a start on the last good identity)
        attempts.inc(status.failures)
        not_after.set(status.leaf.not_after.timestamp())
        last_success.set(status.last_success)
    except Exception as e:  # e.g. PROMETHEUS_MULTIPROC_DIR missing: metrics must never stop TLS serving
        log.warning("Prometheus metrics for %s are off: %s: %s", certfile, type(e).__name__, e)
        with _lock:
            _observed.discard(reloader)
        return False

    def on_reload(old: Leaf, new: Leaf) -> None:
        attempts.inc()
        successes.inc()

    def on_failure(error: ReloadError) -> None:
        attempts.inc()
        failures.inc()

    def on_check(outcome: Outcome, status: Status) -> None:
        checks.inc()
        if outcome is Outcome.PENDING:
            attempts.inc()
        not_after.set(status.leaf.not_after.timestamp())
        last_success.set(status.last_success)

    reloader.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
    return True
