"""End-to-end tests of the Sanic glue: real Sanic main processes and their workers, real TLS clients.

``examples/sanic_app.py`` runs ``app.run(ssl=..., workers=2)``; ``sanic_apps.py`` runs under Sanic's own
command line (``python -m sanic sanic_apps:app --cert C --key K --workers 2``) and restarts a worker on
request, Sanic's own way (``app.m.restart()``). The bodies shared with cheroot are in test_cheroot.py.
"""

from __future__ import annotations

import re
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme

from test_cheroot import (
    DEADLINE,
    FAILED,
    RELOADED,
    ROOT,
    WATCHING,
    example,
    keep_last_good,
    lines_with,
    mtls_layout,
    rotate_client_cas,
    rotate_under_load,
    start,
    stop_cleanly,
)
from test_gunicorn import fetch
from tlstest import (
    HOST,
    CertbotLayout,
    KubeletLayout,
    Layout,
    Server,
    client_context,
    free_port,
    get,
    issue,
    request,
    wait_until,
    without_stock_blocks,
)

EXAMPLE = ROOT / "examples" / "sanic_app.py"
WORKERS = 2
LAST_GOOD = "serving the last good certificate this server served"
STOCK_SELECTOR_WARNING = "sanic/http/tls/context.py"
"""Sanic's main process builds its CertSelector from a list with ``ssl.SSLContext()``, which warns (stock Sanic,
before any of tlsreload runs); the workers' selectors are tlsreload's, made without the warning."""


SANIC_SHUTDOWN_RACE = "object is not a mapping"
"""What Sanic's main process prints when its own SIGTERM handler races its monitor loop: the handler updates the
workers' states (a multiprocessing Manager dict) on the connection the interrupted main thread was using, and reads
the answer to another call (``TypeError: 'NoneType' object is not a mapping`` in ``WorkerProcess.set_state``, exit
status 1). Stock Sanic 25.12 does the same, without tlsreload (measured: 2 of 25 runs stopped 0 to 3 s after
``app.m.restart()``; docs/sanic.md)."""


SANIC_CLOSING_RACE = re.compile(
    r"[^\n]*ERROR: Closing failed\n"
    r"(?:(?:Traceback \(most recent call last\):|During handling of the above exception[^\n]*"
    r"|GeneratorExit|[ \t][^\n]*|)\n)*?"
    r"RuntimeError: Event loop is closed\n"
)
"""What a stopping Sanic worker logs when a connection that arrived as it stopped was closed (it left Sanic's set of
connections) but its task had not yet run its ``finally``: Sanic closes the loop, the task is destroyed, and its
``finally`` closes the TLS transport on the closed loop (uvloop's ``call_later``: ``RuntimeError: Event loop is
closed``), logged as ``Closing failed``. Stock Sanic does the same without tlsreload (measured: 3 of 220 restarts by
``app.m.restart()`` under a polling client; docs/sanic.md)."""


def without_sanic_closing_race(output: str) -> str:
    """``output`` less the blocks :data:`SANIC_CLOSING_RACE` matches that name no module of ours."""
    return without_stock_blocks(SANIC_CLOSING_RACE, output)


def stop_sanic(server: Server, sig: int = signal.SIGTERM, stock: str = "") -> str:
    """:func:`stop_cleanly`, forgiving Sanic's own closing race (:data:`SANIC_CLOSING_RACE`), and skipping the test
    when Sanic's own shutdown race (above) is what made it unclean."""
    try:
        return stop_cleanly(server, sig, stock, without_sanic_closing_race)
    except AssertionError:
        if SANIC_SHUTDOWN_RACE in server.output():
            pytest.skip("Sanic's main process raced its own SIGTERM handler, as stock Sanic does now and then")
        raise


def test_only_sanics_own_closing_race_is_forgiven() -> None:
    stock = (
        "Srv 0 2026-12-05 18:45:45 +0000 ERROR: Closing failed\n"
        "Traceback (most recent call last):\n"
        '  File "connection_task", line 15, in connection_task\n'
        "GeneratorExit\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "connection_task", line 31, in connection_task\n'
        "    )\n"
        "      \n"
        '  File "/venv/sanic/server/protocols/base_protocol.py", line 99, in close\n'
        "    self.transport.close()\n"
        '  File "uvloop/loop.pyx", line 697, in uvloop.loop.Loop._check_closed\n'
        "RuntimeError: Event loop is closed\n"
    )
    assert without_sanic_closing_race("before\n" + stock + "after\n") == "before\nafter\n"
    ours = stock.replace("/venv/sanic/server/protocols/base_protocol.py", "/venv/tlsreload_plugins/sanic.py")
    assert without_sanic_closing_race(ours) == ours
    other = stock.replace("RuntimeError: Event loop is closed", "ValueError: Event loop is closed")
    assert "Traceback" in without_sanic_closing_race(other)
    before_another = other + "Srv 1 INFO: Worker ready\n" + stock
    assert without_sanic_closing_race(before_another).count("Closing failed") == 1


def sanic_command(port: int, layout: Layout, *extra: str) -> list[str]:
    """Sanic's own command line serving ``sanic_apps:app`` in two workers."""
    args = ["-m", "sanic", "sanic_apps:app", "--host", HOST, "--port", str(port), "--workers", str(WORKERS)]
    return [*args, "--cert", str(layout.cert_path), "--key", str(layout.key_path), "--no-access-logs", *extra]


