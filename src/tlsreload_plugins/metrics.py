"""Prometheus metrics for a :class:`~tlsreload_plugins.reloader.Reloader` (the ``prometheus`` extra).

Off unless asked for: the adapters export metrics only with ``TLSRELOAD_METRICS=1`` (or their own
setting: ``tls_metrics = True`` in a gunicorn configuration, ``--tls-metrics`` on the drop-in
commands, ``metrics=True`` in the Python APIs), so that a server that scrapes nothing does not
import ``prometheus_client`` at all.

:func:`observe` registers callbacks on a reloader that keep these up to date, each labelled with
``certfile`` (the certificate path as configured) and ``identity`` (``default`` for the configured
identity, an SNI identity's name for that identity, see :mod:`tlsreload_plugins.sni.identities`):

* ``tlsreload_checks_total``: checks made;
* ``tlsreload_reload_attempts_total``: checks that found new content on disk and tried to use it
  (a rotation caught between writing the certificate and the key, or bad content confirmed on
  the next check, takes one attempt per check);
* ``tlsreload_reload_successes_total``: reloads, i.e. new certificates being served;
* ``tlsreload_reload_failures_total``: failures reported (one per distinct bad content);
* ``tlsreload_refused_resumptions_total``: TLS sessions refused because they were resumed across a change of the
  client-CA bundle or its CRLs (:attr:`~tlsreload_plugins.outcome.Status.refused_resumptions`), counted at checks;
* ``tlsreload_certificate_not_after_timestamp_seconds``: when the served certificate expires;
* ``tlsreload_last_success_timestamp_seconds``: when a check last found a usable identity on disk;
* ``tlsreload_crl_next_update_timestamp_seconds``: with a CRL file configured, the earliest ``nextUpdate`` of the
  CRLs served (past it, OpenSSL refuses every client certificate); a CRL refused counts as a reload failure.

SNI identities (:mod:`tlsreload_plugins.sni.identities`) have these series each when a server has at most
:data:`PER_IDENTITY_UP_TO` of them, or with ``TLSRELOAD_METRICS=per-identity``; beyond, the aggregates of
:func:`report_sni` only: ``tlsreload_sni_identities{state}`` and
``tlsreload_sni_soonest_not_after_timestamp_seconds{identity}``.

Under gunicorn (several worker processes) set ``PROMETHEUS_MULTIPROC_DIR`` as prometheus_client
documents: counters are summed over all workers and the gauges report the minimum over live workers
(``livemin``); docs/metrics.md says how to mark exited workers dead.

Without ``prometheus_client`` installed, :func:`observe` does nothing and returns ``False``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from tlsreload_plugins.errors import ReloadError
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.settings import METRICS_ENV, PER_IDENTITY, resolve_metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from tlsreload_plugins.sni.summary import Summary

log = logging.getLogger("tlsreload_plugins.metrics")

LABELS = ("certfile", "identity")
DEFAULT_IDENTITY = "default"
"""The ``identity`` label of the configured identity (SNI identities are labelled with their names)."""
GAUGE_MULTIPROCESS_MODE: Final = "livemin"

PER_IDENTITY_UP_TO = 100
"""SNI identities get their own series (labelled ``identity``) when a server has at most this many, or
with ``TLSRELOAD_METRICS=per-identity``; beyond, the aggregates of :func:`report_sni` only (six series
per identity, 10,000 identities: 60,000 series in every worker)."""


wanted = resolve_metrics
"""Whether the adapters export metrics: :func:`~tlsreload_plugins.settings.resolve_metrics` (read where no metrics
are imported)."""


def per_identity() -> bool:
    """Whether ``$TLSRELOAD_METRICS`` asks for every SNI identity's own series (``per-identity``)."""
    return os.environ.get(METRICS_ENV, "").strip().lower() == PER_IDENTITY


_sni_families: dict[int, tuple[object, Gauge, Gauge]] = {}
_sni_soonest: dict[int, str] = {}  # the identity the soonest-expiry series was last set for, by registry


