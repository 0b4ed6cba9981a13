"""The table a :class:`~tlsreload_plugins.lastgood.store.SharedStore` region holds, as bytes: :func:`encode` writes
it (each distinct content once, then each identity's name and the indices of its contents, then the refusals
kept: :data:`Refusal`), :func:`decode` reads it whole, and :class:`Index` locates each identity's contents in
place, so a process serving thousands of identities copies out only the few it reads. No file, no lock: the
mapping and its locking are :mod:`tlsreload_plugins.lastgood.store`'s.
"""

from __future__ import annotations

import json
import mmap
import struct
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Index:
    """Where a region's table keeps each content (offsets into the shared mapping) and which contents each
    identity has: a process serving thousands of identities copies out the few it reads, not the table."""

    starts: array[int]
    lengths: array[int]
    entries: dict[str, tuple[int, int, int, int, int]]  # indices of cert, key, CA, CRL, leaf among the contents
    refusals: dict[str, tuple[int, int]]  # where each name's refusal lies in the mapping: offset, length
    # Leaves decoded so far, by content index: a region is never rewritten under the generation this index is
    # for, and a process taking thousands of verdicts at start looks each up more than once.
    leaves: dict[int, Leaf] = field(default_factory=dict)

    @classmethod
    def of(cls, payload: memoryview, start: int) -> Index:
        """The index of ``payload`` (an :func:`encode` table found at offset ``start`` of the mapping).

        Raises:
            ValueError: ``payload`` is not a table :func:`encode` wrote.
        """
        at = 0

        def count() -> int:
            nonlocal at
            if at + _COUNT.size > len(payload):
                raise ValueError("truncated table")
            (n,) = _COUNT.unpack_from(payload, at)
            at += _COUNT.size
            return int(n)

        starts, lengths = array("Q"), array("Q")
        for _ in range(count()):
            length = count()
            if at + length > len(payload):
                raise ValueError("truncated table")
            starts.append(start + at)
            lengths.append(length)
            at += length
        entries: dict[str, tuple[int, int, int, int, int]] = {}
        for _ in range(count()):
            size = count()
            if at + size + _ENTRY.size > len(payload):
                raise ValueError("truncated table")
            name = bytes(payload[at : at + size]).decode()
            cert, key, ca, crl, leaf = _ENTRY.unpack_from(payload, at + size)
            at += size + _ENTRY.size
            if cert < 0 or max(cert, key, ca, crl, leaf) >= len(starts):
                raise ValueError(f"identity {name!r} kept with contents the table does not hold")
            entries[name] = (cert, key, ca, crl, leaf)
        refusals: dict[str, tuple[int, int]] = {}
        for _ in range(count() if at < len(payload) else 0):
            name_size = count()
            if at + name_size > len(payload):
                raise ValueError("truncated table")
            name = bytes(payload[at : at + name_size]).decode()
            at += name_size
            size = count()
            if at + size > len(payload):
                raise ValueError("truncated table")
            refusals[name] = (start + at, size)
            at += size
        return cls(starts, lengths, entries, refusals)

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
