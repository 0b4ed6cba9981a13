"""The SNI identities a reader published, found by server name: one SQLite database in the publication.

SQLite in WAL mode is the well-kept part here: one writer (the reader) and readers that never block (every serving
process), atomic commits, and a tested story for a writer killed mid-commit. ``identities`` holds each identity that
passed (its bytes and the leaf validation found, its fingerprint); ``routes`` the server names its certificate lists
(exact names and one-label wildcards, as :mod:`tlsreload_plugins.sni.table` decides them), each to the identity that
answers it. A serving process looks a name up when a handshake asks for it (an indexed lookup, wildcards included)
and holds no object per identity; whether anything changed since it last looked is one ``PRAGMA data_version``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping

from tlsreload_plugins.files import Snapshot, fingerprint

__all__ = ["INDEX_NAME", "Found", "IndexReader", "IndexWriter"]

INDEX_NAME = "sni.sqlite"
"""The database's name in the publication's directory."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS identities (
    name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, cert BLOB NOT NULL, key BLOB, leaf TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS routes (host TEXT PRIMARY KEY, name TEXT NOT NULL);
"""

Found = tuple[str, str, bytes, "bytes | None"]
"""An identity found for a server name: its name, fingerprint, certificate (chain after it) and key."""


class IndexWriter:
    """The reader's side: what it publishes of the SNI identities, one transaction per change.

    Example::

        index = IndexWriter(directory)
        index.write({"a": (snapshot, leaf_json)}, removed=["old"], routes={"a.test": "a"})
    """

    def __init__(self, directory: str) -> None:
        self.path: str = os.path.join(directory, INDEX_NAME)
        self._connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.executescript(SCHEMA)
        self._routes: dict[str, str] = dict(self._connection.execute("SELECT host, name FROM routes"))
        self.names: set[str] = {name for (name,) in self._connection.execute("SELECT name FROM identities")}
        """The identities the index holds (a reader started again finds its predecessor's)."""

    def write(
        self,
        changed: Mapping[str, tuple[Snapshot, str]],
        removed: Iterable[str] = (),
        routes: Mapping[str, str] | None = None,
    ) -> None:
        """Publish ``changed`` identities (name: bytes and the leaf as JSON), forget ``removed`` ones and make the
        routes ``routes`` (host: identity name; ``None``: as they are), in one commit. Blocking."""
        gone = list(removed)
        route_changes: list[tuple[str, str]] = []
        route_removals: list[str] = []
        if routes is not None:
            route_changes = [(host, name) for host, name in routes.items() if self._routes.get(host) != name]
            route_removals = [host for host in self._routes if host not in routes]
        if not changed and not gone and not route_changes and not route_removals:
            return
        rows = [
            (name, fingerprint(snapshot), snapshot.cert, snapshot.key, leaf)
            for name, (snapshot, leaf) in changed.items()
        ]
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany("INSERT OR REPLACE INTO identities VALUES (?, ?, ?, ?, ?)", rows)
            connection.executemany("DELETE FROM identities WHERE name = ?", [(name,) for name in gone])
            connection.executemany("INSERT OR REPLACE INTO routes VALUES (?, ?)", route_changes)
            connection.executemany("DELETE FROM routes WHERE host = ?", [(host,) for host in route_removals])
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        if routes is not None:
            self._routes = dict(routes)
        self.names.difference_update(gone)
        self.names.update(changed)

    def close(self) -> None:
        """Close the connection (the database stays, for the serving processes)."""
        self._connection.close()


class IndexReader:
    """A serving process's side: one connection per thread (a handshake's, a check's), never a lock.

    Example: ``IndexReader(directory).lookup("a.example.com")``.
    """

    def __init__(self, directory: str) -> None:
        self.path: str = os.path.join(directory, INDEX_NAME)
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection | None:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None and os.path.exists(self.path):
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._local.connection = connection
        return connection

    def lookup(self, server_name: str) -> Found | None:
        """The identity answering ``server_name``: its exact name, else the one-label wildcard covering it; ``None``
        when none does (or nothing is published yet). Never raises for the database (a failure is ``None``)."""
        name = server_name.lower()
        dot = name.find(".")
        wildcard = "*" + name[dot:] if dot > 0 else name
        try:
            connection = self._connection()
            if connection is None:
                return None
            row = connection.execute(
                "SELECT i.name, i.fingerprint, i.cert, i.key FROM routes r JOIN identities i ON i.name = r.name "
                "WHERE r.host IN (?, ?) ORDER BY r.host = ? DESC LIMIT 1",
                (name, wildcard, name),
            ).fetchone()
        except sqlite3.Error:
            return None
        return None if row is None else (row[0], row[1], row[2], row[3])

    def fingerprints(self, names: Iterable[str]) -> dict[str, str]:
        """The fingerprint published for each of ``names`` that is still published."""
        wanted = list(names)
        connection = self._connection()
        if connection is None or not wanted:
            return {}
        found: dict[str, str] = {}
        for start in range(0, len(wanted), 500):  # SQLite's limit on parameters, with room
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT name, fingerprint FROM identities WHERE name IN ({marks})"  # parameters only
            found.update(connection.execute(query, chunk))
        return found

    def data_version(self) -> int | None:
        """A number that changes when the reader has committed since this thread last asked (``None``: nothing is
        published yet)."""
        connection = self._connection()
        if connection is None:
            return None
        try:
            return int(connection.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None
