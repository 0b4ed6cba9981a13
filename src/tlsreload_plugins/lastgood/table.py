"""The table a :class:`~tlsreload_plugins.lastgood.store.SharedStore` region holds, as bytes: :func:`encode` writes
it (each distinct content once, then each identity's name and the indices of its contents, then the refusals
kept: :data:`Refusal`), :func:`decode` reads it whole, and :class:`Index` locates each identity's contents in
place, so a process serving thousands of identities copies out only the few it reads. A change to the table
is written as a record after it (:func:`encode_change`: the names it removes, the contents it adds, the
identities and refusals it sets), which :meth:`Index.with_changes` takes in: a write costs what it changes, not
what the table holds. No file, no lock: the mapping and its locking are :mod:`tlsreload_plugins.lastgood.store`'s.
"""

from __future__ import annotations

import json
import mmap
import struct
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence

from tlsreload_plugins.frozen import FrozenRecord
from tlsreload_plugins.identity import Leaf

Parts = tuple[bytes, "bytes | None", "bytes | None", "bytes | None"]
"""An identity as kept: the bytes of its certificate, key, client-CA and CRL files (``None``: no such file)."""

Kept = tuple[Parts, "Leaf | None"]
"""An identity as kept, with the leaf its validation found (``None``: kept without it)."""

Refusal = tuple[str, str, "str | None"]
"""Validation's refusal of one content of a name, as kept: which content (its bytes and the key password: see
:func:`~tlsreload_plugins.lastgood.last_good.content_key`), the refusal's message and the path it names."""

_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<5i")  # indices of an identity's cert, key, CA, CRL and leaf among the table's blobs (-1: none)


def _leaf_bytes(leaf: Leaf | None) -> bytes | None:
    if leaf is None:
        return None
    return json.dumps(leaf.fields()).encode()


def _leaf_from(data: bytes) -> Leaf:
    try:
        return Leaf.from_fields(json.loads(data))
    except (TypeError, ValueError) as e:
        raise ValueError(f"a leaf kept in a form this version does not read: {e}") from e


def encode(table: Mapping[str, Kept], refusals: Mapping[str, Refusal] | None = None) -> bytes:
    """The payload of a :class:`~tlsreload_plugins.lastgood.store.SharedStore` region: each distinct content once
    (file contents, leaves), then each identity's name and the indices of its contents (SNI identities share the
    client-CA bundle), then, when there are any, the ``refusals`` kept by name (each a name and a JSON list)."""
    blobs: dict[bytes, int] = {}
    entries: list[bytes] = []
    for name, (parts, leaf) in table.items():
        indices = [-1 if blob is None else blobs.setdefault(blob, len(blobs)) for blob in (*parts, _leaf_bytes(leaf))]
        label = name.encode()
        entries += [_COUNT.pack(len(label)), label, _ENTRY.pack(*indices)]
    out = [_COUNT.pack(len(blobs))]
    for blob in blobs:  # in index order: a dict keeps insertion order
        out += [_COUNT.pack(len(blob)), blob]
    out += [_COUNT.pack(len(table)), *entries]
    if refusals:
        out.append(_COUNT.pack(len(refusals)))
        for name, refusal in refusals.items():
            label, data = name.encode(), json.dumps(list(refusal)).encode()
            out += [_COUNT.pack(len(label)), label, _COUNT.pack(len(data)), data]
    return b"".join(out)


def encode_change(
    kept: Mapping[str, Kept],
    refusals: Mapping[str, Refusal],
    removed: Iterable[str],
    held: int,
    existing: Callable[[str, bytes], int | None],
) -> bytes:
    """A record of one change to a table of ``held`` contents: the names ``removed`` (their identities and
    refusals), then the identities ``kept`` and the ``refusals`` set, by name. A content ``existing(name,
    content)`` finds among the table's (its index) is not written again (SNI identities share the client-CA
    bundle); the others are numbered from ``held`` on. :meth:`Index.with_changes` reads it."""
    blobs: dict[bytes, int] = {}

    def index_of(name: str, blob: bytes | None) -> int:
        if blob is None:
            return -1
        found = blobs.get(blob)
        if found is None:
            found = existing(name, blob)
        if found is None:
            found = blobs[blob] = held + len(blobs)
        return found

    entries: list[bytes] = []
    for name, (parts, leaf) in kept.items():
        label = name.encode()
        indices = [index_of(name, blob) for blob in (*parts, _leaf_bytes(leaf))]
        entries += [_COUNT.pack(len(label)), label, _ENTRY.pack(*indices)]
    gone = [name.encode() for name in removed]
    out = [_COUNT.pack(held), _COUNT.pack(len(gone))]
    for label in gone:
        out += [_COUNT.pack(len(label)), label]
    out.append(_COUNT.pack(len(blobs)))
    for blob in blobs:  # in index order: a dict keeps insertion order
        out += [_COUNT.pack(len(blob)), blob]
    out += [_COUNT.pack(len(kept)), *entries, _COUNT.pack(len(refusals))]
    for name, refusal in refusals.items():
        label, data = name.encode(), json.dumps(list(refusal)).encode()
        out += [_COUNT.pack(len(label)), label, _COUNT.pack(len(data)), data]
    return b"".join(out)