def report_sni(summary: Summary, registry: CollectorRegistry | None = None) -> None:
    """Export a server's SNI identities in aggregate: ``tlsreload_sni_identities{state="valid"|"refused"}``
    and ``tlsreload_sni_soonest_not_after_timestamp_seconds{identity=...}`` (the served certificate that
    expires first). Does nothing without prometheus_client; never raises."""
    try:
        from prometheus_client import REGISTRY, Gauge
    except ImportError:
        return
    try:
        with _lock:
            entry = _sni_families.get(id(registry))
            if entry is None:
                target = REGISTRY if registry is None else registry
                count = Gauge(
                    "tlsreload_sni_identities",
                    "SNI identities found, by state: valid (served) or refused (their names get the default identity).",
                    ("state",),
                    registry=target,
                    multiprocess_mode="livemax",
                )
                soonest = Gauge(
                    "tlsreload_sni_soonest_not_after_timestamp_seconds",
                    "Expiry (not-after) of the served SNI certificate that expires first, as a Unix timestamp.",
                    ("identity",),
                    registry=target,
                    multiprocess_mode=GAUGE_MULTIPROCESS_MODE,
                )
                entry = (registry, count, soonest)
                _sni_families[id(registry)] = entry
            _, count, soonest = entry
            count.labels("valid").set(summary.valid)
            count.labels("refused").set(len(summary.refused))
            before = _sni_soonest.get(id(registry))
            now = summary.soonest[0] if summary.soonest is not None else None
            if before is not None and before != now and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
                soonest.remove(before)  # (not possible across processes: there the old series keeps its value)
            if summary.soonest is not None:
                soonest.labels(summary.soonest[0]).set(summary.soonest[1].timestamp())
                _sni_soonest[id(registry)] = summary.soonest[0]
    except Exception as e:  # metrics must never stop TLS serving
        log.warning("Prometheus metrics of the SNI identities are off: %s: %s", type(e).__name__, e)


@dataclass(frozen=True)
class _Families:
    checks: Counter
    attempts: Counter
    successes: Counter
    failures: Counter
    refused_resumptions: Counter
    not_after: Gauge
    last_success: Gauge
    crl_next_update: Gauge


_lock = threading.RLock()
_families: dict[int, tuple[object, _Families]] = {}


class Observed(Protocol):
    """What :func:`observe` exports: a server's :class:`~tlsreload_plugins.reloader.Reloader` or a client's
    :class:`~tlsreload_plugins.client.identity.ClientIdentity` (their checks, reloads and failures mean the same)."""

    @property
    def files(self) -> TLSFiles: ...

    def status(self) -> Status: ...

    def add_callbacks(
        self,
        *,
        on_reload: Callable[[Leaf, Leaf], object] | None = None,
        on_failure: Callable[[ReloadError], object] | None = None,
        on_check: Callable[[Outcome, Status], object] | None = None,
    ) -> None: ...


_observed: weakref.WeakSet[Observed] = weakref.WeakSet()


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
        refused_resumptions=Counter(
            "tlsreload_refused_resumptions",
            "TLS sessions refused because they were resumed across a change of the client-CA bundle or its CRLs.",
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
        crl_next_update=Gauge(
            "tlsreload_crl_next_update_timestamp_seconds",
            "The earliest nextUpdate of the served CRLs, as a Unix timestamp: past it, every client certificate is "
            "refused.",
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


def observing(reloader: Observed) -> bool:
    """Whether :func:`observe` exports ``reloader``'s metrics."""
    with _lock:
        return reloader in _observed


def observe(reloader: Observed, registry: CollectorRegistry | None = None, *, identity: str = DEFAULT_IDENTITY) -> bool:
    """Export ``reloader``'s activity (a server's reloader or a client's identity) as Prometheus metrics; ``False``
    (and nothing done) without prometheus_client.

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
        refused_resumptions = families.refused_resumptions.labels(certfile, identity)
        not_after = families.not_after.labels(certfile, identity)
        last_success = families.last_success.labels(certfile, identity)
        # Only for a reloader serving CRLs: a server without them shows no series.
        crl_next_update = families.crl_next_update.labels(certfile, identity) if reloader.files.crl else None
        status = reloader.status()
        failures.inc(status.failures)  # reported before metrics were set up (a start on the last good identity)
        attempts.inc(status.failures)
        refused = status.refused_resumptions  # counted so far: each check adds those since
        refused_resumptions.inc(refused)
        not_after.set(status.leaf.not_after.timestamp())
        last_success.set(status.last_success)
        _set_next_update(crl_next_update, status.leaf)
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
        nonlocal refused
        checks.inc()
        if outcome is Outcome.PENDING:
            attempts.inc()
        not_after.set(status.leaf.not_after.timestamp())
        last_success.set(status.last_success)
        _set_next_update(crl_next_update, status.leaf)
        if status.refused_resumptions > refused:
            refused_resumptions.inc(status.refused_resumptions - refused)
            refused = status.refused_resumptions

    reloader.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
    return True


def _set_next_update(gauge: Gauge | None, leaf: Leaf) -> None:
    """Set ``gauge`` to the served CRLs' earliest ``nextUpdate`` (``+Inf`` when none has one)."""
    revocation = leaf.revocation
    if gauge is not None and revocation is not None:
        gauge.set(revocation.next_update.timestamp() if revocation.next_update is not None else float("inf"))
