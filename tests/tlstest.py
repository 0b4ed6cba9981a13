"""Test kit shared by every test file: certificates, the on-disk layouts real systems write,
real TLS clients, and polling with deadlines. No mocks: everything here does real I/O."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tlsreload_plugins.identity import serial_hex

HOST = "127.0.0.1"


# --- certificates ---------------------------------------------------------------------------


@dataclass
class Pair:
    """A leaf certificate (with its chain) and key, as PEM bytes."""

    chain: bytes
    key: bytes
    serial: str

    @property
    def leaf(self) -> bytes:
        end = b"-----END CERTIFICATE-----\n"
        return self.chain[: self.chain.index(end) + len(end)]


def issue(ca: trustme.CA, *names: str, key_type: trustme.KeyType | None = None, **kwargs: Any) -> Pair:
    """Mint a leaf for ``names`` (default localhost and 127.0.0.1) signed by ``ca``."""
    if key_type is not None:
        kwargs["key_type"] = key_type
    leaf = ca.issue_cert(*(names or ("localhost", HOST)), **kwargs)
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    cert = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())
    return Pair(chain=chain, key=leaf.private_key_pem.bytes(), serial=serial_hex(cert.serial_number))


PASSWORD = "correct horse"


def with_password(pair: Pair, password: str, traditional: bool = False) -> Pair:
    """``pair`` with its key encrypted as openssl writes it: PKCS#8, or the older 'Proc-Type: 4,ENCRYPTED'."""
    key = serialization.load_pem_private_key(pair.key, None)
    fmt = serialization.PrivateFormat.TraditionalOpenSSL if traditional else serialization.PrivateFormat.PKCS8
    encryption = serialization.BestAvailableEncryption(password.encode())
    return Pair(pair.chain, key.private_bytes(serialization.Encoding.PEM, fmt, encryption), pair.serial)


def serial_of(der: bytes) -> str:
    return serial_hex(x509.load_der_x509_certificate(der).serial_number)


# --- revocation lists -----------------------------------------------------------------------


def ca_key(ca: trustme.CA) -> Any:
    """The private key of ``ca``."""
    return serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)


