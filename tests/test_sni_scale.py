"""Many SNI identities (a few hundred, as CI can afford) through the code paths 10,000 take: the kernel's
change notifications and the sweep (sni_watch), contexts built on the first handshake and kept for the
identities asked for lately (sni_contexts), one summary line at start. Real servers (an in-process
threaded server, tlsreload-uvicorn, gunicorn gthread with 2 workers), real clients sending random names."""

from __future__ import annotations

import logging
import os
import random
import secrets
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from test_sni import sni_serial, sni_server, trusting, verifying
from tlsreload_plugins.sni.contexts import CONTEXTS
from tlstest import KubeletLayout, Pair, free_port, issue, run_server, wait_until

TESTS = Path(__file__).parent
COUNT = 300
ASKED = 40
INTERVAL = 0.5
DEADLINE = 60.0


@dataclass
class Many:
    sni: Path
    names: dict[str, str]  # identity -> its random server name
    pairs: dict[str, Pair]
    layouts: dict[str, KubeletLayout]


def many_identities(tmp_path: Path, ca: trustme.CA, count: int = COUNT) -> Many:
    """``count`` kubelet Secrets under one directory, each for one random name."""
    sni = tmp_path / "sni"
    many = Many(sni, {}, {}, {})
    for i in range(count):
        identity = f"site{i:04d}"
        name = f"{secrets.token_hex(5)}.s{i}.scale.test"
        many.names[identity] = name
        many.layouts[identity] = KubeletLayout(sni / identity)
        many.pairs[identity] = issue(ca, name)
        many.layouts[identity].install(many.pairs[identity])
    return many


def every_name_gets_its_own_leaf(port: int, ca: trustme.CA, many: Many, identities: list[str]) -> None:
    ctx = verifying(ca)
    for identity in identities:
        assert sni_serial(port, ctx, many.names[identity]) == many.pairs[identity].serial, identity


# --- in-process: the core alone ---------------------------------------------------------------------


def test_random_names_get_their_own_leaf_with_contexts_built_on_demand(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    many = many_identities(tmp_path, ca)
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        assert s.identities.summary().built == 0  # nobody asked yet: no context built
        asked = random.sample(sorted(many.names), ASKED)
        every_name_gets_its_own_leaf(s.port, ca, many, asked)
        summary = s.identities.summary()
        assert (summary.identities, summary.valid, summary.refused, summary.built) == (COUNT, COUNT, {}, ASKED)
        assert sni_serial(s.port, trusting(ca), "unknown.scale.test") == s.default.serial
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{COUNT} identities, {COUNT} valid, 0 refused" in m for m in messages), messages
    assert not any(m.startswith("SNI identity site") for m in messages)  # no line per identity at start


def test_contexts_kept_stay_bounded_and_evicted_ones_are_built_again(tmp_path: Path, ca: trustme.CA) -> None:
    many = many_identities(tmp_path, ca, 60)
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        s.identities._contexts.capacity = 8  # CONTEXTS (1,000) scaled down to what this test asks for
        every_name_gets_its_own_leaf(s.port, ca, many, sorted(many.names))
        assert s.identities.summary().built == 8
        built = [identity for identity, reloader in s.identities.reloaders().items() if reloader.built]
        assert len(built) == 8
        every_name_gets_its_own_leaf(s.port, ca, many, sorted(many.names)[:3])  # evicted long ago: built again
    assert CONTEXTS == 1000


def test_a_renewal_keeps_the_context_its_check_built_among_those_kept(tmp_path: Path, ca: trustme.CA) -> None:
    """A renewed identity's context is built by its check, off the event loop, and kept as if just asked for: the
    next handshake naming it builds nothing. The contexts kept stay bounded however many identities renew."""
    many = many_identities(tmp_path, ca, 12)
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        s.identities._contexts.capacity = 4
        reloaders = s.identities.reloaders()
        assert not any(reloader.built for reloader in reloaders.values())
        renewed = sorted(many.names)[:6]
        for identity in renewed:
            many.pairs[identity] = issue(ca, many.names[identity])
            many.layouts[identity].install(many.pairs[identity])
        wait_until(
            lambda: all(reloaders[i].leaf.serial == many.pairs[i].serial for i in renewed), DEADLINE, what="renewals"
        )
        assert s.identities.summary().built == 4  # the capacity: the ones renewed last
        assert sum(reloader.built for reloader in reloaders.values()) == 4
        every_name_gets_its_own_leaf(s.port, ca, many, renewed)


def test_handshakes_racing_for_one_name_not_built_yet_all_get_its_leaf(tmp_path: Path, ca: trustme.CA) -> None:
    many = many_identities(tmp_path, ca, 20)
    identity = "site0007"
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        start = threading.Barrier(12)
        serials: list[str] = []
        errors: list[BaseException] = []

        def client() -> None:
            start.wait()
            try:
                serials.append(sni_serial(s.port, verifying(ca), many.names[identity]))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=client) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert serials == [many.pairs[identity].serial] * 12


