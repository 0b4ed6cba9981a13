"""``tlsreload demo``: watch a real server pick up rotated certificates without a restart.

It mints a throwaway CA, lays the certificate out the way kubelet mounts a Secret, starts
gunicorn or uvicorn through this package's drop-ins as a subprocess, rotates the certificate
a few times exactly as kubelet's atomic writer does, and after each rotation opens fresh TLS
connections (trusting only the throwaway CA) until one gets the new certificate. Everything
it created (the temporary directory, the server and its workers) is gone when it returns,
whether it succeeded, failed or was interrupted.

The certificates and the kubelet layout are made by :mod:`~tlsreload_plugins.demo.certs`; this module
runs the server and the client.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

from cryptography import x509

from tlsreload_plugins.demo.certs import HOST, mint_ca, mint_leaf, write_secret_volume
from tlsreload_plugins.identity import serial_hex

APP = {"gunicorn": "tlsreload_plugins.demo.app:wsgi", "uvicorn": "tlsreload_plugins.demo.app:asgi"}
ADAPTER = {"gunicorn": "tlsreload_plugins.gunicorn_conf", "uvicorn": "tlsreload_plugins.uvicorn"}
EXTRA = {"gunicorn": "gunicorn", "uvicorn": "uvicorn"}
POLL = 0.05


class DemoFailed(Exception):
    """Something the demo needs did not happen; ``str()`` says what."""


# --- the server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _gunicorn_has(setting: str) -> bool:
    try:
        config = importlib.import_module("gunicorn.config")
    except ImportError:
        return False
    return any(s.name == setting for s in config.KNOWN_SETTINGS)


def server_command(server: str, certfile: Path, keyfile: Path, port: int) -> list[str]:
    """The command line starting ``server`` with reload on, through this package's drop-in."""
    if server == "gunicorn":
        command = [sys.executable, "-m", "gunicorn", "-c", f"python:{ADAPTER['gunicorn']}"]
        command += ["--certfile", str(certfile), "--keyfile", str(keyfile), "--bind", f"{HOST}:{port}"]
        command += ["--workers", "1", "--graceful-timeout", "5"]
        if _gunicorn_has("control_socket_disable"):
            # gunicorn >= 25.1 otherwise opens a control socket at a path shared by every arbiter of this user.
            command.append("--no-control-socket")
        return [*command, APP["gunicorn"]]
    if server == "uvicorn":
        command = [sys.executable, "-m", ADAPTER["uvicorn"], APP["uvicorn"]]
        command += ["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
        return [*command, "--host", HOST, "--port", str(port)]
    raise ValueError(f"unknown server {server!r}")


def missing_requirement(server: str) -> str | None:
    """Why ``server`` cannot be demonstrated here, or ``None`` when it can."""
    if importlib.util.find_spec(server) is None:
        return f"{server} is not installed: pip install 'tlsreload-plugins[{EXTRA[server]}]'"
    if importlib.util.find_spec(ADAPTER[server]) is None:
        return f"this installation of tlsreload-plugins has no {server} adapter ({ADAPTER[server]})"
    return None


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the server's whole process group (gunicorn's workers too), then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: do not wait, kill
            continue
        # The leader is gone; make sure no worker of its group outlives it.
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


