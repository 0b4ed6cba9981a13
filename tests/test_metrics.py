"""Prometheus metrics: one process, gunicorn-style multiprocess mode, and no prometheus_client at all."""

from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import trustme
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from tlsreload_plugins import Outcome, Reloader
from tlsreload_plugins.metrics import observe
from tlstest import KubeletLayout, issue

UTC = datetime.timezone.utc


def recipe_for(cert: Path, key: Path) -> Any:
    def recipe() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key))
        return context

    return recipe


def samples(exposition: bytes) -> dict[tuple[str, str], float]:
    """{(sample name, certfile label): value} from the text exposition format."""
    found = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            if sample.name.startswith("tlsreload_") and not sample.name.endswith("_created"):
                found[sample.name, sample.labels["certfile"]] = sample.value
    return found


def leaf_not_after(layout: KubeletLayout) -> float:
    from cryptography import x509

    return x509.load_pem_x509_certificate(layout.cert_path.read_bytes()).not_valid_after_utc.timestamp()


def test_single_process_exposition(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    layout.install(issue(ca))
    reloader = Reloader(
        str(layout.cert_path), str(layout.key_path), recipe=recipe_for(layout.cert_path, layout.key_path)
    )
    registry = CollectorRegistry()
    assert observe(reloader, registry)
    assert observe(reloader, registry)  # observing twice must not count twice
    label = str(layout.cert_path)

    before = samples(generate_latest(registry))
    assert before[("tlsreload_reload_attempts_total", label)] == 0
    assert before[("tlsreload_certificate_not_after_timestamp_seconds", label)] == leaf_not_after(layout)

    assert reloader.check() is Outcome.UNCHANGED
    layout.install(issue(ca))
    assert reloader.check() is Outcome.RELOADED
    reloaded_at = reloader.status().last_success
    layout.write_raw(b"not a certificate", layout.key_path.read_bytes())
    assert reloader.check() is Outcome.PENDING
    assert reloader.check() is Outcome.FAILED
    assert reloader.check() is Outcome.FAILED  # the same failure: not another attempt

    after = samples(generate_latest(registry))
    assert after[("tlsreload_checks_total", label)] == 5
    assert after[("tlsreload_reload_attempts_total", label)] == 3  # reload, first sight of the bad file, its report
    assert after[("tlsreload_reload_successes_total", label)] == 1
    assert after[("tlsreload_reload_failures_total", label)] == 1
    assert after[("tlsreload_last_success_timestamp_seconds", label)] == reloaded_at
    assert after[("tlsreload_certificate_not_after_timestamp_seconds", label)] == reloader.leaf.not_after.timestamp()


WORKER = textwrap.dedent(
    """
    import json, ssl, sys
    from tlsreload_plugins import Reloader
    from tlsreload_plugins.metrics import observe

    cert, key = sys.argv[1:3]

    def recipe():
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    reloader = Reloader(cert, key, recipe=recipe)
    assert observe(reloader)
    print(json.dumps({"serial": reloader.leaf.serial}), flush=True)
    for command in sys.stdin:
        outcome = reloader.check().value
        status = reloader.status()
        print(json.dumps({"outcome": outcome, "last_success": status.last_success}), flush=True)
    """
)


class Worker:
    """A process holding one observed Reloader; each line on its stdin makes it check once."""

    def __init__(self, layout: KubeletLayout, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(layout.cert_path), str(layout.key_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.serial = self.read()["serial"]  # started: its reloader has read the files

    def check(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker {self.proc.pid} died (status {self.proc.wait(30)})"
        result: dict[str, Any] = json.loads(line)
        return result

    def exit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0


def test_multiprocess_mode_sums_counters_and_shows_the_worst_live_worker(tmp_path: Path, ca: trustme.CA) -> None:
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)}
    layout = KubeletLayout(tmp_path / "secret")
    now = datetime.datetime.now(UTC)

    def rotate(days: int) -> float:
        layout.install(issue(ca, not_after=now + datetime.timedelta(days=days)))
        return leaf_not_after(layout)

    rotate(10)
    first, second = Worker(layout, env), Worker(layout, env)
    try:
        b_not_after = rotate(20)
        assert first.check()["outcome"] == second.check()["outcome"] == "reloaded"
        second_success = second.check()["last_success"]  # unchanged; then this worker checks no more
        c_not_after = rotate(30)
        assert first.check()["outcome"] == "reloaded"
        layout.write_raw(b"garbage", layout.key_path.read_bytes())
        assert first.check()["outcome"] == "pending"
        assert first.check()["outcome"] == "failed"
        first_success = first.check()["last_success"]
        assert first_success > second_success

        def scrape() -> dict[tuple[str, str], float]:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(multiproc_dir))
            return samples(generate_latest(registry))

        label = str(layout.cert_path)
        both = scrape()
        assert both[("tlsreload_checks_total", label)] == 5 + 2
        assert both[("tlsreload_reload_successes_total", label)] == 2 + 1
        assert both[("tlsreload_reload_failures_total", label)] == 1
        assert both[("tlsreload_reload_attempts_total", label)] == 4 + 1
        # The oldest certificate any live worker serves, and the stalest live worker's last success.
        assert both[("tlsreload_certificate_not_after_timestamp_seconds", label)] == b_not_after
        assert both[("tlsreload_last_success_timestamp_seconds", label)] == second_success

        # gunicorn's child_exit hook does this for a worker that exits.
        second.exit()
        mark_process_dead(second.proc.pid, str(multiproc_dir))
        one = scrape()
        assert one[("tlsreload_reload_successes_total", label)] == 3  # a dead worker's counts still count
        assert one[("tlsreload_certificate_not_after_timestamp_seconds", label)] == c_not_after
        assert one[("tlsreload_last_success_timestamp_seconds", label)] == first_success
    finally:
        for worker in (first, second):
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(30)


NO_METRICS = textwrap.dedent(
    """
    import logging, ssl, sys
    if sys.argv[5] == "uninstalled":
        sys.modules["prometheus_client"] = None  # what importing it does when the extra is not installed
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from tlsreload_plugins import Outcome, Reloader
    from tlsreload_plugins import metrics

    cert, key, new_cert, new_key = sys.argv[1:5]

    def recipe():
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    reloader = Reloader(cert, key, recipe=recipe)
    assert metrics.observe(reloader) is False
    open(cert, "wb").write(open(new_cert, "rb").read())
    open(key, "wb").write(open(new_key, "rb").read())
    assert reloader.check() is Outcome.RELOADED
    print("ok")
    """
)


def run_without_metrics(
    tmp_path: Path, ca: trustme.CA, how: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    old, new = issue(ca), issue(ca)
    paths = []
    for name, data in (("cert", old.chain), ("key", old.key), ("new_cert", new.chain), ("new_key", new.key)):
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    command = [sys.executable, "-c", NO_METRICS, *paths, how]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_without_prometheus_client_nothing_breaks(tmp_path: Path, ca: trustme.CA) -> None:
    result = run_without_metrics(tmp_path, ca, "uninstalled", dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert result.stderr == ""  # no warning, no traceback


def test_a_missing_multiprocess_directory_turns_metrics_off_not_tls(tmp_path: Path, ca: trustme.CA) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "does-not-exist")}
    result = run_without_metrics(tmp_path, ca, "misconfigured", env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("WARNING Prometheus metrics for ") and "are off" in warning
