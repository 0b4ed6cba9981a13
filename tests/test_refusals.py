"""Refusals kept in the last good store: the process that validates content and refuses it keeps the refusal (its
message and path, for exactly those bytes and that key password), and another process of the server that reads
the same bytes takes it instead of validating them again; a gunicorn worker started on broken files then starts
as fast as one on good files. Real files, real fork(), a real server answering a real client."""

from __future__ import annotations

import logging
import os
import ssl
import struct
from pathlib import Path

import pytest
import trustme

import tlsreload_plugins.lastgood.last_good
import tlsreload_plugins.validation.apart
from tls_server import make_recipe, serving
from tlsreload_plugins import InvalidIdentity, Outcome, Reloader, TLSFiles
from tlsreload_plugins.errors import Unjudged
from tlsreload_plugins.files import Snapshot, read_files
from tlsreload_plugins.identity import validate
from tlsreload_plugins.lastgood.last_good import LastGood, content_key, keep_all_valid, shareable
from tlsreload_plugins.lastgood.store import SharedStore
from tlsreload_plugins.lastgood.table import decode, decode_refusals, encode
from tlstest import client_context, issue, served_serial, wait_for_child


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile, files.ca_certs)()


def counting(monkeypatch: pytest.MonkeyPatch) -> list[Snapshot]:
    """Every validation the last good store's users run from now on (at start and in checks)."""
    judged: list[Snapshot] = []
    real = tlsreload_plugins.validation.apart.validate

    def count(snapshot: Snapshot, password: object = None) -> object:
        judged.append(snapshot)
        return real(snapshot, password)  # type: ignore[arg-type]

    monkeypatch.setattr(tlsreload_plugins.validation.apart, "validate", count)
    return judged


def test_the_table_keeps_refusals_beside_the_identities(ca: trustme.CA) -> None:
    pair = issue(ca)
    table = {"": ((pair.chain, pair.key, None, None), None)}
    refusals = {"shop": ("digest:password", "key file k does not match", "k"), "": ("d:p", "torn", None)}
    payload = encode(table, refusals)
    assert decode(payload) == table and decode_refusals(payload) == refusals
    assert decode_refusals(encode(table)) == {} and encode(table, {}) == encode(table)
    with pytest.raises(ValueError):
        decode_refusals(payload[:-3])
    with pytest.raises(ValueError):
        decode_refusals(encode(table) + struct.pack("<I", 1) + struct.pack("<I", 1) + b"n" + struct.pack("<I", 3))