@contextmanager
def running(command: list[str], log_path: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` in its own process group with output to ``log_path``; always stop it."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            yield proc
        finally:
            _stop(proc)


def log_tail(log_path: Path, lines: int = 25) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --- the client ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    serial: str
    status: int
    body: str


def fetch(port: int, context: ssl.SSLContext, timeout: float = 10.0) -> Response:
    """One fresh verified TLS connection and one GET: the serial served and the HTTP answer."""
    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=timeout)
    try:
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        der = conn.sock.getpeercert(binary_form=True)
        if der is None:
            raise DemoFailed("the server sent no certificate")
        conn.request("GET", "/", headers={"Connection": "close"})
        answer = conn.getresponse()
        body = answer.read().decode(errors="replace").strip()
        return Response(serial_hex(x509.load_der_x509_certificate(der).serial_number), answer.status, body)
    finally:
        conn.close()


def wait_for(
    port: int, context: ssl.SSLContext, serial: str | None, proc: subprocess.Popen[bytes], timeout: float
) -> Response:
    """Fresh connections until one gets ``serial`` (any, if ``None``); fail if the server exits or time runs out."""
    deadline = time.monotonic() + timeout
    last: str = "no connection attempted"
    while True:
        if proc.poll() is not None:
            raise DemoFailed(f"the server exited with status {proc.returncode}")
        try:
            response = fetch(port, context)
        except (OSError, http.client.HTTPException, DemoFailed) as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if serial is None or response.serial == serial:
                return response
            last = f"still served serial {response.serial}"
        if time.monotonic() > deadline:
            raise DemoFailed(f"gave up after {timeout:g} s; last attempt: {last}")
        time.sleep(POLL)


def reload_log_line(log_path: Path, serial: str, timeout: float = 5.0) -> str | None:
    """The server's log line about reloading to ``serial`` (it may follow the swap by a moment), if any."""
    deadline = time.monotonic() + timeout
    while True:
        for line in log_tail(log_path, 200).splitlines():
            start = line.find("reloaded TLS certificate")
            if start >= 0 and f"-> {serial}" in line:
                return line[start:].split("; now serving", 1)[0]
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL)


def short(serial: str) -> str:
    return serial if len(serial) <= 10 else serial[:10] + "..."


def _pid(body: str) -> str:
    return body.rsplit(" ", 1)[-1] if body.startswith("hello from pid ") else "?"


# --- the demo --------------------------------------------------------------------------------


def say(text: str) -> None:
    print(text, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def run(*, server: str = "uvicorn", rotations: int = 3, interval: float = 0.5, timeout: float = 60.0) -> int:
    """Run the demo; returns the exit status (0 success, 1 failure, 130 interrupted)."""
    problem = missing_requirement(server)
    if problem is not None:
        print(f"tlsreload demo: cannot run: {problem}", file=sys.stderr)
        return 1
    in_main_thread = threading.current_thread() is threading.main_thread()
    # Ctrl-C and SIGTERM (e.g. from a CI runner) must both clean up. SIGINT is set explicitly: a process
    # started in the background by a non-interactive shell inherits SIGINT ignored.
    previous = (
        {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main_thread else {}
    )
    workdir = Path(tempfile.mkdtemp(prefix="tlsreload-demo-"))
    log_path = workdir / "server.log"
    try:
        _demo(server, rotations, interval, timeout, workdir, log_path)
        status = 0
    except DemoFailed as e:
        print(f"tlsreload demo: FAILED: {e}", file=sys.stderr)
        tail = log_tail(log_path)
        if tail:
            print(f"--- last lines of the {server} log ---\n{tail}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    gone = "removed" if not workdir.exists() else "COULD NOT be removed"
    if status == 130:
        print(f"tlsreload demo: interrupted; {server} stopped, {workdir} {gone}", file=sys.stderr)
    else:
        say(f"cleaned up: {server} stopped, {workdir} {gone}")
    return status


def _demo(server: str, rotations: int, interval: float, timeout: float, workdir: Path, log_path: Path) -> None:
    say(f"tlsreload demo: {server} with certificate reload, {rotations} rotations, checking every {interval:g} s")
    ca = mint_ca()
    pair = mint_leaf(ca)
    client = ssl.create_default_context(cadata=ca.pem.decode())
    volume = workdir / "secret"
    write_secret_volume(volume, {"tls.crt": pair.chain, "tls.key": pair.key, "ca.crt": ca.pem})
    say(f"minted a throwaway CA and a certificate for localhost, {HOST}: serial {short(pair.serial)}")
    say(
        f"laid out like a kubelet Secret volume: {volume}/tls.crt -> ..data/tls.crt -> {os.readlink(volume / '..data')}"
    )

    port = free_port()
    command = server_command(server, volume / "tls.crt", volume / "tls.key", port)
    env = {**os.environ, "TLSRELOAD_INTERVAL": f"{interval:g}", "PYTHONUNBUFFERED": "1"}
    with running(command, log_path, env) as proc:
        say(f"started {server} (pid {proc.pid}) on https://{HOST}:{port}/ ...")
        started = time.monotonic()
        first = wait_for(port, client, None, proc, timeout)
        if first.serial != pair.serial:
            raise DemoFailed(f"the server presents serial {first.serial}, not the one just minted ({pair.serial})")
        say(
            f"server up after {time.monotonic() - started:.1f} s: serial {short(first.serial)}, "
            f"HTTP {first.status}, {first.body}"
        )
        pids = {_pid(first.body)}
        for n in range(1, rotations + 1):
            new = mint_leaf(ca)
            write_secret_volume(volume, {"tls.crt": new.chain, "tls.key": new.key, "ca.crt": ca.pem})
            rotated = time.monotonic()
            got = wait_for(port, client, new.serial, proc, timeout)
            say(
                f"rotation {n}/{rotations}: served serial {short(pair.serial)} -> {short(new.serial)} "
                f"after {time.monotonic() - rotated:.1f} s, HTTP {got.status} ({got.body})"
            )
            if got.status != 200:
                raise DemoFailed(f"the server answered HTTP {got.status} after rotation {n}")
            logged = reload_log_line(log_path, new.serial)
            if logged is not None:
                say(f"    {server} logged: {logged}")
            pids.add(_pid(got.body))
            pair = new
        served_by = f"pid {pids.pop()} throughout (no restart)" if len(pids) == 1 else f"pids {', '.join(sorted(pids))}"
        say(f"done: every rotation was served to new connections by {served_by}")
