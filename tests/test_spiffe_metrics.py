"""The Workload API stream in the metrics (issue 47, item 3): the source's figures (drops, reconnects, refused
messages, the SVID's expiry), written beside its files by the process that runs it, served as Prometheus gauges by
the workers that read those files: gunicorn's drop-in with two workers in prometheus_client's multiprocess mode
against the tests' Workload API server, and a reloader in this process for figures that are missing or garbage.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

import trustme
from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tlsreload_plugins import Reloader
from tlsreload_plugins.metrics import observe
from tlsreload_plugins.sources.spiffe import SpiffeSource
from tlsreload_plugins.sources.stream_status import (
    MAX_STATUS_BYTES,
    STATUS_NAME,
    StreamFigures,
    figures_path,
    read_figures,
    write_figures,
)
from tlstest import (
    child_running,
    client_context,
    free_port,
    issue,
    run_server,
    serial_of,
    served_serial,
    wait_until,
)
from workload_api_server import Svid, WorkloadAPI, gunicorn_on, mint_svid

TESTS = Path(__file__).parent
DEADLINE = 20.0
INTERVAL = "0.2"
UTC = datetime.timezone.utc

CONNECTED = "tlsreload_spiffe_connected"
DROPS = "tlsreload_spiffe_stream_drops"
RECONNECTS = "tlsreload_spiffe_stream_reconnects"
REFUSED = "tlsreload_spiffe_refused_messages"
UPDATES = "tlsreload_spiffe_svid_updates"
NOT_AFTER = "tlsreload_spiffe_svid_not_after_timestamp_seconds"


def stream_samples(exposition: bytes, endpoint: str) -> dict[str, float]:
    """{sample name: value} of the ``tlsreload_spiffe_`` series, each labelled with ``endpoint`` alone (one series
    per name: two workers' figures are not two series, nor summed)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            if sample.name.startswith("tlsreload_spiffe_"):
                assert sample.labels == {"endpoint": endpoint}, sample
                assert sample.name not in found, f"two series of {sample.name}"
                found[sample.name] = sample.value
    return found


def leaf_not_after(svid: Svid) -> float:
    return x509.load_der_x509_certificate(svid.chain).not_valid_after_utc.timestamp()


def expiring_in(ca: trustme.CA, hours: int) -> Svid:
    """A server SVID whose expiry differs from any other this test mints (a whole number of hours from now)."""
    return mint_svid(ca, "web", "localhost", not_after=datetime.datetime.now(UTC) + datetime.timedelta(hours=hours))


def test_gunicorn_workers_serve_the_stream_s_drops_reconnects_refusals_and_the_svid_s_expiry(
    tmp_path: Path, ca: trustme.CA
) -> None:
    api = WorkloadAPI(tmp_path)
    svid = expiring_in(ca, 1)
    api.send([svid])
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    port = free_port()
    args, env = gunicorn_on(api, port, INTERVAL, TLSRELOAD_METRICS="1", PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir))

    def scrape() -> dict[str, float]:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(multiproc_dir))
        return stream_samples(generate_latest(registry), api.endpoint)

    def shows(**expected: float) -> Callable[[], bool]:
        names = {"connected": CONNECTED, "drops": DROPS, "reconnects": RECONNECTS, "refused": REFUSED}
        names.update(not_after=NOT_AFTER)
        return lambda: all(scrape().get(names[key]) == value for key, value in expected.items())

    ctx = client_context(ca)
    with api, run_server(args, tmp_path / "gunicorn.log", port, env=env) as server:
        wait_until(lambda: served_serial(port, ctx) == serial_of(svid.chain), DEADLINE, what="serving")
        wait_until(
            shows(connected=1, drops=0, reconnects=0, refused=0, not_after=leaf_not_after(svid)),
            DEADLINE,
            what="the stream open",
        )
        assert scrape()[UPDATES] == 1
        # Both workers report (each has its file in the multiprocess directory), one series between them.
        wait_until(lambda: len(list(multiproc_dir.glob("gauge_livemax_*.db"))) >= 2, DEADLINE, what="two workers")

        api.stop()  # the agent goes away
        wait_until(shows(connected=0, drops=1, reconnects=0), DEADLINE, what="the drop")

        svid = expiring_in(ca, 2)
        api.send([svid])
        api.start()  # the agent comes back with a new SVID
        wait_until(
            shows(connected=1, drops=1, reconnects=1, not_after=leaf_not_after(svid)), DEADLINE, what="the stream back"
        )

        api.send_raw(b"\x0a\xff\xff")  # a malformed message: not written
        wait_until(shows(refused=1, connected=1, not_after=leaf_not_after(svid)), DEADLINE, what="the refusal")
        # The new SVID reaches handshakes once the server's reader has published it (an interval after the file).
        wait_until(lambda: served_serial(port, ctx) == serial_of(svid.chain), DEADLINE, what="the new SVID served")
        assert server.proc.poll() is None, server.output()
        figures = scrape()

        # The source's process killed: its last figures say connected, the workers' metrics say it is not.
        os.kill(child_running(server.proc.pid, "sources.source_process"), signal.SIGKILL)
        wait_until(shows(connected=0, refused=1), DEADLINE, what="the source gone")
    assert figures[DROPS] == figures[RECONNECTS] == figures[REFUSED] == 1 and figures[UPDATES] == 2, figures


