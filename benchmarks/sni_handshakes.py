"""Full-handshake rate with 100 SNI identities against a single identity, side by side, in turn.

Three plugin servers run at the same time (1 worker each, same default certificate, same options):

* ``rotated``: a single identity (a Kubernetes Secret layout) rotated once before measuring. This is
  the steady state of any reloading server: every connection is moved (``conn.context = newest``)
  onto the rebuilt context, as SNI routing moves it onto an identity's context. The target's baseline.
* ``one``: a single identity never rotated: no connection is moved at all (shown for reference).
* ``many``: also serves 100 SNI identities (100 Secret directories under one directory, given as
  ``$TLSRELOAD_SNI``), each with its own ECDSA key and a certificate for ``siteN.bench.test``.

The clients are N processes doing full handshakes with :mod:`ssl` in a loop (a new socket and SSL
object each time, no session reuse, no request), each sending the server names
``site0.bench.test`` ... ``site99.bench.test`` in turn: on ``many`` every handshake is routed to
(and served by) another identity's context; on the others the same names all get the default
identity. ``openssl s_time`` cannot send a server name, so it is not used.

Prints the median rate per server, the ratio many/baseline, the per-round ratios, and the server CPU
per handshake (user+system of the server's processes during the window). Target: many/rotated >= 0.98
(the name lookup is two dictionary reads, whatever the number of identities).

    python benchmarks/sni_handshakes.py                 # uvicorn, 10 rounds x 3 s per server
    python benchmarks/sni_handshakes.py --quick         # 2 rounds x 1 s: a smoke run
    python benchmarks/sni_handshakes.py --servers uvicorn gunicorn-gthread --identities 100
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import multiprocessing
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchkit as kit
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

TARGET = 0.98
SIDES = ("rotated", "one", "many")

_client_ctx: ssl.SSLContext | None = None


def site(i: int) -> str:
    return f"site{i}.bench.test"


def write_identities(ca: kit.CA, root: Path, count: int) -> dict[str, str]:
    """``count`` identity directories (``tls.crt`` + ``tls.key``) under ``root``; their serials by name."""
    serials = {}
    now = datetime.datetime.now(datetime.timezone.utc)
    for i in range(count):
        key = ec.generate_private_key(ec.SECP256R1())
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, site(i))]))
            .issuer_name(ca.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(site(i))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca.key, hashes.SHA256())
        )
        directory = root / f"site{i}"
        directory.mkdir(parents=True)
        (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.pem)
        (directory / "tls.key").write_bytes(kit._pem_key(key))
        serials[site(i)] = kit.serial_hex(serial)
    return serials


@contextlib.contextmanager
def running(server: str, side: str, cert: Path, key: Path, work: Path, sni: Path | None) -> Iterator[kit.Server]:
    """:func:`benchkit.running_server` for the plugin side, with ``$TLSRELOAD_SNI`` set when ``sni`` is given."""
    port = kit.free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kit.BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("TLSRELOAD_SNI", None)
    if sni is not None:
        env["TLSRELOAD_SNI"] = str(sni)
    log_path = work / f"{server}-{side}-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            kit.server_command(server, True, cert, key, port, 1),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            start_new_session=True,
            preexec_fn=kit._die_with_parent if sys.platform == "linux" else None,
        )
    handle = kit.Server(f"{server} {side}", True, port, proc, log_path)
    try:
        kit.wait_ready(handle, 60.0)
        yield handle
    finally:
        kit.stop_process_group(proc)


def served_serial(port: int, name: str) -> str:
    with (
        socket.create_connection((kit.HOST, port), timeout=10) as raw,
        kit.client_context().wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return kit.serial_of(der)


def _client(port: int, names: list[str], offset: int, start_at: float, seconds: float) -> tuple[int, int, str]:
    """Runs in a client process: full handshakes, one name after the other, until the window closes."""
    global _client_ctx
    if _client_ctx is None:
        _client_ctx = kit.client_context()
    ctx = _client_ctx
    ok = failed = 0
    first_error = ""
    i = offset
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    while time.monotonic() < end:
        name = names[i % len(names)]
        i += 1
        try:
            with (
                socket.create_connection((kit.HOST, port), timeout=10) as raw,
                ctx.wrap_socket(raw, server_hostname=name),
            ):
                pass
            ok += 1
        except OSError as e:
            failed += 1
            first_error = first_error or repr(e)
    return ok, failed, first_error


def measure(
    pool: concurrent.futures.Executor, clients: int, server: kit.Server, names: list[str], seconds: float
) -> tuple[float, float, int]:
    """(handshakes/s, server CPU us per handshake, failures) over one window."""
    cpu_before = kit.group_cpu_seconds(server.proc.pid)
    start_at = time.monotonic() + 0.3
    step = max(1, len(names) // clients)
    futures = [pool.submit(_client, server.port, names, c * step, start_at, seconds) for c in range(clients)]
    results = [f.result(timeout=seconds + 60) for f in futures]
    cpu = kit.group_cpu_seconds(server.proc.pid) - cpu_before
    count, failed = sum(r[0] for r in results), sum(r[1] for r in results)
    if failed and not count:
        raise RuntimeError(f"every handshake failed: {next(r[2] for r in results if r[2])}")
    return count / seconds, cpu / count * 1e6 if count else float("nan"), failed


def compare(
    name: str,
    sides: dict[str, kit.Server],
    names: list[str],
    rounds: int,
    seconds: float,
    clients: int,
    pool: concurrent.futures.Executor,
) -> dict[str, Any]:
    for side in SIDES:  # warm-up
        measure(pool, clients, sides[side], names, 1.0)
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu_us: dict[str, list[float]] = {side: [] for side in SIDES}
    failures = dict.fromkeys(SIDES, 0)
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else tuple(reversed(SIDES)):
            rate, cpu, failed = measure(pool, clients, sides[side], names, seconds)
            rates[side].append(rate)
            cpu_us[side].append(cpu)
            failures[side] += failed
        kit.log(f"  {name} round {r + 1}/{rounds}: " + ", ".join(f"{s} {rates[s][-1]:.0f}/s" for s in SIDES))
    result: dict[str, Any] = {"server": name, "rates": rates, "cpu_us": cpu_us, "failures": failures}
    for side in SIDES:
        result[f"{side}_median"] = kit.median(rates[side])
        result[f"{side}_cpu_us"] = kit.median(cpu_us[side])
    for base in ("rotated", "one"):
        per_round = [m / o for m, o in zip(rates["many"], rates[base], strict=True) if o]
        result[f"ratio_{base}"] = result["many_median"] / result[f"{base}_median"]
        result[f"round_ratio_{base}"] = (min(per_round, default=float("nan")), max(per_round, default=float("nan")))
        result[f"cpu_ratio_{base}"] = result[f"{base}_cpu_us"] / result["many_cpu_us"]
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        mp = multiprocessing.get_context("spawn")
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp))
        work = stack.enter_context(kit.work_dir("sni"))
        ca = kit.CA()
        pair = ca.issue()
        cert, key = work / "cert.pem", work / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        kit.log(f"writing {args.identities} SNI identities")
        serials = write_identities(ca, work / "sni", args.identities)
        names = list(serials)
        for server in args.servers:
            kit.log(f"{server}: starting the three servers (1 worker each)")
            secret = kit.KubeletDir(work / f"rotated-{server}")
            secret.install(pair)
            with ExitStack() as servers:
                sides = {
                    "one": servers.enter_context(running(server, "one", cert, key, work, None)),
                    "rotated": servers.enter_context(
                        running(server, "rotated", secret.cert_path, secret.key_path, work, None)
                    ),
                    "many": servers.enter_context(running(server, "many", cert, key, work, work / "sni")),
                }
                for probe in (names[0], names[-1]):  # routing works: each name its own leaf
                    if served_serial(sides["many"].port, probe) != serials[probe]:
                        raise RuntimeError(f"{server}: {probe} did not get its own leaf:\n{sides['many'].output()}")
                default = served_serial(sides["one"].port, names[0])
                if served_serial(sides["many"].port, "unknown.bench.test") != default:
                    raise RuntimeError(f"{server}: an unknown name did not get the default leaf")
                rotated = ca.issue()
                secret.install(rotated)
                deadline = time.monotonic() + 30
                while served_serial(sides["rotated"].port, names[0]) == default:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{server}: the rotated side never served its new certificate")
                    time.sleep(0.2)
                results.append(compare(server, sides, names, args.rounds, args.seconds, args.clients, pool))
    targets = [
        kit.target_row(
            f"{r['server']} handshakes/s {args.identities} identities / 1 (rotated) >= {TARGET}",
            f"{r['ratio_rotated']:.3f}x",
            r["ratio_rotated"] >= TARGET,
        )
        for r in results
    ]
    return {
        "benchmark": "sni_handshakes",
        "settings": {
            "rounds": args.rounds,
            "seconds per side per round": args.seconds,
            "python client processes": args.clients,
            "server workers": 1,
            "SNI identities": args.identities,
        },
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    n = s["SNI identities"]
    rows = []
    for r in result["results"]:
        for base, label in (("rotated", "1 identity, rotated once"), ("one", "1 identity, never rotated")):
            low, high = r[f"round_ratio_{base}"]
            rows.append(
                (
                    r["server"],
                    label,
                    f"{r[f'{base}_median']:.0f}",
                    f"{r['many_median']:.0f}",
                    f"**{r[f'ratio_{base}']:.3f}x**",
                    f"{low:.3f}-{high:.3f}",
                    f"{r[f'{base}_cpu_us']:.0f} / {r['many_cpu_us']:.0f}",
                    f"{r[f'cpu_ratio_{base}']:.3f}x",
                    f"{r['failures'][base]}/{r['failures']['many']}",
                    f">= {TARGET}" if base == "rotated" else "-",
                )
            )
    headers = (
        "server",
        "baseline",
        "baseline hs/s (median)",
        f"{n} identities hs/s (median)",
        f"ratio {n}/baseline",
        "per-round ratios",
        f"server CPU us/hs baseline / {n}",
        f"CPU ratio baseline/{n}",
        "failed",
        "target",
    )
    return (
        f"### Full-handshake rate with {n} SNI identities\n\n"
        f"Three servers with the plugin, 1 worker each, measured in turn ({s['rounds']} rounds of "
        f"{s['seconds per side per round']} s per server, order reversed every round): a single identity rotated "
        "once (the steady state of any reloading server: every connection is moved onto the rebuilt context), a "
        f"single identity never rotated, and {n} SNI identities. {s['python client processes']} client processes "
        f"do full handshakes (no session reuse, no request), sending the {n} server names in turn: on the {n}-identity "
        "server each is routed to its own identity, on the others all get the default one. ECDSA P-256. Server CPU = "
        "user+system time of the server's processes per handshake (medians).\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=["uvicorn"], choices=kit.ALL_SERVERS)
    parser.add_argument("--identities", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side per round")
    parser.add_argument("--clients", type=int, default=2, help="python client processes")
    return kit.run_script(parser, argv, {"rounds": 2, "seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
