"""The last good identity: kept in memory shared across fork() and with spawned processes, rebuilt
through the server's recipe from in-memory files, served by a reloader that starts while the files are
broken; the keeper whose verdicts spawned workers take. Real files, real fork() and multiprocessing
spawn, real handshakes against an in-process server."""

from __future__ import annotations

import datetime
import json
import logging
import multiprocessing
import os
import pickle
import ssl
import struct
import tempfile
import time
from pathlib import Path

import pytest
import trustme

from spawned import serve_and_reload
from tls_server import make_recipe, serving
from tlsreload_plugins import InvalidIdentity, Outcome, Reloader, TLSFiles
from tlsreload_plugins.files import Snapshot, read_files
from tlsreload_plugins.identity import validate
from tlsreload_plugins.lastgood import store as store_module
from tlsreload_plugins.lastgood.last_good import LastGood, NotJudged, keep_newest_valid, verdict
from tlsreload_plugins.lastgood.store import SharedStore
from tlsreload_plugins.lastgood.table import decode, encode
from tlsreload_plugins.memory_files import in_memory_files
from tlsreload_plugins.sni.ahead import judged
from tlstest import KubeletLayout, Pair, client_context, issue, served_serial, wait_for_child, wait_until


def recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile, files.ca_certs)()


def snapshot_of(pair: Pair) -> Snapshot:
    return Snapshot(TLSFiles("tls.crt", "tls.key"), pair.chain, pair.key, None)


def test_a_shared_store_written_by_a_forked_child_is_read_by_its_parent(ca: trustme.CA) -> None:
    store = SharedStore()
    first, second, shop = issue(ca), issue(ca), issue(ca, "shop.test")
    store.write(snapshot_of(first))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.write(snapshot_of(second))
            store.write(snapshot_of(shop), "shop")
            code = 0
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    assert store.read() == (second.chain, second.key, None, None)
    assert store.read("shop") == (shop.chain, shop.key, None, None)
    assert store.read("elsewhere") is None


@pytest.mark.parametrize("rewrites", [1, 2])
def test_a_handshake_reads_the_last_look_and_never_decodes_a_table(ca: trustme.CA, rewrites: int) -> None:
    """``known()``, what an SNI identity's first handshake builds from, gives what this process last took in, while
    another process rewrote the table since (decoding a rewritten table of ten thousand identities takes tens of
    milliseconds, too long for a ClientHello callback); ``look()``, which a check calls, takes the rewrite in. Two
    rewrites overwrite the region looked at: nothing is known then (the next check catches up)."""
    store = SharedStore(region_bytes=16 * 1024)  # a few writes outgrow it: the table is rewritten
    first, second, third = issue(ca), issue(ca), issue(ca)
    store.write(snapshot_of(first), "a")
    assert store.known("a") == ((first.chain, first.key, None, None), None)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            flips, region = 0, newest_region(store)
            for i in range(1000):
                store.write(snapshot_of(third if i % 2 else second), "b")
                if newest_region(store) != region:
                    flips, region = flips + 1, newest_region(store)
                    if flips == rewrites:
                        break
            store.write(snapshot_of(second), "a")
            code = 0 if flips == rewrites else 2
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    expected = ((first.chain, first.key, None, None), None) if rewrites == 1 else None
    assert store.known("a") == expected
    store.look()
    assert store.known("a") == ((second.chain, second.key, None, None), None)


def newest_region(store: SharedStore) -> int:
    return max((0, 1), key=store._generation)


def written(store: SharedStore) -> int:
    """The bytes the newest region holds: its table and the change records appended to it."""
    region = newest_region(store)
    return store._appended(region) - store._base(region)


def test_a_torn_region_falls_back_to_the_other(ca: trustme.CA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "LOG_BYTES", 0)  # every change rewrites the table, into the other region
    store = SharedStore()
    first, second = issue(ca), issue(ca)
    store.write(snapshot_of(first))
    store.write(snapshot_of(second))
    # A writer killed halfway through its next write: the newer region's payload no longer matches its digest.
    store._map[store._base(newest_region(store)) + 100] ^= 0xFF
    fresh = SharedStore.__new__(SharedStore)  # another process's view: nothing cached
    vars(fresh).update(vars(store), _cached=(-1, 0, {}))
    assert fresh.read() == (first.chain, first.key, None, None)


