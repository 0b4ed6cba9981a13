"""The one reader of a server's files: :class:`ReaderProcess`, started by the process that starts the workers.

A server with workers (gunicorn's arbiter, uvicorn's and hypercorn's supervisors, Sanic's main process) starts this
module as a child process (``python -m tlsreload_plugins.publication.reader``) before its first worker. The child
is the only process that opens the configured files: every interval it reads them (regular files only, size caps,
never blocking on a FIFO: :func:`~tlsreload_plugins.files.read_files`), judges new content with ``cryptography``
(key matches, chain parses, dates; OpenSSL loads the pair too), and publishes each identity that passed into the
publication (:mod:`tlsreload_plugins.publication.published`), with its own figures beside it: whether the files are
usable now and, if not, why, naming the file. The serving processes load only what was published.

The parent runs no thread: it writes the settings to the child's standard input (the key password never appears on
a command line), then waits for one line on its standard output: the first version published, or why nothing could
be (after :data:`~tlsreload_plugins.serving.start.BOOT_ATTEMPTS` reads, as any start). The child leaves with its
parent (it looks every :data:`PARENT_POLL` seconds) or on SIGTERM and SIGINT; the publication stays, owned by the
parent, for a reader started again (:meth:`ReaderProcess.again`). Its lines go to the parent's standard error; the
lines about each reload and failure are the serving processes' own, as before (the reader's would repeat them).
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from tlsreload_plugins.child_answer import answer, say
from tlsreload_plugins.errors import ReloadError
from tlsreload_plugins.files import Password, TLSFiles, password_bytes
from tlsreload_plugins.private_directories import memory_directory, owner, private_directory
from tlsreload_plugins.publication.published import Publication
from tlsreload_plugins.settings import PASSWORD_FILE_ENV

__all__ = ["PARENT_POLL", "ReaderFailed", "ReaderProcess", "main"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.reader")

PARENT_POLL = 0.5
"""Seconds between the child's looks at whether its parent is still there (its checks may be further apart)."""

START_WAIT = 60.0
"""Seconds the parent waits for the first version: an interpreter starting and ``cryptography`` imported on a
loaded machine, and the start's retries over unusable files."""

STOP_WAIT = 5.0
"""Seconds :meth:`ReaderProcess.close` gives the child to leave before killing it."""


CANNOT_START = 3
"""The child's exit status when nothing could be published."""


class ReaderFailed(RuntimeError):
    """Nothing could be published: ``str()`` says why, naming the file (or says that the reader said nothing)."""


