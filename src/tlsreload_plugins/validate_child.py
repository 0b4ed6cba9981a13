"""The child process that validates identities for :mod:`tlsreload_plugins.validate_apart`: how it is started,
fed, read, stopped and reaped (:func:`validate_in_child`), and what it runs (:func:`serve`).

The conversation: the parent starts ``sys.executable -I -S -c BOOT DIR`` with ``os.posix_spawn``, three pipes as
its standard streams and no other descriptor. It writes its ``sys.path`` as one JSON line, then per identity a JSON
line (the paths, the sizes of the certificate, key, CA bundle and password bytes, and the error reading the
password raised, if it did) followed by those bytes: secrets go through the pipe, never through arguments or
the environment. The child imports ``cryptography``, answers ``{"ready": true}``, then one JSON line per
identity, in order: ``{"leaf": [...]}`` or ``{"invalid": message, "path": path}``. It leaves at the end of its
input. Nothing it writes is unpickled or executed.

BOOT imports this module without the package's ``__init__`` (which imports the whole core: 0.14 s of the
child's 0.3 s start on a loaded 2-core machine, measured), from the directory this file is in, so the child
runs exactly the parent's code; ``-I -S`` skip ``site`` and the environment's ``PYTHON*`` settings, and the
parent's ``sys.path`` finds ``cryptography`` where the parent would.

Deadlines: :data:`START_WAIT` for the child to be ready, then :data:`ITEM_WAIT` between two verdicts; a child
past either is killed (``SIGKILL``) and reaped. The reap tolerates a child someone else reaped (a server's or
gevent's ``SIGCHLD`` handler). Only functions gevent's monkey-patching leaves alone are used (taken from
``gevent.monkey.get_original`` when it is loaded, by :mod:`tlsreload_plugins.child_process`): checks call this
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
from datetime import datetime
from typing import Any, BinaryIO

from . import child_process
from .identity import InvalidIdentity, Leaf, Password, Snapshot, TLSFiles, password_bytes, validate

__all__ = ["ITEM_WAIT", "START_WAIT", "ChildUnavailable", "Verdict", "serve", "unforeseen", "validate_in_child"]

START_WAIT = 30.0
"""Seconds a child may take to start and import ``cryptography`` (0.2 to 0.3 s on a loaded 2-core machine)
before it is given up on."""

ITEM_WAIT = 10.0
"""Seconds a child may take over one identity (milliseconds: validation is linear in the files' size) before it
is killed and that identity refused."""

BATCH_PAUSE = 0.005
"""Seconds the parent waits after reading verdicts of a batch not yet complete, so that it reads several at once
(the child writes each as soon as it has it, so that a stall is charged to the identity that caused it)."""

Verdict = Leaf | InvalidIdentity
"""What validation finds for one identity."""

# Moved to child_process, under the names they had here (validate_apart imports _original from this module).
_original = child_process.original
_above_stdio = child_process.above_stdio
_inherited = child_process.inherited
_select_flag = child_process.select_flag
_ended = child_process.ended

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_BOOT = (
    "import json, sys, types\n"
    "package = types.ModuleType('tlsreload_plugins')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['tlsreload_plugins'] = package\n"
    "sys.path[:] = json.loads(sys.stdin.buffer.readline())['path']\n"
    "from tlsreload_plugins.validate_child import serve\n"
    "serve(sys.stdin.buffer, sys.stdout.buffer)\n"
)


class Unjudged(InvalidIdentity):
    """The refusal of an identity the child stopped or ended over before its verdict (a hostile file, a crash):
    refused, as validation would not vouch for it, but not a verdict on its bytes another process may take."""


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
    argv = list(command) if command is not None else [sys.executable, "-I", "-S", "-c", _BOOT, _PACKAGE]
    if not argv[0]:
        raise ChildUnavailable("this Python does not know its own executable (sys.executable is empty)")
    spawn = _original("os", "posix_spawn") if hasattr(os, "posix_spawn") else None
    if spawn is None:
        raise ChildUnavailable("os.posix_spawn is not available here")
    fds = [_above_stdio(fd) for pair in (os.pipe(), os.pipe(), os.pipe()) for fd in pair]
    into_child, to_child, from_child, out_of_child, errors, errors_of_child = fds
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, into_child, 0), (os.POSIX_SPAWN_DUP2, out_of_child, 1)]
    actions.append((os.POSIX_SPAWN_DUP2, errors_of_child, 2))
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited()]
    close = _original("os", "close")
    try:
        pid = spawn(argv[0], argv, dict(os.environ), file_actions=actions, setsigmask=())
    except OSError as e:
        for fd in fds:
            close(fd)
        raise ChildUnavailable(f"cannot start {argv[0]}: {e}") from e
    for fd in (into_child, out_of_child, errors_of_child):
        close(fd)
    talk = _Talk(pid, to_child, from_child, errors, _frames(items), len(items))
    try:
        return talk.run(items, start_wait, item_wait)
    except BaseException:  # a signal handler's exception, say: the child is not left behind
        if not talk.reaped:
            talk.reap(kill=True)
        raise
    finally:
        for fd in (to_child, from_child, errors):
            if fd not in talk.closed:
                close(fd)


def _frames(items: Sequence[tuple[Snapshot, Password]]) -> Iterator[bytes]:
    """What the child reads: the parent's ``sys.path``, then per identity a JSON line (paths, sizes, and the error
    its password raised) followed by its bytes."""
    yield json.dumps({"path": sys.path}).encode() + b"\n"
    secrets: dict[int, tuple[bytes | None, list[str] | None]] = {}  # by password: SNI identities share one
    for snapshot, password in items:
        if id(password) not in secrets:
            try:
                secrets[id(password)] = (password_bytes(password), None)
            except Exception as e:  # raised again in the child, where validate asks for the password
                secrets[id(password)] = (None, [type(e).__name__, str(e)])
        secret, fault = secrets[id(password)]
        blobs = (snapshot.cert, snapshot.key, snapshot.ca, secret)
        files = snapshot.files
        header = {
            "files": [files.certfile, files.keyfile, files.ca_certs],
            "sizes": [None if blob is None else len(blob) for blob in blobs],
            "password_error": fault,
        }
        yield json.dumps(header).encode() + b"\n"
        yield from (blob for blob in blobs if blob)


class _Talk:
    """One conversation with one child: feed it, read its verdicts, stop it when it stalls, reap it."""

    def __init__(self, pid: int, to_child: int, from_child: int, errors: int, frames: Iterator[bytes], count: int):
        self.pid, self.to_child, self.from_child, self.errors = pid, to_child, from_child, errors
        self.frames, self.count = frames, count
        self.closed: set[int] = set()
        self.pending = memoryview(b"")
        self.out = bytearray()
        self.err = bytearray()
        self.ready = False
        self.reaped = False
        self.verdicts: list[Verdict] = []

    def run(self, items: Sequence[tuple[Snapshot, Password]], start_wait: float, item_wait: float) -> list[Verdict]:
        os.set_blocking(self.to_child, False)
        poller = _original("select", "poll")()
        poller.register(self.to_child, _select_flag("POLLOUT"))
        for fd in (self.from_child, self.errors):
            poller.register(fd, _select_flag("POLLIN"))
        deadline = time.monotonic() + start_wait
        ended = False
        pause = _original("time", "sleep")
        while len(self.verdicts) < self.count and not ended:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(max(1, int(left * 1000))):
                if fd == self.to_child and not self._feed():
                    poller.unregister(fd)
                    self._close(fd)
                elif fd == self.errors and not self._drain():
                    poller.unregister(fd)
                elif fd == self.from_child:
                    before = len(self.verdicts), self.ready
                    ended = not self._read()
                    if (len(self.verdicts), self.ready) != before:
                        deadline = time.monotonic() + item_wait
                        if self.ready and 0 < len(self.verdicts) < self.count:
                            pause(BATCH_PAUSE)  # a batch: let verdicts gather rather than wake for each line
        if len(self.verdicts) == self.count:
            self.reap(kill=False)
            return self.verdicts
        how = self.reap(kill=not ended)
        detail = self._stderr_tail()
        if not self.ready:
            why = how if ended else f"took longer than {start_wait:g} s"
            raise ChildUnavailable(f"{sys.executable} did not start validating ({why}){detail}")
        files = items[len(self.verdicts)][0].files
        if ended:
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
        """Take the child's answers; ``False`` at the end of its output."""
        data = os.read(self.from_child, 65536)
        if not data:
            return False
        self.out += data
        *lines, rest = self.out.split(b"\n")
        self.out = rest
        for line in lines:
            try:
                answer = json.loads(line)
                if not self.ready:
                    self.ready = answer == {"ready": True}
                    if not self.ready:
                        return False
                    continue
                self.verdicts.append(_verdict(answer))
            except (ValueError, TypeError, KeyError):  # not what serve() writes: treated as a crash
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
        _original("os", "close")(fd)
        self.closed.add(fd)

    def reap(self, kill: bool) -> str:
        """Wait for the child to end (killing it first with ``kill``, or when it lingers); how it ended."""
        waitpid, sleep = _original("os", "waitpid"), _original("time", "sleep")
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
                return _ended(status)
            kill = time.monotonic() > deadline
            sleep(0.002)