def _refusal_from(data: bytes) -> Refusal:
    try:
        key, message, path = json.loads(data)
        return str(key), str(message), None if path is None else str(path)
    except (TypeError, ValueError) as e:
        raise ValueError(f"a refusal kept in a form this version does not read: {e}") from e


def decode(payload: bytes) -> dict[str, Kept]:
    """The table :func:`encode` wrote (without its refusals: :func:`decode_refusals`). Raises ``ValueError`` on a
    payload it did not write."""
    return _decoded(payload)[0]


def decode_refusals(payload: bytes) -> dict[str, Refusal]:
    """The refusals :func:`encode` wrote, by name. Raises ``ValueError`` on a payload it did not write."""
    return _decoded(payload)[1]


def _decoded(payload: bytes) -> tuple[dict[str, Kept], dict[str, Refusal]]:
    view = memoryview(payload)
    at = 0

    def take(n: int) -> bytes:
        nonlocal at
        if n < 0 or at + n > len(view):
            raise ValueError("truncated table")
        at += n
        return bytes(view[at - n : at])

    def count() -> int:
        (n,) = _COUNT.unpack(take(_COUNT.size))
        return int(n)

    blobs = [take(count()) for _ in range(count())]
    table: dict[str, Kept] = {}
    for _ in range(count()):
        name = take(count()).decode()
        cert, key, ca, crl, leaf = _ENTRY.unpack(take(_ENTRY.size))
        if cert < 0 or max(cert, key, ca, crl, leaf) >= len(blobs):
            raise ValueError(f"identity {name!r} kept with contents the table does not hold")
        parts = (blobs[cert], *(None if i < 0 else blobs[i] for i in (key, ca, crl)))
        table[name] = (parts, None if leaf < 0 else _leaf_from(blobs[leaf]))
    refusals: dict[str, Refusal] = {}
    for _ in range(count() if at < len(view) else 0):  # a table without refusals ends after its entries
        name = take(count()).decode()
        refusals[name] = _refusal_from(take(count()))
    return table, refusals


