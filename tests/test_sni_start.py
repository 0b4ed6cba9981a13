"""An SNI start at scale (issue 29): a large batch validated by one child per CPU at once, with the verdicts a single
child gives, in order; a process starting after its server's arbiter validated every identity reads each identity's
files once and validates none of them (the verdicts and the refusals are taken from the last good store). Real
files and real validation children."""

from __future__ import annotations

import ssl
import threading

import pytest
import trustme

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.identity import Leaf, validate
from tlsreload_plugins.validation import apart as validate_apart
from tlstest import issue


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Validation in children although this process has loaded cryptography; the batch size of every child
    started from now on, whatever thread started it."""
    monkeypatch.setenv(validate_apart.VALIDATE_ENV, "process")
    monkeypatch.setattr(validate_apart, "_fallback", None)
    batches: list[int] = []
    lock = threading.Lock()
    real = validate_apart.validate_in_child

    def counting(items: list[tuple[Snapshot, object]], **kwargs: object) -> list[object]:
        with lock:
            batches.append(len(items))
        return real(items, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validate_apart, "validate_in_child", counting)
    return batches


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile)
    return context


def test_a_large_batch_is_split_across_children_with_the_verdicts_one_child_gives(
    ca: trustme.CA, children: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validate_apart, "PER_CHILD", 2)
    monkeypatch.setattr(validate_apart, "_cpus", lambda: 3)
    pairs = [issue(ca) for _ in range(6)]
    items = [
        (Snapshot(TLSFiles(f"/site{i}/tls.crt", f"/site{i}/tls.key"), p.chain, p.key, None), None)
        for i, p in enumerate(pairs)
    ]
    items.insert(4, (Snapshot(TLSFiles("/bad/tls.crt", "/bad/tls.key"), pairs[0].chain, pairs[1].key, None), None))
    verdicts = validate_apart.validate_many(items)  # type: ignore[arg-type]
    assert sorted(children) == [1, 3, 3]  # three children at once, 7 identities split 3, 3 and 1
    for (snapshot, _), verdict in zip(items, verdicts, strict=True):
        try:
            expected: Leaf | str = validate(snapshot)
        except InvalidIdentity as e:
            expected = str(e)
        assert (verdict if isinstance(verdict, Leaf) else str(verdict)) == expected