def test_a_hostile_identity_among_many_is_contained(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    many = many_identities(tmp_path, ca, 100)
    hostile = many.sni / "fifo"
    hostile.mkdir()
    os.mkfifo(hostile / "tls.crt")
    (hostile / "tls.key").write_bytes(many.pairs["site0000"].key)
    mismatched = KubeletLayout(many.sni / "mismatched")
    mismatched.write_raw(issue(ca, "mismatched.scale.test").chain, many.pairs["site0001"].key)
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        summary = s.identities.summary()
        assert (summary.identities, summary.valid, set(summary.refused)) == (102, 100, {"fifo", "mismatched"})
        assert "FIFO" in summary.refused["fifo"]
        every_name_gets_its_own_leaf(s.port, ca, many, random.sample(sorted(many.names), 10))
        assert sni_serial(s.port, trusting(ca), "mismatched.scale.test") == s.default.serial
        # One identity's files turning hostile while running: it keeps its last good leaf, the others serve.
        layout = many.layouts["site0042"]
        layout.write_raw(many.pairs["site0042"].chain, many.pairs["site0043"].key)
        wait_until(lambda: s.identities.status()["site0042"].failures == 1, DEADLINE, what="the bad pair reported")
        every_name_gets_its_own_leaf(s.port, ca, many, ["site0042", "site0043"])
    refused = [r.getMessage() for r in caplog.records if "reload failed" in r.getMessage()]
    assert len(refused) == 1 and str(layout.root) in refused[0], refused


def test_directories_added_and_removed_among_many_while_running(tmp_path: Path, ca: trustme.CA) -> None:
    many = many_identities(tmp_path, ca, 150)
    with sni_server(tmp_path, ca, str(many.sni)) as s:
        new = issue(ca, "new.scale.test")
        KubeletLayout(many.sni / "new").install(new)
        wait_until(lambda: sni_serial(s.port, trusting(ca), "new.scale.test") == new.serial, DEADLINE, what="added")
        shutil.rmtree(many.sni / "site0100")
        gone = many.names["site0100"]
        wait_until(lambda: sni_serial(s.port, trusting(ca), gone) == s.default.serial, DEADLINE, what="removed")
        assert s.identities.summary().identities == 150
        every_name_gets_its_own_leaf(s.port, ca, many, ["site0099", "site0101"])


# --- real servers: tlsreload-uvicorn (one process) and gunicorn gthread (2 workers) ---------------


@contextmanager
def real_server(kind: str, tmp_path: Path, ca: trustme.CA, many: Many) -> Iterator[tuple[int, Pair]]:
    default_layout = KubeletLayout(tmp_path / "default")
    default = issue(ca, "default.scale.test")
    default_layout.install(default)
    cert, key = str(default_layout.cert_path), str(default_layout.key_path)
    port = free_port()
    env = {"PYTHONPATH": str(TESTS), "TLSRELOAD_INTERVAL": str(INTERVAL), "TLSRELOAD_SNI": str(many.sni)}
    if kind == "tlsreload-uvicorn":
        args = ["-m", "tlsreload_plugins.uvicorn", "uvicorn_apps:plain", "--app-dir", str(TESTS), "--host"]
        args += ["127.0.0.1", "--port", str(port), "--ssl-certfile", cert, "--ssl-keyfile", key]
    else:
        args = ["-m", "gunicorn", "-c", "python:tlsreload_plugins.gunicorn_conf", "--certfile", cert, "--keyfile"]
        args += [key, "--bind", f"127.0.0.1:{port}", "--no-control-socket", "--worker-class", "gthread"]
        args += ["--workers", "2", "--graceful-timeout", "5", "gunicorn_apps:wsgi"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=cwd) as running:
        first = sorted(many.names)[0]
        wait_until(
            lambda: sni_serial(port, verifying(ca), many.names[first]) == many.pairs[first].serial,
            DEADLINE,
            interval=0.2,
            what=f"{kind} serving its identities",
        )
        yield port, default
        out = running.output()
    assert f"{len(many.names)} identities, {len(many.names)} valid, 0 refused" in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("kind", ["tlsreload-uvicorn", "gunicorn-gthread"])
def test_a_rotation_among_many_reaches_clients_within_the_interval_and_2_s(
    tmp_path: Path, ca: trustme.CA, kind: str
) -> None:
    many = many_identities(tmp_path, ca)
    with real_server(kind, tmp_path, ca, many) as (port, _default):
        for _ in range(2):  # with 2 workers, each connection lands on either
            every_name_gets_its_own_leaf(port, ca, many, random.sample(sorted(many.names), ASKED // 2))
        identity = random.choice(sorted(many.names))
        rotated = issue(ca, many.names[identity])
        many.layouts[identity].install(rotated)
        wait_until(
            lambda: all(sni_serial(port, verifying(ca), many.names[identity]) == rotated.serial for _ in range(6)),
            INTERVAL + 2.0,
            interval=0.05,
            what="the rotated identity served by every worker",
        )
