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

A reloader serving the files of a SPIFFE source (:class:`~tlsreload_plugins.sources.spiffe.SpiffeSource`, its
directory ``tlsreload-spiffe-...``) also exports the source's stream, labelled ``endpoint`` (the Workload API's
address). The source runs in one process (gunicorn's arbiter, uvicorn's supervisor) and writes its figures beside
its files (:mod:`tlsreload_plugins.sources.stream_status`); each worker's checks read them (on the checking thread,
never on an event loop; a file missing or malformed changes nothing), so the workers serve them:

* ``tlsreload_spiffe_connected``: 1 while the Workload API stream is open, else 0;
* ``tlsreload_spiffe_stream_drops``: times the stream went away after it had been open;
* ``tlsreload_spiffe_stream_reconnects``: times it was open again after a drop;
* ``tlsreload_spiffe_refused_messages``: messages not written (malformed, no SVID, none with the SPIFFE ID asked
  for, files not written);
* ``tlsreload_spiffe_svid_updates``: updates written into the files (rotations, bundle changes);
* ``tlsreload_spiffe_svid_not_after_timestamp_seconds``: when the SVID last written expires.

They are gauges, not counters: every worker reports the same source's figures, which a sum would multiply.

Under gunicorn (several worker processes) set ``PROMETHEUS_MULTIPROC_DIR`` as prometheus_client
documents: counters are summed over all workers and the gauges report the minimum over live workers
(``livemin``), the SPIFFE stream's the maximum (``livemax``: the figures of the worker that read them last, as
they only rise; ``connected`` is 1 while one live worker last read it so, an interval at most after a drop);
docs/metrics.md says how to mark exited workers dead.

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

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.errors import ReloadError
from tlsreload_plugins.expiry import SPIFFE_DIRECTORY
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.settings import METRICS_ENV, PER_IDENTITY, resolve_metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from tlsreload_plugins.sni.summary import Summary
    from tlsreload_plugins.sources.stream_status import StreamFigures

log: logging.Logger = logging.getLogger("tlsreload_plugins.metrics")