def test_a_change_is_a_record_after_the_table_and_a_damaged_one_is_left_out(ca: trustme.CA) -> None:
    store = SharedStore()
    first, second, third = issue(ca), issue(ca), issue(ca, "shop.test")
    store.write(snapshot_of(first))
    region, table = newest_region(store), written(store)
    store.write(snapshot_of(second))
    assert newest_region(store) == region and written(store) > table  # appended: the table stays
    assert written(store) - table < len(second.chain) + len(second.key) + 1024  # what changed, not the table again
    # A record damaged after it was committed: readers take the table without it.
    store._map[store._base(newest_region(store)) + written(store) - 1] ^= 0xFF
    fresh = SharedStore.__new__(SharedStore)  # another process's view: nothing cached
    vars(fresh).update(vars(store), _cached=(-1, 0, {}))
    assert fresh.read() == (first.chain, first.key, None, None)
    # The next write rewrites the table whole, leaving the damaged record behind.
    fresh.write(snapshot_of(third), "shop")
    again = SharedStore.__new__(SharedStore)
    vars(again).update(vars(store), _cached=(-1, 0, {}))
    assert again.read() == (first.chain, first.key, None, None)
    assert again.read("shop") == (third.chain, third.key, None, None)


def test_writers_in_several_processes_at_once_lose_nothing(ca: trustme.CA) -> None:
    """Four processes each write their own identity 40 times, all at once: every last write survives."""
    store = SharedStore()
    pairs = {f"site{n}": [issue(ca, f"site{n}.test") for _ in range(2)] for n in range(4)}
    pids = []
    for name, (one, two) in pairs.items():
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for round in range(40):
                    store.write(snapshot_of(one if round % 2 else two), name)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert [wait_for_child(pid) for pid in pids] == [0] * 4
    for name, (one, _) in pairs.items():
        assert store.read(name) == (one.chain, one.key, None, None), name


def test_identities_sharing_a_ca_bundle_keep_it_once_and_can_be_forgotten(ca: trustme.CA) -> None:
    store = SharedStore()
    bundle = b"".join(issue(ca).chain for _ in range(40))  # a client-CA bundle of some size
    sites = {f"site{n}": issue(ca, f"site{n}.test") for n in range(20)}
    for name, pair in sites.items():
        store.write(Snapshot(TLSFiles("tls.crt", "tls.key", "ca.pem"), pair.chain, pair.key, bundle), name)
    assert written(store) < len(bundle) + sum(len(p.chain) + len(p.key) for p in sites.values()) + 4096
    assert store.read("site7") == (sites["site7"].chain, sites["site7"].key, bundle, None)
    store.forget("site7")
    assert store.read("site7") is None
    assert store.read("site8") == (sites["site8"].chain, sites["site8"].key, bundle, None)
    forgotten = written(store)
    store.forget("site7")  # forgetting twice changes nothing
    assert written(store) == forgotten


def test_a_full_store_keeps_what_it_had_and_says_so_once(ca: trustme.CA, caplog: pytest.LogCaptureFixture) -> None:
    pair = issue(ca)
    store = SharedStore(region_bytes=len(pair.chain) + len(pair.key) + 200)
    store.write(snapshot_of(pair))
    big = issue(ca, "big.test")
    for _ in range(3):
        store.write(snapshot_of(big), "big")  # does not fit beside the first one: never raises
    assert store.read() == (pair.chain, pair.key, None, None)
    assert store.read("big") is None
    full = [r.getMessage() for r in caplog.records if "is not kept" in r.getMessage()]
    assert len(full) == 1 and "SNI identity big" in full[0], full


def test_a_store_pickled_outside_a_process_start_is_a_copy(ca: trustme.CA) -> None:
    store = SharedStore()
    pair, shop = issue(ca), issue(ca, "shop.test")
    store.write(snapshot_of(pair))
    store.write(snapshot_of(shop), "shop")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read() == (pair.chain, pair.key, None, None)
    assert copy.read("shop") == (shop.chain, shop.key, None, None)
    copy.forget("shop")
    assert copy.read("shop") is None and store.read("shop") is not None


def test_without_a_keeper_nobody_is_asked_and_a_silent_keeper_is_waited_for_boundedly() -> None:
    store = SharedStore()
    assert store.ask() is False  # gunicorn's: no keeper, no wait
    store.keep()  # a keeper that never looks
    started = time.monotonic()
    assert store.ask(wait=0.2) is False
    assert 0.2 <= time.monotonic() - started < 5


