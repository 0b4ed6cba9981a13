"""The last good certificate survives worker restarts: real gunicorn, uvicorn and hypercorn servers whose
workers are recycled (max_requests, HUP, SIGKILL) while the files on disk are broken, with client threads
handshaking throughout. Every handshake gets the last good leaf; good files are then served by all.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from test_gunicorn import DROP_IN, UVICORN, WAITING, fetch, gunicorn, start, wait_every_worker
from test_hypercorn import drop_in as hypercorn_drop_in
from test_hypercorn import start as start_hypercorn
from test_hypercorn import unless_hypercorn_left_on_hup
from test_sni import install
from test_sni_servers import command as sni_command
from test_sni_servers import make_sites
from test_uvicorn import drop_in
from test_uvicorn import start as start_uvicorn
from tlstest import (
    READER,
    Hammer,
    KubeletLayout,
    Pair,
    Server,
    client_context,
    free_port,
    issue,
    run_server,
    wait_until,
    without_stock_blocks,
)
from tlstest import children as tlstest_children

LAST_GOOD = "serving the last good certificate this server served"
FAILED = "certificate reload failed"
DEADLINE = 30.0
# A worker killed with SIGKILL drops the connections it holds at that moment: the client sees the
# connection end, never a certificate it did not expect. Those are counted apart.
DROPPED = re.compile(r"ConnectionResetError|SSLEOFError|BrokenPipeError|EOF occurred|UNEXPECTED_EOF|timed out")


STOCK_SHUTDOWN_ERROR = re.compile(
    r"[^\n]*(?:unhandled exception during asyncio\.run\(\) shutdown\ntask"
    r"|Unhandled exception in client_connected_cb\ntransport): [^\n]*\n"
    r"(?:Traceback \(most recent call last\):\n(?:[ \t][^\n]*\n)*[\w.]*LocalProtocolError: [^\n]*\n)?"
    r"(?:[ \t][^\n]*\n)*"
)
"""What asyncio logs when a task raised as ``asyncio.run()`` ended: a hypercorn worker stopping (HUP) with a request
mid-body answers it 500, and h11 refuses (``LocalProtocolError: can't handle event type Response when
role=SERVER and state=SEND_BODY``), inside an exception group whose lines are all indented; or, for hypercorn's
``_handle`` task itself (Python 3.10 with the ``taskgroup`` backport), as a plain traceback ending in that refusal; or,
when the connection's task ends before the loop does, as asyncio's ``Unhandled exception in client_connected_cb``
with the same exception group (CI, newest versions, once)."""


def without_stock_shutdown_errors(output: str) -> str:
    """``output`` less the blocks :data:`STOCK_SHUTDOWN_ERROR` matches that are h11's refusal and name no module of
    ours: stock hypercorn logs them in the same situation (seen without tlsreload: 15 under ``--max-requests 20``
    and two clients)."""
    return without_stock_blocks(STOCK_SHUTDOWN_ERROR, output, naming="LocalProtocolError")


def children(pid: int) -> set[int]:
    """The workers of ``pid`` (a gunicorn arbiter's, a uvicorn supervisor's children): its child processes, but for
    the server's reader of the files (:data:`tlstest.READER`)."""
    return {child for child, command in tlstest_children(pid).items() if READER not in command}


def serving_pids(port: int, ctx: ssl.SSLContext, want: int = 2) -> set[int]:
    """Poll until ``want`` distinct pids have answered; returns them."""
    pids: set[int] = set()

    def enough() -> bool:
        pids.update(fetch(port, ctx)[1] for _ in range(6))
        return len(pids) >= want

    wait_until(enough, DEADLINE, what=f"{want} serving processes")
    return pids


def assert_only(hammer: Hammer, serial: str) -> None:
    """Every handshake got ``serial``; any failure is a connection dropped by a killed worker."""
    assert hammer.successes > 0
    assert hammer.serials == {serial}, hammer.serials
    wrong = [failure for failure in hammer.failures if not DROPPED.search(failure)]
    assert wrong == [], wrong[:5]


