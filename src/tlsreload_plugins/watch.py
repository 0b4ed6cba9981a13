"""``tlsreload watch``: validate each certificate rotation, then tell a server whose TLS is not in Python to reload.

For servers that reload their certificate on a signal or a command (granian, nginx, haproxy, envoy, ...)::

    tlsreload watch --certfile C --keyfile K (--pid PID | --pid-file F | --exec CMD) [--signal HUP]
    tlsreload watch --certfile C --keyfile K -- granian --interface asgi --ssl-certificate C --ssl-keyfile K app:app

The checking is the core's :class:`~tlsreload_plugins.reloader.Reloader`: its recipe builds a plain OpenSSL
server context from the files, so only a complete pair that OpenSSL itself accepts counts as a change; a torn
or half-rotated pair is waited out by its settle logic, a bad one reported once. Its ``on_reload`` callback
sends the signal or runs the command, once per change. A bad pair therefore never reaches the server.

With a child (the form after ``--``), watch keeps the last validated files in a private directory and
points the child at those copies (its arguments naming the watched files are rewritten): the server only
ever reads bytes watch validated, even when it re-reads them on its own, and even for servers that resolve
symlinks once at start (granian does; see docs/watch.md). Signals TERM, INT, HUP and QUIT sent to watch are
forwarded to the child, and watch exits with the child's status (128+N when a signal N killed it).

Exit status: the child's status; 0 after SIGTERM/SIGINT without a child; 1 when the files are not usable at
start; 2 for a bad command line; 126/127 when the command cannot be run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import logging
import os
import select
import shlex
import shutil
import signal
import ssl
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from .identity import InvalidIdentity, Leaf, Password, Snapshot, TLSFiles, password_file, read_files, validate
from .reloader import INTERVAL_ENV, Outcome, Reloader, resolve_interval

__all__ = ["add_parser", "run"]

log = logging.getLogger("tlsreload_plugins.watch")

EXIT_UNUSABLE = 1
EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)

EXEC_TIMEOUT = 60.0
"""Seconds an ``--exec`` command may run before it (and its process group) is killed."""

ENV_CERTFILE = "TLSRELOAD_CERTFILE"
ENV_KEYFILE = "TLSRELOAD_KEYFILE"
ENV_CA_CERTS = "TLSRELOAD_CA_CERTS"
ENV_SERIAL = "TLSRELOAD_SERIAL"

_COPY_NAMES = {"cert": "cert.pem", "key": "key.pem", "ca": "ca.pem"}


class UsageError(Exception):
    """A command line or set-up that cannot work (exit status 2)."""


# --- the last validated files, in a private directory ------------------------------------------------


class Copies:
    """The last validated certificate, key and CA bundle, kept where only this user can read them.

    ``stage`` writes a snapshot next to the live copies (0600, in a 0700 directory, never following a
    symlink); ``promote`` renames the staged files over the live ones. A temporary directory (the
    default) is removed by :meth:`remove`; a directory given with ``--copy-dir`` is the server's
    configuration and keeps the live copies (only staged leftovers are removed).
    """

    def __init__(self, directory: str | None, files: TLSFiles) -> None:
        if directory is None:
            try:
                self.path = tempfile.mkdtemp(prefix="tlsreload-watch-")  # mode 0700
            except OSError as e:
                raise UsageError(
                    f"cannot create a private directory for the copies in {tempfile.gettempdir()}: "
                    f"{e.strerror or e}; set $TMPDIR, or give --copy-dir DIR or --no-copy"
                ) from None
            self.temporary = True
        else:
            self.path = os.path.abspath(directory)
            self.temporary = False
            self._prepare(self.path)
        self.files = TLSFiles(
            os.path.join(self.path, _COPY_NAMES["cert"]),
            os.path.join(self.path, _COPY_NAMES["key"]) if files.keyfile else None,
            os.path.join(self.path, _COPY_NAMES["ca"]) if files.ca_certs else None,
        )
        self._staged: list[tuple[str, str]] = []

    @staticmethod
    def _prepare(path: str) -> None:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise UsageError(f"cannot create the copy directory {path}: {e.strerror or e}") from None
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"the copy directory {path} is not a directory (symlinks are refused)")
        if info.st_uid != os.geteuid():
            raise UsageError(f"the copy directory {path} belongs to uid {info.st_uid}, not to this user")
        if info.st_mode & 0o077:
            raise UsageError(
                f"the copy directory {path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
                "it will hold a private key: make it private (chmod 700) or give a new path"
            )

    def stage(self, snapshot: Snapshot) -> TLSFiles:
        """Write ``snapshot`` beside the live copies; returns the staged paths."""
        self._staged = []
        staged: dict[str, str | None] = {"cert": None, "key": None, "ca": None}
        for role, data in (("cert", snapshot.cert), ("key", snapshot.key), ("ca", snapshot.ca)):
            if data is None:
                continue
            path = os.path.join(self.path, f".{_COPY_NAMES[role]}.staged")
            _write_private(path, data)
            staged[role] = path
            self._staged.append((path, os.path.join(self.path, _COPY_NAMES[role])))
        assert staged["cert"] is not None
        return TLSFiles(staged["cert"], staged["key"], staged["ca"])

    def promote(self) -> None:
        """Make the staged files the live copies: one rename each (cert, key, CA)."""
        staged, self._staged = self._staged, []
        for source, target in staged:
            os.replace(source, target)

    def remove(self) -> None:
        """Remove the temporary directory, or only the staged leftovers of a ``--copy-dir``."""
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for name in _COPY_NAMES.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.path, f".{name}.staged"))


def _write_private(path: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def plain_context(files: TLSFiles, password: Password = None) -> ssl.SSLContext:
    """A default server context loaded from ``files``: OpenSSL itself judges the pair (as ``tlsreload check``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile, password)
    if files.ca_certs:
        context.load_verify_locations(files.ca_certs)
    return context