class Unreported:
    """SNI identities whose changes the kernel does not report: the keeper looks at those it is asked about."""

    def __init__(self, identities: dict[str, TLSFiles]) -> None:
        self.identities = identities

    def __call__(self) -> dict[str, TLSFiles]:
        return self.identities

    def tick(self, interval: float) -> tuple[dict[str, TLSFiles], set[str]]:
        return dict(self.identities), set()


def test_one_ask_about_many_renewals_has_the_keeper_judge_them_and_the_asker_none(
    tmp_path: Path, ca: trustme.CA
) -> None:
    """A spawn server's worker whose check found renewals of its SNI identities asks the keeper once about all of
    them (``judged(..., ask=True)``), and takes the keeper's verdicts and refusals: it validates none itself (it
    would otherwise start a validation child of its own, as would every other worker, for the same bytes)."""
    names = [f"renewed-{index:02d}.example.com" for index in range(40)]  # one ask: one write to the keeper's pipe
    identities = {name: TLSFiles(str(tmp_path / f"{name}.crt"), str(tmp_path / f"{name}.key")) for name in names}
    for name, files in identities.items():
        first = issue(ca, name)
        Path(files.certfile).write_bytes(first.chain)
        Path(files.keyfile).write_bytes(first.key)
    store = SharedStore()
    keep_newest_valid(Unreported(identities), None, store, interval=30.0)  # only asks make it look again
    renewed = {name: issue(ca, name) for name in names}
    mismatched = names[-1]
    for name, pair in renewed.items():
        Path(identities[name].certfile).write_bytes(pair.chain)
        Path(identities[name].keyfile).write_bytes(issue(ca).key if name == mismatched else pair.key)
    read = {name: read_files(files) for name, files in identities.items()}

    kept, to_validate = judged(read, None, store, recipe_for)  # not asked: nobody looked at the renewals yet
    assert kept == {} and len(to_validate) == len(names)

    kept, to_validate = judged(read, None, store, recipe_for, ask=True)
    assert to_validate == []  # a verdict or a refusal for each: nothing left to validate here
    assert {name: leaf.serial for name, leaf in kept.items()} == {
        name: pair.serial for name, pair in renewed.items() if name != mismatched
    }
    assert LastGood(store, recipe_for, mismatched).refusal(read[mismatched], None) is not None


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
    assert last_good.store.read() == (newer.chain, newer.key, None, None)  # what it now serves is kept