def break_and_recycle(
    server: Server, layout: KubeletLayout, last: Pair, breakage: Pair, recycle: Callable[[], None], ctx: ssl.SSLContext
) -> None:
    """Put a mismatched pair on disk, then a missing key, recycling every worker under each once the problem is
    reported (by the server's reader, in every worker) while client threads handshake; every handshake must get
    ``last``."""
    port = server.port

    def reported(before: int, why: str) -> None:
        try:
            wait_until(lambda: refusals_said(server.output(), why) > before, DEADLINE, what=f"'{why}' reported")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{server.output()}") from None

    with Hammer(port, ctx, threads=3) as hammer:
        before = refusals_said(server.output(), MISMATCH)
        layout.write_raw(breakage.chain, last.key)
        reported(before, MISMATCH)
        recycle()
        before = refusals_said(server.output(), MISSING)
        layout.write_files({"tls.crt": breakage.chain})  # the key is gone
        reported(before, MISSING)
        recycle()
        assert {fetch_through_drops(port, ctx) for _ in range(8)} == {last.serial}
    print(f"{recycle.__name__}: {hammer.successes} handshakes on the last good leaf, {len(hammer.failures)} dropped")
    assert_only(hammer, last.serial)


MISMATCH = "does not match the certificate"
MISSING = "does not exist"


def refusals_said(output: str, why: str) -> int:
    """How many lines of ``output`` say that the server's reader refused the files for ``why``: a running worker's
    failure line, or a worker started since, serving the last good certificate (workers that recycle every second
    may all have started after the refusal, and then say it only that way)."""
    return sum(1 for line in output.splitlines() if why in line and (FAILED in line or LAST_GOOD in line))


def fetch_through_drops(port: int, ctx: ssl.SSLContext, attempts: int = 5) -> str:
    """The serial a request gets, trying again when a worker being replaced drops the connection (stock
    gunicorn's gevent worker drops those it accepts as max_requests stops it)."""
    for attempt in range(attempts):
        try:
            return fetch(port, ctx)[0]
        except OSError as e:
            if not DROPPED.search(repr(e)) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.mark.parametrize("worker_class", ["sync", "gthread", "gevent", "tornado", "asgi", UVICORN])
