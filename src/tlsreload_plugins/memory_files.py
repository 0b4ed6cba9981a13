"""Paths that read as given bytes, in memory (:func:`in_memory_files`), and a context built through a server's
recipe from the bytes of a snapshot (:func:`context_from`), and CRLs checked from bytes (:func:`check_revocation_of`):
how a published identity, and an SNI identity built on its first handshake, are served from bytes rather than from
the files on disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
from collections.abc import Callable, Iterator

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.private_directories import private_directory
from tlsreload_plugins.revocation import check_revocation

RecipeFor = Callable[[TLSFiles], ssl.SSLContext]
"""Builds the server's context exactly as it does from its configured files, but from ``files``."""


@contextlib.contextmanager
def in_memory_files(cert: bytes, key: bytes | None, ca: bytes | None, crl: bytes | None = None) -> Iterator[TLSFiles]:
    """Paths that read as ``cert``, ``key``, ``ca`` and ``crl`` for the ``with`` block, in memory where the
    system allows it (memfd), else in a private directory removed at the end of the block."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:

            def path(name: str, data: bytes | None) -> str | None:
                if data is None:
                    return None
                fd = os.memfd_create(f"tlsreload-{name}", getattr(os, "MFD_CLOEXEC", 1))
                fds.append(fd)
                os.write(fd, data)
                return f"/proc/self/fd/{fd}"

            yield TLSFiles(path("cert", cert) or "", path("key", key), path("ca", ca), path("crl", crl))
        finally:
            for fd in fds:
                os.close(fd)
        return
    directory = private_directory("memory")  # 0700; one a SIGKILL left behind is swept by the next
    try:

        def write(name: str, data: bytes | None) -> str | None:
            if data is None:
                return None
            target = os.path.join(directory, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return target

        yield TLSFiles(write("cert.pem", cert) or "", write("key.pem", key), write("ca.pem", ca), write("crl.pem", crl))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def context_from(snapshot: Snapshot, recipe_for: RecipeFor) -> ssl.SSLContext:
    """A context built by ``recipe_for`` from the bytes of ``snapshot`` (already validated), through
    :func:`in_memory_files`: exactly those bytes are served, whatever the files on disk hold by now.

    Raises:
        InvalidIdentity: the recipe refused them (the reason in the message, ``snapshot``'s files named).
        TypeError: the recipe returned something that is not an :class:`ssl.SSLContext`.
    """
    with in_memory_files(*snapshot.parts) as paths:
        try:
            context = recipe_for(paths)
            if paths.crl and isinstance(context, ssl.SSLContext):
                check_revocation(context, paths.crl)
        except Exception as e:
            raise InvalidIdentity(
                f"the SSL context could not be built from {snapshot.files.describe()}: {type(e).__name__}: {e}",
                path=snapshot.files.certfile,
            ) from e
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"the SSL context recipe returned {type(context).__name__}, not ssl.SSLContext")
    return context


def check_revocation_of(context: ssl.SSLContext, crl: bytes) -> None:
    """:func:`~tlsreload_plugins.revocation.check_revocation` with the CRLs ``crl`` (PEM), read from memory: exactly
    the bytes validated are served, whatever the CRL file holds by now (and a FIFO put at its path meanwhile is
    never opened).

    Raises:
        ssl.SSLError: OpenSSL refused them.
    """
    with in_memory_files(b"", None, None, crl) as paths:
        assert paths.crl is not None
        check_revocation(context, paths.crl)