def test_figures_missing_or_garbage_change_nothing_and_other_files_have_no_stream_series(
    tmp_path: Path, ca: trustme.CA
) -> None:
    api = WorkloadAPI(tmp_path)
    svid = expiring_in(ca, 1)
    api.send([svid])
    with api, SpiffeSource(api.endpoint, timeout=DEADLINE) as source:
        files = source.files
        path = figures_path(files.certfile)
        assert path == os.path.join(source.pushed.directory, STATUS_NAME)
        figures = read_figures(path)
        assert figures is not None and figures.endpoint == api.endpoint and figures.spiffe_id == svid.spiffe_id
        assert (figures.connected, figures.updates, figures.not_after) == (True, 1, leaf_not_after(svid))
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        status = source.status()
        assert (status.reconnects, status.not_after) == (0, leaf_not_after(svid))

        def recipe() -> ssl.SSLContext:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(files.certfile, files.keyfile)
            return context

        registry = CollectorRegistry()
        reloader = Reloader(files.certfile, files.keyfile, recipe=recipe)
        assert observe(reloader, registry)
        assert stream_samples(generate_latest(registry), api.endpoint) == {}  # nothing read before a check
        reloader.check()
        first = stream_samples(generate_latest(registry), api.endpoint)
        assert first[CONNECTED] == 1 and first[NOT_AFTER] == leaf_not_after(svid) and first[DROPS] == 0

        # Garbage, figures of the wrong types, an oversized file, no file: read as nothing; the gauges keep their
        # values and the checks go on.
        wrong_types = {**figures._asdict(), "drops": "many"}
        for garbage in (b"{not json", json.dumps(wrong_types).encode(), b" " * (MAX_STATUS_BYTES + 1), b"[]"):
            Path(path).write_bytes(garbage)
            assert read_figures(path) is None
            reloader.check()
            assert stream_samples(generate_latest(registry), api.endpoint) == first
        os.unlink(path)
        assert read_figures(path) is None
        reloader.check()
        assert stream_samples(generate_latest(registry), api.endpoint) == first

        api.stop()  # a figure changes: the source writes them again
        wait_until(lambda: (read_figures(path) or figures).drops == 1, DEADLINE, what="the drop written")
        reloader.check()
        dropped = stream_samples(generate_latest(registry), api.endpoint)
        assert dropped[CONNECTED] == 0 and dropped[DROPS] == 1 and dropped[NOT_AFTER] == first[NOT_AFTER]

    # Figures round-trip; a reloader of files that are not a SPIFFE source's has no stream series.
    written = StreamFigures("unix:///a.sock", False, None, 0, 0, 0, 0, None, 1.5, os.getpid())
    write_figures(str(tmp_path), written)
    assert read_figures(str(tmp_path / STATUS_NAME)) == written
    pair = issue(ca)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)
    assert figures_path(str(cert)) is None

    def plain_recipe() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    plain_registry = CollectorRegistry()
    plain = Reloader(str(cert), str(key), recipe=plain_recipe)
    assert observe(plain, plain_registry)
    plain.check()
    exposition = generate_latest(plain_registry).decode()
    assert "tlsreload_checks_total" in exposition and "tlsreload_spiffe_" not in exposition
