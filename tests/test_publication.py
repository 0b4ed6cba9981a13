"""The one reader and its publication: what passes is published, what does not is said with the file named, and a
serving process's reloader loads only what was published (decisions called directly; the reader as a real process)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tlsreload_plugins import Outcome, Reloader
from tlsreload_plugins.atomic_swap import current_version
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.private_directories import memory_directory, owner, private_directory
from tlsreload_plugins.publication.index import IndexReader
from tlsreload_plugins.publication.judging import Judging
from tlsreload_plugins.publication.published import (
    Publication,
    ReaderFigures,
    read_figures,
    reader_gone,
    version_fingerprint,
)
from tlsreload_plugins.publication.reader import ReaderFailed, ReaderProcess
from tlsreload_plugins.publication.subscription import Subscription
from tlstest import (
    HOST,
    READER,
    KubeletLayout,
    child_running,
    client_context,
    free_port,
    issue,
    run_server,
    served_serial,
    wait_until,
)

DEADLINE = 30.0


def server_context(files: TLSFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile)
    return context


@pytest.fixture
def layout(tmp_path: Path) -> KubeletLayout:
    return KubeletLayout(tmp_path / "secret")


@pytest.fixture
def publication() -> Iterator[Publication]:
    made = Publication(private_directory("published", memory_directory()[0]))
    yield made
    made.remove()


def subscriber_of(publication: Publication, files: TLSFiles) -> Reloader:
    """A serving process's reloader on ``publication``, naming ``files``."""
    subscription = Subscription(publication.directory, server_context)
    return Reloader(files.certfile, files.keyfile, recipe=lambda: server_context(files), subscription=subscription)


def error_of(directory: str) -> str:
    figures = read_figures(directory)
    return (figures.error if figures is not None else None) or ""


def files_of(layout: KubeletLayout) -> TLSFiles:
    return TLSFiles(str(layout.cert_path), str(layout.key_path))


def test_what_passes_is_published_and_what_does_not_is_said_with_the_file_named(
    layout: KubeletLayout, publication: Publication
) -> None:
    ca = trustme.CA()
    first, second = issue(ca), issue(ca)
    layout.install(first)
    now = [0.0]
    judging = Judging(files_of(layout), None, 1.0, publication, owner(), clock=lambda: now[0])
    started = judging.version
    assert current_version(publication.directory) == started
    files = files_of(layout)
    subscriber = subscriber_of(publication, files)
    assert subscriber.leaf.serial == first.serial

    layout.write_raw(second.chain, first.key)  # a pair that does not match
    for _ in range(2):  # reported once it settled, as any check
        now[0] += 1.0
        judging.tick()
    assert current_version(publication.directory) == started  # nothing unusable is ever published
    figures = read_figures(publication.directory)
    assert figures is not None and figures.error is not None and figures.failures == 1
    assert subscriber.check(settle=False) is Outcome.FAILED
    status = subscriber.status()
    assert status.failures == 1 and status.last_error == figures.error and subscriber.leaf.serial == first.serial

    layout.install(second)
    now[0] += 1.0
    judging.tick()
    assert current_version(publication.directory) != started
    assert version_fingerprint(judging.version) is not None
    assert read_figures(publication.directory).error is None  # type: ignore[union-attr]
    assert subscriber.check() is Outcome.RELOADED and subscriber.leaf.serial == second.serial
    assert subscriber.status().last_error is None


def test_a_version_removed_while_it_is_read_is_read_again_at_the_next_check(
    layout: KubeletLayout, publication: Publication
) -> None:
    ca = trustme.CA()
    layout.install(issue(ca))
    now = [0.0]
    judging = Judging(files_of(layout), None, 1.0, publication, owner(), clock=lambda: now[0])
    files = files_of(layout)
    subscriber = subscriber_of(publication, files)
    newer = issue(ca)
    layout.install(newer)
    now[0] += 1.0
    judging.tick()
    # The version named is gone before it is read (a third one was published meanwhile): read again later.
    name = current_version(publication.directory)
    assert name is not None
    os.rename(os.path.join(publication.directory, name), os.path.join(publication.directory, "..moved"))
    assert subscriber.check() is Outcome.PENDING
    os.rename(os.path.join(publication.directory, "..moved"), os.path.join(publication.directory, name))
    assert subscriber.check() is Outcome.RELOADED and subscriber.leaf.serial == newer.serial


def test_the_reader_process_publishes_refuses_hostile_files_and_is_seen_gone(tmp_path: Path) -> None:
    ca = trustme.CA()
    layout = KubeletLayout(tmp_path / "secret")
    layout.install(issue(ca))
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(ReaderFailed, match=r"fifo\.key"):  # never blocks on a FIFO, names it
        ReaderProcess(TLSFiles(str(layout.cert_path), str(fifo)), password=None, interval=0.2)
    assert time.monotonic() - started < DEADLINE

    with ReaderProcess(files_of(layout), password=None, interval=0.2) as reader:
        directory = reader.directory
        assert current_version(directory) == reader.version
        assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
        newer = issue(ca)
        layout.install(newer)
        wait_until(lambda: current_version(directory) != reader.version, DEADLINE, what="the rotation published")
        layout.write_raw(b"-----BEGIN CERTIFICATE-----\nhalf", newer.key)  # a half-written PEM
        wait_until(lambda: "tls.crt" in error_of(directory), DEADLINE, what="the half-written certificate, named")
        figures = read_figures(directory)
        assert figures is not None and not reader_gone(figures)
        os.kill(reader.pid, signal.SIGKILL)
        wait_until(lambda: not reader.alive(), DEADLINE, what="the reader killed")
        assert reader_gone(figures)
        layout.install(newer)
        assert reader.again() and not reader_gone(read_figures(directory))  # type: ignore[arg-type]
        assert current_version(directory) is not None
    assert not os.path.exists(directory)  # the publication goes with the server that made it


