"""The deciding half of a check: what the files found mean for what is served and what is reported.

:class:`Concluding` is :class:`~tlsreload_plugins.Reloader`'s base class (itself on
:class:`~tlsreload_plugins.served.Served`) and, like it, holds no state of its own. Given what
:meth:`Reloader.examine <tlsreload_plugins.Reloader.examine>` found, :meth:`Concluding._conclude` decides:
swap new handshakes onto the new context, report a failure (once it settled, once per distinct problem),
say when the files are usable again, warn that the served certificate expires. No I/O: it runs with the
state lock held, and what it has callbacks, the last good store and the store's refusals do it leaves in
``_notices``, for after the lock is released.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from tlsreload_plugins.errors import NotServable, ReloadError
from tlsreload_plugins.examine import Examined
from tlsreload_plugins.files import Snapshot
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome, Settling, warn_expiry
from tlsreload_plugins.served import Served

# Its log lines keep the logger they were always written under.
log = logging.getLogger("tlsreload_plugins.reloader")

_JUDGED_AT_FIRST_CHECK = Examined(fingerprint=None)
"""The known bad content of a reloader that started on its last good identity before anyone judged the files."""


class Concluding(Served):
    """The deciding half of :class:`~tlsreload_plugins.Reloader`, its base class: never used alone. The
    attributes below (beside :class:`~tlsreload_plugins.served.Served`'s) are set by ``Reloader.__init__``."""

    expiry_warning_days: float
    _on_reload: list[Callable[[Leaf, Leaf], object]]
    _on_failure: list[Callable[[ReloadError], object]]
    _settling: Settling
    _known_bad: Examined | None
    _fixed_warned: tuple[str, ...]
    _last_expiry_warning: float | None

    def _conclude(self, examined: Examined, now: float, settle: bool) -> Outcome:
        """The deciding half of :meth:`check`: no I/O, called with the state lock held."""
        self._checks += 1
        if not self._hook_in_place():
            error = NotServable(
                f"the server's SSL context no longer calls tlsreload's sni_callback (other code replaced it after "
                f"start): new certificates from {self.files.certfile} cannot be served"
            )
            return self._fail("hook replaced", error, settle=False, level=logging.ERROR)
        starting = self._known_bad is _JUDGED_AT_FIRST_CHECK  # then a refusal is reported at once, as at a start
        if starting and not examined.changed_while_building:
            self._known_bad = None
        if examined.error is not None:
            if examined.refused is not None and self._last_good is not None and examined is not self._known_bad:
                # Kept for the server's other processes (a new worker takes it), once the state lock is released.
                refusal = (self._last_good.name, examined.content_key, examined.refused)
                self._notices.append(([self._last_good.store.refuse], refusal))
            if examined.fingerprint is not None:
                self._known_bad = examined
            level = logging.ERROR if isinstance(examined.error, NotServable) else logging.WARNING
            key = f"{examined.fingerprint}:{examined.error}"
            return self._fail(key, examined.error, settle and not starting, level)
        if examined.unchanged:
            self._succeeded(now)
            return Outcome.UNCHANGED
        if examined.changed_while_building or examined.context is None or examined.leaf is None:
            log.debug("certificate files changed while being loaded; checking again")
            return Outcome.PENDING
        if examined.fixed_changes and examined.fixed_changes != self._fixed_warned:
            self._fixed_warned = examined.fixed_changes
            log.warning(
                "the rebuilt SSL context for %s sets %s; connections keep the settings the server started with "
                "(protocol bounds, verify mode and options are fixed at start: restart to change them)",
                self.files.certfile,
                ", ".join(examined.fixed_changes),
            )
        if self._demand is not None:
            self._demand.validated = examined.snapshot
        self._swap(examined.context, examined.leaf, examined.fingerprint or "", now, examined.snapshot)
        if self._last_good is not None and examined.snapshot is not None:
            # After the state lock is released: a shared store may wait for another process's write.
            self._notices.append(([self._last_good.remember], (examined.snapshot, examined.leaf)))
        return Outcome.RELOADED

    def _swap(
        self, context: ssl.SSLContext, leaf: Leaf, observed_fingerprint: str, now: float, snapshot: Snapshot | None
    ) -> None:
        """Make ``context`` the one new handshakes get. Established connections keep theirs."""
        old = self._leaf
        if self._demand is None or self._serving[0] is not None:  # on demand and not built: left unbuilt
            self._newest_for_connections(context, snapshot)
        self._fingerprint = observed_fingerprint
        self._known_bad = None
        self._leaf = leaf
        self._reloads += 1
        self._last_reload = now
        self._last_expiry_warning = None
        log.info(
            "reloaded TLS certificate from %s: serial %s -> %s; now serving %s",
            self.files.certfile,
            old.serial,
            leaf.serial,
            leaf.describe(),
        )
        self._succeeded(now)
        self._notices.append((self._on_reload, (old, leaf)))

    def _succeeded(self, now: float) -> None:
        self._last_success = now
        if self._settling.good():
            log.info("certificate files %s are usable again; serving %s", self.files.describe(), self._leaf.describe())
        self._last_error = None
        self._warn_expiry(now)

    def _fail(self, key: str, error: ReloadError, settle: bool, level: int = logging.WARNING) -> Outcome:
        outcome = self._settling.bad(key, settle)
        if outcome is Outcome.PENDING:
            log.debug("certificate files not usable yet (%s); checking again", error)
        if outcome is not None:
            return outcome
        self._last_error = str(error)
        self._failures += 1
        log.log(
            level,
            "certificate reload failed, still serving serial %s (not after %s): %s",
            self._leaf.serial,
            self._leaf.not_after.isoformat(),
            error,
        )
        self._notices.append((self._on_failure, (error,)))
        return Outcome.FAILED

    def _warn_expiry(self, now: float) -> None:
        self._last_expiry_warning = warn_expiry(
            log, self._leaf, now, self.expiry_warning_days, self._last_expiry_warning
        )
