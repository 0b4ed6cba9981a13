"""End-to-end tests of the reload core: real handshakes against tests/tls_server.py (a subprocess) or,
where noted, the same server in-process; rotations written the way kubelet, certbot and scripts write."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tls_server import make_recipe, serving
from tlsreload_plugins import (
    AsyncioDriver,
    InvalidIdentity,
    Outcome,
    Reloader,
    Status,
    ThreadDriver,
)
from tlstest import (
    LAYOUTS,
    PASSWORD,
    CertbotLayout,
    Hammer,
    KubeletLayout,
    Pair,
    RenameEachLayout,
    client_context,
    handshake,
    issue,
    obey_file_modes,
    serial_of,
    served_serial,
    wait_for_serial,
    wait_until,
    with_password,
)

SERVER = Path(__file__).with_name("tls_server.py")
INTERVAL = 0.2
DEADLINE = 20.0
NOBODY = 65534
# The gevent worker's situation: everything monkey-patched before anything else is imported.
GEVENT_BOOT = (
    "from gevent import monkey; monkey.patch_all()\n"
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


# --- the server subprocess ------------------------------------------------------------------


@dataclass
class ServerProc:
    proc: subprocess.Popen[bytes]
    workdir: Path
    port: int = 0

    def output(self) -> str:
        """Everything the server logged (its stderr)."""
        return (self.workdir / "stderr").read_text(errors="replace")

    def lines(self, level: str = "") -> list[str]:
        return [line for line in self.output().splitlines() if line.startswith(level)]

    def status(self) -> dict[str, Any]:
        """The reloader's status after its latest check (written by tls_server.py --status)."""
        path = self.workdir / "status.json"
        return dict(json.loads(path.read_text())) if path.exists() else {"checks": 0}

    def wait_checks(self, more: int) -> dict[str, Any]:
        """Wait until the server has run ``more`` further checks; returns the status then."""
        target = self.status()["checks"] + more
        return dict(wait_until(lambda: (s := self.status())["checks"] >= target and s, DEADLINE, what="checks"))

    def wait_status(self, **expected: object) -> dict[str, Any]:
        """Wait until the status has these values (it is written after each check: it lags a handshake)."""

        def matches() -> dict[str, Any] | None:
            status = self.status()
            return status if all(status.get(k) == v for k, v in expected.items()) else None

        return dict(wait_until(matches, DEADLINE, what=f"status {expected}"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"server ignored SIGTERM:\n{self.output()}") from None
        return int(self.proc.returncode)


def launch(
    workdir: Path,
    args: list[str],
    *,
    obey_modes: bool = False,
    gevent: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    workdir.mkdir(parents=True, exist_ok=True)
    python = obey_file_modes() if obey_modes else [sys.executable]
    boot = ["-c", GEVENT_BOOT] if gevent else []
    with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
        return subprocess.Popen(
            [*python, *boot, str(SERVER), *args],
            stdout=out,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )


@contextmanager
def tls_server(
    workdir: Path,
    cert: Path,
    key: Path | None,
    *,
    ca: Path | None = None,
    password: str | None = None,
    interval: float | None = INTERVAL,
    obey_modes: bool = False,
    gevent: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[ServerProc]:
    """Run tests/tls_server.py; stop it with SIGTERM at the end and require a clean exit."""
    args = ["--cert", str(cert), "--status", str(workdir / "status.json")]
    args += ["--interval", str(interval)] if interval else []
    args += ["--key", str(key)] if key else []
    args += ["--ca", str(ca)] if ca else []
    args += ["--password", password] if password else []
    server = ServerProc(launch(workdir, args, obey_modes=obey_modes, gevent=gevent, env=env), workdir)
    try:

        def port() -> int | bool:
            if not server.alive():
                return True
            first = (workdir / "stdout").read_text().split("\n", 1)
            return int(first[0]) if len(first) > 1 else False

        server.port = wait_until(port, DEADLINE, what="the server's port")
        assert server.alive(), f"server exited with {server.proc.returncode}:\n{server.output()}"
        yield server
    except BaseException:
        server.stop()
        raise
    rc = server.stop()
    assert rc == 0, f"SIGTERM gave exit status {rc}:\n{server.output()}"


def write_pair(cert: Path, key: Path, pair: Pair) -> None:
    cert.write_bytes(pair.chain)
    key.write_bytes(pair.key)


def started(server: ServerProc) -> list[str]:
    """The lines a healthy start logs: the driver's one INFO line."""
    return [line for line in server.output().splitlines() if "tlsreload_plugins.drivers: watching" in line]


# --- 1. every on-disk layout ----------------------------------------------------------------


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_each_layout_serves_every_rotation(tmp_path: Path, ca: trustme.CA, layout_name: str) -> None:
    layout_class: Any = LAYOUTS[layout_name]  # each takes its root directory
    # In place: 50 ms between 256-byte pieces, so checks (every 200 ms) do land on half-written files.
    layout = layout_class(tmp_path / "tls", pause=0.05) if layout_name == "inplace" else layout_class(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    client = client_context(ca)
    rotations = 3
    pairs = [issue(ca) for _ in range(rotations)]
    with tls_server(tmp_path / "server", layout.cert_path, layout.key_path) as server:
        assert served_serial(server.port, client) == first.serial
        with Hammer(server.port, client, threads=2) as hammer:  # handshaking all through the rotations
            for n, pair in enumerate(pairs, start=1):
                old_data = os.readlink(layout.root / "..data") if isinstance(layout, KubeletLayout) else None
                layout.install(pair)
                wait_for_serial(server.port, client, pair.serial, DEADLINE)
                server.wait_status(reloads=n)
                if old_data is not None:
                    assert not (layout.root / old_data).exists(), "kubelet deletes the old timestamped directory"
        assert hammer.failures == [], f"{len(hammer.failures)} of {hammer.successes}: {hammer.failures[:3]}"
        assert hammer.successes > 0
        assert len(server.lines("INFO tlsreload_plugins.reloader: reloaded")) == rotations
        if isinstance(layout, KubeletLayout):
            # One rename swaps both files: never a torn pair, so never a warning.
            assert server.lines("WARNING") == [], server.output()
    if isinstance(layout, CertbotLayout):
        kept = sorted(p.name for p in layout.archive.glob("privkey*.pem"))
        assert kept == [f"privkey{v}.pem" for v in range(1, rotations + 2)], "certbot keeps the archive"


# --- 2. no failed handshake while swapping (in-process server) ------------------------------

SWAPS = 300
Swapper = Callable[[RenameEachLayout], tuple[ssl.SSLContext, Callable[[], None]]]


def swap_under_load(tmp_path: Path, ca: trustme.CA, setup: Swapper) -> tuple[Hammer, list[Pair]]:
    """Serve the context ``setup`` returns, handshake from 4 threads continuously and rotate SWAPS times,
    calling the swap ``setup`` returned after each; each swap waits for at least one more handshake to end,
    so swaps and handshakes interleave all along."""
    layout = RenameEachLayout(tmp_path / "tls")
    pairs = [issue(ca) for _ in range(3)]
    layout.install(pairs[0])
    context, swap = setup(layout)
    with serving(context) as port, Hammer(port, client_context(ca), threads=4) as hammer:
        for n in range(1, SWAPS + 1):
            seen = hammer.successes + len(hammer.failures)
            layout.install(pairs[n % len(pairs)])
            swap()
            deadline = time.monotonic() + DEADLINE
            while hammer.successes + len(hammer.failures) <= seen:
                assert time.monotonic() < deadline, "the clients made no progress"
                time.sleep(0.001)
    return hammer, pairs


def with_reloader(layout: RenameEachLayout) -> tuple[ssl.SSLContext, Callable[[], None]]:
    cert, key = str(layout.cert_path), str(layout.key_path)
    reloader = Reloader(cert, key, recipe=make_recipe(cert, key), interval=3600)

    def swap() -> None:
        assert reloader.check() is Outcome.RELOADED

    return reloader.context, swap


def naive(layout: RenameEachLayout) -> tuple[ssl.SSLContext, Callable[[], None]]:
    live = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    live.load_cert_chain(layout.cert_path, layout.key_path)
    return live, lambda: live.load_cert_chain(layout.cert_path, layout.key_path)


def test_no_handshake_fails_during_hundreds_of_swaps(tmp_path: Path, ca: trustme.CA) -> None:
    hammer, pairs = swap_under_load(tmp_path, ca, with_reloader)
    assert hammer.failures == [], f"{len(hammer.failures)} failed of {hammer.successes}: {hammer.failures[:3]}"
    assert hammer.serials == {p.serial for p in pairs}
    assert hammer.successes >= SWAPS


# In a process of its own: load_cert_chain on a context that other threads are handshaking with is not
# only wrong, it is memory-unsafe: 1 run in 20 here died of SIGSEGV (the others: 91 to 181 failed handshakes),
# and one run in CI never finished. A run takes seconds: one still running after CONTROL_HANG seconds writes every
# thread's stack and exits (faulthandler), rather than outlive the test's own timeout.
CONTROL_HANG = 60
HUNG = f"Timeout ({datetime.timedelta(seconds=CONTROL_HANG)})!"
"""What faulthandler writes first when it ends a control run that was still running."""
CONTROL = (
    "import faulthandler, pathlib, sys, trustme\n"
    f"faulthandler.dump_traceback_later({CONTROL_HANG}, exit=True)\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import test_core\n"
    "hammer, _ = test_core.swap_under_load(pathlib.Path(sys.argv[2]), trustme.CA(), test_core.naive)\n"
    "print(len(hammer.failures), hammer.successes)\n"
)


def test_control_load_cert_chain_on_a_live_context_fails_handshakes(tmp_path: Path) -> None:
    """The test above can fail: the naive swap, under the same load, breaks handshakes (or the process)."""
    tests = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-c", CONTROL, tests, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    if result.returncode in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT):
        return  # a crash is the loudest failure of all
    if result.returncode == 1 and HUNG in result.stderr:
        return  # a process that stopped making progress: broken too (its stacks are in result.stderr)
    assert result.returncode == 0, result.stderr
    failures, successes = map(int, result.stdout.split())
    assert failures > 0, f"no failure in {successes} handshakes with load_cert_chain on the live context"


# --- 3. bad inputs: keep serving, warn once, recover ----------------------------------------


BadInput = Callable[[RenameEachLayout, trustme.CA], None]

BAD_INPUTS: dict[str, tuple[BadInput, str, str]] = {
    # name: (how to break the files, words the warning must contain, the file it must name)
    "mismatched key": (
        lambda layout, ca: layout.write_raw(issue(ca).chain, issue(ca).key),
        "does not match the certificate",
        "key",
    ),
    "truncated certificate": (
        lambda layout, ca: layout.write_raw((p := issue(ca)).chain[: len(p.chain) // 2], p.key),
        "truncated",
        "cert",
    ),
    "missing key": (lambda layout, ca: layout.key_path.unlink(), "does not exist", "key"),
    "unreadable key": (lambda layout, ca: layout.key_path.chmod(0), "permission denied", "key"),
    "wrong key password": (
        lambda layout, ca: layout.install(with_password(issue(ca), "not the password")),
        "wrong password",
        "key",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_files_keep_the_last_good_leaf_and_recover(tmp_path: Path, ca: trustme.CA, case: str) -> None:
    breaks, reason, which = BAD_INPUTS[case]
    password = PASSWORD if "password" in case else None

    def new_pair() -> Pair:
        return with_password(issue(ca), password) if password else issue(ca)

    layout = RenameEachLayout(tmp_path / "tls")
    good = new_pair()
    layout.install(good)
    bad_path = str(layout.key_path if which == "key" else layout.cert_path)
    client = client_context(ca)
    server_dir = tmp_path / "server"
    with tls_server(server_dir, layout.cert_path, layout.key_path, password=password, obey_modes=True) as server:
        assert served_serial(server.port, client) == good.serial
        breaks(layout, ca)
        warning = wait_until(lambda: server.lines("WARNING"), DEADLINE, what="a warning")[0]
        assert reason in warning and bad_path in warning, warning
        assert f"still serving serial {good.serial}" in warning, warning
        status = server.wait_checks(10)  # many more ticks: the same problem is not logged again
        assert server.alive()
        assert served_serial(server.port, client) == good.serial
        assert server.lines("WARNING") == [warning], server.output()
        assert status["failures"] == 1 and reason in status["last_error"] and status["reloads"] == 0
        assert "Traceback" not in server.output()

        fixed = new_pair()
        layout.install(fixed)  # new files (0644): readable again
        wait_for_serial(server.port, client, fixed.serial, DEADLINE)
        wait_until(lambda: server.lines("INFO tlsreload_plugins.reloader: certificate files"), DEADLINE)
        assert "usable again" in server.lines("INFO tlsreload_plugins.reloader: certificate files")[0]
        server.wait_status(last_error=None, failures=1)
        assert server.lines("WARNING") == [warning]
    assert PASSWORD not in server.output()


# --- 4. metadata storms change nothing ------------------------------------------------------


def test_chmod_chown_touch_storm_reloads_nothing_and_logs_nothing(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    pair = issue(ca)
    layout.install(pair)
    files = [layout.cert_path, layout.key_path]
    owners = [(0, 0), (NOBODY, NOBODY)] if os.geteuid() == 0 else [(os.getuid(), os.getgid())]
    with tls_server(tmp_path / "server", layout.cert_path, layout.key_path) as server:
        start = server.wait_checks(1)
        n = 0
        while server.status()["checks"] < start["checks"] + 25:
            n += 1
            for path in files:
                path.chmod((0o600, 0o644, 0o640, 0o400)[n % 4])
                os.chown(path, *owners[n % len(owners)])
                os.utime(path)
            if n % 10 == 0:  # kubelet's resync: the same bytes in a new directory, new inodes
                layout.install(pair)
            time.sleep(0.01)
        status = server.status()
        assert status["reloads"] == 0 and status["failures"] == 0 and status["last_error"] is None
        assert served_serial(server.port, client_context(ca)) == pair.serial
        assert server.output().splitlines() == started(server), server.output()


# --- 5. an invalid pair at start-up ---------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("mismatched key", "does not match the certificate"),
        ("missing certificate", "does not exist"),
        ("bad TLSRELOAD_INTERVAL", "TLSRELOAD_INTERVAL must be a number of seconds, got '1s'"),
    ],
)
def test_start_with_invalid_files_exits_with_one_clear_line(
    tmp_path: Path, ca: trustme.CA, case: str, reason: str
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_pair(cert, key, issue(ca))
    env = {}
    if case == "mismatched key":
        key.write_bytes(issue(ca).key)
    elif case == "missing certificate":
        cert.unlink()
    else:
        env["TLSRELOAD_INTERVAL"] = "1s"
    proc = launch(tmp_path / "server", ["--cert", str(cert), "--key", str(key)], env=env)
    assert proc.wait(DEADLINE) != 0
    err = (tmp_path / "server" / "stderr").read_text()
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert reason in err, err
    if case != "bad TLSRELOAD_INTERVAL":
        assert str(key if "key" in case else cert) in err
    assert (tmp_path / "server" / "stdout").read_text() == "", "no port: it never served"


# --- 6. drivers -------------------------------------------------------------------------------


def make_reloader(tmp_path: Path, ca: trustme.CA, **kwargs: Any) -> tuple[Reloader, RenameEachLayout]:
    layout = RenameEachLayout(tmp_path / "tls")
    layout.install(issue(ca))
    cert, key = str(layout.cert_path), str(layout.key_path)
    return Reloader(cert, key, recipe=make_recipe(cert, key), **kwargs), layout


def test_thread_driver_reloads_and_stop_leaves_no_thread(tmp_path: Path, ca: trustme.CA) -> None:
    reloader, layout = make_reloader(tmp_path, ca, interval=INTERVAL)
    before = set(threading.enumerate())
    with ThreadDriver(reloader) as driver:
        assert driver.running
        assert [t.name for t in set(threading.enumerate()) - before] == ["tlsreload"]
        new = issue(ca)
        layout.install(new)
        wait_until(lambda: reloader.leaf.serial == new.serial, DEADLINE, what="the driver's reload")
    assert not driver.running
    assert set(threading.enumerate()) == before


def test_thread_driver_stop_does_not_wait_for_the_interval(tmp_path: Path, ca: trustme.CA) -> None:
    reloader, _ = make_reloader(tmp_path, ca, interval=3600)
    driver = ThreadDriver(reloader).start()
    driver.stop(timeout=DEADLINE)  # returns once the thread ended: long before the hour is up
    assert not driver.running
    assert [t for t in threading.enumerate() if t.name == "tlsreload"] == []
    with pytest.raises(RuntimeError):
        driver.start()


def test_asyncio_driver_reloads_and_stop_leaves_no_task(tmp_path: Path, ca: trustme.CA) -> None:
    reloader, layout = make_reloader(tmp_path, ca, interval=INTERVAL)

    async def main() -> None:
        async with AsyncioDriver(reloader) as driver:
            assert driver.running
            assert len(asyncio.all_tasks()) == 2
            new = issue(ca)
            layout.install(new)
            deadline = time.monotonic() + DEADLINE
            while reloader.leaf.serial != new.serial:
                assert time.monotonic() < deadline, "the asyncio driver did not reload"
                await asyncio.sleep(0.05)
        assert not driver.running
        assert asyncio.all_tasks() == {asyncio.current_task()}
        idle = await AsyncioDriver(make_reloader(tmp_path / "idle", ca, interval=3600)[0]).start()
        await idle.stop()  # cancels the hour-long sleep
        assert not idle.running and asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


@pytest.mark.parametrize("driver_class", [ThreadDriver, AsyncioDriver])
def test_reload_now_acts_at_once_and_reports_at_once(
    tmp_path: Path, ca: trustme.CA, driver_class: type[ThreadDriver | AsyncioDriver]
) -> None:
    reloader, layout = make_reloader(tmp_path, ca, interval=3600)
    driver = driver_class(reloader)  # not started: reload_now needs no ticker
    assert driver.reload_now() is Outcome.UNCHANGED
    new = issue(ca)
    layout.install(new)
    assert driver.reload_now() is Outcome.RELOADED
    assert reloader.leaf.serial == new.serial
    layout.write_raw(issue(ca).chain, issue(ca).key)
    assert driver.reload_now() is Outcome.FAILED  # no settling when asked explicitly
    assert reloader.status().failures == 1
    assert reloader.leaf.serial == new.serial


def test_thread_driver_under_gevent_monkey_patching_reloads(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    layout.install(issue(ca))
    client = client_context(ca)
    env = {"TLSRELOAD_INTERVAL": str(INTERVAL)}  # and no --interval: the environment decides
    server_dir = tmp_path / "server"
    with tls_server(server_dir, layout.cert_path, layout.key_path, interval=None, gevent=True, env=env) as server:
        assert f"every {INTERVAL:g}s" in started(server)[0]
        for _ in range(2):
            new = issue(ca)
            layout.install(new)
            wait_for_serial(server.port, client, new.serial, DEADLINE)
        assert server.lines("ERROR") == [] and server.lines("WARNING") == [], server.output()


# --- 7. status, callbacks, settings ---------------------------------------------------------


def test_status_counters_and_callbacks(tmp_path: Path, ca: trustme.CA) -> None:
    reloads: list[tuple[str, str]] = []
    failures: list[InvalidIdentity] = []
    checks: list[tuple[Outcome, Status]] = []
    reloader, layout = make_reloader(
        tmp_path,
        ca,
        interval=3600,
        on_reload=lambda old, new: reloads.append((old.serial, new.serial)),
        on_failure=failures.append,
        on_check=lambda outcome, status: checks.append((outcome, status)),
    )
    first = reloader.leaf
    status = reloader.status()
    assert (status.checks, status.reloads, status.failures, status.last_error) == (0, 0, 0, None)
    assert status.last_reload is None and status.interval == 3600 and status.leaf == first
    assert status.files.certfile == str(layout.cert_path) and status.files.keyfile == str(layout.key_path)

    assert reloader.check() is Outcome.UNCHANGED
    second = issue(ca)
    layout.install(second)
    assert reloader.check() is Outcome.RELOADED
    status = reloader.status()
    assert (status.checks, status.reloads, status.leaf.serial) == (2, 1, second.serial)
    assert status.last_reload is not None and status.last_reload >= status.last_success - 1

    layout.write_raw(issue(ca).chain, second.key)
    assert [reloader.check() for _ in range(4)] == [Outcome.PENDING, *[Outcome.FAILED] * 3]
    status = reloader.status()
    assert status.failures == 1 and status.last_error is not None and "does not match" in status.last_error
    assert len(failures) == 1 and str(failures[0]) == status.last_error

    third = issue(ca)
    layout.install(third)
    assert reloader.check() is Outcome.RELOADED
    status = reloader.status()
    assert (status.last_error, status.failures, status.reloads, status.checks) == (None, 1, 2, 7)
    assert reloads == [(first.serial, second.serial), (second.serial, third.serial)]
    assert [outcome for outcome, _ in checks] == [
        Outcome.UNCHANGED,
        Outcome.RELOADED,
        Outcome.PENDING,
        *[Outcome.FAILED] * 3,
        Outcome.RELOADED,
    ]
    assert [s.checks for _, s in checks] == list(range(1, 8))


def test_a_raising_callback_does_not_stop_reloads(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("callback bug")

    seen: list[str] = []
    reloader, layout = make_reloader(tmp_path, ca, interval=3600, on_reload=broken, on_check=broken)
    reloader.add_callbacks(on_reload=lambda old, new: seen.append(new.serial), on_failure=broken)
    pairs = [issue(ca) for _ in range(3)]
    for pair in pairs:
        layout.install(pair)
        assert reloader.check() is Outcome.RELOADED
        assert reloader.leaf.serial == pair.serial
    layout.write_raw(pairs[0].chain, pairs[1].key)
    assert reloader.check(settle=False) is Outcome.FAILED
    assert seen == [p.serial for p in pairs]
    raised = [r for r in caplog.records if "callback" in r.getMessage() and r.exc_info]
    assert len(raised) == 3 + 4 + 1  # on_reload x3, on_check x4, on_failure x1: each logged with its traceback


@pytest.mark.parametrize("kind", ["on_reload", "on_failure", "on_check"])
def test_a_callback_may_read_the_status(tmp_path: Path, ca: trustme.CA, kind: str) -> None:
    """What a metrics callback does. on_reload and on_failure must not run under the reloader's lock:
    status() inside them would deadlock the check, and with it the driver, forever."""
    statuses: list[Status] = []
    reloader, layout = make_reloader(tmp_path, ca, interval=3600)
    reloader.add_callbacks(**{kind: lambda *args: statuses.append(reloader.status())})
    layout.install(issue(ca))
    done = threading.Event()

    def run() -> None:
        reloader.check()
        layout.write_raw(issue(ca).chain, issue(ca).key)
        reloader.check(settle=False)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(DEADLINE), f"check() deadlocked when {kind} called status()"
    assert statuses and statuses[-1].checks >= 1


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ca: trustme.CA) -> None:
    monkeypatch.setenv("TLSRELOAD_INTERVAL", "0.3")
    reloader, layout = make_reloader(tmp_path, ca)
    assert reloader.interval == 0.3 and reloader.status().interval == 0.3
    cert, key = str(layout.cert_path), str(layout.key_path)
    assert Reloader(cert, key, recipe=make_recipe(cert, key), interval=2).interval == 2  # explicit wins
    for bad in ["abc", "1s", "0", "-1", "nan", "inf"]:
        monkeypatch.setenv("TLSRELOAD_INTERVAL", bad)
        with pytest.raises(ValueError, match=r"TLSRELOAD_INTERVAL must be a (positive )?number") as error:
            Reloader(cert, key, recipe=make_recipe(cert, key))
        assert repr(bad) in str(error.value)
    monkeypatch.delenv("TLSRELOAD_INTERVAL")
    assert Reloader(cert, key, recipe=make_recipe(cert, key)).interval == 1.0


def test_recipe_settings_survive_a_reload(tmp_path: Path, ca: trustme.CA) -> None:
    layout = RenameEachLayout(tmp_path / "tls")
    layout.install(issue(ca))
    plain = make_recipe(str(layout.cert_path), str(layout.key_path))

    def recipe() -> ssl.SSLContext:
        ctx = plain()
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx

    reloader = Reloader(str(layout.cert_path), str(layout.key_path), recipe=recipe, interval=3600)
    modern = client_context(ca)
    modern.set_alpn_protocols(["h2", "http/1.1"])
    tls12 = client_context(ca, maximum_version=ssl.TLSVersion.TLSv1_2)
    with serving(reloader.context) as port:
        for _ in range(2):
            new = issue(ca)
            layout.install(new)
            assert reloader.check() is Outcome.RELOADED
            with handshake(port, modern) as tls:
                der = tls.getpeercert(binary_form=True)
                assert der is not None and serial_of(der) == new.serial
                assert tls.selected_alpn_protocol() == "h2"
                assert tls.version() == "TLSv1.3"
            with pytest.raises(ssl.SSLError):
                handshake(port, tls12).close()


def accepted(port: int, ctx: ssl.SSLContext) -> bool:
    """Whether the server lets this client in (with TLS 1.3 a refused client cert shows on the first read)."""
    try:
        with handshake(port, ctx) as tls:
            return tls.recv(16) == b"ok\n"
    except (ssl.SSLError, OSError):
        return False


def test_client_ca_rotation(tmp_path: Path, ca: trustme.CA) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    layout = KubeletLayout(tmp_path / "tls")
    pair = issue(ca)
    layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": old_ca.cert_pem.bytes()})
    old_client = client_context(ca, client=issue(old_ca, "client.test"))
    new_client = client_context(ca, client=issue(new_ca, "client.test"))
    anonymous = client_context(ca)
    with tls_server(tmp_path / "server", layout.cert_path, layout.key_path, ca=layout.ca_path) as server:
        assert accepted(server.port, old_client)
        assert not accepted(server.port, new_client)
        assert not accepted(server.port, anonymous)
        layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": new_ca.cert_pem.bytes()})
        wait_until(lambda: accepted(server.port, new_client), DEADLINE, what="the new client CA")
        assert not accepted(server.port, old_client)
        assert not accepted(server.port, anonymous)
        assert server.lines("WARNING") == [], server.output()


# --- 8. expiry warning ------------------------------------------------------------------------


def test_expiry_warning_once_not_per_tick(tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tlsreload_plugins")
    now = datetime.datetime.now(datetime.timezone.utc)
    layout = RenameEachLayout(tmp_path / "tls")
    soon = issue(ca, not_after=now + datetime.timedelta(days=2))
    layout.install(soon)
    cert, key = str(layout.cert_path), str(layout.key_path)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    Reloader(cert, key, recipe=make_recipe(cert, key), expiry_warning_days=1)
    assert warnings() == [], "two days left, a one-day window: nothing to say"

    reloader = Reloader(cert, key, recipe=make_recipe(cert, key), interval=3600)  # the default 14-day window
    for _ in range(20):
        assert reloader.check() is Outcome.UNCHANGED
    assert len(warnings()) == 1, warnings()
    assert "expires in 48.0 hours" in warnings()[0] and soon.serial in warnings()[0]

    renewed = issue(ca)
    layout.install(renewed)
    assert reloader.check() is Outcome.RELOADED
    for _ in range(20):
        assert reloader.check() is Outcome.UNCHANGED
    assert len(warnings()) == 1, "the renewed certificate is far from expiry"
