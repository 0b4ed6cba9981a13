"""The SNI identities of one server: several certificates, chosen by the server name a client asks for.

Besides its default identity (the usual certfile and keyfile), a server serves the identities found in
directories (``$TLSRELOAD_SNI``, ``--tls-sni DIR``, ``tls_sni``; :mod:`tlsreload_plugins.sni.discovery`), each
by its own :class:`~tlsreload_plugins.Reloader` built with the server's own recipe aimed at that identity's
files, so every guarantee of the single identity holds for each of them: validated before use, the last good
one kept serving, no failed handshake during its rotation, no effect on the others. (A server with a reader runs
them in the reader only, and its workers look the identities up in its publication:
:mod:`tlsreload_plugins.publication`.) Their names
(stable labels in logs, :meth:`SNIIdentities.status` and metrics) are those of their directories.

Every check of the default reloader (its driver's tick) checks the identities the change tracker names
(:mod:`tlsreload_plugins.sni.tracker`: those the kernel saw change, and a slice of the others): identities
added are served once their files are valid, identities removed (gone on two looks in a row) stop being
served. Which identity answers a handshake is :mod:`tlsreload_plugins.sni.table`'s; its context is built by
the first handshake that names it (:mod:`tlsreload_plugins.sni.contexts`).

Example (a server of your own; the adapters do this for you)::

    default = Reloader("tls.crt", "tls.key", recipe=lambda: recipe_for(TLSFiles("tls.crt", "tls.key")))
    identities = SNIIdentities.attach(default, ["/etc/letsencrypt/live"], recipe_for=recipe_for)
    server = make_server(ssl_context=default.context)
    with ThreadDriver(default):  # checks the default and every SNI identity
        server.serve_forever()
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Set
from contextlib import AbstractContextManager
from typing import Any, cast

from tlsreload_plugins import metrics
from tlsreload_plugins.drivers import gevent_offload
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.examine import Examined
from tlsreload_plugins.files import Password, Snapshot, Stamp, TLSFiles
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.reloader import Offload, OnDemand, Reloader
from tlsreload_plugins.settings import resolve_interval
from tlsreload_plugins.sni.ahead import read_ahead
from tlsreload_plugins.sni.contexts import ContextCache
from tlsreload_plugins.sni.discovery import is_alive, resolve_directories
from tlsreload_plugins.sni.summary import Summary, summarize
from tlsreload_plugins.sni.table import lookup, routing_table
from tlsreload_plugins.sni.tracker import ChangeTracker
from tlsreload_plugins.validation import apart as validate_apart

__all__ = ["SNIIdentities", "attach_from_settings", "for_reloader"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sni")

_attached: weakref.WeakKeyDictionary[Reloader, SNIIdentities] = weakref.WeakKeyDictionary()


class SNIIdentities:
    """The SNI identities of one server: one :class:`~tlsreload_plugins.Reloader` each, and the
    table of server names that routes each handshake to one of them in constant time.

    Most code uses :meth:`attach`. ``recipe_for(files)`` builds the server's context exactly as it does from its
    configured files, but from ``files``; ``ca_certs`` (the client-CA bundle: a connection moved onto an identity's
    context verifies client certificates against that context's store) and its ``crl`` (the CRLs that store checks
    them against), ``password`` (the key password), ``interval`` and ``expiry_warning_days`` are the default
    reloader's, shared by every identity; what concerns the bundle and CRL (a change of them alone, a failure naming
    one of them, a CA without a CRL, the CRL's ``nextUpdate``) the default reloader reports, once for all (each
    identity's reloader ``shares_trust``). Identities whose files cannot be used when first seen are not served
    (their names get the default identity), and are tried again when their files change (and at least once a
    minute). ``metrics`` exports the identities' aggregate metrics, and each identity's own, labelled
    with its name, when there are at most :data:`~tlsreload_plugins.metrics.PER_IDENTITY_UP_TO` or
    ``TLSRELOAD_METRICS=per-identity`` (:mod:`tlsreload_plugins.metrics`); ``export_metrics``, its name before,
    still works for this release and warns (``DeprecationWarning``). Each identity's context is built by the first
    handshake that names it (:mod:`tlsreload_plugins.sni.contexts`).
    """

    def __init__(
        self,
        directories: Iterable[str] | str | None,
        *,
        recipe_for: RecipeFor,
        ca_certs: str | None = None,
        crl: str | None = None,
        password: Password = None,
        interval: float | None = None,
        expiry_warning_days: float | None = None,
        metrics: bool = False,
        export_metrics: bool | None = None,
    ) -> None:
        if export_metrics is not None:
            warnings.warn(
                "SNIIdentities(export_metrics=) is deprecated: it is metrics=, as in every glue",
                DeprecationWarning,
                stacklevel=2,
            )
            metrics = export_metrics
        self.directories: list[str] = resolve_directories(directories)
        self.recipe_for = recipe_for
        self.ca_certs = ca_certs
        self.crl = crl
        self.password = password
        self.interval = interval
        self.expiry_warning_days = expiry_warning_days
        self.export_metrics = metrics
        self._lock = threading.Lock()  # one scan at a time
        self._tracker = ChangeTracker(self.directories, resolve_interval(interval), ca_certs, crl=crl)
        self._found: dict[str, TLSFiles] = {}  # what the tracker found last
        self._count = 0  # how many identities it found (per-identity metrics below metrics.PER_IDENTITY_UP_TO)
        self._again: set[str] = set()  # identities to look at again on the next check, whatever happens
        self._read_ahead: dict[str, Snapshot] = {}  # the bytes of identities about to be added, read in one pass
        self._stamps_ahead: dict[str, Stamp | None] = {}  # their files' stamps, taken before they were read
        self._starting = True  # the first look: one summary line, not a line per identity
        self._changes = 0  # what is served changed this many times (see the changes property)
        self._sweeping: frozenset[str] = frozenset()  # identities looked at only by the sweep, this tick
        self._reported: tuple[int, int] = (-1, -1)  # (served, unserved) the aggregate metrics last showed
        self._missing: set[str] = set()
        self._removed: dict[str, Reloader] = {}  # identities removed by this check, forgotten once the table is swapped
        self._pending: dict[str, str] = {}
        self._directories_missing: set[str] = set()
        self._shadowed_logged: set[str] = set()
        # What is served, read by handshakes and status() without the lock: each replaced whole, never mutated.
        self._identities: dict[str, Reloader] = {}  # the identities served, by name, in precedence order
        self._table: dict[str, Reloader] = {}  # server name (or *. wildcard) -> the identity answering it
        self._contexts = ContextCache()  # the contexts built, for the identities asked for most recently
        self._unserved: dict[str, str] = {}  # identities found but not served, by name: why
        self._conflicts_logged: set[tuple[str, str, str]] = set()  # (name, first, second) claimed twice, logged
        self._routed: dict[str, tuple[str, ...]] = {}  # the SANs each identity's leaf listed when the table was built
        self.check(settle=False)
        self._starting = False

    @classmethod
    def attach(
        cls, default: Reloader, directories: Iterable[str] | str | None, *, recipe_for: RecipeFor
    ) -> SNIIdentities:
        """Serve the identities in ``directories`` (or ``$TLSRELOAD_SNI``) through ``default``'s
        context: handshakes are routed on its ``sni_callback``, and every check of ``default``
        (its driver's tick) checks them too. Returns the new :class:`SNIIdentities`, also found
        later with :func:`for_reloader`. They have metrics when ``default`` has them.

        Raises:
            ValueError: a directory does not exist.
        """
        identities = cls(
            directories,
            recipe_for=recipe_for,
            ca_certs=default.files.ca_certs,
            crl=default.files.crl,
            password=default.password,
            interval=default.interval,
            expiry_warning_days=default.expiry_warning_days,
            metrics=metrics.observing(default),
        )
        default.set_route(identities.context_for)
        default.add_callbacks(on_check=identities._on_default_check)
        _attached[default] = identities
        log.info(
            "serving SNI identities from %s: %s", os.pathsep.join(identities.directories), identities.summary().line()
        )
        return identities

    # -- the lookup (inside OpenSSL's ClientHello callback) ----------------------------------

    def context_for(self, server_name: str | None) -> ssl.SSLContext | None:
        """The newest context of the identity serving ``server_name``, or ``None`` when no SNI
        identity does (the default identity's, then). What Go's ``GetCertificate`` returns: a
        dispatcher of your own can delegate to it. Constant time; never raises."""
        reloader = self.reloader_for(server_name)
        # Built on the first handshake that names it (a concurrent one waits for that build), kept among
        # the contexts of the identities asked for most recently.
        return None if reloader is None else self._contexts.get(reloader)

    def reloader_for(self, server_name: str | None) -> Reloader | None:
        """The :class:`~tlsreload_plugins.Reloader` of the identity serving ``server_name``, or ``None``."""
        return lookup(self._table, server_name)

    # -- reading state -------------------------------------------------------------------------

    @property
    def changes(self) -> int:
        """How many times what is served changed (an identity added, removed, or reloaded): one who copies what is
        served elsewhere (the reader, into its publication) compares it with the count it last copied at, rather
        than look at every identity."""
        return self._changes

    def reloaders(self) -> dict[str, Reloader]:
        """The identities served, by name."""
        return dict(self._identities)

    def status(self) -> dict[str, Status]:
        """Each served identity's :class:`~tlsreload_plugins.Status`, by name."""
        return {name: reloader.status() for name, reloader in self._identities.items()}

    def unserved(self) -> dict[str, str]:
        """Identities found but not served (their files were never usable, or OpenSSL refused what
        ``cryptography`` accepted), by name: why."""
        refused = self._contexts.refused()
        named = {name: refused[reloader] for name, reloader in self._identities.items() if reloader in refused}
        return {**self._unserved, **named}

    def summary(self) -> Summary:
        """How many identities there are, how many are served and refused (and why), how many contexts are
        built, which certificate expires first: what to read about thousands of identities, rather than
        :meth:`status`."""
        leaves = {name: reloader.leaf for name, reloader in self._identities.items()}
        unserved = self.unserved()
        return summarize(leaves, unserved, len(leaves) + len(unserved.keys() - leaves.keys()), len(self._contexts))

    def names(self) -> dict[str, str]:
        """The routing table: each server name (or ``*.`` wildcard) and the identity that answers it."""
        by_reloader = {id(reloader): name for name, reloader in self._identities.items()}
        return {host: by_reloader.get(id(reloader), "?") for host, reloader in self._table.items()}

    def _rebuild(self) -> None:
        # One reference swap: a handshake sees the old table or the new one.
        self._table = routing_table(self._identities, self._conflicts_logged)
        self._routed = {name: reloader.leaf.sans for name, reloader in self._identities.items()}

    # -- the scan ------------------------------------------------------------------------------

    def _on_default_check(self, outcome: Outcome, status: Status) -> None:
        self.check()

    def check(self, *, settle: bool = True) -> None:
        """Check the identities whose files changed since the last check (the kernel says which: see
        :mod:`tlsreload_plugins.sni.tracker`), a slice of the others, and new and removed ones; where the
        kernel cannot say, every identity. Blocking (file I/O): drivers call it through the default
        reloader's check, in their worker thread. Never raises for bad files."""
        with self._lock:
            offload = gevent_offload()
            self._note_directories()
            tick = self._tracker.tick(also=self._again)
            found = tick.found
            self._count = len(found)
            for files in tick.shadowed:
                if files.certfile not in self._shadowed_logged:
                    self._shadowed_logged.add(files.certfile)
                    log.warning(
                        "SNI identity %s is not served: an identity of the same name was found first",
                        os.path.dirname(files.certfile),
                    )
            wanted = tick.check | self._pending.keys() | self._missing
            self._sweeping = tick.check - tick.dirty if not tick.everything else frozenset()
            self._again = set()
            with self._judged_ahead(tick.dirty if not tick.everything else frozenset(), found, wanted, offload):
                current = self._identities
                rebuild = False
                if found is self._found and not self._missing:  # nobody added or removed: only those wanted
                    added: dict[str, Reloader] = {}
                    for name in wanted:
                        known = current.get(name)
                        if known is not None:
                            rebuild |= self._check_one(name, known, settle, offload)
                        elif name in found:
                            fresh = self._add(name, found[name], settle)
                            if fresh is not None:
                                added[name] = fresh
                    if added:  # in precedence order
                        served = {**current, **added}
                        self._identities = {name: served[name] for name in found if name in served}
                        rebuild = True
                else:
                    rebuild = True
                    self._identities = self._walk(found, wanted, settle, offload)
            self._found = found
            self._read_ahead.clear()
            self._stamps_ahead.clear()
            if rebuild:
                self._changes += 1
                self._rebuild()
            for reloader in self._removed.values():
                # Only now that no handshake is routed to it: one routed by the old table still gets its context.
                self._contexts.forget(reloader)
            self._removed = {}
            if self.export_metrics and (rebuild or self._reported != (len(self._identities), len(self._unserved))):
                self._reported = (len(self._identities), len(self._unserved))
                metrics.report_sni(self.summary())

    def _judged_ahead(
        self, dirty: Set[str], found: dict[str, TLSFiles], wanted: Set[str], offload: Offload[Examined] | None
    ) -> AbstractContextManager[None]:
        """Read, ahead of this check, the bytes of the identities it adds, once (:mod:`tlsreload_plugins.sni.ahead`),
        and validate in one batch (:mod:`tlsreload_plugins.validation.apart`: a child process per CPU) what the
        check is about to validate one identity at a time: the identities it adds and, of those the kernel reported
        changed, the ones whose files hold new content. Under gevent, in its threadpool."""
        run = cast("Callable[[Callable[[], Any]], Any] | None", offload) or (lambda work: work())
        current = self._identities
        if found is self._found and not self._missing:  # nothing added or removed: only those wanted are added
            adding = {name for name in wanted if name in found and name not in current}
        else:
            adding = found.keys() - current.keys()
        apart = validate_apart.apart()

        def gather() -> list[tuple[Snapshot, Password]]:
            ahead = read_ahead(adding, found, (self.ca_certs, self.crl))
            self._read_ahead, self._stamps_ahead = ahead.read, ahead.stamps  # not read again by _add
            changed = [current[name].new_content() for name in dirty & wanted if name in current and apart]
            fresh = [*ahead.read.values(), *(snapshot for snapshot in changed if snapshot is not None)]
            return [(snapshot, self.password) for snapshot in fresh]

        items = run(gather) if adding or (dirty and apart) else []
        # Judged ahead where validation runs in a child, and in a reader (which validates in itself) when the batch is
        # large enough to split across the CPUs: prejudged decides (validation.apart.batched).
        return validate_apart.prejudged(items, run=run)

    def _check_one(self, name: str, reloader: Reloader, settle: bool, offload: Offload[Examined] | None) -> bool:
        """Check one served identity; whether the names its leaf lists changed (the routing table must follow: a
        renewal for the same names leaves it as it is, rather than rebuilding it for every identity)."""
        if name in self._sweeping:  # nothing reported by the kernel: a read and a hash, a full check if changed
            outcome = reloader.sweep(offload=offload)
        else:
            outcome = reloader.check(settle=settle, offload=offload)
        if outcome is not Outcome.UNCHANGED:
            self._tracker.resolved(name)
        if outcome is Outcome.PENDING:
            self._again.add(name)
        if outcome is not Outcome.RELOADED:
            return False
        self._changes += 1
        self._contexts.keep(reloader)  # the context the reload built, here rather than in a handshake
        return reloader.leaf.sans != self._routed.get(name)

    def _walk(
        self, found: dict[str, TLSFiles], wanted: Set[str], settle: bool, offload: Offload[Examined] | None
    ) -> dict[str, Reloader]:
        """The identities to serve now that some were added or removed: every one found (in precedence
        order), new ones added, those gone once kept until the next look confirms it."""
        current = self._identities
        served: dict[str, Reloader] = {}
        for name, files in found.items():  # in precedence order
            self._missing.discard(name)
            known = current.get(name)
            if known is None:
                known = self._add(name, files, settle)
            elif name in wanted:
                self._check_one(name, known, settle, offload)
            if known is not None:
                served[name] = known
        for name, reloader in current.items():
            if name in found:
                continue
            if is_alive(reloader.files):  # certbot relinking its files one at a time
                self._missing.discard(name)
                self._again.add(name)
                if reloader.check(settle=settle, offload=offload) is Outcome.RELOADED:
                    self._changes += 1
                    self._contexts.keep(reloader)
            elif name not in self._missing:  # gone once: served until the next look confirms it
                self._missing.add(name)
            else:
                self._missing.discard(name)
                log.info(
                    "SNI identity %s removed: its names now go to another identity listing them, or to the default",
                    name,
                )
                self._removed[name] = reloader
                continue
            served[name] = reloader
        for name in [*self._pending, *self._unserved]:
            if name not in found:
                self._pending.pop(name, None)
                self._unserved.pop(name, None)
        return served  # replaced, never mutated: status() may iterate the old one

    def _note_directories(self) -> None:
        for directory in self.directories:
            exists = os.path.isdir(directory)
            if not exists and directory not in self._directories_missing:
                self._directories_missing.add(directory)
                log.warning("SNI directory %s is gone: its identities are removed", directory)
            elif exists and directory in self._directories_missing:
                self._directories_missing.discard(directory)
                log.info("SNI directory %s is back", directory)

    def _add(self, name: str, found: TLSFiles, settle: bool) -> Reloader | None:
        files = TLSFiles(found.certfile, found.keyfile, self.ca_certs, self.crl)
        try:
            reloader = Reloader(
                files.certfile,
                files.keyfile,
                recipe=functools.partial(self.recipe_for, files),
                ca_certs=files.ca_certs,
                crl=files.crl,
                password=self.password,
                interval=self.interval,
                expiry_warning_days=self.expiry_warning_days,
                on_demand=OnDemand(
                    self.recipe_for,
                    read=self._read_ahead.pop(name, None),
                    stamp=self._stamps_ahead.pop(name, None),
                    shares_trust=True,  # the default identity's bundle and CRL: it reports them, once
                ),
            )
        except (InvalidIdentity, TypeError) as e:
            reason = str(e)
            if settle and self._pending.get(name) != reason:  # maybe caught while being written
                self._pending[name] = reason
                return None
            self._pending.pop(name, None)
            if self._unserved.get(name) != reason:
                self._unserved[name] = reason
                log.warning("SNI identity %s not served (its names get the default certificate): %s", name, reason)
            return None
        self._pending.pop(name, None)
        self._unserved.pop(name, None)
        if self.export_metrics and (metrics.per_identity() or self._count <= metrics.PER_IDENTITY_UP_TO):
            metrics.observe(reloader, identity=name)
        if not self._starting:  # at start, one summary line for all of them
            log.info("SNI identity %s: %s", name, reloader.describe())
        return reloader


def for_reloader(default: Reloader) -> SNIIdentities | None:
    """The :class:`SNIIdentities` attached to ``default``, or ``None``.

    For an adapter's reloader: ``for_reloader(tlsreload_plugins.uvicorn.reloaders()[0])``.
    """
    return _attached.get(default)


def attach_from_settings(
    default: Reloader, directories: Iterable[str] | str | None, recipe_for: RecipeFor
) -> SNIIdentities | None:
    """What the adapters call: attach the configured identities, if any (``$TLSRELOAD_SNI`` when
    ``directories`` is ``None``); ``None`` when none is configured.

    Raises:
        ValueError: a configured directory does not exist.
    """
    if not resolve_directories(directories):
        return None
    return SNIIdentities.attach(default, directories, recipe_for=recipe_for)
