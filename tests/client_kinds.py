"""The client matrix: each client library's example (examples/*_client.py), run as a user runs it, against an mTLS
server of tests/mtls_servers.py that re-reads its own files per connection and answers with the client
certificate it saw.

:data:`CLIENTS` maps a kind to its example and the server it talks to; :func:`serve` starts that server, :func:`start`
runs the example, and :class:`ClientRun` reads its answers (one JSON line per request on stdout) and its log
(stderr) as they come.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from tlstest import Pair, free_port, issue, run_server, wait_until

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

CLIENTS: dict[str, tuple[str, str]] = {
    "httpx": ("examples/httpx_client.py", "http"),
    "httpx-async": ("examples/httpx_async_client.py", "http"),
    "httpx2": ("examples/httpx2_client.py", "http"),
    "httpx2-async": ("examples/httpx2_async_client.py", "http"),
    "requests": ("examples/requests_client.py", "http"),
    "grpc": ("examples/grpc_client.py", "grpc"),
    "grpc-aio": ("examples/grpc_async_client.py", "grpc"),
    "aiohttp": ("examples/aiohttp_client.py", "http"),
}
"""kind: (its example, relative to the repository; the server it calls: ``http`` or ``grpc``)."""

STOCK = ("tests/stock_client.py", "http")
"""httpx as users run it without us: the files loaded once."""

HTTPX2 = importlib.util.find_spec("httpx2") is not None
"""httpx2 installs on Python 3.11 and later only: its kinds are skipped where it is missing."""


def needs(kind: str) -> pytest.MarkDecorator:
    """What a test of ``kind`` needs: httpx2 for the httpx2 kinds (nothing for the others)."""
    return pytest.mark.skipif(
        kind.startswith("httpx2") and not HTTPX2, reason="httpx2 is not installed (it needs Python 3.11)"
    )


def kinds() -> list[Any]:
    """Every kind of :data:`CLIENTS` as a test parameter, named by its kind and skipped where its library is
    missing."""
    return [pytest.param(kind, id=kind, marks=needs(kind)) for kind in CLIENTS]


@dataclass
class ClientRun:
    """A client example running; its answers and log lines collected by reader threads."""

    proc: subprocess.Popen[bytes]
    answers: list[dict[str, Any]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        def answers() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = json.loads(raw)
                with self.lock:
                    self.answers.append(line)

        def log() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                with self.lock:
                    self.log.append(raw.decode(errors="replace").rstrip())

        for target in (answers, log):
            threading.Thread(target=target, daemon=True).start()

    def since(self, when: float) -> list[dict[str, Any]]:
        with self.lock:
            return [answer for answer in self.answers if answer["t"] >= when]

    def all(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.answers)

    def lines(self, text: str) -> list[str]:
        with self.lock:
            return [line for line in self.log if text in line]

    def output(self) -> str:
        with self.lock:
            failed = [answer for answer in self.answers if not answer["ok"]][:5]
            return "\n".join(self.log[-40:]) + f"\nanswers: {len(self.answers)}, failed (first 5): {failed}"

    def terminate(self, within: float = 5.0) -> float:
        """SIGTERM; the seconds it took to exit (it must exit 0 within ``within``)."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(within)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"the client did not exit within {within}s of SIGTERM:\n{self.output()}") from None
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}:\n{self.output()}"
        return time.monotonic() - started


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` at ``path`` in one step (a file renamed over it)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


@dataclass
class World:
    """An mTLS server (its CA, its files) and a client's files."""

    server_ca: trustme.CA
    client_ca: trustme.CA
    server_dir: Path
    port: int
    server_kind: str

    def server_files(self, pair: Pair, client_cas: bytes) -> None:
        replace(self.server_dir / "server.key", pair.key)  # before the certificate: never a mismatched pair
        replace(self.server_dir / "server.crt", pair.chain)
        replace(self.server_dir / "client-ca.pem", client_cas)


@contextlib.contextmanager
def serve(tmp_path: Path, server_kind: str) -> Iterator[World]:
    """An mTLS server of tests/mtls_servers.py (``http`` or ``grpc``) on files of its own, listening."""
    directory = tmp_path / "server"
    directory.mkdir()
    here = World(trustme.CA(), trustme.CA(), directory, free_port(), server_kind)
    here.server_files(issue(here.server_ca), here.client_ca.cert_pem.bytes())
    args = [
        str(TESTS / "mtls_servers.py"),
        server_kind,
        *("--cert", str(directory / "server.crt"), "--key", str(directory / "server.key")),
        *("--client-ca", str(directory / "client-ca.pem"), "--port", str(here.port)),
    ]
    with run_server([sys.executable, *args], tmp_path / "server.log", here.port) as server:
        wait_until(lambda: "ready" in server.output(), 30, what=f"the {server_kind} mTLS server to listen")
        yield here


def command(example: str, server: str, port: int, cert: Path, key: Path, cacert: Path, **options: Any) -> list[str]:
    """The command line of ``example`` calling the ``server`` kind at ``port``."""
    target = ["--url", f"https://localhost:{port}/"] if server == "http" else ["--target", f"localhost:{port}"]
    args = [sys.executable, str(ROOT / example), "--cert", str(cert), "--key", str(key), "--cacert", str(cacert)]
    for name, value in options.items():
        args += [f"--{name}", str(value)]
    return args + target


def start(example: str, server: str, port: int, cert: Path, key: Path, cacert: Path, **options: Any) -> ClientRun:
    """Start ``example`` (``duration``, ``every``, ``interval`` as options)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = command(example, server, port, cert, key, cacert, **options)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    run = ClientRun(proc)
    run.read()
    return run