def copying_recipe(files: TLSFiles, copies: Copies, password: Password) -> Callable[[], ssl.SSLContext]:
    """A recipe that validates the files' bytes, stages exactly those bytes and builds the context from
    the staged copies: what gets promoted is what OpenSSL accepted, whatever happens to the originals."""

    def recipe() -> ssl.SSLContext:
        try:
            snapshot = read_files(files)
            validate(snapshot, password)
        except InvalidIdentity as e:  # the files changed since the reloader validated them
            raise ValueError(str(e)) from None
        return plain_context(copies.stage(snapshot), password)

    return recipe


# --- telling the server ------------------------------------------------------------------------------


class Notifier:
    """How the server is told that new files are in place. ``notify`` never raises."""

    undelivered = False
    """A signal that could not be delivered yet: :meth:`retry` tries again on every check."""

    def notify(self, leaf: Leaf) -> None:
        raise NotImplementedError

    def retry(self) -> None:
        """Deliver a notice that failed earlier (signals only)."""

    def describe(self) -> str:
        raise NotImplementedError


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class SignalProcess(Notifier):
    """``--pid`` / ``--pid-file``: send a signal; the pid file is read again every time."""

    def __init__(self, sig: int, pid: int | None = None, pid_file: str | None = None) -> None:
        self.sig = sig
        self.pid = pid
        self.pid_file = pid_file
        self._last_problem: str | None = None

    def describe(self) -> str:
        target = f"pid {self.pid}" if self.pid_file is None else f"the pid in {self.pid_file}"
        return f"send {_signal_name(self.sig)} to {target}"

    def _target(self) -> int:
        if self.pid_file is None:
            assert self.pid is not None
            return self.pid
        try:
            with open(self.pid_file, "rb") as f:
                text = f.read(64).strip()
        except OSError as e:
            raise OSError(f"pid file {self.pid_file} cannot be read: {e.strerror or e}") from None
        if not text.isdigit() or int(text) <= 0:
            raise OSError(f"pid file {self.pid_file} holds no process id ({text[:20]!r})")
        return int(text)

    def _deliver(self) -> None:
        pid = 0
        try:
            pid = self._target()
            os.kill(pid, self.sig)
        except ProcessLookupError:
            problem = f"no process {pid}" + (f" (from {self.pid_file})" if self.pid_file else "")
        except PermissionError:
            problem = f"not permitted to signal process {pid}"
        except OSError as e:  # the pid file
            problem = str(e)
        else:
            if self.undelivered:
                log.info("sent %s to pid %d: the new certificate reached the server", _signal_name(self.sig), pid)
            else:
                log.debug("sent %s to pid %d", _signal_name(self.sig), pid)
            self.undelivered = False
            self._last_problem = None
            return
        self.undelivered = True
        if problem != self._last_problem:  # one line per new problem, not one per retry
            self._last_problem = problem
            log.error("could not %s: %s; will retry on every check", self.describe(), problem)

    def notify(self, leaf: Leaf) -> None:
        self._deliver()

    def retry(self) -> None:
        if self.undelivered:
            self._deliver()


