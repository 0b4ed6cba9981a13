"""Read and fingerprint the files that make up a server's TLS identity, and the key password.

The reading half of :mod:`tlsreload_plugins.identity`: every check of every process runs it, so it
imports nothing that parses (no ``cryptography``: a worker that loads what its server's reader published loads
none, see :mod:`tlsreload_plugins.publication`). A file is read whole, at most
:data:`MAX_FILE_BYTES`, and only when it is a regular file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from collections.abc import Callable

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.frozen import FrozenRecord

Password = str | bytes | Callable[[], str | bytes] | None
"""A key password as :meth:`ssl.SSLContext.load_cert_chain` accepts it."""

MAX_FILE_BYTES = 1024 * 1024
"""The largest file read (1 MiB). A certificate chain is a few KiB, a client-CA bundle holding every
public root about 220 KiB; anything larger is refused unread, so a 1 GB file or ``/dev/zero`` at a
configured path costs nothing."""


class TLSFiles(FrozenRecord):
    """The paths that make up one TLS identity.

    ``keyfile`` may be ``None`` when the key is in ``certfile`` (as :mod:`ssl` allows);
    ``ca_certs`` is the optional bundle of CAs that client certificates are verified against, and ``crl``
    an optional PEM file of certificate revocation lists for the CAs of that bundle (it needs ``ca_certs``).
    """

    _fields = ("certfile", "keyfile", "ca_certs", "crl")
    __slots__ = _fields
    certfile: str
    keyfile: str | None
    ca_certs: str | None
    crl: str | None

    def __init__(
        self, certfile: str, keyfile: str | None = None, ca_certs: str | None = None, crl: str | None = None
    ) -> None:
        self._set(certfile, keyfile, ca_certs, crl)

    def describe(self) -> str:
        """One line naming the files, for logs."""
        parts = [f"cert={self.certfile}"]
        if self.keyfile:
            parts.append(f"key={self.keyfile}")
        if self.ca_certs:
            parts.append(f"ca={self.ca_certs}")
        if self.crl:
            parts.append(f"crl={self.crl}")
        return " ".join(parts)


Parts = tuple[bytes, "bytes | None", "bytes | None", "bytes | None"]
"""The bytes of a certificate, key, client-CA and CRL file, in that order (``None``: no such file)."""


class Snapshot(FrozenRecord):
    """The bytes of each file as read in one check."""

    _fields = ("files", "cert", "key", "ca", "crl")
    __slots__ = _fields
    files: TLSFiles
    cert: bytes
    key: bytes | None
    ca: bytes | None
    crl: bytes | None

    def __init__(
        self, files: TLSFiles, cert: bytes, key: bytes | None, ca: bytes | None, crl: bytes | None = None
    ) -> None:
        self._set(files, cert, key, ca, crl)

    @property
    def parts(self) -> Parts:
        """The bytes of the certificate, key, client-CA and CRL files, in that order (``None``: no such file)."""
        return self.cert, self.key, self.ca, self.crl

    @property
    def trust(self) -> bytes | None:
        """What client certificates are judged by: the client-CA bundle and its CRLs (``None``: no bundle).
        A change of either is a change of trust: no session made before it may resume after it."""
        if self.ca is None:
            return None
        return self.ca if self.crl is None else b"%d:%s%s" % (len(self.ca), self.ca, self.crl)


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def _refuse_unless_regular(mode: int, path: str, role: str) -> None:
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise InvalidIdentity(f"{role} file {path} is {kind}, not a regular file; refusing to read it", path=path)


# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the
# stat of the opened descriptor then refuses it, devices and sockets before any read.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)

_GROWTH = 64 * 1024
"""Bytes asked for at a time past the size a file had when opened (it grew while being read)."""


def _read(path: str, role: str) -> bytes:
    # Opening the path on every check follows whatever symlinks point at now:
    # kubelet's ..data swap and certbot's relinking are seen without watching anything.
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise InvalidIdentity(f"{role} file {path} does not exist", path=path) from None
    except PermissionError:
        raise InvalidIdentity(f"{role} file {path} cannot be read: permission denied", path=path) from None
    except OSError as e:
        with contextlib.suppress(OSError):
            _refuse_unless_regular(os.stat(path).st_mode, path, role)  # a socket: ENXIO
        raise InvalidIdentity(f"{role} file {path} cannot be read: {e.strerror or e}", path=path) from None
    try:
        info = os.fstat(fd)
        _refuse_unless_regular(info.st_mode, path, role)
        if info.st_size > MAX_FILE_BYTES:
            raise InvalidIdentity(
                f"{role} file {path} is {info.st_size} bytes, more than the {MAX_FILE_BYTES} a TLS file may be",
                path=path,
            )
        chunks = []
        size = 0
        # The size it stats and a byte more, not MAX_FILE_BYTES: a buffer that large costs glibc an mmap and an
        # mremap per read (a server with many SNI identities reads them all at start), and its shrunk remains
        # stay mapped while kept.
        want = info.st_size + 1
        while size <= MAX_FILE_BYTES:  # the file may grow while it is read
            request = min(want, MAX_FILE_BYTES + 1 - size)
            chunk = os.read(fd, request)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if len(chunk) < request and size >= info.st_size:
                break  # a short read of a regular file: its end, with all the bytes it had when opened
            want = _GROWTH
        if size > MAX_FILE_BYTES:
            raise InvalidIdentity(
                f"{role} file {path} grew past the {MAX_FILE_BYTES} bytes a TLS file may be while being read", path=path
            )
        return b"".join(chunks)
    except OSError as e:
        raise InvalidIdentity(f"{role} file {path} cannot be read: {e.strerror or e}", path=path) from None
    finally:
        os.close(fd)


def password_file(path: str) -> Callable[[], bytes]:
    """A key password kept in a file: the callable reads the file's first line each time it is called
    (so a password changed with the key is picked up on the next reload), without the line ending.

    Raises (when called):
        InvalidIdentity: the file cannot be read or is not a regular file.
    """

    def read_password() -> bytes:
        first_line = _read(path, "key password").split(b"\n", 1)[0]
        return first_line.removesuffix(b"\r")

    return read_password


def read_files(files: TLSFiles) -> Snapshot:
    """Read every file of ``files`` once. Raises :class:`InvalidIdentity` naming a file that cannot be read."""
    return Snapshot(
        files=files,
        cert=_read(files.certfile, "certificate"),
        key=_read(files.keyfile, "key") if files.keyfile else None,
        ca=_read(files.ca_certs, "client CA") if files.ca_certs else None,
        crl=_read(files.crl, "CRL") if files.crl else None,
    )


def fingerprint(snapshot: Snapshot) -> str:
    """A digest of the content of every file: equal when, and only when, no byte changed.

    Metadata (mtime, mode, owner, inode) is deliberately not part of it: chmod storms and
    touch cause nothing. A CRL is read with the other files and is part of the same digest: a client-CA bundle and
    its CRLs written together are one change.
    """
    digest = hashlib.sha256()
    parts = snapshot.parts if snapshot.crl is not None else (snapshot.cert, snapshot.key, snapshot.ca)
    for part in parts:
        if part is None:
            digest.update(b"-")
        else:
            digest.update(b"%d:" % len(part))
            digest.update(part)
    return digest.hexdigest()


RACY_NS = 2_000_000_000
"""Nanoseconds a file's change time must lie before a :func:`stamp` is taken for the stamp to vouch for its content:
a filesystem's clock ticks coarsely (milliseconds), so two writes within one tick leave the same change time, and
a stamp taken between them would hide the second (git's "racy clean" entries)."""


Stamp = tuple[tuple[int, int, int, int, int], ...]
"""What :func:`stamp` gives: per file, its inode, device, size, modification and change time."""


def stamp(files: TLSFiles) -> Stamp | None:
    """What the files' metadata says now, following links: inode, device, size, modification and change time of
    each. Equal stamps mean that no file was written, replaced or relinked between them: a write changes the change
    time, a rename or a relink the inode. ``None`` when a file cannot be looked at, or changed too recently for its
    stamp to vouch for it (:data:`RACY_NS`): the caller reads the files instead. One ``stat`` per file: what a
    check costs when nothing changed, where reading and hashing cost several times more.

    Example: ``before = stamp(files)``; later, ``stamp(files) == before`` means the content is unchanged.
    """
    now = time.time_ns()
    found = []
    for path in (files.certfile, files.keyfile, files.ca_certs, files.crl):
        if not path:
            continue
        try:
            info = os.stat(path)
        except OSError:
            return None
        if now - info.st_ctime_ns < RACY_NS:
            return None
        found.append((info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(found)


def identity_hash(snapshot: Snapshot) -> int | None:
    """A hash, valid in this process, of the certificate and key files' content alone: what an identity serves,
    without the client-CA bundle and CRLs it may share with other identities (an SNI identity shares the default
    identity's); ``None`` when it has neither, so shares nothing. An ``int``, not a 64-character digest: ten
    thousand SNI identities keep one each."""
    if snapshot.ca is None and snapshot.crl is None:
        return None
    return hash((snapshot.cert, snapshot.key))


def password_text(password: Password) -> str | None:
    """The text of ``password`` (calling it when it is a callable), for servers that take a ``str``."""
    value = password() if callable(password) else password
    return value.decode() if isinstance(value, bytes) else value


def password_bytes(password: Password) -> bytes | None:
    """The bytes of ``password`` (calling it when it is a callable, as :mod:`ssl` does)."""
    if callable(password):
        password = password()
    if isinstance(password, str):
        return password.encode()
    return password


def password_digest(password: Password) -> str:
    """A digest of the key password ``password`` gives now (a password file is read): what a verdict on some
    bytes depends on beside them."""
    try:
        secret = password_bytes(password)
    except Exception as e:  # an unreadable password file: that is the verdict's input too
        return f"unreadable: {e}"
    return hashlib.sha256(secret or b"").hexdigest()
