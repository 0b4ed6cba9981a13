"""Validation in a child process (issue 25): the same verdicts as ``identity.validate`` in this process, every
identity of a batch judged by one child, a child that stalls or crashes stopped and named, no child or
descriptor left behind, and validation in this process (said once) when no child can start."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from hostile import HOSTILE, place_good
from tlsreload_plugins import SNIIdentities
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.files import Snapshot, TLSFiles, read_files
from tlsreload_plugins.identity import Leaf, validate
from tlsreload_plugins.validation import apart as validate_apart
from tlsreload_plugins.validation import child as validate_child
from tlstest import issue, sni_tree, with_password

# The child's own start (validate_child._BOOT), with a validate that stalls on a certificate holding STALL and
# ends the process on one holding CRASH.
MISBEHAVING = (
    "import json, os, sys, time, types\n"
    "package = types.ModuleType('tlsreload_plugins')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['tlsreload_plugins'] = package\n"
    "sys.path[:] = json.loads(sys.stdin.buffer.readline())['path']\n"
    "from tlsreload_plugins.validation import child as validate_child\n"
    "real = validate_child.validate\n"
    "def validate(snapshot, password=None):\n"
    "    if b'STALL' in snapshot.cert:\n"
    "        time.sleep(3600)\n"
    "    if b'CRASH' in snapshot.cert:\n"
    "        os._exit(9)\n"
    "    return real(snapshot, password)\n"
    "validate_child.validate = validate\n"
    "validate_child.serve(sys.stdin.buffer, sys.stdout.buffer)\n"
)


@pytest.fixture(autouse=True)
def in_a_child(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Validation in a child although this process has loaded cryptography; the batch size of each child this
    test's thread started, in order (a keeper thread an earlier test left running may start its own)."""
    monkeypatch.setenv(validate_apart.VALIDATE_ENV, "process")
    monkeypatch.setattr(validate_apart, "_fallback", None)
    batches: list[int] = []
    real = validate_apart.validate_in_child
    this_thread = threading.current_thread()

    def counting(items: list[tuple[Snapshot, object]], **kwargs: object) -> list[object]:
        if threading.current_thread() is this_thread:
            batches.append(len(items))
        return real(items, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validate_apart, "validate_in_child", counting)
    yield batches


def children() -> set[str]:
    """This process's children (zombies included), as ``pid state``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.append(f"{entry} {fields[0]}")
    return set(found)


def pipes() -> set[str]:
    """This process's descriptors that are pipes (what a conversation with a child opens)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                found.add(fd)
    return found


def snapshot_of(cert: bytes, key: bytes | None, name: str = "x") -> Snapshot:
    return Snapshot(TLSFiles(f"/{name}/tls.crt", f"/{name}/tls.key"), cert, key, None)


def same(verdict: object, expected: Leaf | InvalidIdentity) -> bool:
    if isinstance(expected, Leaf):
        return verdict == expected
    return isinstance(verdict, InvalidIdentity) and (str(verdict), verdict.path) == (str(expected), expected.path)


def in_process(snapshot: Snapshot, password: object = None) -> Leaf | InvalidIdentity:
    try:
        return validate(snapshot, password)  # type: ignore[arg-type]
    except InvalidIdentity as e:
        return e