class RunCommand(Notifier):
    """``--exec CMD``: run a shell command after each good change; its failure is logged, not retried
    (a reload command need not be idempotent or cheap)."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.command = command
        self.env = env

    def describe(self) -> str:
        return f"run {self.command!r}"

    def notify(self, leaf: Leaf) -> None:
        env = {**os.environ, **self.env, ENV_SERIAL: leaf.serial}
        try:
            proc = subprocess.Popen(
                self.command,
                shell=True,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            log.error("--exec command %r could not be started: %s", self.command, e.strerror or e)
            return
        try:
            output, _ = proc.communicate(timeout=EXEC_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            log.error("--exec command %r did not finish within %gs; killed", self.command, EXEC_TIMEOUT)
            return
        text = output.decode(errors="replace").strip()
        if proc.returncode != 0:
            tail = " | ".join(text.splitlines()[-3:])[-400:]
            status = _describe_status(proc.returncode)
            log.error("--exec command %r failed (%s)%s", self.command, status, f": {tail}" if tail else "")
        else:
            log.debug("--exec command %r succeeded%s", self.command, f": {text[-200:]}" if text else "")


class SignalChild(Notifier):
    """The child form: send the signal to the child watch started."""

    def __init__(self, sig: int) -> None:
        self.sig = sig
        self.proc: subprocess.Popen[bytes] | None = None

    def describe(self) -> str:
        return f"send {_signal_name(self.sig)} to the child"

    def notify(self, leaf: Leaf) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return  # not started yet (the first identity) or already gone
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, self.sig)
            log.debug("sent %s to the child (pid %d)", _signal_name(self.sig), self.proc.pid)


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    return f"exit status {returncode}"


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: its exit code, or 128+N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


# --- the child -----------------------------------------------------------------------------------------


def rewrite_paths(command: Sequence[str], replacements: dict[str, str]) -> tuple[list[str], int]:
    """``command`` with every argument naming a watched file (``PATH`` or ``--opt=PATH``) pointed at its
    copy; returns the new command and how many arguments were rewritten. Paths are compared as absolute
    paths, without resolving symlinks (the user names the symlink)."""
    wanted = {os.path.abspath(original): copy for original, copy in replacements.items()}

    def replace(value: str) -> str | None:
        return wanted.get(os.path.abspath(value)) if value else None

    result = [command[0]]
    changed = 0
    for arg in command[1:]:
        new = replace(arg)
        if new is None and arg.startswith("-") and "=" in arg:
            option, _, value = arg.partition("=")
            copy = replace(value)
            new = f"{option}={copy}" if copy is not None else None
        if new is not None:
            changed += 1
        result.append(arg if new is None else new)
    return result, changed


def is_granian(command: Sequence[str]) -> bool:
    """Whether ``command`` starts granian (``granian ...`` or ``python -m granian ...``)."""
    if not command:
        return False
    if "granian" in os.path.basename(command[0]):
        return True
    return any(a == "-m" and b == "granian" for a, b in itertools.pairwise(command))


def granian_caveats(files: TLSFiles, copying: bool) -> list[str]:
    """What will go wrong with granian 2.8 and these files, as measured (see docs/watch.md)."""
    caveats = []
    if not copying:
        linked = [p for p in (files.certfile, files.keyfile, files.ca_certs) if p and _has_symlink(p)]
        if linked:
            caveats.append(
                f"granian resolves symlinks once, at start ({', '.join(linked)}): after a kubelet or certbot "
                "rotation its SIGHUP re-reads the old target (certbot) or a deleted one (kubelet: the new worker "
                "panics and granian exits). Drop --no-copy so granian reads watch's copies"
            )
    key_path = files.keyfile or files.certfile
    try:
        with open(key_path, "rb") as f:
            head = f.read(1024 * 1024)
    except OSError:
        return caveats
    if b"ENCRYPTED PRIVATE KEY-----" in head or b"Proc-Type: 4,ENCRYPTED" in head:
        caveats.append(
            f"key file {key_path} is encrypted: granian 2.8 panics on encrypted keys ('Invalid key'), with or "
            "without --ssl-keyfile-password; give granian an unencrypted key (PKCS#8, 0600)"
        )
    return caveats


def _has_symlink(path: str) -> bool:
    return os.path.realpath(path) != os.path.abspath(path)


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


PR_SET_PDEATHSIG = 1


def _child_setup(parent: int, prctl: Callable[..., int] | None) -> Callable[[], None]:
    """Runs in the child between fork and exec: its own process group (a terminal's Ctrl-C reaches only
    watch, which forwards it once), and SIGTERM when watch dies (Linux), so no server is orphaned."""

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # watch died before the line above
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


# --- the loop --------------------------------------------------------------------------------------------


@dataclass
class Options:
    """Everything ``run`` needs, decoded from the command line."""

    files: TLSFiles
    password: Password
    interval: float | None
    sig: int
    pid: int | None
    pid_file: str | None
    exec_command: str | None
    command: list[str]
    copy_dir: str | None
    copy: bool


class Watch:
    """One ``tlsreload watch`` run: the reloader, the notifier, the optional child and the signal loop."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.copies: Copies | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self._check_error_logged = False
        self.env: dict[str, str] = {}
        self.notifier: Notifier
        if options.command:
            self.notifier = SignalChild(options.sig)
        elif options.exec_command is not None:
            self.notifier = RunCommand(options.exec_command, self.env)
        else:
            self.notifier = SignalProcess(options.sig, options.pid, options.pid_file)
        self.reloader: Reloader | None = None

    # the reloader's callback: runs after a reload, outside its lock
    def _on_reload(self, old: Leaf, new: Leaf) -> None:
        if self.copies is not None:
            self.copies.promote()
        self.notifier.notify(new)

    def start_reloader(self) -> Reloader:
        files, options = self.options.files, self.options
        if options.copy:
            self.copies = Copies(options.copy_dir, files)
            recipe = copying_recipe(files, self.copies, options.password)
            served = self.copies.files
        else:
            served = files

        def recipe_plain() -> ssl.SSLContext:
            return plain_context(files, options.password)

        reloader = Reloader(
            files.certfile,
            files.keyfile,
            recipe=recipe if self.copies is not None else recipe_plain,
            ca_certs=files.ca_certs,
            password=options.password,
            interval=options.interval,
            on_reload=self._on_reload,
        )
        if self.copies is not None:
            self.copies.promote()
        self.env[ENV_CERTFILE] = served.certfile
        if served.keyfile:
            self.env[ENV_KEYFILE] = served.keyfile
        if served.ca_certs:
            self.env[ENV_CA_CERTS] = served.ca_certs
        self.reloader = reloader
        return reloader

    def start_child(self) -> int | None:
        """Start the command; returns an exit status when it cannot be started."""
        command = list(self.options.command)
        if self.copies is not None:
            originals = self.options.files
            replacements = {originals.certfile: self.copies.files.certfile}
            if originals.keyfile and self.copies.files.keyfile:
                replacements[originals.keyfile] = self.copies.files.keyfile
            if originals.ca_certs and self.copies.files.ca_certs:
                replacements[originals.ca_certs] = self.copies.files.ca_certs
            command, changed = rewrite_paths(command, replacements)
            if changed:
                log.info("%d argument(s) of the command now name the copies in %s", changed, self.copies.path)
            else:
                log.warning(
                    "no argument of the command names %s: the child does not read watch's copies unless it takes "
                    "them from $%s/$%s",
                    originals.describe(),
                    ENV_CERTFILE,
                    ENV_KEYFILE,
                )
        if is_granian(command):
            for caveat in granian_caveats(self.options.files, self.copies is not None):
                log.warning("%s", caveat)
        try:
            self.child = subprocess.Popen(
                command,
                env={**os.environ, **self.env},
                # preexec_fn is safe here: watch runs no other thread.
                preexec_fn=_child_setup(os.getpid(), _libc_prctl()),
            )
        except FileNotFoundError:
            log.error("cannot run %s: command not found", command[0])
            return EXIT_NOT_FOUND
        except PermissionError:
            log.error("cannot run %s: permission denied", command[0])
            return EXIT_CANNOT_EXECUTE
        except OSError as e:
            log.error("cannot run %s: %s", command[0], e.strerror or e)
            return EXIT_CANNOT_EXECUTE
        assert isinstance(self.notifier, SignalChild)
        self.notifier.proc = self.child
        log.info("started the child (pid %d): %s", self.child.pid, shlex.join(command))
        return None

    def check(self, settle: bool = True) -> Outcome | None:
        assert self.reloader is not None
        try:
            outcome = self.reloader.check(settle=settle)
        except Exception:  # a bug must not end the checking silently
            if not self._check_error_logged:
                self._check_error_logged = True
                log.exception("unexpected error while checking %s; will keep checking", self.options.files.describe())
            return None
        self.notifier.retry()
        return outcome

    def on_signal(self, sig: int) -> None:
        name = _signal_name(sig)
        if self.child is None:
            if sig in STOPPING:
                log.info("%s received: stopping", name)
                self.stopping = True
            elif sig == signal.SIGHUP:
                log.info("SIGHUP received: checking the files now")
                self.check(settle=False)
            return
        if self.stopping and sig == signal.SIGHUP:
            log.debug("SIGHUP while the child stops: not forwarded")
            return
        if sig == signal.SIGHUP:
            outcome = self.check(settle=False)
            if outcome is Outcome.RELOADED and self.options.sig == signal.SIGHUP:
                return  # the reload has just sent SIGHUP
            if outcome in (Outcome.FAILED, Outcome.PENDING, None) and self.copies is None:
                log.warning(
                    "SIGHUP not forwarded: the files on disk are not usable, and the child reads them directly; "
                    "it keeps serving its current certificate"
                )
                return
        if sig in STOPPING:
            self.stopping = True
        log.info("%s received: forwarding it to the child (pid %d)", name, self.child.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, sig)

    def loop(self, wakeup: int) -> int:
        assert self.reloader is not None
        interval = self.reloader.interval
        next_check = _now() + interval
        while True:
            if self.child is not None:
                returncode = self.child.poll()
                if returncode is not None:
                    status = exit_status(returncode)
                    log.info(
                        "the child (pid %d) ended: %s; exiting %d", self.child.pid, _describe_status(returncode), status
                    )
                    return status
            elif self.stopping:
                return 0
            if not self.stopping and _now() >= next_check:
                self.check()
                next_check = _now() + interval
            # Wait for a signal (SIGCHLD included) or the next check; 1 s at most as a safety net.
            timeout = 1.0 if self.stopping else min(1.0, max(0.0, next_check - _now()))
            readable, _, _ = select.select([wakeup], [], [], timeout)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    for sig in os.read(wakeup, 256):
                        if sig != signal.SIGCHLD:
                            self.on_signal(sig)

    def run(self) -> int:
        try:
            reloader = self.start_reloader()
        except InvalidIdentity as e:
            log.error("NOT USABLE: %s", e)
            return EXIT_UNUSABLE
        except ValueError as e:  # $TLSRELOAD_INTERVAL that is not a number
            raise UsageError(str(e)) from None
        log.info("%s", reloader.describe())
        if self.copies is not None:
            served = f"validated copies in {self.copies.path} ({self.copies.files.describe()})"
        else:
            served = "the files themselves"
        log.info("on each valid change: %s; the server reads %s", self.notifier.describe(), served)
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        watched = (*FORWARDED, signal.SIGCHLD)
        previous = {sig: signal.getsignal(sig) for sig in watched}
        old_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        try:
            for sig in watched:
                signal.signal(sig, _note_signal)  # the byte on the wake-up pipe is what counts
            if self.options.command:
                failed = self.start_child()
                if failed is not None:
                    return failed
            return self.loop(read_end)
        finally:
            self._stop_child()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(sig, handler)
            os.close(read_end)
            os.close(write_end)

    def cleanup(self) -> None:
        if self.copies is not None:
            self.copies.remove()

    def _stop_child(self) -> None:
        """Leaving while the child runs (an error in watch): stop it rather than orphan it."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        log.error("watch is leaving while the child (pid %d) runs: sending it SIGTERM", child.pid)
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _note_signal(signum: int, frame: FrameType | None) -> None:
    """Installed so the C-level handler writes the signal number to the wake-up pipe; nothing else to do."""


def _now() -> float:
    return time.monotonic()


# --- command line ----------------------------------------------------------------------------------------


def parse_signal(value: str) -> int:
    """``HUP``, ``SIGHUP``, ``hup`` or ``1`` -> 1."""
    text = value.strip().upper()
    if text.isdigit():
        number = int(text)
        if 0 < number < signal.NSIG:
            return number
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        with contextlib.suppress(KeyError):
            return int(signal.Signals[name])
    raise argparse.ArgumentTypeError(f"not a signal: {value!r} (try HUP, USR1, USR2 or a number)")


def _pid(value: str) -> int:
    if not value.isdigit() or int(value) <= 1:
        raise argparse.ArgumentTypeError(f"expected a process id > 1, got {value!r}")
    return int(value)


def _positive_seconds(value: str) -> float:
    try:
        return resolve_interval(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}") from None


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``watch`` to ``tlsreload``'s sub-commands (``commands`` is what ``add_subparsers`` returned)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "watch",
        help="validate rotations and signal a server whose TLS is not in Python (granian, nginx, ...)",
        description="Check the certificate files every --interval seconds; after each change to a complete, "
        "valid pair, signal the server (--pid, --pid-file), run a command (--exec), or signal the child given "
        "after '--'. A torn, mismatched or missing pair never reaches the server. With a child, watch serves it "
        "validated copies of the files and forwards TERM, INT, HUP and QUIT. Exit: the child's status (128+N "
        "when killed by signal N); 1 files unusable at start; 2 bad command line.",
        epilog="example: tlsreload watch --certfile tls.crt --keyfile tls.key -- "
        "granian --interface asgi --ssl-certificate tls.crt --ssl-keyfile tls.key app:app",
    )
    parser.add_argument("--certfile", required=True, metavar="PATH", help="certificate chain (PEM), leaf first")
    parser.add_argument("--keyfile", metavar="PATH", help="private key (PEM); omit when it is in --certfile")
    parser.add_argument("--ca-certs", metavar="PATH", help="client CA bundle (PEM) the server verifies clients with")
    parser.add_argument("--password-file", metavar="PATH", help="file whose first line is the key's password")
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        metavar="SECONDS",
        help=f"seconds between checks (default: ${INTERVAL_ENV}, else 1)",
    )
    parser.add_argument(
        "--signal", type=parse_signal, default=int(signal.SIGHUP), metavar="SIG", help="signal to send (default: HUP)"
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--pid", type=_pid, metavar="PID", help="signal this process after each valid change")
    target.add_argument(
        "--pid-file", metavar="PATH", help="signal the process whose id is in PATH (read again every time)"
    )
    target.add_argument(
        "--exec",
        dest="exec_command",
        metavar="CMD",
        help=f"run this shell command after each valid change (e.g. 'nginx -s reload'); ${ENV_CERTFILE}, "
        f"${ENV_KEYFILE} and ${ENV_SERIAL} are set; a failure is logged",
    )
    copying = parser.add_mutually_exclusive_group()
    copying.add_argument(
        "--copy-dir",
        metavar="DIR",
        help="keep the last validated files in DIR (created 0700; files 0600, replaced atomically, kept at exit) "
        "and point the server there; with a child the default is a temporary directory removed at exit",
    )
    copying.add_argument(
        "--no-copy", action="store_true", help="let the child read the original files (see docs/watch.md)"
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="default: info"
    )
    parser.add_argument("child", nargs="*", metavar="-- COMMAND", help="run COMMAND as the child")
    parser.set_defaults(watch_parser=parser)
    return parser


def options_from(args: argparse.Namespace) -> Options:
    """Decode and cross-check the parsed arguments; raises :class:`UsageError`."""
    command = list(args.child or [])
    targets = [args.pid is not None, args.pid_file is not None, args.exec_command is not None, bool(command)]
    if sum(targets) != 1:
        raise UsageError("say what to tell: --pid PID, --pid-file PATH, --exec CMD, or -- COMMAND (exactly one)")
    if args.no_copy and not command:
        raise UsageError("--no-copy is for the child form (-- COMMAND): without a child nothing is copied by default")
    password: Password = None
    if args.password_file:
        password = password_file(args.password_file)
    return Options(
        files=TLSFiles(args.certfile, args.keyfile or None, args.ca_certs or None),
        password=password,
        interval=args.interval,
        sig=args.signal,
        pid=args.pid,
        pid_file=args.pid_file,
        exec_command=args.exec_command,
        command=command,
        copy_dir=args.copy_dir,
        copy=bool(args.copy_dir) or (bool(command) and not args.no_copy),
    )


_LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """tlsreload's lines on stderr, one per event, at ``level`` (the child's output is its own)."""
    package = logging.getLogger("tlsreload_plugins")
    if not package.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        package.addHandler(handler)
        package.propagate = False
    package.setLevel(level.upper())


def run(args: argparse.Namespace) -> int:
    """``tlsreload watch``: returns the exit status."""
    parser: argparse.ArgumentParser | None = getattr(args, "watch_parser", None)
    configure_logging(args.log_level)
    try:
        options = options_from(args)
    except UsageError as e:
        if parser is not None:
            parser.print_usage(sys.stderr)
        print(f"tlsreload watch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    watch = Watch(options)
    try:
        return watch.run()
    except UsageError as e:
        print(f"tlsreload watch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        watch.cleanup()
