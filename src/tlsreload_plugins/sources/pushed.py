"""An identity handed over in memory, kept as files the core already watches: :class:`PushedIdentity`.

A certificate, its key and a CA bundle that code fetched (a secret manager, SPIFFE's Workload API) are written
into a private directory as one atomic swap of all the files (kubelet's ``..data`` symlink swap), so that every
server glue, every worker model and :class:`~tlsreload_plugins.client.ClientIdentity` take them as they take any
files: validated (by the server's reader, or in a child process), the last good identity kept serving, a failure
reported once with the file named. Hostile bytes are written like any others, and refused by the readers
like a bad file: the last good identity keeps serving.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import tempfile
import threading
from types import TracebackType

from tlsreload_plugins.atomic_swap import swap_in
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.private_directories import memory_directory, private_directory

__all__ = ["CA_NAME", "CERT_NAME", "KEY_NAME", "PushedIdentity", "memory_directory"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sources")

CERT_NAME = "tls.crt"
"""The certificate file's name in a :class:`PushedIdentity`'s directory (its chain after it)."""
KEY_NAME = "tls.key"
"""The key file's name."""
CA_NAME = "ca.crt"
"""The CA bundle's name (present when the pushes carry one)."""


class PushedIdentity:
    """A TLS identity pushed in as bytes, served to any glue as files (:attr:`files`).

    Each :meth:`push` writes the certificate, the key and (optionally) the CA bundle into a new directory, then
    swaps them all in with one rename, so that a reader never sees half a push. The directory is private (mode
    0700, each file 0600), made in memory where the system allows (``/dev/shm``, ``$XDG_RUNTIME_DIR``), and removed
    by :meth:`close` or at the exit of the process that made it (not of a forked worker). One left by a process
    killed with SIGKILL is removed by the next ``PushedIdentity`` made in the same place
    (:func:`~tlsreload_plugins.private_directories.sweep`).

    Args:
        parent: where to make the private directory (default: :func:`memory_directory`, else the system's
            temporary directory, said in a WARNING line).
        kind: what its directory's name says the identity is from, a lowercase word (a SPIFFE source's ``spiffe``:
            the readers' expiry lines then say the next SVID is to come from the Workload API).

    Example::

        pushed = PushedIdentity()
        pushed.push(cert_pem, key_pem, ca_pem)        # e.g. what a secret manager returned
        with fresh_context(pushed.files.certfile, pushed.files.keyfile) as context: ...
        pushed.push(new_cert_pem, new_key_pem, ca_pem)  # the next reload serves it
    """

    def __init__(self, parent: str | None = None, *, kind: str = "pushed") -> None:
        if parent is None:
            parent, in_memory = memory_directory()
            if not in_memory:
                log.warning(
                    "no memory filesystem is writable (/dev/shm, $XDG_RUNTIME_DIR): pushed keys are written "
                    "under %s, which may be on disk",
                    tempfile.gettempdir(),
                )
        # Mode 0700, named for this process: what a process killed with SIGKILL leaves is removed by the next.
        self.directory: str = private_directory(kind, parent)
        self._owner = os.getpid()
        self._numbers = itertools.count(1)
        # Held by pushers only, never by a reloader or a serving thread: it orders pushes (the last one called
        # is the one served) across their writes.
        self._push_lock = threading.Lock()
        self._pushed: tuple[bytes, bytes, bytes | None] | None = None
        self._closed = False
        atexit.register(self._remove_at_exit)

    @property
    def files(self) -> TLSFiles:
        """The certificate, key and CA paths to configure a server or a client with (stable across pushes).

        Raises:
            RuntimeError: nothing was pushed yet (whether there is a CA bundle is not known).
        """
        pushed = self._pushed
        if pushed is None:
            raise RuntimeError(f"nothing was pushed into {self.directory} yet: push an identity before using its files")
        ca = os.path.join(self.directory, CA_NAME) if pushed[2] is not None else None
        return TLSFiles(os.path.join(self.directory, CERT_NAME), os.path.join(self.directory, KEY_NAME), ca)

    @property
    def pushed(self) -> bool:
        """Whether anything was pushed yet."""
        return self._pushed is not None

    def push(self, cert: bytes, key: bytes, ca: bytes | None = None) -> bool:
        """Make ``cert``, ``key`` and ``ca`` what the files hold, all at once. Blocking (file writes): call it from a
        thread, not an event loop. The bytes are not judged here: the readers judge them as they judge files.

        Args:
            cert: the certificate, its chain after it (PEM).
            key: its private key (PEM).
            ca: the CA bundle (PEM): client certificates' on a server, servers' on a client. Every push carries
                one, or none does.

        Returns:
            Whether the files changed (pushing the same bytes again writes nothing).

        Raises:
            TypeError: a part is not bytes.
            ValueError: a CA bundle is pushed where the first push had none, or the other way round.
            RuntimeError: closed.

        Example: ``pushed.push(secret["tls.crt"], secret["tls.key"], secret.get("ca.crt"))``.
        """
        for name, part in (("cert", cert), ("key", key), ("ca", ca)):
            if part is not None and not isinstance(part, bytes | bytearray | memoryview):
                raise TypeError(f"{name} must be bytes, not {type(part).__name__}")
        new = (bytes(cert), bytes(key), bytes(ca) if ca is not None else None)
        with self._push_lock:
            if self._closed:
                raise RuntimeError(f"{self.directory} is closed: nothing more can be pushed")
            if self._pushed is not None and (self._pushed[2] is None) != (new[2] is None):
                had = "a CA bundle" if self._pushed[2] is not None else "no CA bundle"
                raise ValueError(f"the first push into {self.directory} had {had}: every push must, as its files do")
            if new == self._pushed:
                return False
            self._swap_in(new)
            self._pushed = new
            return True

    def _swap_in(self, parts: tuple[bytes, bytes, bytes | None]) -> None:
        """Write ``parts`` into a new version and swap it in (:func:`~tlsreload_plugins.atomic_swap.swap_in`)."""
        named = dict(zip((CERT_NAME, KEY_NAME, CA_NAME), parts, strict=True))
        swap_in(self.directory, f"..{next(self._numbers)}", named)

    def close(self) -> None:
        """Remove the directory (the files with it). Idempotent; a server still configured with them keeps serving
        the identity it loaded, and reports the missing files on its next check."""
        with self._push_lock:
            self._closed = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def _remove_at_exit(self) -> None:
        if os.getpid() == self._owner:  # a forked worker exiting leaves its parent's files alone
            self.close()

    def __enter__(self) -> PushedIdentity:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