def ask_restart(port: int, ctx: ssl.SSLContext) -> int:
    """``GET /restart``: the worker that answers has Sanic restart it; returns its pid."""
    response = request(port, ctx, "/restart")
    match = re.search(rb"pid=(\d+) restarting", response)
    assert match, response
    return int(match.group(1))


@pytest.mark.parametrize(
    ("layout_class", "sig"),
    [(KubeletLayout, signal.SIGTERM), (CertbotLayout, signal.SIGINT)],
    ids=["kubelet-sigterm", "certbot-sigint"],
)
def test_rotations_reach_every_worker_and_bad_files_keep_the_last_good(
    ca: trustme.CA, tmp_path: Path, layout_class: Callable[[Path], Layout], sig: int
) -> None:
    layout = layout_class(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    with start(example(EXAMPLE, port, layout), tmp_path, port) as server:
        latest = rotate_under_load(port, layout, ca, first, WORKERS)
        keep_last_good(server, port, layout, ca, latest, WORKERS)
        out = stop_sanic(server, sig)
    assert len(lines_with(out, WATCHING)) == WORKERS and "every 0.3s" in lines_with(out, WATCHING)[0]
    assert len(lines_with(out, RELOADED)) == (3 + 1) * WORKERS
    assert all("WARNING" in line for line in lines_with(out, FAILED)), out  # through Sanic's log, with its level


def test_mtls_client_ca_rotation(ca: trustme.CA, tmp_path: Path) -> None:
    old, new = trustme.CA(), trustme.CA()
    layout = mtls_layout(tmp_path, ca, old)
    port = free_port()
    with start(example(EXAMPLE, port, layout, "--ca-certs", str(layout.ca_path)), tmp_path, port) as server:
        wait_until(lambda: fetch(port, client_context(ca, issue(old, "c.test"))), DEADLINE, what="server up")
        rotate_client_cas(port, layout, ca, old, new)
        stop_sanic(server)


def test_a_worker_sanic_restarts_on_bad_files_serves_the_last_good(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    with start([sys.executable, *sanic_command(port, layout)], tmp_path, port) as server:
        pids: set[int] = set()
        wait_until(lambda: pids.add(fetch(port, ctx)[1]) or len(pids) == WORKERS, DEADLINE, what="both workers")
        layout.write_raw(issue(ca).chain, first.key)  # a key that is not the certificate's
        wait_until(lambda: len(lines_with(server.output(), FAILED)) >= WORKERS, DEADLINE, what="the reports")

        restarted = ask_restart(port, ctx)
        served: list[str] = []

        def a_new_worker_answers() -> bool:
            serial, pid = fetch(port, ctx)
            served.append(serial)
            return pid not in pids

        wait_until(a_new_worker_answers, DEADLINE, what="the restarted worker answering")
        assert set(served) == {first.serial}, served  # the new worker too: the last good certificate
        assert lines_with(server.output(), LAST_GOOD), server.output()
        assert restarted in pids

        fixed = issue(ca)
        layout.install(fixed)
        wait_until(lambda: all(fetch(port, ctx)[0] == fixed.serial for _ in range(6)), DEADLINE, what="the fix")
        out = stop_sanic(server)
    assert len(lines_with(out, LAST_GOOD)) == 1, out


def test_several_certificates_reload_each_on_its_own(ca: trustme.CA, tmp_path: Path) -> None:
    layouts = {name: KubeletLayout(tmp_path / name) for name in ("a.test", "b.test")}
    pairs = {name: issue(ca, name) for name in layouts}
    for name, layout in layouts.items():
        layout.install(pairs[name])
    port = free_port()
    args = example(EXAMPLE, port, layouts["a.test"])
    args += ["--certfile", str(layouts["b.test"].cert_path), "--keyfile", str(layouts["b.test"].key_path)]
    ctx = client_context(ca)

    def every_worker_serves(expected: dict[str, str]) -> bool:  # six in a row: either worker may answer
        return all({name: get(port, ctx, server_name=name)[0] for name in expected} == expected for _ in range(6))

    with start(args, tmp_path, port) as server:
        expected = {name: pair.serial for name, pair in pairs.items()}
        wait_until(lambda: every_worker_serves(expected), DEADLINE, what="both served")
        renewed = issue(ca, "a.test")
        layouts["a.test"].install(renewed)
        expected = {"a.test": renewed.serial, "b.test": pairs["b.test"].serial}
        wait_until(lambda: every_worker_serves(expected), DEADLINE, what="a.test renewed alone")

        layouts["b.test"].write_raw(issue(ca, "b.test").chain, pairs["a.test"].key)  # b.test's files broken
        wait_until(lambda: len(lines_with(server.output(), FAILED)) >= WORKERS, DEADLINE, what="the reports")
        assert every_worker_serves(expected)
        assert all(str(layouts["b.test"].cert_path) in line for line in lines_with(server.output(), FAILED))

        renamed = issue(ca, "b.test", "c.test")  # a new name too: Sanic's names come from each new certificate
        layouts["b.test"].install(renamed)
        expected = {"a.test": renewed.serial, "b.test": renamed.serial, "c.test": renamed.serial}
        wait_until(lambda: every_worker_serves(expected), DEADLINE, what="b.test renewed, with its new name")
        stop_sanic(server, stock=STOCK_SELECTOR_WARNING)
