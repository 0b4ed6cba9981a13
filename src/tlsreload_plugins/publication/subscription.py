"""A serving process's side of a publication: :class:`Subscription`, what its reloader looks at instead of the files.

A serving process of a server with a reader (:mod:`tlsreload_plugins.publication.reader`) never opens the configured
files and never validates: each check takes one look at which version is published (a ``readlink``) and at the
reader's figures; a new version is built through the server's recipe from that version's own paths, its verdict
taken as published (only its dates are judged again: time changes them). The reader's refusal of the files, naming
the configured file, is this process's failure too: counted in its ``status()`` and metrics, and said in its log as
every process said it before. Blocking (small reads): called where a check runs, never on an event loop.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from datetime import datetime, timezone

from tlsreload_plugins.atomic_swap import current_version
from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError
from tlsreload_plugins.examine import Examined, build_context, fixed_setting_changes, keep_fixed_settings
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.identity import Leaf, judge_period
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.publication.published import (
    ReaderFigures,
    Version,
    read_figures,
    read_version,
    reader_gone,
    version_fingerprint,
)

__all__ = ["Subscription"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.publication")


class Subscription:
    """What a serving process's reloader reads: the publication in ``directory``, built with ``recipe_for``.

    Args:
        directory: the publication (:attr:`~tlsreload_plugins.publication.reader.ReaderProcess.directory`).
        recipe_for: the server's recipe aimed at other files (here: a version's own).

    Example: ``Reloader(certfile, keyfile, recipe=recipe, subscription=Subscription(directory, recipe_for))``.
    """

    def __init__(self, directory: str, recipe_for: RecipeFor) -> None:
        self.directory = directory
        self.recipe_for = recipe_for
        self.gone_reader: str | None = None
        """The reader found gone (its owner, as its figures name it; ``None`` while it runs): said once."""

    def first(self, files: TLSFiles, now: float) -> tuple[Snapshot, Leaf, ssl.SSLContext, InvalidIdentity | None]:
        """What a process starting now serves: the current version, as the bytes of ``files`` (the names every line
        and metric uses), its leaf and a context built from it; and the reader's refusal of the files as they are
        now (``None``: they are usable), which makes what is served the last good identity, its dates judged (the
        files' own identity is served whatever its dates, as at any start: its checks say what is wrong with it).

        Raises:
            InvalidIdentity: nothing is published, or what is cannot be served (expired since; the recipe refused).
        """
        version = self._current()
        figures = read_figures(self.directory)
        refusal = figures.refusal() if figures is not None else None
        if figures is not None and refusal is not None and figures.error_content != version_fingerprint(version.name):
            # The files hold something else, which is not usable now: what is published is the last good identity.
            leaf = version.leaf
            try:
                judge_period(leaf, files, datetime.fromtimestamp(now, timezone.utc))
            except InvalidIdentity:  # as a start on the files themselves would say it: no, and why
                raise InvalidIdentity(
                    f"{refusal}; the last good certificate (serial {leaf.serial}) is outside its validity period "
                    f"({leaf.not_before.isoformat()} to {leaf.not_after.isoformat()})",
                    path=refusal.path,
                ) from None
        context = self._build(version, files)
        return Snapshot(files, *version.snapshot.parts), version.leaf, context, refusal

    def _note_reader(self, figures: ReaderFigures | None) -> None:
        """Say once, at ERROR, that the reader has gone (killed, crashed): nothing new will be published."""
        if figures is None or not reader_gone(figures):
            self.gone_reader = None
            return
        if self.gone_reader == figures.owner:
            return
        self.gone_reader = figures.owner
        log.error(
            "the server's reader of %s (process %s) has gone: no new certificate is served until it is started "
            "again (gunicorn starts it before its next worker and on HUP; other servers: restart them); what it "
            "published serves meanwhile",
            figures.files.describe(),
            figures.owner.split(".")[1] if figures.owner.count(".") == 2 else figures.owner,
        )

    def _current(self) -> Version:
        name = current_version(self.directory)
        if name is None:
            raise InvalidIdentity(f"nothing is published in {self.directory} (has the server's reader gone?)")
        return read_version(self.directory, name)

    def _build(self, version: Version, files: TLSFiles) -> ssl.SSLContext:
        paths = version.snapshot.files
        return build_context(lambda: self.recipe_for(paths), files, version.snapshot.crl)

    def examine(
        self,
        files: TLSFiles,
        now: float,
        *,
        served: str,
        live: ssl.SSLContext | None,
        in_use: Callable[[ssl.SSLContext], bool],
    ) -> Examined:
        """One check's look: what is published, when it is not the content ``served`` (its fingerprint), judged for
        its dates at ``now`` and built; else the reader's refusal of the files, when it has one. ``live`` and
        ``in_use`` as for :func:`~tlsreload_plugins.examine.examine_files`. Never raises for what it finds."""
        name = current_version(self.directory)
        if name is None:
            gone = os.path.isdir(self.directory)
            error: ReloadError = InvalidIdentity(
                f"nothing is published in {self.directory}"
                + (" (has the server's reader gone?)" if gone else ": the publication has been removed")
            )
            return Examined(fingerprint=None, error=error)
        observed = version_fingerprint(name)
        if observed == served:
            figures = read_figures(self.directory)
            self._note_reader(figures)
            refusal: ReloadError | None = figures.refusal() if figures is not None else None
            if refusal is not None:
                if figures is not None and figures.error_level >= 40:
                    refusal = NotServable(str(refusal))
                return Examined(fingerprint=observed, error=refusal)
            return Examined(fingerprint=observed, unchanged=True)
        try:
            version = read_version(self.directory, name)
        except InvalidIdentity:  # removed while read: a newer one was published; read at the next check
            return Examined(fingerprint=observed, changed_while_building=True)
        leaf = version.leaf
        try:
            judge_period(leaf, files, datetime.fromtimestamp(now, timezone.utc))
            context = self._build(version, files)
        except InvalidIdentity as e:
            return Examined(fingerprint=observed, leaf=leaf, error=e)
        if in_use(context):
            error = NotServable(
                f"the SSL context recipe for {files.certfile} returned a context already in use (does an "
                "ssl_context hook cache its context?): it must build a new one on every call"
            )
            return Examined(fingerprint=observed, error=error)
        changes = tuple(fixed_setting_changes(live, context)) if live is not None else ()
        if changes and live is not None:
            keep_fixed_settings(live, context)
        snapshot = Snapshot(files, *version.snapshot.parts)
        return Examined(observed, snapshot, leaf=leaf, context=context, fixed_changes=changes)