class Index(FrozenRecord):
    """Where a region's table keeps each content (offsets into the shared mapping) and which contents each
    identity has: a process serving thousands of identities copies out the few it reads, not the table."""

    _fields = ("starts", "lengths", "entries", "refusals", "leaves", "end")
    __slots__ = _fields
    starts: array[int]
    lengths: array[int]
    entries: dict[str, tuple[int, int, int, int, int]]  # indices of cert, key, CA, CRL, leaf among the contents
    refusals: dict[str, tuple[int, int]]  # where each name's refusal lies in the mapping: offset, length
    # Leaves decoded so far, by content index: a region is never rewritten under the generation this index is
    # for, and a process taking thousands of verdicts at start looks each up more than once.
    leaves: dict[int, Leaf]

    end: int
    """Where in the mapping the table and the change records taken in end."""

    def __init__(
        self,
        starts: array[int],
        lengths: array[int],
        entries: dict[str, tuple[int, int, int, int, int]],
        refusals: dict[str, tuple[int, int]],
        leaves: dict[int, Leaf],
        end: int = 0,
    ) -> None:
        self._set(starts, lengths, entries, refusals, leaves, end)

    @classmethod
    def of(cls, payload: memoryview, start: int) -> Index:
        """The index of ``payload`` (an :func:`encode` table found at offset ``start`` of the mapping).

        Raises:
            ValueError: ``payload`` is not a table :func:`encode` wrote.
        """
        cursor = _Cursor(payload, start)
        starts, lengths = array("Q"), array("Q")
        cursor.blobs(starts, lengths)
        entries = cursor.entries(len(starts))
        refusals = cursor.refusals() if cursor.at < len(payload) else {}
        return cls(starts, lengths, entries, refusals, {}, end=start + len(payload))

    def with_changes(self, records: Sequence[tuple[memoryview, int]]) -> Index:
        """This index with the change ``records`` taken in, in order (each an :func:`encode_change` record and
        its offset in the mapping, the first right after what this index covers, each right after the one
        before): a new index, copied once for all of them; this one is left as it is, for the threads reading it.

        Raises:
            ValueError: a record is not a change :func:`encode_change` wrote for this table.
        """
        starts, lengths = array("Q", self.starts), array("Q", self.lengths)
        entries, refusals = dict(self.entries), dict(self.refusals)
        end = self.end
        for record, start in records:
            cursor = _Cursor(record, start)
            if cursor.count() != len(starts):
                raise ValueError("a change written for another table")
            for name in [cursor.name() for _ in range(cursor.count())]:
                entries.pop(name, None)
                refusals.pop(name, None)
            cursor.blobs(starts, lengths)
            entries.update(cursor.entries(len(starts)))
            refusals.update(cursor.refusals())
            if cursor.at != len(record):
                raise ValueError("a change longer than its contents")
            end = start + len(record)
        return Index(starts, lengths, entries, refusals, self.leaves, end=end)

    def find(self, mapping: mmap.mmap, blob: bytes, near: Iterable[str]) -> int | None:
        """The index of a content equal to ``blob`` among those of the identities ``near`` (compared in place,
        the lengths first), or ``None``: where a change finds contents it need not write again."""
        for name in near:
            entry = self.entries.get(name)
            for index in entry[:4] if entry is not None else ():
                start = self.starts[index] if index >= 0 else 0
                if index >= 0 and self.lengths[index] == len(blob) and mapping[start : start + len(blob)] == blob:
                    return index
        return None

    def contents(self, mapping: mmap.mmap, name: str) -> Kept | None:
        """What is kept for ``name``, copied out of ``mapping`` (``None``: nothing)."""
        entry = self.entries.get(name)
        if entry is None:
            return None
        cert, key, ca, crl = (
            None if i < 0 else mapping[self.starts[i] : self.starts[i] + self.lengths[i]] for i in entry[:4]
        )
        assert cert is not None  # checked when indexed
        return (cert, key, ca, crl), self._leaf(mapping, entry[4])

    def holds(self, mapping: mmap.mmap, name: str, parts: Parts) -> tuple[bool, Leaf | None]:
        """Whether exactly ``parts`` are kept for ``name``, and the leaf kept with them: compared in place, the
        lengths first, nothing copied out for a name kept with other contents (a process taking thousands of
        verdicts at start compares each identity's bytes with the store's)."""
        entry = self.entries.get(name)
        if entry is None:
            return False, None
        for index, part in zip(entry[:4], parts, strict=True):
            if index < 0 or part is None:
                if index >= 0 or part is not None:
                    return False, None
                continue
            start = self.starts[index]
            if self.lengths[index] != len(part) or mapping[start : start + len(part)] != part:
                return False, None
        return True, self._leaf(mapping, entry[4])

    def _leaf(self, mapping: mmap.mmap, index: int) -> Leaf | None:
        """The leaf kept as content ``index`` (``None``: none, or one this version does not read), decoded once."""
        judged = self.leaves.get(index) if index >= 0 else None
        if judged is None and index >= 0:
            try:
                judged = self.leaves[index] = _leaf_from(
                    mapping[self.starts[index] : self.starts[index] + self.lengths[index]]
                )
            except ValueError:  # a leaf this version does not read: kept without it
                judged = None
        return judged

    def refusal(self, mapping: mmap.mmap, name: str) -> Refusal | None:
        """The refusal kept for ``name`` in ``mapping`` (``None``: none, or one this version does not read)."""
        where = self.refusals.get(name)
        if where is None:
            return None
        try:
            return _refusal_from(mapping[where[0] : where[0] + where[1]])
        except ValueError:
            return None

    def all_refusals(self, mapping: mmap.mmap) -> dict[str, Refusal]:
        """Every refusal kept in ``mapping``, by name: for a write."""
        return {name: refusal for name in self.refusals if (refusal := self.refusal(mapping, name)) is not None}


class _Cursor:
    """Reads a table or a change record found at offset ``start`` of the mapping: counts, names, the contents'
    places, entries and refusals, each checked against the record's length."""

    def __init__(self, payload: memoryview, start: int) -> None:
        self.payload, self.start, self.at = payload, start, 0

    def _take(self, size: int) -> int:
        if size < 0 or self.at + size > len(self.payload):
            raise ValueError("truncated table")
        self.at += size
        return self.at - size

    def count(self) -> int:
        (n,) = _COUNT.unpack_from(self.payload, self._take(_COUNT.size))
        return int(n)

    def name(self) -> str:
        size = self.count()
        at = self._take(size)
        return bytes(self.payload[at : at + size]).decode()

    def blobs(self, starts: array[int], lengths: array[int]) -> None:
        for _ in range(self.count()):
            length = self.count()
            starts.append(self.start + self._take(length))
            lengths.append(length)

    def entries(self, held: int) -> dict[str, tuple[int, int, int, int, int]]:
        entries: dict[str, tuple[int, int, int, int, int]] = {}
        for _ in range(self.count()):
            name = self.name()
            cert, key, ca, crl, leaf = _ENTRY.unpack_from(self.payload, self._take(_ENTRY.size))
            if cert < 0 or max(cert, key, ca, crl, leaf) >= held:
                raise ValueError(f"identity {name!r} kept with contents the table does not hold")
            entries[name] = (cert, key, ca, crl, leaf)
        return entries

    def refusals(self) -> dict[str, tuple[int, int]]:
        refusals: dict[str, tuple[int, int]] = {}
        for _ in range(self.count()):
            name = self.name()
            size = self.count()
            refusals[name] = (self.start + self._take(size), size)
        return refusals
