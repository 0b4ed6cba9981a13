"""The child process that validates identities for :mod:`tlsreload_plugins.validation.apart`: how it is started,
fed, read, stopped and reaped (:func:`validate_in_child`), and what it runs (:func:`serve`).

The conversation: the parent starts ``sys.executable -I -S -c BOOT DIR`` with ``os.posix_spawn``, three pipes as
its standard streams and no other descriptor. It writes its ``sys.path`` as one JSON line, then the identities
in groups (:func:`~tlsreload_plugins.validation.process.frames`): per group one JSON line (the paths, the sizes of
each certificate, key, CA bundle, CRL and password bytes, and the error reading a password raised, if it did),
followed by those bytes end to end: secrets go through the pipe, never through arguments or the environment.
The child imports ``cryptography``, answers ``{"ready": true}``, then one JSON line per identity, in order:
``["leaf", ...]`` or ``["invalid", message, path]``. It leaves at the end of its input. Nothing it writes is
unpickled or executed.

The parent's CPU goes to waking and parsing, so it does little of either per identity: a group has one header
and one write, the pipe is written to when the child has taken something (:data:`FEED_PAUSE`), verdicts gather
a while (:data:`BATCH_PAUSE`) and one read's are one ``json.loads``.

BOOT imports this module without the package's ``__init__`` (which imports the whole core, a good part of the
child's start), from the directory this file is in, so the child runs exactly the parent's code; ``-I -S``
skip ``site`` and the environment's ``PYTHON*`` settings, and the parent's ``sys.path`` finds ``cryptography``
where the parent would.

Deadlines: :data:`START_WAIT` for the child to be ready, then :data:`ITEM_WAIT` between two verdicts; a child
past either is killed (``SIGKILL``) and reaped. The reap tolerates a child someone else reaped (a server's or
gevent's ``SIGCHLD`` handler). Only functions gevent's monkey-patching leaves alone are used (taken from
``gevent.monkey.get_original`` when it is loaded, by :mod:`tlsreload_plugins.validation.process`): checks call this
from native threads, gevent's hub threadpool included, where the cooperative versions must not be used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from tlsreload_plugins.errors import InvalidIdentity, Unjudged
from tlsreload_plugins.files import Password, Snapshot, TLSFiles
from tlsreload_plugins.identity import Leaf, validate
from tlsreload_plugins.validation.process import above_stdio, ended, frames, inherited, original, select_flag, widen

__all__ = [
    "ITEM_WAIT",
    "START_WAIT",
    "ChildUnavailable",
    "Verdict",
    "serve",
    "unforeseen",
    "validate_in_child",
]

START_WAIT = 30.0
"""Seconds a child may take to start and import ``cryptography`` (far less, even on a loaded machine) before it is
given up on."""

ITEM_WAIT = 10.0
"""Seconds a child may take over one identity (milliseconds: validation is linear in the files' size) before it
is killed and that identity refused."""

BATCH_PAUSE = 0.05
"""The most seconds the parent waits after reading verdicts of a batch not yet complete, so that it reads many at
once (the child writes each as soon as it has it, so that a stall is charged to the identity that caused it): a
millisecond per identity still to judge (about what one costs the child), so the end of a batch is not waited
past, nor is the parent woken for every verdict."""

FEED_PAUSE = 0.02
"""Seconds the parent waits, when the child's pipe is full and no verdict came meanwhile, before it writes to it
again (a verdict is the sign the child has read more; polling the pipe for room woke the parent for each 4 KiB
the child read)."""

_PIPE_BYTES = 1 << 20
"""What the pipe into the child is asked to hold (Linux's default limit for a process; the default is 64 KiB): the
parent writes a group or more while the child imports ``cryptography``, and wakes less often to write the rest."""

Verdict = Leaf | InvalidIdentity
"""What validation finds for one identity."""

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tlsreload_plugins/, above validation/
_BOOT = (
    "import json, sys, types\n"
    "package = types.ModuleType('tlsreload_plugins')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['tlsreload_plugins'] = package\n"
    "sys.path[:] = json.loads(sys.stdin.buffer.readline())['path']\n"
    "from tlsreload_plugins.validation.child import serve\n"
    "serve(sys.stdin.buffer, sys.stdout.buffer)\n"
)


class ChildUnavailable(Exception):
    """No child could be started to validate, or it ended or stalled before it was ready: ``str()`` says why."""


def unforeseen(files: TLSFiles, e: Exception) -> InvalidIdentity:
    """The refusal of ``files`` for an error ``validate`` let escape (it lets none: a bug), naming the files."""
    return InvalidIdentity(f"{files.describe()} cannot be validated: {type(e).__name__}: {e}", path=files.certfile)


# -- the parent's side ------------------------------------------------------------------------------------------


def validate_in_child(
    items: Sequence[tuple[Snapshot, Password]],
    *,
    command: Sequence[str] | None = None,
    start_wait: float = START_WAIT,
    item_wait: float = ITEM_WAIT,
) -> list[Verdict]:
    """Start one child and have it judge ``items`` in order: the verdicts it gave, all of them, or those up to one
    it took longer than ``item_wait`` seconds over (killed; that identity refused) or ended without (crashed).
    ``command``: the child's command line (default: this Python running :func:`serve`). The child is reaped.

    Raises:
        ChildUnavailable: no child started, or it ended or took longer than ``start_wait`` before it was ready.
    """
    if not items:
        return []
    return _started(command).judge(items, start_wait, item_wait)


def _started(command: Sequence[str] | None) -> _Talk:
    """A new child, its standard streams three pipes of this process (see the module's description).

    Raises:
        ChildUnavailable: it could not be started.
    """
    argv = list(command) if command is not None else [sys.executable, "-I", "-S", "-c", _BOOT, _PACKAGE]
    if not argv[0]:
        raise ChildUnavailable("this Python does not know its own executable (sys.executable is empty)")
    spawn = original("os", "posix_spawn") if hasattr(os, "posix_spawn") else None
    if spawn is None:
        raise ChildUnavailable("os.posix_spawn is not available here")
    fds = [above_stdio(fd) for pair in (os.pipe(), os.pipe(), os.pipe()) for fd in pair]
    into_child, to_child, from_child, out_of_child, errors, errors_of_child = fds
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, into_child, 0), (os.POSIX_SPAWN_DUP2, out_of_child, 1)]
    actions.append((os.POSIX_SPAWN_DUP2, errors_of_child, 2))
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited()]
    close = original("os", "close")
    try:
        pid = spawn(argv[0], argv, dict(os.environ), file_actions=actions, setsigmask=())
    except OSError as e:
        for fd in fds:
            close(fd)
        raise ChildUnavailable(f"cannot start {argv[0]}: {e}") from e
    for fd in (into_child, out_of_child, errors_of_child):
        close(fd)
    widen(to_child, _PIPE_BYTES)
    return _Talk(pid, to_child, from_child, errors)


class _Talk:
    """The conversation with one child: feed it, read its verdicts, stop it when it stalls, reap it."""

    def __init__(self, pid: int, to_child: int, from_child: int, errors: int):
        self.pid, self.to_child, self.from_child, self.errors = pid, to_child, from_child, errors
        self.frames: Iterator[bytes] = iter(())
        self.count = 0
        self.closed: set[int] = set()
        self.pending = memoryview(b"")
        self.out = bytearray()
        self.err = bytearray()
        self.ready = False
        self.reaped = False
        self.verdicts: list[Verdict] = []

    def judge(self, items: Sequence[tuple[Snapshot, Password]], start_wait: float, item_wait: float) -> list[Verdict]:
        """The verdicts on ``items`` (see :func:`validate_in_child`); the child is reaped and the pipes closed."""
        self.frames = frames(items, sys.path)
        self.count, self.verdicts = len(items), []
        try:
            return self.run(items, start_wait, item_wait)
        except BaseException:  # a signal handler's exception, say: the child is not left behind
            if not self.reaped:
                self.reap(kill=True)
            raise
        finally:
            self._close_all()

    def _close_all(self) -> None:
        for fd in (self.to_child, self.from_child, self.errors):
            if fd not in self.closed:
                self._close(fd)

    def run(self, items: Sequence[tuple[Snapshot, Password]], start_wait: float, item_wait: float) -> list[Verdict]:
        os.set_blocking(self.to_child, False)
        poller = original("select", "poll")()
        for fd in (self.from_child, self.errors):
            poller.register(fd, select_flag("POLLIN"))
        deadline = time.monotonic() + (item_wait if self.ready else start_wait)
        gone, feeding, feed_at = False, True, 0.0
        pause = original("time", "sleep")
        while len(self.verdicts) < self.count and not gone:
            now = time.monotonic()
            if feeding and now >= feed_at:  # the pipe is written to when due, not woken for at each page it frees
                feeding, feed_at = self._feed(), now + FEED_PAUSE
                if not feeding:
                    self._close(self.to_child)
            left = deadline - now
            if left <= 0:
                break
            for fd, _ in poller.poll(max(1, int(1000 * (min(left, feed_at - now) if feeding else left)))):
                if fd == self.errors and not self._drain():
                    poller.unregister(fd)
                elif fd == self.from_child:
                    before = len(self.verdicts), self.ready
                    gone = not self._read()
                    if (len(self.verdicts), self.ready) != before:
                        deadline, feed_at = time.monotonic() + item_wait, 0.0  # it took what it judged: write more
                        if self.ready and 0 < len(self.verdicts) < self.count:
                            pause(min(BATCH_PAUSE, (self.count - len(self.verdicts)) / 1000))  # let them gather
        if len(self.verdicts) == self.count:
            self.reap(kill=False)
            return self.verdicts
        how = self.reap(kill=not gone)
        detail = self._stderr_tail()
        if not self.ready:
            why = how if gone else f"took longer than {start_wait:g} s"
            raise ChildUnavailable(f"{sys.executable} did not start validating ({why}){detail}")
        files = items[len(self.verdicts)][0].files
        if gone:
            reason = f"the process validating {files.describe()} ended without a verdict ({how}){detail}"
        else:
            reason = f"validating {files.describe()} took longer than {item_wait:g} s: stopped (is a file hostile?)"
        return [*self.verdicts, Unjudged(reason, path=files.certfile)]

    def _feed(self) -> bool:
        """Write what the child is ready to take; ``False`` once everything is written (or it reads no more)."""
        try:
            while True:
                if not self.pending:
                    frame = next(self.frames, None)
                    if frame is None:
                        return False
                    self.pending = memoryview(frame)
                self.pending = self.pending[os.write(self.to_child, self.pending) :]
        except BlockingIOError:
            return True
        except OSError:  # the child is gone: its verdicts so far, then the end of its output, say what happened
            return False

    def _read(self) -> bool:
        """Take the child's answers; ``False`` at the end of its output, or at an answer ``serve`` does not write."""
        data = os.read(self.from_child, 65536)
        if not data:
            return False
        self.out += data
        end = self.out.rfind(b"\n")
        if end < 0:
            return True
        lines = bytes(self.out[:end])
        del self.out[: end + 1]
        if not self.ready:
            first, _, lines = lines.partition(b"\n")
            with contextlib.suppress(ValueError):
                self.ready = json.loads(first) == {"ready": True}
            if not self.ready or not lines:
                return self.ready
        try:  # every complete line at once: one json.loads of a list
            answers = json.loads(b"[" + lines.replace(b"\n", b",") + b"]")
            if len(answers) != lines.count(b"\n") + 1:
                raise ValueError("not one answer per line")
            self.verdicts += [_verdict(answer) for answer in answers]
        except (ValueError, TypeError, KeyError, IndexError):
            for line in lines.split(b"\n"):  # one by one: the verdicts before the line that is not serve()'s
                try:
                    self.verdicts.append(_verdict(json.loads(line)))
                except (ValueError, TypeError, KeyError, IndexError):  # treated as a crash
                    return False
        return True

    def _drain(self) -> bool:
        data = os.read(self.errors, 65536)
        self.err = (self.err + data)[-2000:]
        return bool(data)

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            os.set_blocking(self.errors, False)
            with contextlib.suppress(BlockingIOError):
                while self._drain():
                    pass
        text = self.err.decode(errors="replace").strip().splitlines()
        return f": {text[-1]}" if text else ""

    def _close(self, fd: int) -> None:
        original("os", "close")(fd)
        self.closed.add(fd)

    def reap(self, kill: bool) -> str:
        """Wait for the child to end (killing it first with ``kill``, or when it lingers); how it ended."""
        waitpid, sleep = original("os", "waitpid"), original("time", "sleep")
        if self.to_child not in self.closed:
            self._close(self.to_child)  # end of input: a child waiting for more leaves
        deadline = time.monotonic() + 2.0
        while True:
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            try:
                pid, status = waitpid(self.pid, 0 if kill else os.WNOHANG)
            except ChildProcessError:  # reaped by a SIGCHLD handler (the server's, gevent's): it has ended
                self.reaped = True
                return "it ended"
            if pid:
                self.reaped = True
                return ended(status)
            kill = time.monotonic() > deadline
            sleep(0.002)


def _verdict(answer: list[Any]) -> Verdict:
    if answer[0] == "leaf":
        return Leaf.from_fields(answer[1:])
    if answer[0] != "invalid":
        raise ValueError(f"not a verdict: {answer[0]!r}")
    _, message, path = answer
    return InvalidIdentity(str(message), path=None if path is None else str(path))


# -- the child's side -------------------------------------------------------------------------------------------


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    """The child: import ``cryptography``, say so, then judge each identity ``source`` holds (see
    :func:`~tlsreload_plugins.validation.process.frames`) and write one JSON line per verdict to ``sink`` as soon as
    it has it (so that the parent's deadline is charged to the identity that stalled), until the end of
    ``source``."""
    from cryptography import x509  # noqa: F401  before "ready": the start deadline covers the import
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: F401

    def send(answer: object) -> None:
        sink.write(json.dumps(answer).encode() + b"\n")
        sink.flush()

    send({"ready": True})
    while header := source.readline():
        group = json.loads(header)
        paths, sizes = group["paths"], group["sizes"]
        for index, fault in enumerate(group["faults"]):
            cert, key, ca, crl, secret = (
                None if size is None else source.read(size) for size in sizes[5 * index : 5 * index + 5]
            )
            snapshot = Snapshot(TLSFiles(*paths[4 * index : 4 * index + 4]), cert or b"", key, ca, crl)
            password: Password = _raising(*fault) if fault else secret
            try:
                leaf = validate(snapshot, password)
            except InvalidIdentity as e:
                send(["invalid", str(e), e.path])
                continue
            except Exception as e:
                error = unforeseen(snapshot.files, e)
                send(["invalid", str(error), error.path])
                continue
            send(["leaf", *leaf.fields()])


def _raising(kind: str, message: str) -> Callable[[], bytes]:
    """A password that raises what the parent's raised (its type's name and message: what validate reports)."""
    error = type(kind, (Exception,), {})

    def password() -> bytes:
        raise error(message)

    return password


if __name__ == "__main__":
    # `python -m tlsreload_plugins.validation.child`: the same conversation (its first line is not needed here)
    sys.stdin.buffer.readline()
    serve(sys.stdin.buffer, sys.stdout.buffer)