def test_gunicorn_workers_recycled_on_broken_files_serve_the_last_good(
    tmp_path: Path, ca: trustme.CA, worker_class: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    first, last, breakage, fixed = (issue(ca) for _ in range(4))
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    extra = ["-c", DROP_IN, "--max-requests", "25", *(["--preload"] if worker_class == "sync" else [])]
    with start(gunicorn(port, layout.cert_path, layout.key_path, *extra, worker_class=worker_class), tmp_path) as s:
        wait_every_worker(port, ctx, first.serial)
        layout.install(last)
        wait_every_worker(port, ctx, last.serial)
        arbiter = s.proc.pid

        def replaced(before: set[int], what: str, drive: Callable[[], object] = lambda: None) -> None:
            def all_new() -> bool:
                drive()
                now = children(arbiter)
                return len(now) == 2 and not now & before and len(serving_pids(port, ctx)) == 2

            wait_until(all_new, DEADLINE, what=what)

        def max_requests() -> None:
            replaced(children(arbiter), "max_requests to replace both workers", lambda: fetch(port, ctx))

        def hup() -> None:
            before = children(arbiter)
            s.proc.send_signal(signal.SIGHUP)
            replaced(before, "HUP to replace both workers")

        def kill_each() -> None:
            for pid in sorted(children(arbiter)):
                # A worker may have left meanwhile (max_requests, counted by the probes): its replacement
                # started on the same broken files, which is what this round is about.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_until(lambda pid=pid: pid not in children(arbiter) and len(children(arbiter)) == 2, DEADLINE)
                serving_pids(port, ctx)

        for recycle in (max_requests, hup, kill_each):
            break_and_recycle(s, layout, last, breakage, recycle, ctx)
            layout.install(last)  # good again between the rounds, as the same bytes: nothing to reload
        with Hammer(port, ctx, threads=3) as hammer:
            layout.install(fixed)
            wait_every_worker(port, ctx, fixed.serial)
        assert hammer.failures == [] and fixed.serial in hammer.serials
        output = s.output()
    assert "Worker failed to boot" not in output
    # Stock gunicorn's gevent worker logs this traceback for connections accepted as max_requests stops it
    # (measured without tlsreload too): none other may appear.
    assert output.count("Traceback") == output.count("'StreamServer' object has no attribute 'handle'"), output
    assert output.count(LAST_GOOD) >= 6, output  # two replacement workers per broken round at least
    assert WAITING not in output


def test_uvicorn_children_killed_on_broken_files_serve_the_last_good(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    first, last, breakage, fixed = (issue(ca) for _ in range(4))
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = drop_in(port, layout, "--workers", "2", "--log-level", "debug", app="gunicorn_apps:asgi")
    with start_uvicorn(args, tmp_path, port) as server:
        serving_pids(port, ctx)
        layout.install(last)
        wait_every_worker(port, ctx, last.serial)  # served once the supervisor's reader has published it
        supervisor = server.proc.pid

        def kill_each() -> None:
            for pid in sorted(children(supervisor) & serving_pids(port, ctx)):
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda pid=pid: pid not in serving_pids(port, ctx), DEADLINE, what="a new child")

        break_and_recycle(server, layout, last, breakage, kill_each, ctx)
        with Hammer(port, ctx, threads=3) as hammer:
            layout.install(fixed)
            wait_every_worker(port, ctx, fixed.serial)
        assert hammer.failures == [] and fixed.serial in hammer.serials
        assert server.proc.poll() is None, server.output()
        output = server.output()
    assert output.count(LAST_GOOD) >= 4, output
    assert "stopping the parent process" not in output


def test_only_stock_hypercorn_s_shutdown_errors_are_left_out() -> None:
    """The output the restarts test forgives: h11's refusal as asyncio logs it at a stopping worker's shutdown; not
    a traceback through our modules, nor one outside such a block."""
    group = (
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/venv/hypercorn/asyncio/task_group.py", line 29, in _handle\n'
        "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/venv/hypercorn/protocol/h11.py", line 140, in stream_send\n'
        "    | h11._util.LocalProtocolError: can't handle event type Response when role=SERVER and state=SEND_BODY\n"
        "    +------------------------------------\n"
    )
    stock = "unhandled exception during asyncio.run() shutdown\ntask: <Task finished name='Task-7'>\n" + group
    ours = stock.replace("/venv/hypercorn/protocol/h11.py", "/venv/tlsreload_plugins/reloader.py")
    other = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: no\n'
    assert without_stock_shutdown_errors("before\n" + stock + "after\n") == "before\nafter\n"
    assert without_stock_shutdown_errors(ours) == ours
    assert without_stock_shutdown_errors(stock + other).count("Traceback") == 1
    plain = (
        "unhandled exception during asyncio.run() shutdown\n"
        "task: <Task finished name='Task-166' coro=<_handle() done> exception=LocalProtocolError('...')>\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/hypercorn/asyncio/task_group.py", line 34, in _handle\n'
        "    await send(None)\n"
        "h11._util.LocalProtocolError: can't handle event type Response when role=SERVER and state=SEND_BODY\n"
    )
    assert without_stock_shutdown_errors("before\n" + plain + stock + "after\n") == "before\nafter\n"
    plain_ours = plain.replace("/venv/hypercorn/asyncio/task_group.py", "/venv/tlsreload_plugins/reloader.py")
    assert without_stock_shutdown_errors(plain_ours) == plain_ours
    not_h11 = plain.replace("h11._util.LocalProtocolError: can't", "ValueError: can't")
    assert without_stock_shutdown_errors(not_h11).count("Traceback") == 1
    connected = (
        "Unhandled exception in client_connected_cb\ntransport: <asyncio.sslproto._SSLProtocolTransport object>\n"
        + group
    )
    assert without_stock_shutdown_errors("before\n" + connected + "after\n") == "before\nafter\n"
    connected_ours = connected.replace("/venv/hypercorn/protocol/h11.py", "/venv/tlsreload_plugins/reloader.py")
    assert without_stock_shutdown_errors(connected_ours) == connected_ours


@pytest.mark.parametrize("worker_class", ["asyncio", "trio"])
def test_hypercorn_workers_restarted_by_hup_on_broken_files_serve_the_last_good(
    tmp_path: Path, ca: trustme.CA, worker_class: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    first, last, breakage, fixed = (issue(ca) for _ in range(4))
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = hypercorn_drop_in(port, layout, "--workers", "2", "--worker-class", worker_class)
    with start_hypercorn(args, tmp_path, port) as server:
        workers = wait_every_worker(port, ctx, first.serial)
        layout.install(last)
        wait_every_worker(port, ctx, last.serial)

        def hup() -> None:
            nonlocal workers
            before, fresh = workers, set()
            server.proc.send_signal(signal.SIGHUP)

            def both_new() -> bool:
                unless_hypercorn_left_on_hup(server)
                fresh.update(pid for _, pid in (fetch(port, ctx) for _ in range(6)) if pid not in before)
                return len(fresh) >= 2

            wait_until(both_new, DEADLINE, what="HUP to replace both workers")
            workers = fresh

        # A restart on good files first: by its end hypercorn's parent has long kept `last` for new workers.
        with Hammer(port, ctx, threads=3) as hammer:
            hup()
        assert_only(hammer, last.serial)
        break_and_recycle(server, layout, last, breakage, hup, ctx)
        with Hammer(port, ctx, threads=3) as hammer:
            layout.install(fixed)
            wait_every_worker(port, ctx, fixed.serial)
        assert hammer.failures == [] and fixed.serial in hammer.serials
        assert server.proc.poll() is None, server.output()
        output = server.output()
    assert output.count(LAST_GOOD) == 4, output  # two workers started on each broken HUP
    assert WAITING not in output, output
    # Stock hypercorn's asyncio worker (Python 3.11's asyncio streams) logs this traceback for connections it
    # cancels as a HUP stops it, and h11's refusal of a 500 mid-body (measured without tlsreload too): no other.
    rest = without_stock_shutdown_errors(output)
    assert rest.count("Traceback") == rest.count("Exception in callback StreamReaderProtocol"), output


@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn", "hypercorn"])
def test_an_expired_last_good_is_not_served_after_a_restart(tmp_path: Path, ca: trustme.CA, server_kind: str) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    now = datetime.datetime.now(datetime.timezone.utc)
    short_lived = issue(
        ca, not_before=now - datetime.timedelta(minutes=1), not_after=now + datetime.timedelta(seconds=8)
    )
    fixed = issue(ca)
    layout.install(short_lived)
    port = free_port()
    ctx = client_context(ca)
    if server_kind == "gunicorn":
        args = gunicorn(port, layout.cert_path, layout.key_path, "-c", DROP_IN, worker_class="sync")
        args[args.index("--workers") + 1] = "1"
        server_cm = start(args, tmp_path)
    elif server_kind == "hypercorn":
        server_cm = start_hypercorn(hypercorn_drop_in(port, layout, "--workers", "2"), tmp_path, port)
    else:
        server_cm = start_uvicorn(drop_in(port, layout, "--workers", "2", app="gunicorn_apps:asgi"), tmp_path, port)
    with server_cm as server:
        wait_until(lambda: fetch(port, ctx)[0] == short_lived.serial, DEADLINE, what="the short-lived leaf")
        layout.write_raw(fixed.chain, short_lived.key)  # broken from now on
        expired_ctx = client_context(ca, check_hostname=False, verify_mode=ssl.CERT_NONE)
        expiry = x509.load_pem_x509_certificate(short_lived.leaf).not_valid_after_utc
        wait_until(lambda: datetime.datetime.now(datetime.timezone.utc) > expiry, 30, what="the leaf to expire")
        if server_kind == "hypercorn":  # hypercorn stops the whole server when a worker is killed: HUP restarts them
            server.proc.send_signal(signal.SIGHUP)
        else:
            for pid in children(server.proc.pid):
                os.kill(pid, signal.SIGKILL)

        def replacement_waits() -> bool:
            if server_kind == "hypercorn":
                unless_hypercorn_left_on_hup(server)
            return "waits for usable ones" in server.output()

        wait_until(replacement_waits, DEADLINE, what="a replacement that waits")
        # Nothing serves the expired leaf: connections wait in the listen queue or are refused.
        served = []
        for _ in range(3):
            with contextlib.suppress(OSError, AssertionError):  # no answer: nothing serves it
                served.append(fetch(port, expired_ctx, timeout=1)[0])
        assert short_lived.serial not in served
        layout.install(fixed)
        wait_until(lambda: fetch(port, ctx)[0] == fixed.serial, DEADLINE, what="the fixed leaf")
        assert server.proc.poll() is None, server.output()


@pytest.mark.parametrize("server", ["gthread", "UvicornWorker", "tlsreload-uvicorn", "hypercorn"])
def test_workers_restarted_while_an_sni_identity_is_broken_serve_its_last_good(
    tmp_path: Path, ca: trustme.CA, server: str
) -> None:
    """Every worker is replaced (SIGKILL; hypercorn: HUP) while SNI identity ``a``'s files hold a mismatched
    pair: the new workers serve a's last good leaf for a.test (as the server's reader published it), not the default
    one, and b's. The reader says a's broken pair once, naming its key; the workers hold nothing per identity, so
    none of them says anything about a."""
    sites = make_sites(tmp_path, ca)
    port = free_port()
    args, env, cwd = sni_command(server, port, sites, tmp_path)
    args += [] if server in ("gthread", "UvicornWorker") else ["--log-level", "debug"]
    ctx = client_context(ca)
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=cwd) as running:
        wait_until(lambda: fetch(port, ctx, server_name="a.test")[0] == sites.a.serial, DEADLINE, what="a.test served")
        a2 = install(sites.layouts["a"], issue(ca, "a.test"))
        workers: set[int] = set()

        def every_worker_on(serial: str) -> bool:
            batch = [fetch(port, ctx, server_name="a.test") for _ in range(6)]
            workers.update(pid for s, pid in batch if s == serial)
            return all(s == serial for s, _ in batch) and len(workers) >= 2

        wait_until(lambda: every_worker_on(a2.serial), DEADLINE, what="a2 served by every worker")
        sites.layouts["a"].write_raw(a2.chain, issue(ca, "a.test").key)  # a's key no longer matches
        before = set(workers)
        if server == "hypercorn":  # hypercorn stops the whole server when a worker is killed
            running.proc.send_signal(signal.SIGHUP)
        else:
            for pid in sorted(before):
                os.kill(pid, signal.SIGKILL)
        fresh: set[int] = set()

        def both_replaced() -> bool:
            if server == "hypercorn":
                unless_hypercorn_left_on_hup(running)
            batch = [fetch(port, ctx, server_name="a.test") for _ in range(6)]
            assert {s for s, _ in batch} == {a2.serial}, running.output()
            fresh.update(pid for _, pid in batch if pid not in before)
            return len(fresh) >= 2

        with contextlib.suppress(OSError):  # connections the killed workers held
            fetch(port, ctx, timeout=2, server_name="a.test")
        wait_until(lambda: _tolerating_drops(both_replaced), DEADLINE, what="two new workers serving a2")
        assert {fetch(port, ctx, server_name="b.test")[0] for _ in range(6)} == {sites.b.serial}
        assert {fetch(port, ctx, server_name="x.w.test")[0] for _ in range(6)} == {sites.exact.serial}
        key = str(sites.layouts["a"].key_path)
        wait_until(lambda: key in running.output(), DEADLINE, what="a's broken pair said")
        a3 = install(sites.layouts["a"], issue(ca, "a.test"))
        workers.clear()
        wait_until(lambda: every_worker_on(a3.serial), DEADLINE, what="a3 served by every new worker")
        assert running.proc.poll() is None, running.output()
        output = running.output()
    said = [line for line in output.splitlines() if key in line and "reload failed" in line]
    assert len(said) == 1, output


def _tolerating_drops(check: Callable[[], bool]) -> bool:
    """``check()``, counting a connection dropped by a worker being replaced as "not yet"."""
    try:
        return check()
    except OSError as e:
        if DROPPED.search(repr(e)):
            return False
        raise