def test_a_refusal_found_in_one_process_is_taken_by_another_without_validating(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    served, newer = issue(ca), issue(ca)
    cert.write_bytes(served.chain)
    key.write_bytes(served.key)
    store = SharedStore()
    recipe = make_recipe(str(cert), str(key))
    running = Reloader(str(cert), str(key), recipe=recipe, last_good=LastGood(store, recipe_for))
    cert.write_bytes(newer.chain)  # a half-done rotation: mismatched
    pid = os.fork()
    if pid == 0:  # a sibling worker: its check refuses the bytes and keeps the refusal
        code = 1
        try:
            code = 0 if running.check(settle=False) is Outcome.FAILED else 2
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    snapshot = read_files(TLSFiles(str(cert), str(key)))
    kept = LastGood(store, recipe_for).refusal(snapshot, None)
    assert kept is not None and kept.path == str(key) and "does not match" in str(kept)
    assert LastGood(store, recipe_for).refusal(snapshot, "another password") is None  # a verdict for this one only

    judged = counting(monkeypatch)
    started = Reloader(str(cert), str(key), recipe=recipe, last_good=LastGood(store, recipe_for))
    assert judged == []  # taken, not validated again: neither at start nor by the start's own look
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "serving the last good certificate" in warnings[0] and str(kept) in warnings[0]
    status = started.status()
    assert status.failures == 1 and status.last_error is not None and str(kept) in status.last_error
    assert [started.check() for _ in range(3)] == [Outcome.FAILED] * 3 and judged == []
    with serving(started.context) as port:
        assert served_serial(port, client_context(ca)) == served.serial
    key.write_bytes(newer.key)
    assert started.check() is Outcome.RELOADED and len(judged) == 1


def test_the_arbiter_keeps_the_refusals_of_sni_identities_for_its_workers(tmp_path: Path, ca: trustme.CA) -> None:
    good, other = issue(ca, "good.test"), issue(ca, "bad.test")
    files = {}
    for name, (chain, key) in {"good": (good.chain, good.key), "bad": (other.chain, good.key)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "tls.crt").write_bytes(chain)
        (tmp_path / name / "tls.key").write_bytes(key)
        files[name] = TLSFiles(str(tmp_path / name / "tls.crt"), str(tmp_path / name / "tls.key"))
    store = SharedStore()
    refused = keep_all_valid(files, None, store)
    assert list(refused) == ["bad"]
    kept = LastGood(store, recipe_for, "bad").refusal(read_files(files["bad"]), None)
    assert kept is not None and str(kept) == refused["bad"]
    assert (
        store.read("good") is not None
        and LastGood(store, recipe_for, "good").refusal(read_files(files["good"]), None) is None
    )


def test_a_child_stopped_before_its_verdict_is_not_a_verdict_to_share() -> None:
    assert not shareable(Unjudged("validating cert=x took longer than 10 s: stopped", path="x"))
    assert shareable(InvalidIdentity("key file k does not match", path="k"))
    snapshot = Snapshot(TLSFiles("c", "k"), b"cert", b"key", None)
    assert content_key(snapshot, None) != content_key(snapshot, "secret")
    assert content_key(snapshot, None) != content_key(Snapshot(TLSFiles("c", "k"), b"cert", b"kez", None), None)


def test_a_start_on_content_nobody_judged_serves_the_last_good_at_once_and_its_first_check_judges(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where validation takes a child process, a process started on content no process of the server has judged
    serves the last good identity without waiting for it; its first check judges the content and reports a
    refusal at once (kept for the others), or serves valid content."""
    monkeypatch.setenv("TLSRELOAD_VALIDATE", "process")
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    served, newer = issue(ca), issue(ca)
    store = SharedStore()
    kept = Snapshot(TLSFiles(str(cert), str(key)), served.chain, served.key, None)
    LastGood(store, recipe_for).remember(kept, validate(kept))  # as a serving process keeps it: with its verdict
    cert.write_bytes(newer.chain)
    key.write_bytes(served.key)  # mismatched, and nobody has judged it
    recipe = make_recipe(str(cert), str(key))
    judged = counting(monkeypatch)
    started = Reloader(str(cert), str(key), recipe=recipe, last_good=LastGood(store, recipe_for))
    assert judged == [] and started.status().failures == 0
    assert any("serving the last good certificate this server served" in r.getMessage() for r in caplog.records)
    with serving(started.context) as port:
        assert served_serial(port, client_context(ca)) == served.serial
        assert started.check() is Outcome.FAILED and len(judged) == 1  # reported at once, not after settling
        assert [started.check() for _ in range(2)] == [Outcome.FAILED] * 2 and len(judged) == 1
        assert started.status().failures == 1
        assert LastGood(store, recipe_for).refusal(read_files(started.files), None) is not None
        key.write_bytes(newer.key)
        assert started.check() is Outcome.RELOADED
        assert served_serial(port, client_context(ca)) == newer.serial

    third = issue(ca)
    cert.write_bytes(third.chain)
    key.write_bytes(third.key)  # valid, and nobody has judged it: served from the first check on
    again = Reloader(str(cert), str(key), recipe=recipe, last_good=LastGood(store, recipe_for))
    assert again.leaf.serial == newer.serial and again.check() is Outcome.RELOADED and again.leaf.serial == third.serial


def test_nothing_kept_to_serve_meanwhile_means_the_content_is_judged_at_start(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TLSRELOAD_VALIDATE", "process")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(issue(ca).chain)
    key.write_bytes(issue(ca).key)
    recipe = make_recipe(str(cert), str(key))
    with pytest.raises(InvalidIdentity, match=r"does not match the certificate.*no certificate was served") as e:
        Reloader(str(cert), str(key), recipe=recipe, last_good=LastGood(SharedStore(), recipe_for))
    assert "not judged" not in str(e.value)
