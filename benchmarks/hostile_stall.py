"""Handshake stalls while hostile files sit on disk (issue 9): the worst handshake, next to a quiet baseline.

Each server runs with the plugin, 1 worker (so that nothing hides a stall behind another worker),
``TLSRELOAD_INTERVAL`` 0.5 s, over a certificate and key written as plain files. Client threads
loop: fresh connection, full handshake, close; each handshake is timed and every exception counts
as a failure. First a quiet baseline (good files, nothing changes) for ``--seconds``; then, for each
case of ``tests/hostile.py`` (a FIFO, ``/dev/zero``, a 200 MB file, 4,000 BEGIN lines with no END, a
malformed SAN, a chain over 100 KiB, ...), the case is put on disk and left there for ``--seconds``,
then a good pair is written and the script waits until a client is served it before the next case.

Reported per server and case: handshakes, failures, the median / p99 / worst handshake time in the
window (a check that holds the GIL, the event loop or the gevent hub shows in the worst), the
server's CPU time per handshake (user + system of its process group, from ``/proc``), and whether
any serial other than the last good one was served. A server should show the baseline's figures
for every case.

Runs against whatever ``tlsreload_plugins`` is installed. Do not run it against a core that reads
files without a size cap: the ``dev_zero`` case would fill the machine's memory (pick cases with
``--cases``).

    python benchmarks/hostile_stall.py                 # 5 s per case, 3 servers: about 3.5 min
    python benchmarks/hostile_stall.py --quick         # 1 s per case: about 1 min
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import threading
import time
from typing import Any

import benchkit as kit
import trustme

sys.path.insert(0, str(kit.BENCH_DIR.parent / "tests"))
import hostile  # tests/hostile.py, found through the line above

SERVERS = ("uvicorn", "gunicorn-gthread", "gunicorn-gevent")
BASELINE = "baseline (good files)"
HANDSHAKE_TIMEOUT = 10.0
SETTLE_DEADLINE = 20.0
"""Seconds for a good pair written after a case to be served."""


class Clients:
    """Client threads that handshake in a loop and record (start, seconds, serial or error) of each."""

    def __init__(self, port: int, threads: int) -> None:
        self.port = port
        self.records: list[tuple[float, float, str | None, str | None]] = []
        self.seen = threading.Condition()
        self._stop = threading.Event()
        self._last_start = [0.0] * threads
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def _handshake(self, ctx: ssl.SSLContext) -> str:
        with (
            socket.create_connection((kit.HOST, self.port), timeout=HANDSHAKE_TIMEOUT) as raw,
            ctx.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        if der is None:
            raise ValueError("no certificate")
        return _serial(kit.serial_of(der))

    def _loop(self, index: int) -> None:
        ctx = kit.client_context()
        while not self._stop.is_set():
            started = time.monotonic()
            serial: str | None = None
            error: str | None = None
            try:
                serial = self._handshake(ctx)
            except (OSError, ValueError) as e:
                error = repr(e)
            with self.seen:
                self.records.append((started, time.monotonic() - started, serial, error))
                self._last_start[index] = started
                self.seen.notify_all()

    def wait_for(self, serial: str, after: float, timeout: float) -> bool:
        """Wait until a handshake started after ``after`` was served ``serial``."""

        def served() -> bool:
            return any(r[0] >= after and r[2] == serial for r in reversed(self.records[-200:]))

        with self.seen:
            return self.seen.wait_for(served, timeout)

    def between(self, start: float, end: float) -> list[tuple[float, float, str | None, str | None]]:
        """The handshakes started in [start, end), once every one of them has ended (a stalled one is
        recorded when it ends: collecting at ``end`` would leave out exactly the stalls)."""
        with self.seen:
            self.seen.wait_for(lambda: min(self._last_start) >= end, HANDSHAKE_TIMEOUT + 5)
            return [r for r in self.records if start <= r[0] < end]

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


def _serial(hex_serial: str) -> str:
    """One spelling for every serial (hex, no padding), whichever helper printed it."""
    return format(int(hex_serial, 16), "X")


def window(name: str, clients: Clients, pgid: int, seconds: float, good: str) -> dict[str, Any]:
    """Measure ``seconds`` from now: handshakes, stalls, failures, CPU per handshake, foreign serials."""
    cpu_start = kit.group_cpu_seconds(pgid)
    start = time.monotonic()
    time.sleep(seconds)  # the measuring window itself, not a synchronisation
    end = time.monotonic()
    cpu = kit.group_cpu_seconds(pgid) - cpu_start
    records = clients.between(start, end)
    ok = [r[1] for r in records if r[3] is None]
    failures = [r[3] for r in records if r[3] is not None]
    foreign = sorted({r[2] for r in records if r[2] is not None and r[2] != good})
    return {
        "case": name,
        "seconds": end - start,
        "handshakes": len(ok),
        "failures": len(failures),
        "failure_sample": sorted(set(failures))[:3],
        "ms_median": kit.median(ok) * 1000,
        "ms_p99": kit.percentile(ok, 99) * 1000,
        "ms_max": max(ok, default=float("nan")) * 1000,
        "cpu_ms_per_handshake": cpu / len(ok) * 1000 if ok else float("nan"),
        "foreign_serials": foreign,
    }


def measure(
    server: str, cases: list[str], seconds: float, interval: float, workers: int, threads: int
) -> dict[str, Any]:
    ca = trustme.CA()
    windows = []
    with kit.work_dir("hostile") as tmp:
        cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
        good = _serial(hostile.place_good(cert_path, key_path, ca))
        with kit.running_server(server, True, cert_path, key_path, tmp, workers=workers, interval=interval) as srv:
            pgid = srv.proc.pid  # started in its own session: its pid is the group id
            with Clients(srv.port, threads) as clients:
                if not clients.wait_for(good, 0.0, SETTLE_DEADLINE):
                    raise RuntimeError(f"{srv.label} never served the first pair:\n{srv.output()}")
                windows.append(window(BASELINE, clients, pgid, seconds, good))
                for case in cases:
                    hostile.HOSTILE[case](cert_path, key_path, ca)
                    result = window(case, clients, pgid, seconds, good)
                    windows.append(result)
                    if srv.proc.poll() is not None:
                        result["recovery_s"] = "server exited"
                        kit.log(f"  {srv.label}: exited during {case}:\n{srv.output()}")
                        break
                    placed = time.monotonic()
                    good = _serial(hostile.place_good(cert_path, key_path, ca))
                    served = clients.wait_for(good, placed, SETTLE_DEADLINE)
                    result["recovery_s"] = time.monotonic() - placed if served else "stuck"
                    kit.log(
                        f"  {srv.label}: {case}: {result['handshakes']} handshakes, {result['failures']} failed, "
                        f"worst {result['ms_max']:.0f} ms; next good pair served "
                        + (f"after {result['recovery_s']:.1f} s" if served else f"not within {SETTLE_DEADLINE:.0f} s")
                    )
                    if not served:
                        # The server is stuck: what it would do with the remaining cases is not measurable.
                        kit.log(f"  {srv.label}: stuck after {case}; skipping its remaining cases")
                        break
    return {"server": server, "workers": workers, "windows": windows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    unknown = sorted(set(args.cases) - set(hostile.HOSTILE))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(hostile.HOSTILE)}")
    # Mint the big inputs once, before any server runs, so that minting does not land in a window.
    hostile.ca_bundle()
    hostile.many_certs_pem()
    results = []
    for server in args.servers:
        kit.log(f"hostile files: {server} (plugin)")
        results.append(measure(server, args.cases, args.seconds, args.interval, args.workers, args.threads))
    targets = []
    for r in results:
        base, *cases = r["windows"]
        failed = sum(w["failures"] for w in cases)
        foreign = sorted({s for w in cases for s in w["foreign_serials"]})
        worst = max(cases, key=lambda w: w["ms_max"]) if cases else base
        # A stall is a handshake held by something other than handshaking: judged against the
        # baseline's worst, with room for a loaded machine.
        limit = max(250.0, 2 * base["ms_max"])
        stuck = [w["case"] for w in cases if not isinstance(w.get("recovery_s"), float)]
        targets += [
            kit.target_row(
                f"{r['server']} (plugin): serves the next good pair after every case",
                f"{len(cases) - len(stuck)} of {len(args.cases)} cases"
                + (f"; not after {', '.join(stuck)}" if stuck else ""),
                not stuck and len(cases) == len(args.cases),
            ),
            kit.target_row(
                f"{r['server']} (plugin): failed handshakes while hostile files sit on disk == 0",
                f"{failed} of {sum(w['handshakes'] for w in cases) + failed}",
                failed == 0,
            ),
            kit.target_row(
                f"{r['server']} (plugin): only the last good leaf served while hostile files sit on disk",
                ", ".join(foreign) or "yes",
                not foreign,
            ),
            kit.target_row(
                f"{r['server']} (plugin): worst handshake with hostile files <= max(250 ms, 2 x baseline worst)",
                f"{worst['ms_max']:.0f} ms ({worst['case']}); baseline worst {base['ms_max']:.0f} ms",
                worst["ms_max"] <= limit,
            ),
        ]
    return {
        "benchmark": "hostile_stall",
        "settings": {
            "interval": args.interval,
            "workers": args.workers,
            "client threads": args.threads,
            "seconds per case": args.seconds,
        },
        "results": results,
        "targets": targets,
    }


def _recovery(w: dict[str, Any]) -> str:
    value = w.get("recovery_s", "-")
    return f"{value:.1f}" if isinstance(value, float) else f"**{value}**" if value != "-" else "-"


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        (
            r["server"],
            w["case"],
            w["handshakes"],
            f"**{w['failures']}**" if w["failures"] else "0",
            f"{w['ms_median']:.1f}",
            f"{w['ms_p99']:.0f}",
            f"**{w['ms_max']:.0f}**",
            f"{w['cpu_ms_per_handshake']:.2f}",
            _recovery(w),
            ", ".join(w["foreign_serials"]) or "-",
        )
        for r in result["results"]
        for w in r["windows"]
    ]
    headers = (
        "server",
        "case",
        "handshakes ok",
        "failed",
        "ms median",
        "ms p99",
        "ms worst",
        "server CPU ms / handshake",
        "next good pair served after (s)",
        "other serials served",
    )
    return (
        "### Handshake stalls while hostile files sit on disk\n\n"
        f"Plugin servers, {s['workers']} worker, interval {s['interval']:g} s, {s['client threads']} client threads "
        f"each looping fresh connection + full handshake + close; each case on disk for {s['seconds per case']:g} s "
        "(the cases of `tests/hostile.py`), then a good pair; 'ms' = one connection + handshake; 'server CPU' = "
        "user + system time of the server's process group in the window divided by its handshakes; 'next good "
        "pair served after' = seconds from writing a good pair after the case to a client being served it "
        "(**stuck**: not within 20 s, the server's remaining cases skipped).\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=kit.ALL_SERVERS)
    parser.add_argument("--cases", nargs="+", default=list(hostile.HOSTILE), help="cases of tests/hostile.py")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each case (and the baseline) is measured")
    parser.add_argument("--interval", type=float, default=0.5, help="TLSRELOAD_INTERVAL for the servers")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    return kit.run_script(parser, argv, {"seconds": 1.0}, run, report)


if __name__ == "__main__":
    sys.exit(main())