class ReaderProcess:
    """The reader of ``files``, in a child process, publishing into :attr:`directory`.

    Starts at once and returns once the first version is published (or raises).

    Args:
        files: the configured certificate, key, client-CA and CRL files.
        password: the key's password (a callable is called now; ``$TLSRELOAD_KEY_PASSWORD_FILE``'s is read by the
            child at each validation, as the serving processes read it).
        interval: seconds between the child's checks.
        sni: directories of SNI identities (:mod:`tlsreload_plugins.sni.discovery`), judged by the child too and
            published in the publication's index (:mod:`tlsreload_plugins.publication.index`).

    Raises:
        ReaderFailed: the files could not be used (the sentence names the file), or the child said nothing in time.

    Example::

        reader = ReaderProcess(TLSFiles("tls.crt", "tls.key"), password=None, interval=1.0)
        # every worker: start_reloader(..., publication=reader.directory)
    """

    def __init__(self, files: TLSFiles, *, password: Password, interval: float, sni: Sequence[str] = ()) -> None:
        self.files = files
        self.interval = interval
        self.sni: list[str] = list(sni)
        self._password = _password_for_child(password)
        parent, in_memory = memory_directory()
        if not in_memory:
            log.warning(
                "no memory filesystem is writable (/dev/shm, $XDG_RUNTIME_DIR): the TLS reader publishes the key under "
                "%s, which may be on disk",
                tempfile.gettempdir(),
            )
        # Owned by this process (named for it, removed at its exit): a reader started again publishes into it.
        self.directory: str = private_directory("published", parent)
        self._owner = os.getpid()
        self._process: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)
        try:
            self.version: str = self._start()
        except ReaderFailed:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self._process.pid if self._process is not None else 0

    def _start(self) -> str:
        settings = {
            "directory": self.directory,
            "files": [self.files.certfile, self.files.keyfile, self.files.ca_certs, self.files.crl],
            "interval": self.interval,
            "sni": self.sni,
            "password": self._password,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "tlsreload_plugins.publication.reader"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._process = process
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(json.dumps(settings).encode() + b"\n")
        said = answer(process.stdout, time.monotonic() + START_WAIT)
        if said is None or "version" not in said:
            reason = said.get("error") if said else None
            self._stop()
            raise ReaderFailed(str(reason or f"the reader process {process.pid} published nothing in time"))
        return str(said["version"])

    def alive(self) -> bool:
        """Whether the child still runs (a server that reaps every child, as gunicorn's arbiter does, makes it look
        gone once it has exited, as it is)."""
        return self._process is not None and self._process.poll() is None

    def again(self) -> bool:
        """Start a new child when this one has gone (killed, crashed), publishing into the same directory: for the
        parent's hooks (a worker about to start, gunicorn's HUP). Returns whether one was started; one WARNING
        line says so, one ERROR line when it could not (the serving processes keep what was published).
        """
        if self.alive():
            return False
        log.warning("the TLS reader process %d has gone: starting another", self.pid)
        try:
            self.version = self._start()
        except ReaderFailed as e:
            log.error("cannot start the TLS reader again: %s; the workers keep serving what was published", e)
            return False
        return True

    def _stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after :data:`STOP_WAIT` s) and remove the publication; in the
        process that started it only (a forked worker exiting leaves its parent's reader alone). Idempotent."""
        if os.getpid() != self._owner:
            return
        self._stop()
        Publication(self.directory).remove()

    def __enter__(self) -> ReaderProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _password_for_child(password: Password) -> str | None:
    """The password as the child gets it on its standard input (base64), or ``None``: none, or the one
    ``$TLSRELOAD_KEY_PASSWORD_FILE`` names, which the child reads itself, at each validation."""
    if password is None or (callable(password) and os.environ.get(PASSWORD_FILE_ENV)):
        return None
    secret = password_bytes(password)
    return None if secret is None else base64.b64encode(secret).decode()


# -- the child ---------------------------------------------------------------------------------


def main() -> int:
    """The child: publish the files' identity until SIGTERM, SIGINT or the parent's end; exit
    :data:`CANNOT_START` when nothing could be published at start."""
    settings = json.loads(sys.stdin.readline())
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    # The judging (cryptography, the SNI machinery): loaded in the reader only, never where a server imports this.
    # With cryptography loaded, validation runs here (a process that serves nothing), not in a child each time.
    import cryptography.hazmat.bindings._rust  # noqa: F401

    from tlsreload_plugins.publication.judging import QUIET, Judging

    QUIET.setLevel(logging.CRITICAL + 1)
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    certfile, keyfile, ca_certs, crl = settings["files"]
    files = TLSFiles(certfile, keyfile, ca_certs, crl)
    secret = settings["password"]
    password: Password = base64.b64decode(secret) if secret is not None else None
    publication = Publication(settings["directory"])
    try:
        judging = Judging(files, password, float(settings["interval"]), publication, owner(), sni=settings["sni"])
    except (ReloadError, ValueError) as e:
        say({"error": str(e)})
        return CANNOT_START
    say({"version": judging.version})
    log.info("reading %s every %gs for the workers, who load what it publishes", files.describe(), judging.interval)
    try:
        judging.start_sni()
    except ValueError as e:  # an SNI directory gone since the parent checked it: the default identity serves on
        log.error("no SNI identity is published: %s", e)
    while not stop.wait(min(PARENT_POLL, judging.interval)) and os.getppid() == parent:
        judging.tick()
    return 0


if __name__ == "__main__":
    sys.exit(main())
