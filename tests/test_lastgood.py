"""The last good identity: kept in memory shared across fork(), rebuilt through the server's recipe
from in-memory files, served by a reloader that starts while the files are broken. Real files,
real fork(), real handshakes against an in-process server."""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import ssl
import tempfile
from pathlib import Path

import pytest
import trustme

from tls_server import make_recipe, serving
from tlsreload_plugins import InvalidIdentity, Outcome, Reloader, TLSFiles
from tlsreload_plugins.identity import Snapshot
from tlsreload_plugins.lastgood import CopyStore, LastGood, SharedStore, in_memory_files
from tlstest import Pair, client_context, issue, served_serial, wait_for_child


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile, files.ca_certs)()


def snapshot_of(pair: Pair) -> Snapshot:
    return Snapshot(TLSFiles("tls.crt", "tls.key"), pair.chain, pair.key, None)


def test_a_shared_store_written_by_a_forked_child_is_read_by_its_parent(ca: trustme.CA) -> None:
    store = SharedStore()
    first, second = issue(ca), issue(ca)
    store.write(snapshot_of(first))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.write(snapshot_of(second))
            code = 0
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    assert store.read() == (second.chain, second.key, None)


def test_a_torn_slot_falls_back_to_the_other(ca: trustme.CA) -> None:
    store = SharedStore()
    first, second = issue(ca), issue(ca)
    store.write(snapshot_of(first))
    store.write(snapshot_of(second))
    # A writer killed halfway through its next write: the newer slot's payload no longer matches its digest.
    newer = max((0, 1), key=lambda i: store._slot(i)[0])  # type: ignore[index]
    store._map[newer * len(store._map) // 2 + 100] ^= 0xFF
    assert store.read() == (first.chain, first.key, None)


def test_a_copy_store_travels_by_pickle(ca: trustme.CA) -> None:
    store = CopyStore()
    pair = issue(ca)
    store.write(snapshot_of(pair))
    assert pickle.loads(pickle.dumps(store)).read() == (pair.chain, pair.key, None)


def test_in_memory_files_build_a_context_and_leave_nothing_on_disk(ca: trustme.CA) -> None:
    pair = issue(ca)
    before = set(os.listdir(tempfile.gettempdir()))
    with in_memory_files(pair.chain, pair.key, None) as files:
        context = recipe_for(files)
        assert files.certfile.startswith("/proc/self/fd/")
    assert set(os.listdir(tempfile.gettempdir())) == before
    with serving(context) as port:
        assert served_serial(port, client_context(ca)) == pair.serial


def test_a_reloader_started_on_broken_files_serves_the_last_good_then_the_files(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    served, newer = issue(ca), issue(ca)
    last_good = LastGood(SharedStore(), recipe_for)
    last_good.remember(snapshot_of(served))
    cert.write_bytes(newer.chain)
    key.write_bytes(served.key)  # a half-done rotation: mismatched
    reloader = Reloader(str(cert), str(key), recipe=make_recipe(str(cert), str(key)), last_good=last_good)
    client = client_context(ca)
    with serving(reloader.context) as port:
        assert served_serial(port, client) == served.serial
        assert [reloader.check() for _ in range(3)] == [Outcome.FAILED] * 3  # reported already: quiet
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "serving the last good certificate" in warnings[0], warnings
        assert str(key) in warnings[0]
        status = reloader.status()
        assert status.failures == 1 and status.last_error is not None and str(key) in status.last_error
        key.write_bytes(newer.key)
        assert reloader.check() is Outcome.RELOADED
        assert served_serial(port, client) == newer.serial
    assert last_good.store.read() == (newer.chain, newer.key, None)  # what it now serves is kept


def test_an_expired_last_good_is_not_served(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = issue(ca, not_before=now - datetime.timedelta(days=2), not_after=now - datetime.timedelta(days=1))
    last_good = LastGood(CopyStore(), recipe_for)
    last_good.remember(snapshot_of(expired))
    with pytest.raises(InvalidIdentity, match=r"does not exist; the last good certificate .* outside its validity"):
        Reloader(str(cert), str(key), recipe=make_recipe(str(cert), str(key)), last_good=last_good)


def test_nothing_kept_is_the_usual_start_up_error(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    last_good = LastGood(CopyStore(), recipe_for)
    with pytest.raises(InvalidIdentity, match=r"tls.crt does not exist; no certificate was served"):
        Reloader(str(cert), str(key), recipe=make_recipe(str(cert), str(key)), last_good=last_good)
