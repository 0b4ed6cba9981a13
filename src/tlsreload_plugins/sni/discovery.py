"""Find SNI identities on disk: which directories are configured, which of them (or of their
subdirectories) hold an identity, and by what name each is served.

A directory is an identity when it holds one of :data:`IDENTITY_FILES` (a Kubernetes TLS Secret, a
certbot lineage); otherwise its immediate subdirectories are looked at. No certificate is read
here: serving the identities found is :mod:`tlsreload_plugins.sni.identities`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.settings import SNI_ENV
from tlsreload_plugins.settings import resolve_sni_directories as resolve_directories

__all__ = [
    "IDENTITY_FILES",
    "SNI_ENV",
    "discover",
    "identities_found",
    "identity_files",
    "is_alive",
    "is_directory",
    "resolve_directories",
]

IDENTITY_FILES = (("tls.crt", "tls.key"), ("fullchain.pem", "privkey.pem"))
"""The (certificate, key) file names that make a directory an identity, in order of preference:
a Kubernetes TLS Secret, a certbot lineage."""

_MARKERS = frozenset(name for pair in IDENTITY_FILES for name in pair) | {"cert.pem", "chain.pem"}
"""Any of these present keeps an identity alive: certbot relinks its files one at a time."""


def identity_files(directory: str) -> TLSFiles | None:
    """The certificate and key of the identity ``directory`` is, or ``None`` when it is none."""
    prefix = directory + "/" if directory and not directory.endswith("/") else directory  # os.path.join's
    for cert, key in IDENTITY_FILES:  # lstat, not a listing: a kubelet Secret is found in one system call
        cert_path, key_path = prefix + cert, prefix + key
        if os.path.lexists(cert_path) or os.path.lexists(key_path):
            return TLSFiles(cert_path, key_path)
    return None


def is_alive(files: TLSFiles) -> bool:
    """Whether the directory of the identity ``files`` still holds any file an identity is made of: one
    missing from a listing while certbot relinks its files one at a time is not gone."""
    directory = os.path.dirname(files.certfile)
    try:
        return not _MARKERS.isdisjoint(os.listdir(directory))
    except OSError:
        return False


def is_directory(entry: os.DirEntry[str]) -> bool:
    """``os.path.isdir(entry.path)``, from the listing where it can (a link is still followed)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def identities_found(directories: Sequence[str]) -> tuple[dict[str, TLSFiles], list[TLSFiles]]:
    """Every identity in ``directories``, by name, in precedence order, and those left out because
    an identity found before has the same name."""
    found: dict[str, TLSFiles] = {}
    shadowed: list[TLSFiles] = []

    def add(name: str, files: TLSFiles) -> None:
        if found.setdefault(name, files) is not files:
            shadowed.append(files)

    for directory in directories:
        files = identity_files(directory)
        if files is not None:
            add(os.path.basename(os.path.normpath(directory)), files)
            continue
        try:
            with os.scandir(directory) as listing:  # a listing that says which entries are directories: no stat each
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or not is_directory(entry):  # kubelet's ..data, ..2026_...
                continue
            files = identity_files(entry.path)
            if files is not None:
                add(entry.name, files)
    return found, shadowed


def discover(directories: Sequence[str], ca_certs: str | None = None, crl: str | None = None) -> dict[str, TLSFiles]:
    """Every identity in ``directories`` now, by name, each with the server's client-CA bundle ``ca_certs`` and its
    ``crl``: the identities an :class:`~tlsreload_plugins.sni.SNIIdentities` over them would serve."""
    found, _ = identities_found(directories)
    return {name: TLSFiles(files.certfile, files.keyfile, ca_certs, crl) for name, files in found.items()}