LABELS = ("certfile", "identity")
DEFAULT_IDENTITY = "default"
"""The ``identity`` label of the configured identity (SNI identities are labelled with their names)."""
GAUGE_MULTIPROCESS_MODE: Final = "livemin"
STREAM_MULTIPROCESS_MODE: Final = "livemax"
"""How the SPIFFE stream's gauges are aggregated over a gunicorn's workers (``PROMETHEUS_MULTIPROC_DIR``): every
worker reports the same source's figures, the freshest the largest."""
STREAM_LABELS = ("endpoint",)

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
    reader_up: Gauge


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
        reader_up=Gauge(
            "tlsreload_reader_up",
            "1 while the server's one reader of the files runs, 0 once it has gone (nothing new is served until it is "
            "started again); only for servers with a reader.",
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
        # Only for a serving process of a server with a reader: whether the reader is still there.
        subscription = getattr(reloader, "subscription", None)
        reader_up = families.reader_up.labels(certfile, identity) if subscription is not None else None
        if reader_up is not None:
            reader_up.set(1)
        # A SPIFFE source's stream: read at the checks only (this may run on an event loop), the first one sets it.
        stream = _stream_for(certfile, registry)
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
        if stream is not None:
            stream.update()
        if reader_up is not None and subscription is not None:
            reader_up.set(0 if subscription.gone_reader else 1)

    reloader.add_callbacks(on_reload=on_reload, on_failure=on_failure, on_check=on_check)
    return True


_refused_peers: dict[int, tuple[object, Counter]] = {}
_authorizers_observed: weakref.WeakKeyDictionary[Authorizer, set[int]] = weakref.WeakKeyDictionary()


def observe_authorizer(authorizer: Authorizer, side: str, registry: CollectorRegistry | None = None) -> bool:
    """Count the handshakes ``authorizer`` refuses as ``tlsreload_unauthorized_peers_total{side}`` (``side``:
    ``server`` for the clients a server refused, ``client`` for the servers a client refused); ``False`` (and nothing
    done) without prometheus_client, or where metrics cannot be set up (one WARNING). Observing it again changes
    nothing. The count is made in the handshake's thread: one increment.

    Example: ``observe_authorizer(authorizer, "server")``.
    """
    try:
        from prometheus_client import REGISTRY, Counter
    except ImportError:
        return False
    try:
        with _lock:
            seen = _authorizers_observed.setdefault(authorizer, set())
            if id(registry) in seen:
                return True
            entry = _refused_peers.get(id(registry))
            if entry is None:
                family = Counter(
                    "tlsreload_unauthorized_peers",
                    "TLS handshakes refused because the peer's SPIFFE ID is not one its authorizer accepts.",
                    ("side",),
                    registry=REGISTRY if registry is None else registry,
                )
                entry = _refused_peers[id(registry)] = (registry, family)
            seen.add(id(registry))
        counter = entry[1].labels(side)
        counter.inc(authorizer.refused)  # refused before metrics were set up
        authorizer.on_refused(counter.inc)
    except Exception as e:  # e.g. PROMETHEUS_MULTIPROC_DIR missing: metrics must never stop TLS serving
        log.warning("Prometheus metrics of the SPIFFE authorizer are off: %s: %s", type(e).__name__, e)
        return False
    return True


@dataclass(frozen=True)
class _StreamFamilies:
    connected: Gauge
    drops: Gauge
    reconnects: Gauge
    refused: Gauge
    updates: Gauge
    not_after: Gauge


_stream_families: dict[int, tuple[object, _StreamFamilies]] = {}


def _stream_families_for(registry: CollectorRegistry | None) -> _StreamFamilies:
    """The SPIFFE stream's families, made once per registry and only where a SPIFFE source's files are served (a
    server without one shows none)."""
    from prometheus_client import REGISTRY, Gauge

    with _lock:
        entry = _stream_families.get(id(registry))
        if entry is None:
            target = REGISTRY if registry is None else registry

            def gauge(name: str, meaning: str) -> Gauge:
                return Gauge(name, meaning, STREAM_LABELS, registry=target, multiprocess_mode=STREAM_MULTIPROCESS_MODE)

            families = _StreamFamilies(
                connected=gauge("tlsreload_spiffe_connected", "1 while the Workload API stream is open, else 0."),
                drops=gauge(
                    "tlsreload_spiffe_stream_drops", "Times the Workload API stream went away after it was open."
                ),
                reconnects=gauge(
                    "tlsreload_spiffe_stream_reconnects", "Times the Workload API stream was open again after a drop."
                ),
                refused=gauge(
                    "tlsreload_spiffe_refused_messages",
                    "Messages of the Workload API not written: malformed, no SVID (with the SPIFFE ID asked for), or "
                    "the files could not be written.",
                ),
                updates=gauge("tlsreload_spiffe_svid_updates", "Updates of the Workload API written into the files."),
                not_after=gauge(
                    "tlsreload_spiffe_svid_not_after_timestamp_seconds",
                    "Expiry (not-after) of the SVID last written from the Workload API, as a Unix timestamp.",
                ),
            )
            entry = (registry, families)
            _stream_families[id(registry)] = entry
        return entry[1]


class _Stream:
    """The figures of the SPIFFE source whose files a reloader serves, as gauges: read again at each check."""

    __slots__ = ("families", "last", "path")

    def __init__(self, path: str, families: _StreamFamilies) -> None:
        self.path = path
        self.families = families
        self.last: StreamFigures | None = None

    def update(self) -> None:
        """Read the figures and set the gauges; figures missing or malformed change nothing (the last values stay).
        Called by the checks: on the checking thread, or under gevent from the hub, whence the read goes to its
        pool of native threads (a read on the hub stalls every connection of the worker)."""
        from tlsreload_plugins.sources.source_watch import figures_now
        from tlsreload_plugins.sources.stream_status import source_gone

        figures = figures_now(self.path)
        if figures is not None and source_gone(figures):  # its last figures say connected: it is not
            figures = figures._replace(connected=False)
        if figures is None or figures == self.last:
            return
        families, endpoint = self.families, figures.endpoint
        families.connected.labels(endpoint).set(1 if figures.connected else 0)
        families.drops.labels(endpoint).set(figures.drops)
        families.reconnects.labels(endpoint).set(figures.reconnects)
        families.refused.labels(endpoint).set(figures.refused)
        families.updates.labels(endpoint).set(figures.updates)
        if figures.not_after is not None:
            families.not_after.labels(endpoint).set(figures.not_after)
        self.last = figures


def _stream_for(certfile: str, registry: CollectorRegistry | None) -> _Stream | None:
    """The stream gauges of the SPIFFE source ``certfile`` is from; ``None`` for other files."""
    if SPIFFE_DIRECTORY not in certfile:
        return None
    from tlsreload_plugins.sources.stream_status import figures_path  # only where a SPIFFE source's files serve

    path = figures_path(certfile)
    return _Stream(path, _stream_families_for(registry)) if path is not None else None


def _set_next_update(gauge: Gauge | None, leaf: Leaf) -> None:
    """Set ``gauge`` to the served CRLs' earliest ``nextUpdate`` (``+Inf`` when none has one)."""
    revocation = leaf.revocation
    if gauge is not None and revocation is not None:
        gauge.set(revocation.next_update.timestamp() if revocation.next_update is not None else float("inf"))
