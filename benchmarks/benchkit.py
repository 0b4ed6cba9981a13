"""Shared kit for the benchmark scripts: certificates, the kubelet swap, servers, clients, tables.

Everything here does real I/O: real servers as subprocesses, real TLS handshakes. Every process
started through :func:`running_server` is stopped when the ``with`` block ends, also on Ctrl-C,
SIGTERM or an error (and, on Linux, if this process dies, through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import compileall
import contextlib
import ctypes
import datetime
import functools
import ipaddress
import json
import math
import os
import platform
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

import tlsreload_plugins
from tlsreload_plugins.identity import serial_hex

HOST = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent
SERVERS = ("gunicorn-sync", "gunicorn-gthread", "gunicorn-gevent", "gunicorn-asgi", "uvicorn")
"""The servers the benchmarks run by default."""
MORE_SERVERS = ("gunicorn-tornado", "gunicorn-uvicorn")
"""Also supported, on request (``--servers``): gunicorn's tornado worker, and uvicorn-worker's
``UvicornWorker`` under gunicorn."""
HYPERCORN_SERVERS = ("hypercorn-asyncio", "hypercorn-trio")
ALL_SERVERS = SERVERS + MORE_SERVERS
_GUNICORN_WORKERS = {"gunicorn-uvicorn": "uvicorn_worker.UvicornWorker"}
_ASGI = ("gunicorn-asgi", "gunicorn-uvicorn")
KEY_TYPES = ("ecdsa-p256", "rsa-2048", "rsa-4096")


# --- certificates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """A leaf certificate followed by its CA (PEM), its key (PEM) and its serial in hex."""

    chain: bytes
    key: bytes
    serial: str


def _new_key(key_type: str) -> Any:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type.startswith("rsa-"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(key_type[4:]))
    raise ValueError(f"unknown key type {key_type!r}; expected one of {', '.join(KEY_TYPES)}")


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class CA:
    """A throwaway ECDSA CA that mints leaves for localhost and 127.0.0.1."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tlsreload benchmark CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, key_type: str = "ecdsa-p256", leaf_key: Any = None) -> Pair:
        """A new leaf (new serial). Pass ``leaf_key`` to reuse a key (RSA 4096 keys are slow to make)."""
        key = leaf_key if leaf_key is not None else _new_key(key_type)
        now = datetime.datetime.now(datetime.timezone.utc)
        serial = x509.random_serial_number()
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.pem
        return Pair(chain=chain, key=_pem_key(key), serial=serial_hex(serial))  # as openssl and probe() print it

    def issue_many(self, count: int, key_type: str = "ecdsa-p256") -> list[Pair]:
        """``count`` leaves, each with a new serial and a different key from the one before (two keys
        alternate: an RSA 4096 key takes about a second to make)."""
        keys = [_new_key(key_type), _new_key(key_type)]
        return [self.issue(key_type, keys[i % 2]) for i in range(count)]


def serial_of(der: bytes) -> str:
    return serial_hex(x509.load_der_x509_certificate(der).serial_number)


# --- the kubelet atomic swap --------------------------------------------------------------------


