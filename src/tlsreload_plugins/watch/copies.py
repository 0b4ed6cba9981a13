"""What ``tlsreload watch`` builds from the files, and the validated copies a child reads.

:func:`~tlsreload_plugins.publication.judging.plain_context` is the OpenSSL server context watch's reloader builds
from the files (so OpenSSL itself judges each pair). With copies, :func:`copying_recipe` stages exactly the bytes it
validated in a :class:`Copies` directory, and watch promotes them to the live copies the child is pointed at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import stat
import tempfile
from collections.abc import Callable

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles, read_files
from tlsreload_plugins.private_directories import private_directory
from tlsreload_plugins.publication.judging import plain_context
from tlsreload_plugins.validation.apart import validate
from tlsreload_plugins.watch.options import UsageError

_COPY_NAMES = {"cert": "cert.pem", "key": "key.pem", "ca": "ca.pem"}


class Copies:
    """The last validated certificate, key and CA bundle, kept where only this user can read them.

    ``stage`` writes a snapshot next to the live copies (0600, in a 0700 directory, never following a
    symlink); ``promote`` renames the staged files over the live ones. A temporary directory (the
    default) is removed by :meth:`remove`; a directory given with ``--copy-dir`` is the server's
    configuration and keeps the live copies (only staged leftovers are removed).
    """

    def __init__(self, directory: str | None, files: TLSFiles) -> None:
        self.path: str
        self.temporary: bool
        if directory is None:
            try:
                self.path = private_directory("watch")  # mode 0700; a SIGKILLed watch's is swept by the next
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
        self.files: TLSFiles = TLSFiles(
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
