"""Where identities are validated: in a short-lived child process, so that a serving process never loads
``cryptography``; or in this process.

Parsing a certificate chain and a key takes ``cryptography``, whose import costs a process memory it keeps
until it exits, although a server validates only when its files change. So a serving process hands the bytes to
a child (:mod:`tlsreload_plugins.validation.child`), which runs :func:`~tlsreload_plugins.identity.validate` on
each identity and exits. The verdicts are ``identity.validate``'s own: a :class:`~tlsreload_plugins.identity.Leaf`,
or an :class:`~tlsreload_plugins.errors.InvalidIdentity` with the same message and path.

* :func:`validate_many` judges any number of identities with one child, or thousands (SNI discovery at start)
  with one child per CPU at once; :func:`validate` is ``identity.validate``'s contract for one;
  :func:`prejudged` judges a batch ahead of the checks that will ask for those verdicts one by one.
* Where: in a child, unless this process has loaded cryptography's bindings already (tests, ``tlsreload
  check``, the demo: the memory is spent, and a child would only cost time). ``$TLSRELOAD_VALIDATE``
  (:data:`VALIDATE_ENV`) = ``process`` or ``inline`` forces either. A direct call of ``identity.validate``
  always runs in the calling process.
* When no child can be started (no ``sys.executable``, a process limit, a child that cannot import
  ``cryptography``), validation runs in this process from then on, and one WARNING says why.
* A child that takes longer than :data:`~tlsreload_plugins.validation.child.ITEM_WAIT` over one identity (a
  hostile file) is killed: that identity is refused, its files named, and a new child judges the rest. Such a
  refusal (or one for a child that ended without a verdict) is an :class:`Unjudged`: not a verdict on the bytes.

A child costs the time and CPU of starting Python and importing ``cryptography``, then little per identity
(docs/benchmarks.md has the figures). Blocking: call it where a check runs, never on an event loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tlsreload_plugins import identity
from tlsreload_plugins.errors import InvalidIdentity, Unjudged
from tlsreload_plugins.files import Password, Snapshot, password_bytes
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.validation.child import (
    ChildUnavailable,
    Verdict,
    unforeseen,
    validate_in_child,
)
from tlsreload_plugins.validation.process import original

__all__ = ["PER_CHILD", "VALIDATE_ENV", "Unjudged", "apart", "batched", "prejudged", "validate", "validate_many"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.validate_apart")

VALIDATE_ENV = "TLSRELOAD_VALIDATE"
"""``process``: always validate in a child; ``inline``: always in this process; unset: in a child unless this
process has loaded cryptography's bindings already."""

_BINDINGS = "cryptography.hazmat.bindings._rust"

PER_CHILD = 500
"""The fewest identities :func:`validate_many` gives each child when it splits a batch: starting a child (importing
``cryptography``) costs about as much CPU as validating some hundreds of identities."""

_lock = threading.Lock()
_fallback: str | None = None
"""Why no child could be started (validation runs in this process since), or ``None``."""
_bad_setting_logged = False
_Key = tuple[
    str, "str | None", "str | None", "str | None", bytes, "bytes | None", "bytes | None", "bytes | None", "bytes | None"
]
"""What a verdict of :func:`prejudged` is for: the paths and bytes of a :class:`Snapshot`, and the password's bytes,
flat (a tuple of built-in values hashes without a Python call per field: a batch holds thousands)."""

_verdicts: dict[_Key, Verdict] = {}
"""The verdicts of :func:`prejudged` blocks under way, by bytes and password."""


def apart() -> bool:
    """Whether validation runs in a child now (see the module's description)."""
    global _bad_setting_logged
    if _fallback is not None:
        return False
    setting = os.environ.get(VALIDATE_ENV, "").strip().lower()
    if setting in ("process", "inline"):
        return setting == "process"
    if setting and not _bad_setting_logged:
        _bad_setting_logged = True
        log.warning("%s must be process or inline, got %r: ignored", VALIDATE_ENV, setting)
    return _BINDINGS not in sys.modules


def batched(count: int) -> bool:
    """Whether a batch of ``count`` identities is judged ahead, in children (:func:`prejudged`): always where validation
    runs in a child (:func:`apart`); where it runs in this process (a server's reader, which has loaded
    ``cryptography``), when the batch is large enough to be split across this process's CPUs, one part judged here
    and each other in a child at once (thousands of SNI identities at a reader's start), unless ``$TLSRELOAD_VALIDATE``
    says ``inline`` or no child could be started."""
    if apart():
        return True
    if _fallback is not None or os.environ.get(VALIDATE_ENV, "").strip().lower() == "inline":
        return False
    return _parts(count) >= 2