class KubeletDir:
    """A Kubernetes secret volume: ``tls.crt -> ..data/tls.crt``, ``..data -> ..TIMESTAMP``.

    :meth:`install` writes the new timestamped directory, points a temporary link at it and
    renames that over ``..data`` (the one atomic step), as kubelet's atomic writer does.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cert_path = root / "tls.crt"
        self.key_path = root / "tls.key"
        self._n = 0

    def install(self, pair: Pair) -> float:
        """Rotate to ``pair``; returns ``time.monotonic()`` taken just before the atomic rename."""
        self._n += 1
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y_%m_%d_%H_%M_%S")
        new_dir = self.root / f"..{stamp}.{self._n:06d}"
        new_dir.mkdir()
        (new_dir / "tls.crt").write_bytes(pair.chain)
        (new_dir / "tls.key").write_bytes(pair.key)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        os.symlink(new_dir.name, tmp)
        swapped_at = time.monotonic()
        os.rename(tmp, data)
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if old:
            shutil.rmtree(self.root / old)
        return swapped_at


# --- servers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_command(server: str, plugin: bool, certfile: Path, keyfile: Path, port: int, workers: int) -> list[str]:
    """The command line of ``server`` with (``plugin``) or without the plugin, as the README documents."""
    py = sys.executable
    if server.startswith("gunicorn-"):
        worker = _GUNICORN_WORKERS.get(server, server.removeprefix("gunicorn-"))
        app = "tlsbench_apps:asgi" if server in _ASGI else "tlsbench_apps:wsgi"
        cmd = [py, "-m", "gunicorn"]
        if plugin:
            cmd += ["-c", "python:tlsreload_plugins.gunicorn_conf"]
        cmd += ["--certfile", str(certfile), "--keyfile", str(keyfile), "-k", worker, "-w", str(workers)]
        # gunicorn 27 opens a control socket at one default path per user: arbiters side by side
        # would fight over it. The benchmarks do not use it.
        cmd += ["--bind", f"{HOST}:{port}", "--no-control-socket", "--graceful-timeout", "5", app]
        return cmd
    if server == "uvicorn":
        module = "tlsreload_plugins.uvicorn" if plugin else "uvicorn"
        cmd = [py, "-m", module, "tlsbench_apps:asgi", "--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
        cmd += ["--host", HOST, "--port", str(port), "--no-access-log"]
        if workers > 1:
            cmd += ["--workers", str(workers)]
        return cmd
    if server in HYPERCORN_SERVERS:
        module = "tlsreload_plugins.hypercorn" if plugin else "hypercorn"
        app = f"{BENCH_DIR / 'tlsbench_apps.py'}:asgi"
        cmd = [py, "-m", module, app, "--certfile", str(certfile), "--keyfile", str(keyfile)]
        cmd += ["--bind", f"{HOST}:{port}", "--worker-class", server.removeprefix("hypercorn-")]
        return [*cmd, "--workers", str(workers)]
    raise ValueError(f"unknown server {server!r}; expected one of {', '.join(ALL_SERVERS)}")


@functools.cache
def compiled_package() -> None:
    """Write the bytecode of the tlsreload_plugins under test, once per run, before any server starts.

    Stock servers import their own modules from the bytecode pip wrote when it installed them; a source tree
    on ``PYTHONPATH`` (under ``PYTHONDONTWRITEBYTECODE``, or never imported before) would be compiled again by
    every worker the plugin's servers start, which no installed package does: a start-up cost that is not the
    plugin's."""
    compileall.compile_dir(Path(tlsreload_plugins.__file__).parent, quiet=1)


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM if the benchmark is killed with SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    name: str
    plugin: bool
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def label(self) -> str:
        return f"{self.name} ({'plugin' if self.plugin else 'stock'})"

    def output(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    # Workers of a server that died or ignored SIGTERM may linger in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@contextlib.contextmanager
def running_command(
    server: str,
    plugin: bool,
    log_dir: Path,
    command: Callable[[int], list[str]],
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """:func:`running_server` for a server this module does not know: ``command(port)`` is its command line.
    Start it, wait until it answers over TLS (and says whether the plugin is loaded), yield it, always stop
    the whole process group."""
    compiled_package()
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    log_path = log_dir / f"{server}-{'plugin' if plugin else 'stock'}-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command(port), stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=log_dir, start_new_session=True
        )
    handle = Server(server, plugin, port, proc, log_path)
    try:
        wait_ready(handle, 60.0)
        yield handle
    finally:
        stop_process_group(proc)


@contextlib.contextmanager
def running_server(
    server: str,
    plugin: bool,
    certfile: Path,
    keyfile: Path,
    log_dir: Path,
    workers: int = 1,
    interval: float | None = None,
    ready_timeout: float = 60.0,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """Start a server, wait until it answers over TLS, yield it, always stop it (whole process group).
    ``extra_env`` is added to the server's environment (``TLSRELOAD_METRICS``, say)."""
    compiled_package()
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    if interval is not None:
        env["TLSRELOAD_INTERVAL"] = str(interval)
    log_path = log_dir / f"{server}-{'plugin' if plugin else 'stock'}-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            server_command(server, plugin, certfile, keyfile, port, workers),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_dir,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    handle = Server(server, plugin, port, proc, log_path)
    try:
        wait_ready(handle, ready_timeout)
        yield handle
    finally:
        stop_process_group(proc)


def group_cpu_seconds(pgid: int, reaped: bool = False) -> float:
    """CPU time (user + system) used so far by the live processes of process group ``pgid`` (Linux); with
    ``reaped``, also what each has reaped of its children (a server's whole cost since it started, the workers it
    replaced included)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            total += sum(int(field) for field in fields[11 : 15 if reaped else 13])  # utime, stime (cutime, cstime)
    return total / ticks


def wait_ready(server: Server, timeout: float) -> Probe:
    """Poll until the server answers a request over TLS; check that the plugin is (or is not) loaded."""
    deadline = time.monotonic() + timeout
    ctx = client_context()
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.label} exited with {server.proc.returncode}:\n{server.output()}")
        try:
            answer = probe(server.port, ctx)
        except (OSError, ValueError) as e:
            last = e
            time.sleep(0.1)
            continue
        if answer.tlsreload != server.plugin:
            raise RuntimeError(
                f"{server.label}: the app reports tlsreload={int(answer.tlsreload)}; "
                f"the comparison would be meaningless:\n{server.output()}"
            )
        return answer
    raise RuntimeError(f"{server.label} not answering after {timeout}s (last error {last!r}):\n{server.output()}")


# --- clients ----------------------------------------------------------------------------------


def client_context() -> ssl.SSLContext:
    """A TLS client context that does not verify: the benchmarks measure the server, not the client."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass(frozen=True)
class Probe:
    pid: int
    tlsreload: bool
    serial: str
    handshake_done: float
    """``time.monotonic()`` when the handshake completed."""
    loaded: frozenset[str] = frozenset()
    """The app's watched modules loaded in the worker that answered (``tlsbench_apps.WATCHED_MODULES``)."""


def _quick_ack(sock: socket.socket) -> None:
    # Measured: uvicorn --workers N writes a response's head and body as two segments without
    # TCP_NODELAY, so the body waits for the client's delayed ACK (40 ms). ACK at once, or every
    # probe would take 40 ms more and the latency resolution with it.
    if hasattr(socket, "TCP_QUICKACK"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def probe(port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> Probe:
    """One fresh connection: full handshake, ``GET /``; which worker answered with which leaf."""
    with socket.create_connection((HOST, port), timeout=timeout) as raw, ctx.wrap_socket(raw) as tls:
        done = time.monotonic()
        der = tls.getpeercert(binary_form=True)
        tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            _quick_ack(tls)
            chunk = tls.recv(4096)
            if not chunk:
                raise ValueError(f"connection closed before the response headers: {data!r}")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            _quick_ack(tls)
            chunk = tls.recv(4096)
            if not chunk:
                break
            body += chunk
    if not head.startswith(b"HTTP/1.1 200") or der is None:
        raise ValueError(f"unexpected answer: {head[:80]!r}")
    fields = dict(item.split("=", 1) for item in body.decode().split())
    loaded = frozenset(name for name, value in fields.items() if name not in ("pid", "tlsreload") and value == "1")
    return Probe(int(fields["pid"]), fields["tlsreload"] == "1", serial_of(der), done, loaded)


def handshake_only(port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> None:
    """One fresh connection and a full handshake, then close: no request."""
    with socket.create_connection((HOST, port), timeout=timeout) as raw, ctx.wrap_socket(raw):
        pass


# --- numbers and tables -------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return float(ordered[rank - 1])


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pipes aligned for reading in a terminal too)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def target_row(target: str, measured: str, ok: bool) -> dict[str, Any]:
    return {"target": target, "measured": measured, "pass": ok}


def targets_table(targets: Sequence[dict[str, Any]]) -> str:
    rows = [(t["target"], t["measured"], "PASS" if t["pass"] else "FAIL") for t in targets]
    return table(("target", "measured", "result"), rows)


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_ticks() -> dict[str, int]:
    """The machine's CPU time so far by kind (``/proc/stat``, Linux; empty elsewhere), in clock ticks. ``steal``
    is time a virtual machine's CPUs were ready to run but the host ran something else: where it is high, rates
    fall for reasons outside the servers measured (CPU time per handshake is much less affected)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return {}
    return dict(zip(names, map(int, fields), strict=False))


def steal_share(before: dict[str, int], after: dict[str, int]) -> str:
    """The share of the machine's time stolen by the host between two :func:`cpu_ticks`, as text."""
    total = sum(after.values()) - sum(before.values())
    if not total or "steal" not in after:
        return "not measured"
    return f"{(after['steal'] - before['steal']) / total:.0%}"


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    openssl_cli = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        openssl_cli = subprocess.run(["openssl", "version"], capture_output=True, text=True, timeout=10).stdout.strip()
    load = ""
    with contextlib.suppress(OSError):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "load average (1/5/15 min) at start": load,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Python ssl": ssl.OPENSSL_VERSION,
        "openssl CLI": openssl_cli or "not found",
        "tlsreload-plugins": _version("tlsreload-plugins"),
        "gunicorn": _version("gunicorn"),
        "uvicorn": _version("uvicorn"),
        "hypercorn": _version("hypercorn"),
        "gevent": _version("gevent"),
        "cryptography": _version("cryptography"),
    }


# --- running a script ---------------------------------------------------------------------------


def sigterm_raises() -> None:
    """Turn SIGTERM into SystemExit (and SIGINT into KeyboardInterrupt, as usual) so that ``finally``
    blocks stop the servers; after the first signal both are ignored, so that a second Ctrl-C
    does not interrupt the clean-up the first one started."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """``count`` busy-loop processes beside what runs inside: a machine with scarce CPUs, as under other load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            stop_process_group(proc)


@contextlib.contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"tlsbench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_json(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=2, default=str))


def log(message: str) -> None:
    """Progress goes to stderr; the tables go to stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def time_bounded(seconds: float) -> Callable[[], bool]:
    """A predicate that turns true once ``seconds`` have passed."""
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end


def parse_args(parser: Any, argv: Sequence[str] | None, quick: dict[str, Any]) -> Any:
    """Parse with ``--quick`` (a smoke run) changing the defaults; explicit options still win."""
    description = ", ".join(f"{name.replace('_', '-')} {value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {description}")
    known, _ = parser.parse_known_args(argv)
    if known.quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)


def run_script(
    parser: Any,
    argv: Sequence[str] | None,
    quick: dict[str, Any],
    run: Callable[[Any], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> int:
    """What every script's ``main`` does: parse (with ``--json`` and ``--quick``), run, print the
    tables, save the raw results."""
    parser.add_argument("--json", help="also write the results to this file")
    args = parse_args(parser, argv, quick=quick)
    sigterm_raises()
    result = run(args)
    print(report(result) + "\n\n" + targets_table(result["targets"]))
    write_json(args.json, result)
    return 0