GONE = "the server's reader of"
TESTS = Path(__file__).parent


def test_a_reader_killed_is_said_by_every_worker_and_gunicorn_s_hup_brings_it_back(tmp_path: Path) -> None:
    """gunicorn's reader killed with SIGKILL: each worker says once that nothing new will be served, and serves what
    was published; a rotation meanwhile is not served. A HUP starts a new reader, publishing into the same directory,
    and the rotation reaches every worker."""
    ca = trustme.CA()
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = ["-m", "gunicorn", "-c", "python:tlsreload_plugins.gunicorn_conf", "--certfile", str(layout.cert_path)]
    args += ["--keyfile", str(layout.key_path), "--bind", f"{HOST}:{port}", "--workers", "2", "gunicorn_apps:wsgi"]
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env["TLSRELOAD_INTERVAL"] = "0.3"
    with run_server(args, tmp_path / "server.log", port, env=env) as server:
        wait_until(lambda: served_serial(port, ctx) == first.serial, DEADLINE, what="the server up")
        wait_until(lambda: server.output().count("watching cert=") == 2, DEADLINE, what="both workers started")
        reader = child_running(server.proc.pid, READER)
        os.kill(reader, signal.SIGKILL)
        wait_until(lambda: server.output().count(GONE) == 2, DEADLINE, what="each worker saying the reader is gone")
        layout.install(second)
        served = {served_serial(port, ctx) for _ in range(8)}
        assert served == {first.serial}, server.output()
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: served_serial(port, ctx) == second.serial, DEADLINE, what="the rotation, once back")
        wait_until(
            lambda: all(served_serial(port, ctx) == second.serial for _ in range(6)), DEADLINE, what="every worker"
        )
        assert child_running(server.proc.pid, READER) != reader
        output = server.output()
    assert output.count(GONE) == 2, output
    assert "the TLS reader process" in output and "has gone: starting another" in output, output


def test_a_reader_gone_is_said_once_and_in_the_metrics(layout: KubeletLayout, publication: Publication) -> None:
    """The reader's figures name a process that has ended: the serving process says so once, at ERROR, and
    ``tlsreload_reader_up`` goes from 1 to 0; a reader back (figures of a live one) sets it to 1 again."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from tlsreload_plugins import metrics

    ca = trustme.CA()
    layout.install(issue(ca))
    judging = Judging(files_of(layout), None, 1.0, publication, owner(), clock=lambda: 0.0)
    files = files_of(layout)
    subscriber = subscriber_of(publication, files)
    registry = prometheus_client.CollectorRegistry()
    assert metrics.observe(subscriber, registry)

    def up() -> float | None:
        return registry.get_sample_value("tlsreload_reader_up", {"certfile": files.certfile, "identity": "default"})

    subscriber.check()
    assert up() == 1.0
    dead = owner(os.getpid()).split(".")[0] + f".{_a_dead_pid()}.0"
    publication.say(ReaderFigures(dead, files))
    with _logged("tlsreload_plugins.publication") as lines:
        for _ in range(3):
            subscriber.check()
    assert up() == 0.0
    assert len([line for line in lines if "has gone" in line]) == 1, lines
    publication.say(ReaderFigures(judging.owner, files))
    subscriber.check()
    assert up() == 1.0


def _a_dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@contextlib.contextmanager
def _logged(name: str) -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.ERROR)
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def test_a_reader_started_again_forgets_the_sni_identities_gone_meanwhile(
    tmp_path: Path, layout: KubeletLayout, publication: Publication
) -> None:
    """The index a reader left holds identities a, b; b's directory goes while no reader runs: the next reader
    publishes a and forgets b, whose name then goes to the default identity."""
    ca = trustme.CA()
    layout.install(issue(ca))
    sni = tmp_path / "sni"
    for name in ("a", "b"):
        KubeletLayout(sni / name).install(issue(ca, f"{name}.test"))
    first = Judging(files_of(layout), None, 1.0, publication, owner(), clock=lambda: 0.0, sni=[str(sni)])
    first.start_sni()
    index = IndexReader(publication.directory)
    assert index.lookup("a.test") is not None and index.lookup("b.test") is not None
    shutil.rmtree(sni / "b")
    again = Judging(files_of(layout), None, 1.0, publication, owner(), clock=lambda: 0.0, sni=[str(sni)])
    again.start_sni()
    assert index.lookup("a.test") is not None and index.lookup("b.test") is None
