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

This module runs a watch: the :class:`Watch` loop, the child and the signals. Its parts live beside it:
the command line and the child's arguments in :mod:`~tlsreload_plugins.watch.options`, the ways of telling
the server in :mod:`~tlsreload_plugins.watch.notify`, the context and the validated copies in
:mod:`~tlsreload_plugins.watch.copies`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import select
import shlex
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.outcome import Outcome
from tlsreload_plugins.publication.judging import plain_context
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.watch.copies import Copies, copying_recipe
from tlsreload_plugins.watch.notify import (
    ENV_CA_CERTS,
    ENV_CERTFILE,
    ENV_KEYFILE,
    Notifier,
    RunCommand,
    SignalChild,
    SignalProcess,
    exit_status,
    signal_name,
    status_description,
)
from tlsreload_plugins.watch.options import (
    Options,
    UsageError,
    add_parser,
    configure_logging,
    granian_caveats,
    is_granian,
    options_from,
    rewrite_paths,
)

__all__ = ["add_parser", "run"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.watch")

EXIT_UNUSABLE = 1
EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


# --- the child -----------------------------------------------------------------------------------------


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


class Watch:
    """One ``tlsreload watch`` run: the reloader, the notifier, the optional child and the signal loop."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.copies: Copies | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: bool = False
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
        name = signal_name(sig)
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
                        "the child (pid %d) ended: %s; exiting %d",
                        self.child.pid,
                        status_description(returncode),
                        status,
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


# --- the command -----------------------------------------------------------------------------------------


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