def test_an_expired_last_good_is_not_served(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = issue(ca, not_before=now - datetime.timedelta(days=2), not_after=now - datetime.timedelta(days=1))
    last_good = LastGood(SharedStore(), recipe_for)
    last_good.remember(snapshot_of(expired))
    with pytest.raises(InvalidIdentity, match=r"does not exist; the last good certificate .* outside its validity"):
        Reloader(str(cert), str(key), recipe=make_recipe(str(cert), str(key)), last_good=last_good)


def test_nothing_kept_is_the_usual_start_up_error(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    last_good = LastGood(SharedStore(), recipe_for)
    with pytest.raises(InvalidIdentity, match=r"tls.crt does not exist; no certificate was served"):
        Reloader(str(cert), str(key), recipe=make_recipe(str(cert), str(key)), last_good=last_good)


def test_the_table_round_trips_and_refuses_what_it_did_not_write(ca: trustme.CA) -> None:
    pair = issue(ca)
    leaf = validate(snapshot_of(pair))
    table = {"": ((pair.chain, pair.key, None, None), leaf), "shop": ((pair.chain, None, b"ca bundle", None), None)}
    assert decode(encode(table)) == table
    for garbage in (b"", b"\xff" * 16, encode(table)[:-3]):
        with pytest.raises(ValueError):
            decode(garbage)
    one_blob_pointing_at_the_second = struct.pack("<I", 1) + struct.pack("<I", 1) + b"x" + struct.pack("<I", 1)
    with pytest.raises(ValueError):
        decode(one_blob_pointing_at_the_second + struct.pack("<I", 1) + b"n" + struct.pack("<4i", 1, -1, -1, -1))
    a_leaf_that_is_not_one = one_blob_pointing_at_the_second + struct.pack("<I", 1) + b"n"
    with pytest.raises(ValueError):
        decode(a_leaf_that_is_not_one + struct.pack("<4i", 0, -1, -1, 0))


def kept_then_rotated(tmp_path: Path, ca: trustme.CA) -> tuple[KubeletLayout, TLSFiles, SharedStore, Pair, Pair]:
    """A spawn server's parent: a store its keeper (keep_newest_valid) filled with a first pair, then a second pair
    installed the kubelet way, which the keeper has not looked at (only asks make it look again)."""
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    files = TLSFiles(str(layout.cert_path), str(layout.key_path))
    store = SharedStore()
    keep_newest_valid(lambda: {"": files}, None, store, interval=30.0)
    layout.install(second)
    return layout, files, store, first, second


def test_a_spawned_worker_shares_the_store_and_takes_the_keeper_s_verdicts(tmp_path: Path, ca: trustme.CA) -> None:
    """As uvicorn's and hypercorn's workers: the store travels with the process's arguments, the parent keeps
    it (keep_newest_valid) and the worker loads no cryptography while what it finds on disk is valid. A worker
    that starts while the files hold content nobody judged yet serves the kept identity at once (its start never
    waits on the keeper's validation, a child process) and takes the keeper's verdict at its first check."""
    layout, files, store, first, second = kept_then_rotated(tmp_path, ca)  # the second judged when the worker asks
    out = tmp_path / "worker"

    def result(step: str) -> dict[str, object]:
        path = out.with_suffix(f".{step}")
        wait_until(path.exists, 30, what=f"the spawned worker's {step}")
        data: dict[str, object] = json.loads(path.read_text())
        return data

    worker = multiprocessing.get_context("spawn").Process(
        target=serve_and_reload, args=(store, files.certfile, files.keyfile, str(out))
    )
    worker.start()
    try:
        assert result("start") == {"serial": first.serial, "outcome": None, "cryptography": False, "kept": True}
        out.with_suffix(".step").write_text("reload")
        assert result("reload") == {"serial": second.serial, "outcome": "reloaded", "cryptography": False, "kept": True}
        assert store.read() == (second.chain, second.key, None, None)
        # A pair the keeper refuses: the worker takes the keeper's refusal (no cryptography loaded) and keeps
        # serving the second.
        layout.write_raw(first.chain, second.key)
        out.with_suffix(".step").write_text("bad")
        assert result("bad") == {"serial": second.serial, "outcome": "failed", "cryptography": False, "kept": True}
    finally:
        out.with_suffix(".step").write_text("stop")
        worker.join(30)
        if worker.exitcode is None:
            worker.kill()
    assert worker.exitcode == 0


def test_a_pair_read_mid_rotation_is_judged_again_not_validated_in_the_worker(tmp_path: Path, ca: trustme.CA) -> None:
    """kubelet swaps ``..data`` between a worker's read of the certificate and of the key: the worker holds the
    first certificate with the second key, asks the keeper, and the keeper, reading later, judges the second pair.
    No verdict is kept for the worker's bytes, yet the keeper did not refuse them: the worker reads again at its
    next check (:class:`NotJudged`) instead of validating them in its own process (which loads cryptography). The
    same bytes still on disk are refused as before."""
    layout, files, store, first, second = kept_then_rotated(tmp_path, ca)
    torn = Snapshot(files, first.chain, second.key, None)  # read across the swap
    with pytest.raises(NotJudged, match="changed while being judged"):
        verdict(torn, None, LastGood(store, lambda _: ssl.create_default_context()))
    assert store.read() == (second.chain, second.key, None, None)  # the keeper judged what the files hold
    gone = Snapshot(TLSFiles(str(tmp_path / "gone.crt"), str(tmp_path / "gone.key")), first.chain, second.key, None)
    with pytest.raises(NotJudged, match="changed while being judged"):  # files gone since: not a verdict either
        verdict(gone, None, LastGood(store, lambda _: ssl.create_default_context()))
    layout.write_raw(first.chain, second.key)  # the same bytes, on disk this time: refused
    with pytest.raises(InvalidIdentity, match="does not match") as refused:
        verdict(torn, None, LastGood(store, lambda _: ssl.create_default_context()))
    assert not isinstance(refused.value, NotJudged)


def test_thousands_written_at_once_beside_one_kept_are_all_kept(ca: trustme.CA) -> None:
    """A server's start: the configured identity is kept, then every SNI identity in one write."""
    store = SharedStore()
    pair = issue(ca)
    store.write(snapshot_of(pair))
    bundle = issue(ca).chain
    many = {f"site{n}": (Snapshot(TLSFiles("c", "k", "ca"), b"c%d" % n, b"k%d" % n, bundle), None) for n in range(3000)}
    assert store.write_many(many)
    assert store.read("site2999") == (b"c2999", b"k2999", bundle, None)
    assert store.read() == (pair.chain, pair.key, None, None)