def crl_pem(
    ca: trustme.CA,
    *revoked: Pair,
    next_update: datetime.timedelta = datetime.timedelta(days=1),
    last_update: datetime.timedelta = datetime.timedelta(minutes=-5),
    signer: trustme.CA | None = None,
) -> bytes:
    """A CRL issued by ``ca`` (its name and key id) revoking the leaves of ``revoked``, its ``thisUpdate`` and
    ``nextUpdate`` that far from now, signed by ``ca``'s key (or ``signer``'s: a forgery naming ``ca``)."""
    from cryptography.hazmat.primitives import hashes

    issuer = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer.subject)
        .last_update(now + last_update)
        .next_update(now + next_update)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key()), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.CRLNumber(int(time.time() * 1000)), critical=False)
    )
    for pair in revoked:
        serial = x509.load_pem_x509_certificate(pair.leaf).serial_number
        entry = (
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now - datetime.timedelta(minutes=5))
        )
        builder = builder.add_revoked_certificate(entry.build())
    crl = builder.sign(ca_key(signer or ca), hashes.SHA256())
    return crl.public_bytes(serialization.Encoding.PEM)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` at ``path`` the way tools publish a file: beside it, then renamed into place."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(data)
    os.replace(staged, path)


# --- real TLS clients -----------------------------------------------------------------------


def client_context(ca: trustme.CA, client: Pair | None = None, **kwargs: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client is not None:
        d = Path(os.environ.get("TMPDIR", "/tmp"))
        path = d / f"tlstest-client-{os.getpid()}-{threading.get_ident()}.pem"
        path.write_bytes(client.chain + client.key)
        try:
            ctx.load_cert_chain(str(path))
        finally:
            path.unlink()
    for name, value in kwargs.items():
        setattr(ctx, name, value)
    return ctx


def handshake(
    port: int, ctx: ssl.SSLContext, timeout: float = 10.0, host: str = HOST, server_name: str = "localhost"
) -> ssl.SSLSocket:
    """One full handshake (fresh connection) sending ``server_name``; returns the open TLS socket."""
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname=server_name)
    except BaseException:
        raw.close()
        raise


def request(port: int, ctx: ssl.SSLContext, path: str) -> bytes:
    """``GET path`` on a new connection: the whole response, read to the end."""
    with handshake(port, ctx) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        response = b""
        while chunk := tls.recv(65536):
            response += chunk
    return response


def get(port: int, ctx: ssl.SSLContext, timeout: float = 10.0, server_name: str = "localhost") -> tuple[str, bytes]:
    """``GET /`` on a new connection sending ``server_name``: (serial of the leaf served, the whole response).

    Raises:
        ConnectionResetError: the connection was closed without a response (a worker stopping after the handshake).
    """
    with handshake(port, ctx, timeout, server_name=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
        response = b""
        while chunk := tls.recv(65536):
            response += chunk
    if not response:
        raise ConnectionResetError("the connection was closed without a response")
    return serial_of(der), response


def status_body(port: int, ctx: ssl.SSLContext) -> dict[str, Any]:
    """``GET /status`` of hostile_apps on a new connection: ``{"pid": ..., "reloaders": [status, ...]}``."""
    with handshake(port, ctx) as tls:
        tls.sendall(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        response = b""
        while chunk := tls.recv(65536):
            response += chunk
    body: dict[str, Any] = json.loads(response.partition(b"\r\n\r\n")[2])
    return body


def worker_status(port: int, ctx: ssl.SSLContext) -> tuple[int, dict[str, Any]]:
    """The pid of the worker answering a new connection, and its first reloader's ``status()`` (:func:`status_body`)."""
    body = status_body(port, ctx)
    return int(body["pid"]), body["reloaders"][0]


def served_serial(port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> str:
    """Serial of the leaf the server at ``port`` presents to a new connection."""
    with handshake(port, ctx, timeout) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)


def without_stock_blocks(pattern: re.Pattern[str], output: str, naming: str = "") -> str:
    """``output`` less the blocks ``pattern`` matches that name ``naming`` and none of our modules: what the stock
    server logs in the same situation, which a test of a clean log forgives (and only that)."""

    def kept(match: re.Match[str]) -> str:
        block = match.group(0)
        return "" if naming in block and "tlsreload" not in block else block

    return pattern.sub(kept, output)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # a server still starting refuses connections
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or predicate}; last error: {last_error!r}"
            )
        time.sleep(interval)


def wait_for_child(pid: int, timeout: float = 30.0) -> int:
    """Wait for the forked child ``pid`` to exit and return its exit code; kill it after ``timeout`` seconds."""
    codes: list[int] = []

    def exited() -> bool:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            codes.append(os.waitstatus_to_exitcode(status))
        return bool(codes)

    try:
        wait_until(exited, timeout, what=f"child {pid} to exit")
    except AssertionError:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    return codes[0]


def wait_for_serial(port: int, ctx: ssl.SSLContext, serial: str, timeout: float, attempts: int = 1) -> float:
    """Wait until ``attempts`` consecutive new connections all get ``serial``; returns seconds waited.

    Several attempts matter with several workers: each connection may land on another one.
    """
    start = time.monotonic()

    def all_new() -> bool:
        return all(served_serial(port, ctx) == serial for _ in range(attempts))

    wait_until(all_new, timeout, what=f"serial {serial} on port {port}")
    return time.monotonic() - start


@dataclass
class Hammer:
    """Client threads that handshake in a loop and count every failure, until stopped."""

    port: int
    ctx: ssl.SSLContext
    threads: int = 4
    successes: int = 0
    failures: list[str] = field(default_factory=list)
    serials: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                serial = served_serial(self.port, self.ctx)
            except Exception as e:
                with self._lock:
                    self.failures.append(repr(e))
            else:
                with self._lock:
                    self.successes += 1
                    self.serials.add(serial)

    def __enter__(self) -> Hammer:
        for i in range(self.threads):
            t = threading.Thread(target=self._loop, name=f"hammer-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(30)


# --- on-disk layouts, written the way each real system writes them -------------------------


class Layout:
    """Where the server is told its files are, and how a rotation writes them."""

    name = "layout"
    cert_path: Path
    key_path: Path

    def install(self, pair: Pair) -> None:
        """Rotate to ``pair``."""
        self.write_raw(pair.chain, pair.key)

    def write_raw(self, cert: bytes, key: bytes) -> None:
        """Write arbitrary bytes (possibly broken) the way this layout writes."""
        raise NotImplementedError


class KubeletLayout(Layout):
    """kubelet's atomic writer: dir/tls.crt -> ..data/tls.crt, ..data -> ..TIMESTAMP/; one rename swaps all files."""

    name = "kubelet"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cert_path = root / "tls.crt"
        self.key_path = root / "tls.key"
        self.ca_path = root / "ca.crt"
        self._n = 0

    def write_files(self, files: dict[str, bytes]) -> None:
        self._n += 1
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y_%m_%d_%H_%M_%S")
        ts_dir = self.root / f"..{stamp}.{os.getpid()}{self._n:06d}"
        ts_dir.mkdir()
        for name, data in files.items():
            (ts_dir / name).write_bytes(data)
            os.chmod(ts_dir / name, 0o644)
        data_link = self.root / "..data"
        old = os.readlink(data_link) if data_link.is_symlink() else None
        tmp_link = self.root / "..data_tmp"
        os.symlink(ts_dir.name, tmp_link)
        os.rename(tmp_link, data_link)
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old:
            shutil.rmtree(self.root / old)

    def write_raw(self, cert: bytes, key: bytes) -> None:
        self.write_files({"tls.crt": cert, "tls.key": key})


class CertbotLayout(Layout):
    """certbot: live/NAME/*.pem are relative symlinks into archive/NAME/*N.pem, relinked one at a time
    (unlink then symlink, in certbot's order cert, privkey, chain, fullchain)."""

    name = "certbot"

    def __init__(self, root: Path, domain: str = "example.test") -> None:
        self.live = root / "live" / domain
        self.archive = root / "archive" / domain
        self.live.mkdir(parents=True, exist_ok=True)
        self.archive.mkdir(parents=True, exist_ok=True)
        self.cert_path = self.live / "fullchain.pem"
        self.key_path = self.live / "privkey.pem"
        self._version = 0

    def write_raw(self, cert: bytes, key: bytes) -> None:
        self._version += 1
        v = self._version
        end = b"-----END CERTIFICATE-----\n"
        leaf = cert[: cert.index(end) + len(end)] if end in cert else cert
        contents = {"cert": leaf, "privkey": key, "chain": cert[len(leaf) :], "fullchain": cert}
        for kind, data in contents.items():
            path = self.archive / f"{kind}{v}.pem"
            path.write_bytes(data)
            os.chmod(path, 0o600 if kind == "privkey" else 0o644)
        for kind in ("cert", "privkey", "chain", "fullchain"):
            link = self.live / f"{kind}.pem"
            if link.is_symlink():
                os.unlink(link)
            os.symlink(os.path.join("..", "..", "archive", self.archive.name, f"{kind}{v}.pem"), link)


class InPlaceLayout(Layout):
    """A script or `cp` rewriting the files in place: truncate, then write in pieces; cert first, key later."""

    name = "inplace"

    def __init__(self, root: Path, pause: float = 0.002) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.cert_path = root / "server.crt"
        self.key_path = root / "server.key"
        self.pause = pause

    def _write(self, path: Path, data: bytes) -> None:
        with open(path, "wb") as f:
            for i in range(0, len(data), 256):
                f.write(data[i : i + 256])
                f.flush()
                time.sleep(self.pause)

    def write_raw(self, cert: bytes, key: bytes) -> None:
        self._write(self.cert_path, cert)
        self._write(self.key_path, key)


class RenameEachLayout(Layout):
    """Write a temporary file and rename it over the target, per file: each file atomic, the pair not."""

    name = "rename"

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.cert_path = root / "cert.pem"
        self.key_path = root / "key.pem"

    def write_raw(self, cert: bytes, key: bytes) -> None:
        for path, data in ((self.cert_path, cert), (self.key_path, key)):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)


LAYOUTS: dict[str, type[Layout]] = {
    cls.name: cls for cls in (KubeletLayout, CertbotLayout, InPlaceLayout, RenameEachLayout)
}


# Root reads through chmod 000 (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH). An "unreadable file" test run as root
# therefore starts the server without those two capabilities: still uid 0, so still able to reach the
# interpreter (pyenv under /root, 0700, which uid 65534 cannot enter), but now bound by file modes. The boot
# drops them from the bounding set and re-executes, which clears them from the new process.
OBEY_MODES_BOOT = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH\n"
    "    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP\n"
    "        raise OSError(ctypes.get_errno(), 'prctl(PR_CAPBSET_DROP)')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def sni_tree(root: Path, ca: trustme.CA, count: int) -> dict[str, Pair]:
    """``count`` SNI identities under ``root`` as kubelet mounts Secrets (``site0`` answering ``site0.example``,
    ...), and one more, ``broken``, whose key is not its certificate's; returns the valid ones' pairs by name."""
    pairs = {f"site{i}": issue(ca, f"site{i}.example") for i in range(count)}
    for name, pair in pairs.items():
        KubeletLayout(root / name).install(pair)
    KubeletLayout(root / "broken").write_raw(pairs["site0"].chain, pairs["site1"].key)
    return pairs


def obey_file_modes() -> list[str]:
    """The command that starts this Python bound by file modes, even as root."""
    return [sys.executable, "-c", OBEY_MODES_BOOT] if os.geteuid() == 0 else [sys.executable]


# --- processes --------------------------------------------------------------------------------


READER = "tlsreload_plugins.publication.reader"
"""How the command line of a server's reader of the files (a child of the process that starts the workers) reads."""


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found[int(entry)] = command
    return found


def child_running(parent: int, text: str) -> int:
    """The pid of the one child of ``parent`` whose command line holds ``text``."""
    found = [pid for pid, command in children(parent).items() if text in command]
    assert len(found) == 1, children(parent)
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A server subprocess whose output goes to a file, stopped with SIGTERM (then SIGKILL)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"server did not stop within {timeout}s:\n{self.output()}") from None
        return int(self.proc.returncode)


@contextmanager
def run_server(
    args: list[str], log_path: Path, port: int, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[Server]:
    """Start ``args`` (a list, first item a module run with this Python when it starts with '-m')."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed in the finally below
    cmd = [sys.executable, *args] if args[0] == "-m" else args
    proc = subprocess.Popen(
        cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
    )
    server = Server(proc, log_path, port)
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            log_file.close()
