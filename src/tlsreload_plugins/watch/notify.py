"""How ``tlsreload watch`` tells a server that validated files are in place.

Three ways, one per form of the command line: :class:`SignalProcess` (``--pid``, ``--pid-file``),
:class:`RunCommand` (``--exec``) and :class:`SignalChild` (the child started after ``--``). Watch calls
``notify`` from its reloader's ``on_reload`` callback, once per good change; ``notify`` never raises.
The ``ENV_*`` names are the environment watch gives the ``--exec`` command and the child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess

from tlsreload_plugins.identity import Leaf

# Part of ``tlsreload watch``: its lines come from the command's logger, the one docs/watch.md names.
log: logging.Logger = logging.getLogger("tlsreload_plugins.watch")

EXEC_TIMEOUT = 60.0
"""Seconds an ``--exec`` command may run before it (and its process group) is killed."""

ENV_CERTFILE = "TLSRELOAD_CERTFILE"
ENV_KEYFILE = "TLSRELOAD_KEYFILE"
ENV_CA_CERTS = "TLSRELOAD_CA_CERTS"
ENV_SERIAL = "TLSRELOAD_SERIAL"


class Notifier:
    """How the server is told that new files are in place. ``notify`` never raises."""

    undelivered: bool = False
    """A signal that could not be delivered yet: :meth:`retry` tries again on every check."""

    def notify(self, leaf: Leaf) -> None:
        raise NotImplementedError

    def retry(self) -> None:
        """Deliver a notice that failed earlier (signals only)."""

    def describe(self) -> str:
        raise NotImplementedError


def signal_name(sig: int) -> str:
    """How a log line names the signal ``sig`` (``SIGHUP``; ``signal 99`` for a number Python does not name)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class SignalProcess(Notifier):
    """``--pid`` / ``--pid-file``: send a signal; the pid file is read again every time."""

    undelivered: bool  # Notifier's, set by each delivery below

    def __init__(self, sig: int, pid: int | None = None, pid_file: str | None = None) -> None:
        self.sig = sig
        self.pid = pid
        self.pid_file = pid_file
        self._last_problem: str | None = None

    def describe(self) -> str:
        target = f"pid {self.pid}" if self.pid_file is None else f"the pid in {self.pid_file}"
        return f"send {signal_name(self.sig)} to {target}"

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
                log.info("sent %s to pid %d: the new certificate reached the server", signal_name(self.sig), pid)
            else:
                log.debug("sent %s to pid %d", signal_name(self.sig), pid)
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
            status = status_description(proc.returncode)
            log.error("--exec command %r failed (%s)%s", self.command, status, f": {tail}" if tail else "")
        else:
            log.debug("--exec command %r succeeded%s", self.command, f": {text[-200:]}" if text else "")


class SignalChild(Notifier):
    """The child form: send the signal to the child watch started."""

    def __init__(self, sig: int) -> None:
        self.sig = sig
        self.proc: subprocess.Popen[bytes] | None = None

    def describe(self) -> str:
        return f"send {signal_name(self.sig)} to the child"

    def notify(self, leaf: Leaf) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return  # not started yet (the first identity) or already gone
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, self.sig)
            log.debug("sent %s to the child (pid %d)", signal_name(self.sig), self.proc.pid)


def status_description(returncode: int) -> str:
    """How a log line tells a process's end: ``killed by SIGTERM``, ``exit status 3``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit status {returncode}"


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: its exit code, or 128+N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode
