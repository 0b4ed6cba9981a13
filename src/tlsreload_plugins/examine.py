"""Reading and judging a reloader's files, deciding nothing: what a reloader serves first, and the blocking
half of each check.

:func:`load_identity` (and :func:`first_leaf`, for a reloader that builds its context on first use) is what
a reloader starts serving, usable on their own for start-up checks; :func:`examine_files` is what
:meth:`Reloader.examine <tlsreload_plugins.reloader.Reloader.examine>` runs, in a thread of its own or a gevent
threadpool, and :class:`Examined` what it hands back for the reloader to decide on under its lock. :func:`judge` is
the one place a reloader's bytes are validated.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from datetime import datetime, timezone

from tlsreload_plugins.errors import InvalidIdentity, NotServable, ReloadError
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, fingerprint, password_digest, read_files
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf, judge_period
from tlsreload_plugins.memory_files import check_revocation_of

Recipe = Callable[[], ssl.SSLContext]


def build_context(recipe: Recipe, files: TLSFiles | None = None, crl: bytes | None = None) -> ssl.SSLContext:
    """Call the server's recipe (which reads ``files``, named in errors when given), and have the context it
    returns check client certificates against the CRLs ``crl`` (the validated bytes of ``files.crl``; ``None``:
    none), which no server's own recipe does.

    Raises:
        InvalidIdentity: the recipe raised anything (OpenSSL refusing the files, a bug in a user's
            hook): the reason is in the message.
        TypeError: the recipe returned something that is not an :class:`ssl.SSLContext`.
    """
    try:
        context = recipe()
        if crl is not None and isinstance(context, ssl.SSLContext):
            check_revocation_of(context, crl)
    except Exception as e:
        detail = str(e) if isinstance(e, (ssl.SSLError, OSError)) else f"{type(e).__name__}: {e}"
        source = f" {files.describe()}" if files is not None else ""
        raise InvalidIdentity(f"the SSL context could not be built from the files{source}: {detail}") from e
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"the SSL context recipe returned {type(context).__name__}, not ssl.SSLContext")
    return context


def load_identity(files: TLSFiles, recipe: Recipe, password: Password = None) -> tuple[Snapshot, Leaf, ssl.SSLContext]:
    """Read and validate ``files`` and build a context with ``recipe``: what a reloader requires
    before it serves anything. Start-up checks and ``tlsreload check`` call this so that they
    decide exactly as the reloader does (:func:`judge`: validated in a child process, unless this one has loaded
    ``cryptography``). Raises :class:`InvalidIdentity` with the reason."""
    snapshot = read_files(files)
    leaf = judge(snapshot, password)
    return snapshot, leaf, build_context(recipe, files, snapshot.crl)


def judge(snapshot: Snapshot, password: Password) -> Leaf:
    """The leaf of ``snapshot`` when it is a usable identity (its dates are not judged here):
    :func:`~tlsreload_plugins.validation.apart.validate`, in a child process unless this one has loaded
    ``cryptography``. Blocking.

    Raises:
        InvalidIdentity: the bytes are not a usable identity.
    """
    # Imported here, not at import: a serving process that loads what its server's reader published never loads it.
    from tlsreload_plugins.validation.apart import validate

    return validate(snapshot, password)


def first_leaf(files: TLSFiles, password: Password, read: Snapshot | None = None) -> tuple[Snapshot, Leaf]:
    """What a reloader that builds its context on first use serves first: the identity in ``files``, judged
    (:func:`judge`), without building a context. ``read``: the bytes of ``files`` as the caller has just read them
    (not read again).

    Raises:
        InvalidIdentity: the files cannot be used.
    """
    snapshot = read if read is not None else read_files(files)
    return snapshot, judge(snapshot, password)


def new_content(files: TLSFiles, served: str, known_bad: Examined | None) -> Snapshot | None:
    """What ``files`` hold when a check would validate it (neither the content ``served``, its fingerprint, nor
    the content last found unusable, ``known_bad``), else ``None`` (unreadable too): for a caller validating many
    identities at once ahead of their checks (:func:`~tlsreload_plugins.validation.apart.prejudged`). Blocking
    (reads); changes nothing."""
    try:
        snapshot = read_files(files)
    except InvalidIdentity:
        return None
    observed = fingerprint(snapshot)
    if observed == served or (known_bad is not None and known_bad.fingerprint == observed):
        return None
    return snapshot


FIXED_SETTINGS = ("minimum_version", "maximum_version", "verify_mode", "options")
"""Settings of the live context that a connection keeps when it is moved onto a rebuilt context
(OpenSSL's ``SSL_set_SSL_CTX`` moves the certificate, key, CA store, ALPN and ciphers only)."""


def keep_fixed_settings(live: ssl.SSLContext, rebuilt: ssl.SSLContext) -> None:
    """Give ``rebuilt`` the :data:`FIXED_SETTINGS` of ``live``: new connections are created on the newest
    context (so that sessions made under another trust cannot resume), and keep the settings the server started
    with, as a connection moved onto a rebuilt context does."""
    for name in FIXED_SETTINGS:
        if getattr(rebuilt, name) != getattr(live, name):
            setattr(rebuilt, name, getattr(live, name))


def fixed_setting_changes(live: ssl.SSLContext, rebuilt: ssl.SSLContext) -> list[str]:
    """The :data:`FIXED_SETTINGS` in which ``rebuilt`` differs from ``live``, described for a log line."""
    changes = []
    for name in FIXED_SETTINGS:
        before, after = getattr(live, name), getattr(rebuilt, name)
        if before != after:
            changes.append(f"{name} {getattr(after, 'name', after)} (serving {getattr(before, 'name', before)})")
    return changes


class Examined(FrozenRecord):
    """What one look at the files found, before anything is decided (see :meth:`Reloader.check`)."""

    _fields = (
        "fingerprint",
        "snapshot",
        "unchanged",
        "leaf",
        "context",
        "error",
        "changed_while_building",
        "fixed_changes",
        "password",
    )
    __slots__ = _fields
    fingerprint: str | None
    """Digest of the content read, ``None`` when it could not be read."""
    snapshot: Snapshot | None
    unchanged: bool
    leaf: Leaf | None
    context: ssl.SSLContext | None
    error: ReloadError | None
    changed_while_building: bool
    fixed_changes: tuple[str, ...]
    password: str
    """Digest of the key password the content was judged with: a new password is a new verdict."""

    def __init__(
        self,
        fingerprint: str | None,
        snapshot: Snapshot | None = None,
        unchanged: bool = False,
        leaf: Leaf | None = None,
        context: ssl.SSLContext | None = None,
        error: ReloadError | None = None,
        changed_while_building: bool = False,
        fixed_changes: tuple[str, ...] = (),
        password: str = "",
    ) -> None:
        self._set(
            fingerprint,
            snapshot,
            unchanged,
            leaf,
            context,
            error,
            changed_while_building,
            fixed_changes,
            password,
        )


def examine_files(
    files: TLSFiles,
    recipe: Recipe,
    password: Password,
    now: float,
    *,
    served: str,
    known_bad: Examined | None,
    live: ssl.SSLContext | None,
    in_use: Callable[[ssl.SSLContext], bool],
) -> Examined:
    """Read ``files`` once and, when their content is not the content ``served`` (its fingerprint),
    judge it (:func:`judge`), its dates at ``now``, and build a context with ``recipe``. Blocking; changes no state.

    ``known_bad`` is the last content found unusable: when the files still hold it (with the same
    ``password``), it is not parsed again, and only its dates are judged anew. ``live`` is the
    server's context (a rebuilt one is compared with it, :func:`fixed_setting_changes`; ``None``: none), and
    ``in_use(context)`` tells whether a context the recipe returned is one the server already uses.

    Unusable files never raise: they are an :attr:`Examined.error`. What nobody foresaw (a bug, an
    error other than :class:`InvalidIdentity` from validation) escapes, and :meth:`Reloader.examine
    <tlsreload_plugins.reloader.Reloader.examine>` reports it as a failure.
    """
    try:
        snapshot = read_files(files)
    except InvalidIdentity as e:
        return Examined(fingerprint=None, error=e)
    observed = fingerprint(snapshot)
    if observed == served:
        return Examined(fingerprint=observed, unchanged=True)
    when = datetime.fromtimestamp(now, timezone.utc)
    known = known_bad
    digest = password_digest(password) if known is not None and known.fingerprint == observed else ""
    if known is not None and known.fingerprint == observed and known.password == digest:
        # Known bad content is not parsed again; only a verdict on its dates can change with time.
        if known.leaf is None:
            return known
        try:
            judge_period(known.leaf, files, when)
        except InvalidIdentity as e:
            return Examined(fingerprint=observed, leaf=known.leaf, error=e, password=digest)
    try:
        leaf = judge(snapshot, password)
    except InvalidIdentity as e:
        return Examined(fingerprint=observed, error=e, password=password_digest(password))
    try:
        judge_period(leaf, files, when)
    except InvalidIdentity as e:
        return Examined(fingerprint=observed, leaf=leaf, error=e, password=password_digest(password))
    try:
        context = build_context(recipe, files, snapshot.crl)
    except InvalidIdentity as e:
        # Not remembered as bad content: the recipe reads the files again, maybe mid-rotation.
        if fingerprint(read_files(files)) != observed:
            return Examined(fingerprint=observed, changed_while_building=True)
        return Examined(fingerprint=None, error=e)
    if in_use(context):
        error = NotServable(
            f"the SSL context recipe for {files.certfile} returned a context already in use (does an "
            "ssl_context hook cache its context?): it must build a new one on every call"
        )
        return Examined(fingerprint=observed, error=error)
    # The recipe may have read other bytes than those validated: then try again next check.
    changed = fingerprint(read_files(files)) != observed
    changes = tuple(fixed_setting_changes(live, context)) if live is not None else ()
    if changes and live is not None:
        keep_fixed_settings(live, context)
    return Examined(
        observed, snapshot, leaf=leaf, context=context, changed_while_building=changed, fixed_changes=changes
    )
