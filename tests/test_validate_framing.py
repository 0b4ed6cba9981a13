"""A batch framed for the validating child (``child_process.frames``: a JSON header per group of identities, their
bytes end to end; one ``json.loads`` for the verdicts one read brings): identities of very different sizes, an
empty certificate, a missing key, passwords right, wrong and unreadable get, in order, the verdicts
``identity.validate`` gives in this process, whether the batch is one group or a group per identity."""

from __future__ import annotations

import pytest
import trustme

from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Password, Snapshot, TLSFiles
from tlsreload_plugins.identity import Leaf, validate
from tlsreload_plugins.validation import apart as validate_apart
from tlsreload_plugins.validation import child as validate_child
from tlsreload_plugins.validation import process as child_process
from tlstest import PASSWORD, issue, with_password


def unreadable_password() -> bytes:
    raise OSError("[Errno 2] No such file or directory: '/run/secrets/tls-password'")


def batch(ca: trustme.CA) -> list[tuple[Snapshot, Password]]:
    good, other, locked = issue(ca), issue(ca, "a.example", "b.example"), with_password(issue(ca), PASSWORD)
    bundle = trustme.CA().cert_pem.bytes() * 800  # about 530 KiB of client CAs: two close a group

    def snapshot(name: str, cert: bytes, key: bytes | None, ca_bundle: bytes | None = None) -> Snapshot:
        return Snapshot(
            TLSFiles(f"/{name}/tls.crt", None if key is None else f"/{name}/tls.key", "/ca.crt"), cert, key, ca_bundle
        )

    return [
        (snapshot("good", good.chain, good.key), None),
        (snapshot("bundle", other.chain, other.key, bundle), None),
        (snapshot("empty", b"", good.key), None),
        (snapshot("no-key", good.chain, None), None),
        (snapshot("key-in-cert", good.chain + good.key, None), None),
        (snapshot("locked", locked.chain, locked.key), PASSWORD),
        (snapshot("locked-bytes", locked.chain, locked.key), PASSWORD.encode()),
        (snapshot("wrong-password", locked.chain, locked.key), "not it"),
        (snapshot("unreadable-password", locked.chain, locked.key), unreadable_password),
        (snapshot("mismatch", good.chain, other.key), None),
        (snapshot("garbage", b"x", b"y"), None),
        (snapshot("bundle-again", good.chain, good.key, bundle), None),
        (snapshot("last", other.chain, other.key), None),
    ]


def here(snapshot: Snapshot, password: Password) -> Leaf | InvalidIdentity:
    try:
        return validate(snapshot, password)
    except InvalidIdentity as e:
        return e


def same(verdict: object, expected: Leaf | InvalidIdentity) -> bool:
    if isinstance(expected, Leaf):
        return verdict == expected
    return isinstance(verdict, InvalidIdentity) and (str(verdict), verdict.path) == (str(expected), expected.path)


@pytest.mark.parametrize("group_bytes", [child_process.GROUP_BYTES, 1])
def test_a_batch_of_every_kind_gets_the_verdicts_of_validate_in_order(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, group_bytes: int
) -> None:
    monkeypatch.setenv(validate_apart.VALIDATE_ENV, "process")
    monkeypatch.setattr(validate_apart, "_fallback", None)
    monkeypatch.setattr(child_process, "GROUP_BYTES", group_bytes)  # 1: a header per identity
    items = batch(ca)
    expected = [here(snapshot, password) for snapshot, password in items]
    assert sum(isinstance(verdict, Leaf) for verdict in expected) == 7
    verdicts = validate_child.validate_in_child(items)
    assert len(verdicts) == len(items)
    for (snapshot, _), verdict, wanted in zip(items, verdicts, expected, strict=True):
        assert same(verdict, wanted), (snapshot.files.certfile, verdict, wanted)


def test_frames_hold_each_identitys_bytes_once_after_a_header_per_group(ca: trustme.CA) -> None:
    items = batch(ca)
    frames = list(child_process.frames(items, ["/nowhere"]))
    assert frames[0] == b'{"path": ["/nowhere"]}\n'
    body = b"".join(frames[1:])
    for snapshot, _ in items:
        assert snapshot.cert in body and (snapshot.key or b"") in body
    assert 2 <= len(frames) - 1 < len(items)  # the two bundles close a group; the small ones share one