def _parts(count: int) -> int:
    """How many parts a batch of ``count`` identities is split into: one per CPU, each of :data:`PER_CHILD` or more."""
    return min(_cpus(), count // PER_CHILD)


def validate(snapshot: Snapshot, password: Password = None) -> Leaf:
    """:func:`~tlsreload_plugins.identity.validate`, run where :func:`apart` says (a verdict a :func:`prejudged`
    block found for exactly these bytes and password is taken as it is).

    Raises:
        InvalidIdentity: as ``validate`` does, with the same message; or naming the files when a child judging
            them was stopped (:data:`~tlsreload_plugins.validation.child.ITEM_WAIT`).
    """
    verdict = _prejudged(snapshot, password)
    if verdict is None:
        if not apart():
            return identity.validate(snapshot, password)
        verdict = validate_many([(snapshot, password)])[0]
    if isinstance(verdict, InvalidIdentity):
        raise type(verdict)(str(verdict), path=verdict.path)  # Unjudged stays Unjudged
    return verdict


def validate_many(items: Sequence[tuple[Snapshot, Password]]) -> list[Verdict]:
    """The verdict on each identity of ``items`` (bytes, key password), in order: judged by one child when
    :func:`apart`, else in this process; a batch large enough to be split (:func:`batched`: :data:`PER_CHILD`
    identities or more per CPU this process may use) is judged in parts at once, each by a child, or, where
    validation runs in this process, the first part here and each other by a child. Blocking; never raises for what
    the bytes hold (an error nobody foresaw is a refusal naming the files).

    Example: ``validate_many([(read_files(files), None) for files in found.values()])``.
    """
    parts = _parts(len(items)) if batched(len(items)) else 1
    if parts < 2:
        return _in_a_child(items)
    size = -(-len(items) // parts)
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    here = not apart()
    work = [functools.partial(_in_a_child, chunk, here=here and index == 0) for index, chunk in enumerate(chunks)]
    return [verdict for verdicts in _at_once(work) for verdict in verdicts]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _at_once(work: Sequence[Callable[[], list[Verdict]]]) -> list[list[Verdict]]:
    """What each of ``work`` returns, the first run in this thread and each other in a native thread of its own
    (started and joined with the functions gevent's monkey-patching left alone: checks call this from native
    threads, gevent's threadpool included, and a gunicorn arbiter before it forks: no thread outlives it)."""
    start, allocate_lock = original("_thread", "start_new_thread"), original("_thread", "allocate_lock")
    results: list[list[Verdict] | BaseException | None] = [None] * len(work)
    ended = [allocate_lock() for _ in work[1:]]

    def run(index: int) -> None:
        try:
            results[index] = work[index]()
        except BaseException as e:  # handed to the caller
            results[index] = e
        finally:
            if index:
                ended[index - 1].release()

    for index, lock in enumerate(ended, start=1):
        lock.acquire()
        start(run, (index,))
    run(0)
    for lock in ended:
        lock.acquire()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [result or [] for result in results if not isinstance(result, BaseException)]


def _in_a_child(items: Sequence[tuple[Snapshot, Password]], *, here: bool | None = None) -> list[Verdict]:
    """:func:`validate_many` with one child (a new one for the rest after one stopped over an identity); ``here``:
    in this process instead (default: where :func:`apart` says)."""
    global _fallback
    verdicts: list[Verdict] = []
    in_a_child = apart() if here is None else not here
    if items and in_a_child and _fallback is None:
        try:
            while len(verdicts) < len(items):  # a child stopped over one identity: a new one for the rest
                rest = items[len(verdicts) :]
                verdicts += validate_in_child(rest)
        except ChildUnavailable as e:
            with _lock:
                first, _fallback = _fallback is None, _fallback or str(e)
            if first:
                log.warning("identities are validated in this process from now on (cryptography loaded): %s", e)
    return verdicts + [_inline(snapshot, password) for snapshot, password in items[len(verdicts) :]]


def _inline(snapshot: Snapshot, password: Password) -> Verdict:
    try:
        return identity.validate(snapshot, password)
    except InvalidIdentity as e:
        return e
    except Exception as e:  # validate lets nothing else escape: a bug, reported as the child reports it
        return unforeseen(snapshot.files, e)


@contextlib.contextmanager
def prejudged(
    items: Sequence[tuple[Snapshot, Password]], run: Callable[[Callable[[], Any]], Any] | None = None
) -> Iterator[None]:
    """Judge ``items`` now, in one child (:func:`validate_many`), and let :func:`validate` take those verdicts, from
    any thread, until the block ends: for a caller about to check many identities one by one. ``run(work)``
    runs the validation elsewhere (gevent's threadpool ``apply``: off the hub). Does nothing when validation
    runs in this process and the batch is too small to split across CPUs (:func:`batched`: each is judged when
    asked, if at all)."""
    if not items or not batched(len(items)):
        yield
        return
    keys = [_key(snapshot, password) for snapshot, password in items]
    verdicts: list[Verdict] = run(lambda: validate_many(items)) if run is not None else validate_many(items)
    added = []
    with _lock:
        for key, verdict in zip(keys, verdicts, strict=True):
            if key is not None and key not in _verdicts:
                _verdicts[key] = verdict
                added.append(key)
    try:
        yield
    finally:
        with _lock:
            for key in added:
                _verdicts.pop(key, None)


def _key(snapshot: Snapshot, password: Password) -> _Key | None:
    try:
        secret = password_bytes(password)
    except Exception:  # an unreadable password file: judged when asked
        return None
    files = snapshot.files
    return files.certfile, files.keyfile, files.ca_certs, files.crl, *snapshot.parts, secret


def _prejudged(snapshot: Snapshot, password: Password) -> Verdict | None:
    if not _verdicts:
        return None
    key = _key(snapshot, password)
    with _lock:
        return _verdicts.get(key) if key is not None else None
