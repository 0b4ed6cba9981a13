"""What many SNI identities cost one server: 1, 100, 1,000 and 10,000 identities, each a Kubernetes TLS
Secret as kubelet mounts it (``tls.crt -> ..data/tls.crt``), one directory each under one ``$TLSRELOAD_SNI``
directory, ``TLSRELOAD_INTERVAL=1``, no traffic between the measurements.

For each server and each count, a fresh server is started and measured:

* **ready**: seconds from spawning the server to the first handshake naming a random identity that gets
  that identity's own leaf (and, with 2 workers, until both workers have answered so);
* **start CPU**: CPU seconds each worker used up to the end of the measurements below that precede the
  idle window (start-up, first handshakes);
* **idle CPU**: each worker's CPU over a ``--idle`` second window (20 s) with no traffic, as a share of one core;
* **PSS / RSS**: each worker's memory (``/proc/PID/smaps_rollup``) after handshakes to 40 random names
  (each asked several times, so that every worker is likely to see most of them) and the idle window;
* **rotation**: seconds from the atomic ``..data`` swap of one random identity to the first client
  handshake naming it that gets the new leaf, and to ``BATCH`` consecutive handshakes that all do (with 2
  workers, each connection lands on either);
* **log lines**: lines the server wrote up to ready.

Servers: ``uvicorn`` (``tlsreload-uvicorn``, one process), ``gunicorn-gthread`` (the drop-in, 2 workers),
and ``sanic`` (stock Sanic given the same certificates as a list: its ``CertSelector``, no reload; the peer).

Certificates are minted once (one ECDSA CA; leaves with ``cryptography`` directly, EC P-256 keys, each
with one random-looking DNS name) and kept under ``--cache`` (default ``/tmp/tlsreload-sni-scale``)
between runs: the trees for 10,000 identities take a few seconds to write, the leaves half a minute
to mint. A rotation leaves the tree it rotated valid.

    python benchmarks/sni_scale.py                                  # every count, the three servers
    python benchmarks/sni_scale.py --counts 1000 10000 --servers uvicorn
    python benchmarks/sni_scale.py --quick                          # 1 and 100 identities, idle 5 s
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchkit as kit
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

COUNTS = (1, 100, 1000, 10000)
SERVERS = ("uvicorn", "gunicorn-gthread", "sanic")
WORKERS = {"uvicorn": 1, "gunicorn-gthread": 2, "sanic": 1}
INTERVAL = "1"
NAMES_ASKED = 40
ASKED_EACH = 3
BATCH = 6
READY_TIMEOUT = 300.0
ROTATION_TIMEOUT = 60.0
VALID_DAYS = 90
REMINT_DAYS = 30
"""A cache whose CA expires within this many days is minted again."""

TARGETS = {"extra_pss_mib": 30.0, "idle_share": 0.002, "reader_idle_share": 0.05}
"""Issue 46's targets at 10,000 and 100,000 identities: PSS per worker at most 30 MiB above the same server's with
one identity, idle CPU per serving process at most 0.2 % of a core, the reader's at most 5 % at 100,000; ready within
20 s and a rotation reaching every worker within the interval + 2 s."""


# --- certificates, cached on disk ------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    name: str
    cert: bytes
    key: bytes
    serial: str


class Mint:
    """One CA (kept in the cache) and the leaves minted with it."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = cache / "ca.key", cache / "ca.crt"
        fresh = False
        if ca_key.exists() and ca_cert.exists():
            self.cert = x509.load_pem_x509_certificate(ca_cert.read_bytes())
            left = self.cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
            if left < datetime.timedelta(days=REMINT_DAYS):
                fresh = True
        else:
            fresh = True
        if fresh:
            for stale in cache.iterdir():
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tlsreload scale benchmark CA")])
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS + 10))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256())
            )
            ca_key.write_bytes(kit._pem_key(key))
            ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.cert = x509.load_pem_x509_certificate(ca_cert.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key.read_bytes(), None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        self.key = loaded
        self.pem = ca_cert.read_bytes()

    def leaf(self, name: str) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        serial = x509.random_serial_number()
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.pem
        return Leaf(name, chain, kit._pem_key(key), kit.serial_hex(serial))

    def leaves(self, count: int) -> list[Leaf]:
        """``count`` leaves, each for its own random-looking name: the first ``count`` of those in the cache,
        minting the ones missing."""
        store = self.cache / "leaves.jsonl"
        have: list[Leaf] = []
        if store.exists():
            for line in store.read_text().splitlines():
                name, cert, key, serial = json.loads(line)
                have.append(Leaf(name, cert.encode(), key.encode(), serial))
        if len(have) < count:
            kit.log(f"minting {count - len(have)} leaves")
            with open(store, "a") as out:
                for i in range(len(have), count):
                    token = hashlib.sha256(f"scale-{i}".encode()).hexdigest()[:10]
                    leaf = self.leaf(f"{token}.site{i}.scale.test")
                    out.write(json.dumps([leaf.name, leaf.cert.decode(), leaf.key.decode(), leaf.serial]) + "\n")
                    have.append(leaf)
        return have[:count]


def identity_dir(root: Path, index: int) -> Path:
    return root / f"site{index:05d}"


def kubelet_install(directory: Path, cert: bytes, key: bytes) -> float:
    """Write ``cert`` and ``key`` as kubelet's atomic writer does (a new timestamped directory, ``..data``
    renamed onto it); returns ``time.monotonic()`` just before the rename."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y_%m_%d_%H_%M_%S.%f")
    new = directory / f"..{stamp}"
    new.mkdir()
    (new / "tls.crt").write_bytes(cert)
    (new / "tls.key").write_bytes(key)
    data = directory / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    tmp = directory / "..data_tmp"
    os.symlink(new.name, tmp)
    swapped_at = time.monotonic()
    os.rename(tmp, data)
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            os.symlink(f"..data/{name}", directory / name)
    if old:
        shutil.rmtree(directory / old)
    return swapped_at


def tree(mint: Mint, count: int) -> tuple[Path, list[Leaf]]:
    """The SNI directory holding ``count`` identities (written once, kept in the cache), and their leaves
    as first written (a rotation since then changed one leaf: :func:`served_leaf` asks the disk)."""
    leaves = mint.leaves(count)
    root = mint.cache / f"sni-{count}"
    done = root / ".complete"
    if not done.exists():
        if root.exists():
            shutil.rmtree(root)
        kit.log(f"writing {count} identity directories")
        for i, leaf in enumerate(leaves):
            kubelet_install(identity_dir(root, i), leaf.cert, leaf.key)
        done.write_text("")
    return root, leaves


def default_identity(mint: Mint) -> Path:
    """A kubelet Secret for the default identity (localhost, 127.0.0.1)."""
    directory = mint.cache / "default"
    if not (directory / "tls.crt").exists():
        leaf = mint.leaf("localhost")
        kubelet_install(directory, leaf.cert, leaf.key)
    return directory


def on_disk_serial(directory: Path) -> str:
    pem = (directory / "tls.crt").read_bytes()
    return kit.serial_hex(x509.load_pem_x509_certificate(pem).serial_number)


# --- servers ---------------------------------------------------------------------------------------

SANIC_APP = """
import os, sys
from pathlib import Path
from sanic import Sanic
from sanic.response import text

app = Sanic("scale")

@app.get("/")
async def root(request):
    return text(f"pid={os.getpid()} tlsreload=0 prometheus_client=0 asyncio=1 cryptography=0\\n")

if __name__ == "__main__":
    default, sni, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    dirs = [Path(default)] + sorted(p for p in sni.iterdir() if p.is_dir())
    ssl = [{"cert": str(d / "tls.crt"), "key": str(d / "tls.key")} for d in dirs]
    app.run(host="127.0.0.1", port=port, ssl=ssl, single_process=True, access_log=False, motd=False)
"""


@contextlib.contextmanager
def started(
    server: str, default: Path, sni: Path, work: Path, plugin: bool = True
) -> Iterator[tuple[kit.Server, float]]:
    """``server`` serving ``sni`` (stock: the default identity only); yields it and ``time.monotonic()`` at spawn.
    Stopped at the end."""
    port = kit.free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_SNI": str(sni)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kit.BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("TLSRELOAD_METRICS", None)
    conf = work / "gunicorn.conf.py"
    conf.unlink(missing_ok=True)
    if server == "sanic":
        app = work / "sanic_scale_app.py"
        app.write_text(SANIC_APP)
        command = [sys.executable, str(app), str(default), str(sni), str(port)]
    else:
        command = kit.server_command(server, plugin, default / "tls.crt", default / "tls.key", port, WORKERS[server])
    log_path = work / f"{server}-{sni.name}-{port}.log"
    with open(log_path, "wb") as log_file:
        spawned = time.monotonic()
        proc = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            start_new_session=True,
            preexec_fn=kit._die_with_parent if sys.platform == "linux" else None,
        )
    try:
        yield kit.Server(server, plugin and server != "sanic", port, proc, log_path), spawned
    finally:
        kit.stop_process_group(proc)


def ask(port: int, name: str, timeout: float = 10.0) -> tuple[int, str]:
    """One fresh connection sending server name ``name``, a full handshake and ``GET /``: (pid, serial)."""
    ctx = kit.client_context()
    with (
        socket.create_connection((kit.HOST, port), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"pid=" not in data or not data.endswith(b"\n"):
            chunk = tls.recv(4096)
            if not chunk:
                break
            data += chunk
    assert der is not None
    body = data.partition(b"\r\n\r\n")[2].decode()
    pid = int(body.split("pid=", 1)[1].split()[0]) if "pid=" in body else -1
    return pid, kit.serial_of(der)


READER = b"tlsreload_plugins.publication.reader"
"""How the command line of a server's reader of the files reads (a child of the process that starts the workers)."""


def children_of(pid: int) -> dict[int, bytes]:
    """The child processes of ``pid``, with their command lines."""
    children: dict[int, bytes] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(f"/proc/{entry.name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                if int(fields[1]) == pid:
                    children[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
    return children


def workers_of(server: kit.Server) -> list[int]:
    """The serving processes: gunicorn's workers (the arbiter's children but its reader), else the process itself."""
    if not server.name.startswith("gunicorn"):
        return [server.proc.pid]
    return sorted(pid for pid, command in children_of(server.proc.pid).items() if READER not in command)


def reader_of(server: kit.Server) -> int | None:
    """The server's reader of the files (the process that reads and judges for every worker), if it has one."""
    return next((pid for pid, command in children_of(server.proc.pid).items() if READER in command), None)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, float]:
    kib: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kib[name.strip()] = int(value.split()[0])
    return {
        "rss": kib["Rss"] / 1024,
        "pss": kib["Pss"] / 1024,
        "pss_anon": kib.get("Pss_Anon", 0) / 1024,
        "pss_shmem": kib.get("Pss_Shmem", 0) / 1024,
    }


def until(predicate: Any, timeout: float, what: str, server: kit.Server, every: float = 0.02) -> float:
    """Poll ``predicate`` until true; returns ``time.monotonic()`` then."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.output()}")
        try:
            if predicate():
                return time.monotonic()
        except (OSError, ValueError) as e:
            last = e
        time.sleep(every)
    raise RuntimeError(f"{server.name}: {what} not within {timeout:g}s (last error {last!r}):\n{server.output()}")


def measure(server_name: str, count: int, mint: Mint, work: Path, idle: float, rng: random.Random) -> dict[str, Any]:
    sni, leaves = tree(mint, count)
    default = default_identity(mint)
    probe_index = rng.randrange(count)
    probe_name = leaves[probe_index].name
    probe_serial = on_disk_serial(identity_dir(sni, probe_index))  # an earlier run may have rotated it
    workers = WORKERS[server_name]
    with started(server_name, default, sni, work) as (server, spawned):
        seen_pids: set[int] = set()

        def own_leaf() -> bool:
            pid, serial = ask(server.port, probe_name)
            if serial != probe_serial:
                raise ValueError(f"{probe_name} got serial {serial}, not its own")
            seen_pids.add(pid)
            return True

        first = until(own_leaf, READY_TIMEOUT, "a handshake naming an identity", server)
        log_lines = len(server.log_path.read_bytes().splitlines())
        all_ready = until(lambda: own_leaf() and len(seen_pids) >= workers, READY_TIMEOUT, "every worker", server)
        # Handshakes to 40 random names, each asked a few times (every worker sees most of them).
        asked = rng.sample(range(count), min(NAMES_ASKED, count))
        wrong = 0
        on_disk = {index: on_disk_serial(identity_dir(sni, index)) for index in asked}
        for index in asked * ASKED_EACH:
            _, serial = ask(server.port, leaves[index].name)
            wrong += serial != on_disk[index]
        pids = workers_of(server)
        reader = reader_of(server)
        time.sleep(2.0)  # let a check that the handshakes started end
        start_cpu = {pid: cpu_seconds(pid) for pid in pids}
        reader_start = cpu_seconds(reader) if reader is not None else 0.0
        time.sleep(idle)
        idle_cpu = {pid: (cpu_seconds(pid) - start_cpu[pid]) / idle for pid in pids}
        reader_idle = (cpu_seconds(reader) - reader_start) / idle if reader is not None else None
        mem = {pid: memory(pid) for pid in pids}
        reader_pss = memory(reader)["pss"] if reader is not None else None
        rotation: dict[str, float | None] = {"first": None, "all": None}
        if server.plugin:
            index = rng.randrange(count)
            name = leaves[index].name
            new = mint.leaf(name)
            swapped = kubelet_install(identity_dir(sni, index), new.cert, new.key)
            seen_first = until(lambda: ask(server.port, name)[1] == new.serial, ROTATION_TIMEOUT, "rotation", server)
            seen_all = until(
                lambda: all(ask(server.port, name)[1] == new.serial for _ in range(BATCH)),
                ROTATION_TIMEOUT,
                "rotation in every worker",
                server,
            )
            rotation = {"first": seen_first - swapped, "all": seen_all - swapped}
        group_pss = sum(memory(pid)["pss"] for pid in sorted({server.proc.pid, *pids, *([reader] if reader else [])}))
        result = {
            "server": server_name,
            "identities": count,
            "ready_s": first - spawned,
            "all_ready_s": all_ready - spawned,
            "start_cpu_s": max(start_cpu.values()),
            "idle_share": max(idle_cpu.values()),
            "idle_share_each": list(idle_cpu.values()),
            "pss_mib": max(m["pss"] for m in mem.values()),
            "rss_mib": max(m["rss"] for m in mem.values()),
            "memory_each": list(mem.values()),
            "group_pss_mib": group_pss,
            "rotation_first_s": rotation["first"],
            "rotation_all_s": rotation["all"],
            "log_lines_at_ready": log_lines,
            "wrong_leaves": wrong,
            "workers": len(pids),
            "reader_idle_share": reader_idle,
            "reader_pss_mib": reader_pss,
        }
        rotated = "-" if rotation["first"] is None else f"{rotation['first']:.2f}s"
        kit.log(
            f"  {server_name} {count}: ready {result['ready_s']:.1f}s, start CPU {result['start_cpu_s']:.1f}s, "
            f"idle {result['idle_share']:.1%}, PSS {result['pss_mib']:.0f} MiB, "
            + (f"reader idle {reader_idle:.1%} PSS {reader_pss:.0f} MiB, " if reader_pss is not None else "")
            + f"rotation {rotated}, {log_lines} log lines"
        )
        return result


def stock_idle(server_name: str, mint: Mint, work: Path, idle: float) -> float:
    """The idle CPU of the stock server's busiest serving process (the default identity, no SNI: stock has no
    reload), over the same window: what the server itself spends doing nothing, beside the plugin's figure."""
    default = default_identity(mint)
    with started(server_name, default, default, work, plugin=False) as (server, _):
        until(lambda: bool(ask(server.port, "localhost")[0]), READY_TIMEOUT, "stock answering", server)
        pids = workers_of(server)
        time.sleep(2.0)
        start_cpu = {pid: cpu_seconds(pid) for pid in pids}
        time.sleep(idle)
        share = max((cpu_seconds(pid) - start_cpu[pid]) / idle for pid in pids)
    kit.log(f"  stock {server_name}: idle {share:.2%}")
    return share


def run(args: argparse.Namespace) -> dict[str, Any]:
    mint = Mint(Path(args.cache))
    rng = random.Random(args.seed)
    results: list[dict[str, Any]] = []
    machine_before = kit.cpu_ticks()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    stock: dict[str, float] = {}
    with kit.work_dir("sni-scale") as work:
        for server in args.servers:
            if server in ("uvicorn", "gunicorn-gthread"):
                kit.log(f"stock {server}: idle")
                stock[server] = stock_idle(server, mint, work, args.idle)
        for count in args.counts:
            for server in args.servers:
                if server == "sanic" and not _sanic_installed():
                    kit.log("sanic is not installed: no peer")
                    continue
                kit.log(f"{server}: {count} identities")
                try:
                    results.append(measure(server, count, mint, work, args.idle, rng))
                except RuntimeError as e:
                    kit.log(f"  {server} {count}: FAILED: {str(e)[:2000]}")
                    results.append({"server": server, "identities": count, "error": str(e)[:4000]})
    targets = []
    done = [r for r in results if "error" not in r]
    for r in done:
        if r["server"] not in ("uvicorn", "gunicorn-gthread") or r["identities"] < 10000:
            continue
        name, count = r["server"], f"{r['identities']:,}"
        one = next((o for o in done if o["server"] == name and o["identities"] == 1), None)
        if one is not None:
            extra = r["pss_mib"] - one["pss_mib"]
            targets.append(
                kit.target_row(
                    f"{name} PSS per worker at {count} <= 1 identity's + 30 MiB ({one['pss_mib']:.0f} MiB)",
                    f"+{extra:.0f} MiB ({r['pss_mib']:.0f} MiB)",
                    extra <= TARGETS["extra_pss_mib"],
                )
            )
        stock_share = f" (stock's own: {stock[name]:.2%})" if name in stock else ""
        targets.append(
            kit.target_row(
                f"{name} idle CPU per serving process at {count} <= 0.2 %{stock_share}",
                f"{r['idle_share']:.2%}",
                r["idle_share"] <= TARGETS["idle_share"],
            )
        )
        if r["rotation_all_s"] is not None:
            targets.append(
                kit.target_row(
                    f"{name} rotation reaches every worker at {count} <= interval + 2 s",
                    f"{r['rotation_all_s']:.2f} s",
                    r["rotation_all_s"] <= float(INTERVAL) + 2.0,
                )
            )
        if r["identities"] >= 100000:
            targets.append(
                kit.target_row(f"{name} ready at {count} <= 20 s", f"{r['all_ready_s']:.1f} s", r["all_ready_s"] <= 20)
            )
            if r["reader_idle_share"] is not None:
                targets.append(
                    kit.target_row(
                        f"{name} reader's idle CPU at {count} <= 5 % (its PSS: {r['reader_pss_mib']:.0f} MiB)",
                        f"{r['reader_idle_share']:.1%}",
                        r["reader_idle_share"] <= TARGETS["reader_idle_share"],
                    )
                )
    return {
        "benchmark": "sni_scale",
        "settings": {
            "interval": INTERVAL,
            "idle window s": args.idle,
            "names asked": NAMES_ASKED,
            "load average at start": load,
            "host steal": kit.steal_share(machine_before, kit.cpu_ticks()),
            "inotify max_user_watches": _inotify_watches(),
        },
        "stock_idle_share": stock,
        "results": results,
        "targets": targets,
    }


def _inotify_watches() -> str:
    try:
        return Path("/proc/sys/fs/inotify/max_user_watches").read_text().strip()
    except OSError:
        return "unknown"


def _sanic_installed() -> bool:
    try:
        import sanic  # noqa: F401
    except ImportError:
        return False
    return True


def report(result: dict[str, Any]) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    rows = []
    for r in result["results"]:
        if "error" in r:
            rows.append((r["server"], r["identities"], "FAILED", "", "", "", "", "", "", "", ""))
            continue
        rows.append(
            (
                r["server"],
                f"{r['identities']:,}",
                f"{r['ready_s']:.1f} / {r['all_ready_s']:.1f}",
                f"{r['start_cpu_s']:.1f}",
                f"{r['idle_share']:.1%}",
                f"{r['pss_mib']:.0f}",
                f"{r['rss_mib']:.0f}",
                "-" if r.get("reader_pss_mib") is None else f"{r['reader_idle_share']:.1%} / {r['reader_pss_mib']:.0f}",
                f"{seconds(r['rotation_first_s'])} / {seconds(r['rotation_all_s'])}",
                r["log_lines_at_ready"],
                r["wrong_leaves"],
            )
        )
    headers = (
        "server",
        "identities",
        "ready s (first / every worker)",
        "start CPU s (worker)",
        "idle CPU (worker, of one core)",
        "PSS MiB (worker)",
        "RSS MiB (worker)",
        "reader: idle CPU / PSS MiB",
        "rotation s (first / every worker)",
        "log lines at ready",
        "wrong leaves",
    )
    s = result["settings"]
    return (
        "### SNI identities at scale\n\n"
        f"Kubelet Secrets under one `TLSRELOAD_SNI` directory, interval {s['interval']} s; tlsreload-uvicorn one "
        "process, gunicorn gthread 2 workers (worst worker shown), stock Sanic (CertSelector, no reload). Idle "
        f"window {s['idle window s']} s; memory after handshakes to {s['names asked']} random names. Load average "
        f"at start {s['load average at start']}; host steal {s['host steal']}; inotify watches allowed "
        f"{s['inotify max_user_watches']}. Stock's own idle CPU in the same window (default identity): "
        + (", ".join(f"{name} {share:.2%}" for name, share in result.get("stock_idle_share", {}).items()) or "-")
        + ".\n\n"
        + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", nargs="+", type=int, default=list(COUNTS))
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle CPU window")
    parser.add_argument("--cache", default="/tmp/tlsreload-sni-scale", help="where the minted trees are kept")
    parser.add_argument("--seed", type=int, default=29)
    return kit.run_script(parser, argv, {"counts": [1, 100], "idle": 5.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