def test_every_hostile_case_gets_the_verdict_validate_gives_in_process(tmp_path: Path, ca: trustme.CA) -> None:
    cases: list[Snapshot] = []
    for case, place in HOSTILE.items():
        cert, key = tmp_path / case / "tls.crt", tmp_path / case / "tls.key"
        cert.parent.mkdir()
        place_good(cert, key, ca)
        place(cert, key, ca)
        try:
            cases.append(read_files(TLSFiles(str(cert), str(key))))
        except InvalidIdentity:  # refused unread (a FIFO, /dev/zero, too large): no parsing to compare
            assert case in ("fifo", "dev_zero", "dev_urandom", "huge", "many_certs"), case
    assert len(cases) == 6
    pair = issue(ca)
    cases += [
        snapshot_of(b"", pair.key, "empty"),
        snapshot_of(pair.key, pair.chain, "swapped"),
        snapshot_of(pair.chain[: len(pair.chain) // 2], pair.key, "truncated"),
        snapshot_of(pair.chain, pair.key[:-40], "truncated-key"),
        Snapshot(TLSFiles("/none/tls.crt"), pair.chain, None, None),
        Snapshot(TLSFiles("/ca/tls.crt", "/ca/tls.key", "/ca/ca.crt"), pair.chain, pair.key, b"not a bundle"),
        Snapshot(TLSFiles("/ca/tls.crt", "/ca/tls.key", "/ca/ca.crt"), pair.chain, pair.key, ca.cert_pem.bytes()),
    ]
    before = children()
    verdicts = validate_apart.validate_many([(snapshot, None) for snapshot in cases])
    for snapshot, verdict in zip(cases, verdicts, strict=True):
        assert same(verdict, in_process(snapshot)), (snapshot.files, verdict)
    assert children() <= before


def test_a_good_pair_a_password_and_an_unreadable_password_file(tmp_path: Path, ca: trustme.CA) -> None:
    pair = issue(ca)
    locked = with_password(pair, "s3cret")
    missing = str(tmp_path / "no-such-password")

    def unreadable() -> bytes:
        return Path(missing).read_bytes()

    items: list[tuple[Snapshot, object]] = [
        (snapshot_of(pair.chain, pair.key), None),
        (snapshot_of(locked.chain, locked.key), "s3cret"),
        (snapshot_of(locked.chain, locked.key), b"wrong"),
        (snapshot_of(locked.chain, locked.key), unreadable),
        (snapshot_of(pair.chain + pair.key, None), None),
    ]
    verdicts = validate_apart.validate_many(items)  # type: ignore[arg-type]
    assert isinstance(verdicts[0], Leaf) and verdicts[0].serial == pair.serial
    for (snapshot, password), verdict in zip(items, verdicts, strict=True):
        assert same(verdict, in_process(snapshot, password)), verdict
    assert "FileNotFoundError" in str(verdicts[3])


def test_a_batch_is_one_child_and_judge_takes_what_prejudged_found(ca: trustme.CA, in_a_child: list[int]) -> None:
    pairs = [issue(ca) for _ in range(5)]
    items = [(snapshot_of(p.chain, p.key, f"site{i}"), None) for i, p in enumerate(pairs)]
    assert [leaf.serial for leaf in validate_apart.validate_many(items)] == [p.serial for p in pairs]  # type: ignore[union-attr]
    assert in_a_child == [5]
    with validate_apart.prejudged(items):
        assert [validate_apart.validate(snapshot).serial for snapshot, _ in items] == [p.serial for p in pairs]
        with pytest.raises(InvalidIdentity, match="does not match"):
            validate_apart.validate(snapshot_of(pairs[0].chain, pairs[1].key))  # not judged ahead: a child of its own
    assert in_a_child == [5, 5, 1]
    validate_apart.validate(items[0][0])  # the block has ended
    assert in_a_child == [5, 5, 1, 1]


def test_a_stalled_child_is_killed_its_identity_named_and_a_new_child_judges_the_rest(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, in_a_child: list[int]
) -> None:
    command = [sys.executable, "-c", MISBEHAVING, validate_child._PACKAGE]
    real = validate_apart.validate_in_child  # the fixture's, counting
    monkeypatch.setattr(validate_apart, "validate_in_child", functools.partial(real, command=command, item_wait=1.0))
    good, other = issue(ca), issue(ca)
    fds, before = pipes(), children()
    items = [
        (snapshot_of(good.chain, good.key, "first"), None),
        (snapshot_of(b"STALL" + good.chain, good.key, "stalls"), None),
        (snapshot_of(b"CRASH" + good.chain, good.key, "crashes"), None),
        (snapshot_of(other.chain, other.key, "last"), None),
    ]
    verdicts = validate_apart.validate_many(items)  # type: ignore[arg-type]
    assert isinstance(verdicts[0], Leaf) and verdicts[0].serial == good.serial
    stalled, crashed = verdicts[1], verdicts[2]
    assert isinstance(stalled, InvalidIdentity) and stalled.path == "/stalls/tls.crt"
    assert "validating cert=/stalls/tls.crt key=/stalls/tls.key took longer than 1 s: stopped" in str(stalled)
    assert isinstance(crashed, InvalidIdentity) and crashed.path == "/crashes/tls.crt"
    assert "cert=/crashes/tls.crt key=/crashes/tls.key ended without a verdict (exit status 9)" in str(crashed)
    assert isinstance(verdicts[3], Leaf) and verdicts[3].serial == other.serial
    assert in_a_child == [4, 2, 1]  # a new child for those after the stalled one, another after the crash
    assert children() <= before
    assert pipes() == fds


def test_no_child_can_start_validation_runs_here_said_once(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = validate_apart.validate_in_child
    monkeypatch.setattr(validate_apart, "validate_in_child", functools.partial(real, command=["/nonexistent/python3"]))
    pair = issue(ca)
    fds = pipes()
    first = validate_apart.validate(snapshot_of(pair.chain, pair.key))
    assert first.serial == pair.serial
    with pytest.raises(InvalidIdentity, match="does not match"):
        validate_apart.validate(snapshot_of(pair.chain, issue(ca).key))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "/nonexistent/python3" in warnings[0], warnings
    assert "validated in this process from now on" in warnings[0]
    assert validate_apart.apart() is False
    assert pipes() == fds


def test_a_child_that_cannot_import_cryptography_is_a_child_that_cannot_start(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = [sys.executable, "-I", "-S", "-c", "import sys; sys.exit('no cryptography here')"]
    before = children()
    with pytest.raises(validate_child.ChildUnavailable, match="no cryptography here"):
        validate_child.validate_in_child([(snapshot_of(b"c", b"k"), None)], command=command)
    assert children() <= before


def test_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert validate_apart.apart() is True  # forced by the fixture
    monkeypatch.setenv(validate_apart.VALIDATE_ENV, "inline")
    assert validate_apart.apart() is False
    monkeypatch.delenv(validate_apart.VALIDATE_ENV)
    assert validate_apart.apart() is False  # this process has loaded cryptography: a child would spare nothing


def test_sni_identities_found_at_start_are_validated_by_one_child(
    tmp_path: Path, ca: trustme.CA, in_a_child: list[int]
) -> None:
    sni = tmp_path / "sni"
    sni_tree(sni, ca, 12)

    def recipe_for(files: TLSFiles) -> object:
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(files.certfile, files.keyfile)
        return context

    identities = SNIIdentities(str(sni), recipe_for=recipe_for, interval=60)  # type: ignore[arg-type]
    assert in_a_child == [13]
    summary = identities.summary()
    assert (summary.valid, list(summary.refused)) == (12, ["broken"]), summary
    assert "does not match" in identities.unserved()["broken"]


def test_a_large_batch_where_validation_runs_here_is_split_one_part_here_the_others_in_children(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's reader has loaded cryptography and validates in itself; the thousands of SNI identities it finds at
    its start are judged in parts at once (one per CPU, each of PER_CHILD or more): the first here, each other in a
    child. A batch too small to split is not judged ahead; ``$TLSRELOAD_VALIDATE=inline`` keeps every part here."""
    monkeypatch.delenv(validate_apart.VALIDATE_ENV)
    monkeypatch.setattr(validate_apart, "PER_CHILD", 3)
    monkeypatch.setattr(validate_apart, "_cpus", lambda: 2)
    children: list[int] = []
    real = validate_apart.validate_in_child

    def counting(items: list[tuple[Snapshot, object]], **kwargs: object) -> list[object]:
        children.append(len(items))
        return real(items, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validate_apart, "validate_in_child", counting)
    pairs = [issue(ca) for _ in range(6)]
    items = [(snapshot_of(p.chain, p.key, f"site{i}"), None) for i, p in enumerate(pairs)]
    items.append((snapshot_of(pairs[0].chain, pairs[1].key, "broken"), None))
    assert not validate_apart.apart() and validate_apart.batched(len(items)) and not validate_apart.batched(5)

    verdicts = validate_apart.validate_many(items)

    assert children == [3]  # 7 in two parts, 4 and 3: the first judged here, the second by one child
    assert [leaf.serial for leaf in verdicts[:6]] == [p.serial for p in pairs]  # type: ignore[union-attr]
    assert isinstance(verdicts[6], InvalidIdentity) and "does not match" in str(verdicts[6])
    with validate_apart.prejudged(items):  # judged ahead in parts too, and taken one by one
        assert validate_apart.validate(items[5][0]).serial == pairs[5].serial
    assert children == [3, 3]
    monkeypatch.setenv(validate_apart.VALIDATE_ENV, "inline")
    assert not validate_apart.batched(len(items))
