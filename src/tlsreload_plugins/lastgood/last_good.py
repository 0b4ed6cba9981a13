"""The last good identity, kept in memory so that a process that starts while the files on disk are
broken serves it instead of nothing.

A server's processes come and go (gunicorn's ``max_requests``, HUP, a crashed or killed worker,
uvicorn's supervisor replacing a child). A new process reads the files like the first one did;
if they are broken at that moment it has nothing to serve, although its siblings were serving a
good certificate a moment before. :class:`LastGood` keeps the newest identity a server put in
service in a :class:`SharedStore`, memory all its processes share, and builds a context from it
when the files cannot be used. The store keeps one identity per name: the configured one
(:data:`DEFAULT`) and each SNI identity (:mod:`tlsreload_plugins.sni.identities`) under its own name, each
with the leaf its validation found. Nothing touches the disk.

The store also keeps, per name, the refusal validation found for the newest content it refused (its
message and path, for exactly those bytes and that key password: :func:`content_key`). A process that
reads those bytes takes that refusal instead of validating them again: a gunicorn worker started while
the files are broken serves the last good at once, reporting the refusal as any start on broken files
does. Not kept: refusals for dates (time changes them) and a validation stopped before its verdict
(:class:`~tlsreload_plugins.errors.Unjudged`).

:func:`verdict` answers, for every caller, what the verdict on some bytes is: the one kept for them, else
the refusal kept for them, else validation's. The validation machinery (:mod:`tlsreload_plugins.validation`) is
imported where something is validated: a worker that takes its parent's verdicts never loads it.

* Servers that ``fork()`` their workers (gunicorn) create the store before the first fork. Every
  worker writes what it starts serving; every new worker reads it.
* Servers that start workers with ``spawn`` (uvicorn's ``--workers``, hypercorn) pass the store to
  each child with its configuration (on Linux, as a memfd). Their parent validates the files too
  (:func:`keep_newest_valid`), so a worker takes the parent's verdict on new content instead of
  having it validated again (:mod:`tlsreload_plugins.validation.apart`: a child process each time).

A context is built from the bytes through the server's own recipe, given paths to in-memory files
(``memfd_create``, read as ``/proc/self/fd/N``; :mod:`tlsreload_plugins.memory_files`). Where memfd is
missing, the files go to a private directory (0700, files 0600) and are removed as soon as the context
is built. The store itself (:class:`SharedStore`) is :mod:`tlsreload_plugins.lastgood.store`'s.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tlsreload_plugins import identity
from tlsreload_plugins.errors import InvalidIdentity, Unjudged
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, fingerprint, password_digest, read_files
from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf, judge_period
from tlsreload_plugins.lastgood.spawned import shared_with_spawned_processes
from tlsreload_plugins.lastgood.store import DEFAULT, SharedStore
from tlsreload_plugins.memory_files import RecipeFor, in_memory_files
from tlsreload_plugins.revocation import check_revocation

if TYPE_CHECKING:
    from tlsreload_plugins.validation.child import Resident

log = logging.getLogger("tlsreload_plugins.lastgood")


def bytes_to_build(files: TLSFiles, served: str, last_good: LastGood | None) -> Snapshot | None:
    """What an on-demand reloader that keeps no copy of the bytes it serves builds its context from, taken from
    ``last_good``'s store as this process last looked at it (:meth:`SharedStore.known`): it runs inside a
    ClientHello callback, so no file is read, nothing validated, and what other processes wrote since is left for
    the next check to take in. The bytes whose fingerprint is ``served``; else, when the store had moved past them
    (another process of the server validated newer ones, which this one's check has yet to take), those newer
    bytes, valid by the verdict kept beside them; else ``None``."""
    if last_good is None:
        return None
    kept = last_good.store.known(last_good.name)
    if kept is None:
        return None
    parts, leaf = kept
    snapshot = Snapshot(files, *parts)
    return snapshot if fingerprint(snapshot) == served or leaf is not None else None


class NotJudged(InvalidIdentity):
    """The files hold content no process of the server has judged, and a process starting now serves its last
    good identity at once rather than wait for a validation in a child process: its first check judges them,
    and reports a refusal at once. Or a check read them mid-rotation (a certificate of one pair, the key of the
    next) and the files have changed since: its next check reads them again."""


def content_key(snapshot: Snapshot, password: Password) -> str:
    """What a refusal kept in a :class:`SharedStore` is for: a digest of ``snapshot``'s bytes and of the key
    password ``password`` gives now (validation's verdict depends on nothing else)."""
    return f"{fingerprint(snapshot)}:{password_digest(password)}"


def shareable(error: InvalidIdentity) -> bool:
    """Whether ``error`` is validation's verdict on the bytes, which any process reading them may take: not a
    child stopped or ended before its verdict (:class:`~tlsreload_plugins.errors.Unjudged`)."""
    return not isinstance(error, Unjudged)


def verdict(
    snapshot: Snapshot,
    password: Password,
    last_good: LastGood | None,
    *,
    ask: bool = True,
    defer: bool = False,
    keep: bool = False,
) -> Leaf:
    """The leaf of ``snapshot`` when it is a usable identity (its dates are not judged here): the verdict
    ``last_good`` keeps for exactly these bytes, else the refusal it keeps for them and ``password``, else
    validation's (:func:`~tlsreload_plugins.validation.apart.validate`: in a child process, unless this one
    has loaded ``cryptography``). Blocking.

    ``ask``: when the store keeps no verdict for these bytes and a keeper looks after it (a spawn server's
    parent), ask the keeper to look first (up to the store's ``ASK_WAIT``); a caller judging thousands of
    identities at once asks nobody. When the keeper looked and kept no verdict, it refused them: the refusal
    it kept for exactly these bytes and ``password`` is raised; without one (a refusal for dates, a key
    password of its own) they are validated in this process (which loads ``cryptography``), unless the files no
    longer hold them (read mid-rotation, the keeper judged the next content): a :class:`NotJudged` then.
    ``defer``: when validation would start a child and an identity is kept for ``last_good``'s name, neither
    it nor the keeper is waited for: a process starting now serves what is kept at once, and its first check
    asks (a new worker's start does not wait on a validation the keeper runs in a child process).
    ``keep``: a refusal validation finds is kept in ``last_good`` for the server's other processes.

    Raises:
        InvalidIdentity: the bytes are not a usable identity; a :class:`NotJudged` when deferred.
    """
    if last_good is None:
        return _validated(snapshot, password)
    leaf = _kept_leaf(last_good, snapshot)
    if leaf is not None:
        return leaf
    refused = last_good.refusal(snapshot, password)  # kept for exactly these bytes: what asking would find
    if refused is not None:
        raise refused
    deferred = defer and _apart() and last_good.store.read(last_good.name) is not None
    keeper_refused = False
    if ask and not deferred:
        leaf, keeper_refused = _asked_leaf(last_good, snapshot)
        if leaf is not None:
            return leaf
        refused = last_good.refusal(snapshot, password)
        if refused is not None:
            raise refused
    if keeper_refused:
        if not _still_on_disk(snapshot):  # read mid-rotation: the keeper judged what the files hold now
            raise NotJudged(f"the TLS files changed while being judged ({snapshot.files.describe()}), judged next")
        return identity.validate(snapshot, password)
    if deferred:
        raise NotJudged(f"the TLS files hold content not judged yet ({snapshot.files.describe()}), judged next")
    try:
        return _validated(snapshot, password)
    except InvalidIdentity as e:
        if keep and shareable(e):
            last_good.store.refuse(last_good.name, content_key(snapshot, password), e)
        raise


def _still_on_disk(snapshot: Snapshot) -> bool:
    """Whether the files hold the bytes of ``snapshot`` still (not when one is gone or cannot be read: a read error
    now is the next check's to report, not a verdict on the bytes read before)."""
    try:
        return read_files(snapshot.files) == snapshot
    except InvalidIdentity:
        return False


def _validated(snapshot: Snapshot, password: Password) -> Leaf:
    from tlsreload_plugins.validation.apart import validate  # here, not at import: see the module's description

    return validate(snapshot, password)


def _apart() -> bool:
    from tlsreload_plugins.validation.apart import apart  # here, not at import: see the module's description

    return apart()


def _kept_leaf(last_good: LastGood, snapshot: Snapshot) -> Leaf | None:
    """The leaf ``last_good``'s store keeps for exactly the bytes of ``snapshot``, or ``None`` (compared in place,
    nothing copied out of the shared memory)."""
    return last_good.store.verdicts_on({last_good.name: snapshot.parts}).get(last_good.name)


def _asked_leaf(last_good: LastGood, snapshot: Snapshot) -> tuple[Leaf | None, bool]:
    """:func:`_kept_leaf` once the keeper has looked at the files (asked to), and whether it kept no verdict for
    these bytes (it refused them); ``(None, False)`` when no keeper answered."""
    if not last_good.store.ask(names=(last_good.name,)):
        return None, False
    leaf = _kept_leaf(last_good, snapshot)
    return leaf, leaf is None


class LastGood(FrozenRecord):
    """The newest identity a server served under one name, and how to build a context from it.

    Attributes:
        store: where the identity is kept.
        recipe_for: the server's recipe, aimed at other paths.
        name: the name it is kept under: :data:`~tlsreload_plugins.lastgood.store.DEFAULT` for the configured
            identity, an SNI identity's name for that identity.
    """

    _fields = ("store", "recipe_for", "name")
    __slots__ = _fields
    store: SharedStore
    recipe_for: RecipeFor
    name: str

    def __init__(self, store: SharedStore, recipe_for: RecipeFor, name: str = DEFAULT) -> None:
        self._set(store, recipe_for, name)

    def remember(self, snapshot: Snapshot, leaf: Leaf | None = None) -> None:
        """Keep ``snapshot`` as the newest served identity of :attr:`name`, ``leaf`` its validation's verdict."""
        self.store.write(snapshot, self.name, leaf)

    def refusal(self, snapshot: Snapshot, password: Password) -> InvalidIdentity | None:
        """The refusal validation found for exactly ``snapshot``'s bytes and ``password`` in another process of
        the server (or this one), when the store keeps it for :attr:`name`: raise it rather than parse them again."""
        if not self.store.refuses(self.name):  # the usual case: no digest of the bytes to work out
            return None
        return self.store.refusal(self.name, content_key(snapshot, password))

    def recall(self, files: TLSFiles, password: Password, now: float) -> tuple[Snapshot, Leaf]:
        """The kept identity, carrying ``files`` (its bytes are the kept ones, so a reloader compares what is
        on disk with what it serves as usual), and its leaf (:func:`verdict`), its dates judged at ``now``.

        Raises:
            InvalidIdentity: nothing is kept, or what is kept is no longer usable (expired, say).
        """
        parts = self.store.read(self.name)
        if parts is None:
            raise InvalidIdentity("no certificate was served by this server before")
        snapshot = Snapshot(files, *parts)
        leaf = verdict(snapshot, password, self)
        try:
            judge_period(leaf, files, datetime.fromtimestamp(now, timezone.utc))
        except InvalidIdentity:
            raise InvalidIdentity(
                f"the last good certificate (serial {leaf.serial}) is outside its validity period "
                f"({leaf.not_before.isoformat()} to {leaf.not_after.isoformat()})"
            ) from None
        return snapshot, leaf

    def context(self, snapshot: Snapshot) -> ssl.SSLContext:
        """A context built by :attr:`recipe_for` from the kept identity ``snapshot`` (:meth:`recall`).

        Raises:
            InvalidIdentity: the recipe refused it.
        """
        with in_memory_files(*snapshot.parts) as paths:
            try:
                context = self.recipe_for(paths)
                if paths.crl:
                    check_revocation(context, paths.crl)
                return context
            except Exception as e:
                raise InvalidIdentity(f"the last good certificate could not be loaded: {type(e).__name__}: {e}") from e


def keep_newest_valid(
    identities: Callable[[], Mapping[str, TLSFiles]], password: Password, store: SharedStore, interval: float
) -> threading.Thread:
    """Keep ``store`` holding the newest valid identity of each name ``identities()`` gives (the
    configured identity under :data:`DEFAULT`, and every SNI identity found now), with the leaf
    each validation found: checked at once, then every ``interval`` seconds and whenever a worker
    :meth:`asks <SharedStore.ask>`, in a daemon thread; returns the thread. A name no longer given
    is forgotten.

    For the parent of a server that starts its workers with ``spawn`` (uvicorn's ``--workers``,
    hypercorn's), before it starts them: they share the store, and take the verdicts found here
    instead of having each new pair validated again for each of them. A thread is safe in such a
    parent: its children start as fresh interpreters, not as a bare ``fork()`` of it. Where the store
    cannot be shared with them (:func:`shared_with_spawned_processes`), one WARNING says so: each
    worker then gets a copy of the store when it starts, and judges new content itself.

    The keeper validates in one child it keeps between passes (a
    :class:`~tlsreload_plugins.validation.child.Resident`), which leaves once it has waited
    :data:`~tlsreload_plugins.validation.child.RESIDENT_IDLE` seconds for new content: renewals of
    SNI identities, coming pass after pass, start Python and import ``cryptography`` once.
    """
    why_not = shared_with_spawned_processes()
    if why_not is not None:
        log.warning(
            "workers get a copy of the last good certificate when they start, and validate new certificates "
            "themselves: %s",
            why_not,
        )
    from tlsreload_plugins.validation.child import Resident  # here, not at import: see the module's description

    keeper = store.keep()
    resident = Resident()  # renewals coming pass after pass are validated by one child, not one child a pass

    # The content judged last, by name; not set for a pair refused for its dates only, which time changes.
    seen: dict[str, str] = {}
    tick = getattr(identities, "tick", None)  # sni_discovery.every_identity's: which changed since last time

    def keep_all(asked: set[str] | None) -> None:
        with keeper.one_pass():
            try:
                found, look = tick(interval) if callable(tick) else (dict(identities()), None)
            except Exception:  # an SNI directory gone: the serving processes report it
                found, look = {}, None
            for name in [name for name in seen if name not in found]:
                del seen[name]
                store.forget(name)
            if look is not None:  # those the kernel saw change, a slice of the others, those asked about, new ones
                look = None if asked is None else look | asked | {name for name in found if name not in seen}
            names = [name for name in found if look is None or name in look]
            judged, valid, refused = _keep_if_valid({name: found[name] for name in names}, password, seen, resident)
            seen.update(judged)
            store.write_many(valid)  # one write for all of them
            store.refuse_many(refused)  # before the pass ends: a worker that asked takes it, not cryptography

    def keep() -> None:
        while True:
            keep_all(keeper.wait(interval))
            resident.stop_if_idle()

    keep_all(None)  # before the server starts its first processes: each gets every verdict
    thread = threading.Thread(target=keep, name="tlsreload-last-good", daemon=True)
    thread.start()
    return thread


def keep_all_valid(identities: Mapping[str, TLSFiles], password: Password, store: SharedStore) -> dict[str, str]:
    """Validate every identity of ``identities`` (name: files) once, and keep the valid ones in ``store`` in one
    write, and the refusals in another. For the parent of a server that forks its workers (gunicorn's arbiter),
    before the first fork: each worker then takes these verdicts for the bytes it reads instead of parsing every
    chain itself (10,000 identities: about 5 s of CPU once, rather than in every worker, each restart included).
    Returns the identities refused, by name: why (the workers report them). Blocking; never raises.

    Example: ``keep_all_valid(sni.discover(sni.resolve_directories(None), ca_certs), password, store)``.
    """
    from tlsreload_plugins.validation.apart import validate_many  # here, not at import: see the module's description

    read: dict[str, Snapshot | str] = {}  # the bytes, or why they could not be read
    for name, files in identities.items():
        try:
            read[name] = read_files(files)
        except Exception as e:  # InvalidIdentity, or what nobody foresaw: the workers judge it themselves
            read[name] = str(e)
    snapshots = {name: snapshot for name, snapshot in read.items() if isinstance(snapshot, Snapshot)}
    verdicts = dict(zip(snapshots, validate_many([(s, password) for s in snapshots.values()]), strict=True))
    valid: dict[str, tuple[Snapshot, Leaf | None]] = {}
    refused: dict[str, str] = {}
    shared: dict[str, tuple[str, InvalidIdentity]] = {}  # the workers take these rather than judge the bytes again
    now = datetime.now(timezone.utc)
    for name, snapshot in read.items():
        verdict: Leaf | Exception | str = snapshot if isinstance(snapshot, str) else verdicts[name]
        if isinstance(verdict, Leaf) and isinstance(snapshot, Snapshot):
            try:
                judge_period(verdict, snapshot.files, now)
                valid[name] = (snapshot, verdict)
                continue
            except InvalidIdentity as e:
                verdict = e
        elif isinstance(verdict, InvalidIdentity) and isinstance(snapshot, Snapshot) and shareable(verdict):
            shared[name] = (content_key(snapshot, password), verdict)
        refused[name] = str(verdict)
    store.write_many(valid)
    store.refuse_many(shared)
    return refused


def _keep_if_valid(
    identities: Mapping[str, TLSFiles], password: Password, seen: Mapping[str, str], resident: Resident | None = None
) -> tuple[dict[str, str], dict[str, tuple[Snapshot, Leaf | None]], dict[str, tuple[str, InvalidIdentity]]]:
    """Of ``identities`` (name: files), the fingerprint of the content judged at each one's files (not given
    when it must be judged again: unreadable, or refused for its dates), the identities to keep: those whose
    content is new (not the one ``seen`` gives the name) and valid, and the refusals to keep for the others
    (name: :func:`content_key`, refusal), which the workers take rather than validate those bytes again. The
    new contents are validated in one batch (:func:`~tlsreload_plugins.validation.apart.validate_many`: one child
    process, ``resident`` when given, one per CPU for thousands)."""
    from tlsreload_plugins.validation.apart import validate_many  # here, not at import: see the module's description

    judged: dict[str, str] = {}
    new: dict[str, tuple[Snapshot, str]] = {}
    for name, files in identities.items():
        try:
            snapshot = read_files(files)
            current = fingerprint(snapshot)
        except Exception:  # the serving processes report what is wrong; nothing is served here
            continue
        if current == seen.get(name):
            judged[name] = current
        else:
            new[name] = (snapshot, current)
    kept: dict[str, tuple[Snapshot, Leaf | None]] = {}
    refused: dict[str, tuple[str, InvalidIdentity]] = {}
    now = datetime.now(timezone.utc)
    leaves = validate_many([(snapshot, password) for snapshot, _ in new.values()], resident)
    for (name, (snapshot, current)), leaf in zip(new.items(), leaves, strict=True):
        if isinstance(leaf, InvalidIdentity):
            judged[name] = current  # unusable content is not parsed again on every check
            if shareable(leaf):
                refused[name] = (content_key(snapshot, password), leaf)
            continue
        try:
            judge_period(leaf, snapshot.files, now)
        except InvalidIdentity:
            continue
        judged[name] = current
        kept[name] = (snapshot, leaf)
        log.debug(
            "processes started from now on get serial %s%s if the files are unusable then",
            leaf.serial,
            f" for SNI identity {name}" if name else "",
        )
    return judged, kept, refused