def _verdict(answer: dict[str, Any]) -> Verdict:
    if "invalid" in answer:
        path = answer["path"]
        return InvalidIdentity(str(answer["invalid"]), path=None if path is None else str(path))
    subject, serial, sans, not_before, not_after, sha256 = answer["leaf"]
    return Leaf(
        subject=str(subject),
        serial=str(serial),
        sans=tuple(str(name) for name in sans),
        not_before=datetime.fromisoformat(not_before),
        not_after=datetime.fromisoformat(not_after),
        sha256=str(sha256),
    )


# -- the child's side -------------------------------------------------------------------------------------------


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    """The child: import ``cryptography``, say so, then judge each identity ``source`` holds (see
    :func:`_frames`) and write one JSON line per verdict to ``sink``, until the end of ``source``."""
    from cryptography import x509  # noqa: F401  before "ready": the start deadline covers the import
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: F401

    def send(answer: object) -> None:
        sink.write(json.dumps(answer).encode() + b"\n")
        sink.flush()

    send({"ready": True})
    while header := source.readline():
        item = json.loads(header)
        blobs = [None if size is None else source.read(size) for size in item["sizes"]]
        cert, key, ca, secret = blobs
        snapshot = Snapshot(TLSFiles(*item["files"]), cert or b"", key, ca)
        fault = item["password_error"]
        password: Password = _raising(*fault) if fault else secret
        try:
            leaf = validate(snapshot, password)
        except InvalidIdentity as e:
            send({"invalid": str(e), "path": e.path})
            continue
        except Exception as e:
            error = unforeseen(snapshot.files, e)
            send({"invalid": str(error), "path": error.path})
            continue
        when = (leaf.not_before.isoformat(), leaf.not_after.isoformat())
        send({"leaf": [leaf.subject, leaf.serial, list(leaf.sans), *when, leaf.sha256]})


def _raising(kind: str, message: str) -> Callable[[], bytes]:
    """A password that raises what the parent's raised (its type's name and message: what validate reports)."""
    error = type(kind, (Exception,), {})

    def password() -> bytes:
        raise error(message)

    return password


if __name__ == "__main__":
    # `python -m tlsreload_plugins.validate_child`: the same conversation (its first line is not needed here)
    sys.stdin.buffer.readline()
    serve(sys.stdin.buffer, sys.stdout.buffer)
