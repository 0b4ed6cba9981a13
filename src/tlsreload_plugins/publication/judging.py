"""What the reader does each interval: :class:`Judging`, the files judged and what passed published.

The deciding is the core's own (:class:`~tlsreload_plugins.reloader.Reloader`, building no context of its own: an
``on_demand`` reloader keeps the validated bytes it serves): changed? valid? The reader only acts on it: the bytes
that passed go into the publication, and its figures (usable now? why not, naming the file) beside them. Called by
the reader process's loop and by the tests directly, without a process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Sequence

from tlsreload_plugins.errors import NotServable, ReloadError
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, fingerprint, read_files
from tlsreload_plugins.publication.index import IndexWriter
from tlsreload_plugins.publication.published import Publication, ReaderFigures
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.retrying import retry_at_start
from tlsreload_plugins.settings import resolve_password
from tlsreload_plugins.sni.identities import SNIIdentities

__all__ = ["Judging", "plain_context"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.reader")

QUIET = logging.getLogger("tlsreload_plugins.reader.default")
"""The reader's lines about the default identity: each serving process says every reload and failure of it (and
counts them in its status() and metrics), so the reader's would say each once more. Set above CRITICAL by the reader
process; its SNI identities' lines, which no serving process says, are the reader's own."""


def plain_context(files: TLSFiles, password: Password = None) -> ssl.SSLContext:
    """A default server context loaded from ``files``: OpenSSL itself judges the pair, as a server would (also
    ``tlsreload watch``'s and ``tlsreload check``'s)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile, password)
    if files.ca_certs:
        context.load_verify_locations(files.ca_certs)
    return context


class Judging:
    """The reader's judging of ``files``, publishing into ``publication``.

    The constructor judges the files (read :data:`~tlsreload_plugins.retrying.BOOT_ATTEMPTS` times at most, as any
    start) and publishes them: :attr:`version`. Then :meth:`tick`, called often, checks them every ``interval``.

    Args:
        files: the configured files; password: the key's password; interval: seconds between checks.
        publication: where what passed is published; owner: the reader process (its figures say who they are from).
        clock: monotonic seconds (the tests give their own).

    Raises:
        ReloadError: nothing usable at start (the message names the file).
        ValueError: a bad interval or setting.

    Example::

        judging = Judging(files, None, 1.0, Publication(directory), owner())
        while running:
            judging.tick()
    """

    def __init__(
        self,
        files: TLSFiles,
        password: Password,
        interval: float,
        publication: Publication,
        owner: str,
        clock: Callable[[], float] = time.monotonic,
        sni: Sequence[str] = (),
    ) -> None:
        self.files = files
        self.publication = publication
        self.owner = owner
        self._clock = clock
        self._error: ReloadError | None = None
        password = resolve_password(password)  # $TLSRELOAD_KEY_PASSWORD_FILE's, read at each build
        self.reloader: Reloader = retry_at_start(
            lambda: Reloader(
                files.certfile,
                files.keyfile,
                recipe=lambda: plain_context(files, password),
                ca_certs=files.ca_certs,
                crl=files.crl,
                password=password,
                interval=interval,
                on_demand=lambda paths: plain_context(paths, password),
                on_failure=self._failed,
                logger=QUIET,
            )
        )
        self.interval: float = self.reloader.interval
        self._next = clock() + self.interval
        self._said: ReaderFigures | None = None
        self.version: str = self._publish()
        self._say()
        self._sni: SNIIdentities | None = None
        self._index: IndexWriter | None = None
        self._exported: dict[str, Snapshot] = {}  # what the index holds, by identity name
        self._exported_at = -1  # the SNI identities' changes count at the last export (-1: none yet)
        self._sni_directories = list(sni)
        self._password = password

    def start_sni(self) -> None:
        """Judge the SNI identities (when configured) and publish those that pass: after the default identity is
        published, so that the workers start meanwhile (they serve the default identity to the names not yet
        published). Blocking; thousands of identities take seconds.

        Raises:
            ValueError: an SNI directory does not exist.
        """
        if not self._sni_directories or self._sni is not None:
            return
        password = self._password
        self._sni = SNIIdentities.attach(
            self.reloader, self._sni_directories, recipe_for=lambda paths: plain_context(paths, password)
        )
        self._index = IndexWriter(self.publication.directory)
        self._export()

    def _failed(self, error: ReloadError) -> None:
        self._error = error

    def tick(self) -> None:
        """Check the files when the interval has passed: publish what passed, say the figures when they changed.
        Blocking (reads, validation, writes); never raises for the files (a write that fails is logged)."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        self.reloader.check()  # the SNI identities too: they follow the default identity's checks
        try:
            self.version = self._publish()
            self._say()
            self._export()
        except OSError as e:  # a full memory filesystem: the serving processes keep what was published
            log.error("cannot publish the TLS identity in %s: %s", self.publication.directory, e)

    def _publish(self) -> str:
        return self.publication.publish(self.reloader.served, self.reloader.leaf)

    def _export(self) -> None:
        """Publish the SNI identities whose served bytes changed, forget those gone, and the routes when either."""
        if self._sni is None or self._index is None or self._sni.changes == self._exported_at:
            return
        exported_at = self._sni.changes  # before the look: a change made meanwhile is exported next time
        served = self._sni.reloaders()
        changed: dict[str, tuple[Snapshot, str]] = {}
        for name, reloader in served.items():
            validated = reloader.served
            if validated is not self._exported.get(name):
                changed[name] = (validated, json.dumps(reloader.leaf.fields()))
        removed = [name for name in self._index.names if name not in served]  # a predecessor's too
        if changed or removed:
            self._index.write(changed, removed, self._sni.names())
        self._exported_at = exported_at
        for name in removed:
            self._exported.pop(name, None)
        self._exported.update({name: snapshot for name, (snapshot, _) in changed.items()})

    def _say(self) -> None:
        status = self.reloader.status()
        error = self._error if status.last_error is not None else None
        figures = ReaderFigures(
            self.owner,
            self.files,
            status.last_error,
            getattr(error, "path", None),
            logging.ERROR if isinstance(error, NotServable) else logging.WARNING,
            status.failures,
        )
        said = self._said
        if said is not None and figures == said._replace(error_content=None):
            return
        if error is not None:  # a new problem: what do the files hold (the published version, expired since)?
            with contextlib.suppress(ReloadError):
                figures = figures._replace(error_content=fingerprint(read_files(self.files)))
        self.publication.say(figures)
        self._said = figures
